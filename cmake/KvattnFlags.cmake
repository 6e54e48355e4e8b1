# Warning and sanitizer flags shared by every kvattn target.  (C++20 for nvcc is set up in
# the top-level CMakeLists.txt, where CUDA is enabled.)
function(kvattn_set_flags target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
    # Position-independent code otherwise assumes exported functions may be interposed and
    # does not inline them within their own library (measured: backend build() ~5% faster).
    $<$<COMPILE_LANGUAGE:CXX>:-fno-semantic-interposition>
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xcompiler=-Wall>)
  if(KVATTN_SANITIZE)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer>)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()

# Sanitizer flags must reach every object linked into a sanitized executable.
if(KVATTN_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=all>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=address,undefined)
endif()

# libFuzzer build (the `fuzz` preset, clang): every object is instrumented for the fuzzer's
# coverage feedback (-fsanitize=fuzzer-no-link); the fuzz targets link the libFuzzer runtime
# (fuzz/CMakeLists.txt).  Used with KVATTN_SANITIZE (address + undefined).
option(KVATTN_LIBFUZZER "Build the fuzz targets with libFuzzer (clang only)" OFF)
if(KVATTN_LIBFUZZER)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "KVATTN_LIBFUZZER=ON needs clang (found ${CMAKE_CXX_COMPILER_ID}); configure with "
                        "`cmake --preset fuzz` (Debian: apt-get install clang libclang-rt-14-dev)")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()
