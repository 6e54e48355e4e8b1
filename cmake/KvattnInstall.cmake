# `make install` / `cmake --install`: headers, the layer libraries, a CMake package
# (find_package(kvattn) -> kvattn::kvattn) and a pkg-config file (kvattn.pc).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(kvattn_install_targets kvattn_all)
set(kvattn_pc_libs "")
foreach(layer model engine attention batch kv ops core)  # dependents first, for static linking
  if(TARGET kvattn_${layer})
    list(APPEND kvattn_install_targets kvattn_${layer})
    set_target_properties(kvattn_${layer} PROPERTIES EXPORT_NAME ${layer})
    string(APPEND kvattn_pc_libs " -lkvattn_${layer}")
  endif()
endforeach()
set_target_properties(kvattn_all PROPERTIES EXPORT_NAME kvattn)

install(TARGETS ${kvattn_install_targets} EXPORT kvattnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kvattn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS kvattn RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT kvattnTargets NAMESPACE kvattn:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvattn)

set(KVATTN_CONFIG_WITH_CUDA ${KVATTN_WITH_CUDA})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvattnConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/kvattnConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvattn)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvattnConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvattnConfig.cmake ${PROJECT_BINARY_DIR}/kvattnConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvattn)

if(TARGET kvattn_model)
  string(APPEND kvattn_pc_libs " -lpcre2-8 -lsentencepiece -lutf8proc")
  string(APPEND kvattn_pc_libs " -lopenblas")
endif()
set(KVATTN_PC_LIBS "${kvattn_pc_libs}")
if(KVATTN_WITH_CUDA)
  string(APPEND KVATTN_PC_LIBS " -L${CUDAToolkit_LIBRARY_DIR}")
  if(TARGET kvattn_model)
    string(APPEND KVATTN_PC_LIBS " -lcublas")
  endif()
  string(APPEND KVATTN_PC_LIBS " -lcudart")
endif()
# Relocatable: the prefix is found from the .pc file's own place (<prefix>/<libdir>/pkgconfig), so
# `cmake --install --prefix P` and a moved install tree both work.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(KVATTN_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(KVATTN_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  file(RELATIVE_PATH kvattn_pc_up "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
  string(REGEX REPLACE "/$" "" kvattn_pc_up "${kvattn_pc_up}")
  set(KVATTN_PC_PREFIX "\${pcfiledir}/${kvattn_pc_up}")
  set(KVATTN_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(KVATTN_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(KVATTN_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/kvattn.pc.in ${PROJECT_BINARY_DIR}/kvattn.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kvattn.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
