# The installed package (`cmake --install build --prefix PREFIX`): the
# `tessera` command in PREFIX/bin, the libraries (one static library per
# module) in PREFIX/lib, their headers in PREFIX/include/tessera (included
# as in the checkout: "train/engine.h"), and a CMake package, so a program
# of its own finds them with
#
#   find_package(Tessera 0.1 REQUIRED)   # -DCMAKE_PREFIX_PATH=PREFIX
#   target_link_libraries(my_service PRIVATE Tessera::tessera)
#
# Tessera::tessera is every library; Tessera::train (tessera::Engine,
# tessera::Train), Tessera::cluster (tessera::cluster::Client), ... are the
# modules. The libraries are built for the build machine's CPU
# (TESSERA_NATIVE): configure with -DTESSERA_NATIVE=OFF to install for
# other machines. The third-party libraries are Debian's, found again by
# TesseraConfig.cmake.
include(CMakePackageConfigHelpers)

# Tessera::tessera: every library, the one name an embedding program links
# (DESIGN §1's "libtessera").
add_library(tessera_all INTERFACE)
set_target_properties(tessera_all PROPERTIES EXPORT_NAME tessera)
target_link_libraries(tessera_all INTERFACE tessera_cluster_engine tessera_cluster tessera_train)
add_library(Tessera::tessera ALIAS tessera_all)

function(tessera_install_package)
  if(TESSERA_CUDA_EMULATOR)
    # The emulator stands in for CUDA in tests: nothing to install.
    return()
  endif()
  get_property(libraries GLOBAL PROPERTY TESSERA_EXPORTED_LIBRARIES)
  install(TARGETS ${libraries} tessera_all
    EXPORT TesseraTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tessera)
  install(EXPORT TesseraTargets
    NAMESPACE Tessera::
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera)
  # Every module's headers (their .cc files and tests stay behind), and the
  # protobuf headers generated in the build tree.
  foreach(dir core ops graph nn comm actors scheduler models data train cluster)
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}
      DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tessera
      FILES_MATCHING PATTERN "*.h")
  endforeach()
  install(DIRECTORY ${CMAKE_BINARY_DIR}/comm/proto/
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tessera/comm/proto
    FILES_MATCHING PATTERN "*.pb.h")
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/TesseraConfig.cmake.in
    ${CMAKE_BINARY_DIR}/TesseraConfig.cmake
    INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera)
  write_basic_package_version_file(${CMAKE_BINARY_DIR}/TesseraConfigVersion.cmake
    COMPATIBILITY SameMinorVersion)
  install(FILES ${CMAKE_BINARY_DIR}/TesseraConfig.cmake ${CMAKE_BINARY_DIR}/TesseraConfigVersion.cmake
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera)
endfunction()
