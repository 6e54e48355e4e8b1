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

# Unity builds for the executables whose sources each pull in large header-only libraries (the
# test binaries: GoogleTest; the `kvattn` tool: CLI11 and nlohmann/json; the Python module:
# pybind11): their source files are compiled in batches of KVATTN_UNITY_BATCH, each batch one
# translation unit, so those headers are parsed and their templates instantiated once per batch
# rather than once per file (the test binaries build in about half the CPU time).  The files of
# one such target therefore give their file-local helpers names no other file of the target uses.
# The libraries are not unity-built: their objects, and so the kernels' machine code, stay one per
# source file.  KVATTN_UNITY_BATCH=1 compiles one file per translation unit (quicker when one
# file is rebuilt again and again).
set(KVATTN_UNITY_BATCH 8 CACHE STRING "Source files per unity translation unit of the tests, the tool and the Python module (1: none)")
function(kvattn_unity_build target)
  if(KVATTN_UNITY_BATCH GREATER 1)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${KVATTN_UNITY_BATCH})
  endif()
endfunction()
