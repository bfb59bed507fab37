# Per-target settings for Tessera's own targets. Global CMAKE_CXX_FLAGS are
# never touched: everything goes through tessera_target_options().

# tessera_target_options(TARGET [PCH tessera_pch|tessera_test_pch|OWN|NONE] [TEST])
# PCH: which precompiled header the target reuses (default tessera_pch; OWN:
# the same headers compiled for this target alone, for a target whose flags
# differ, e.g. -fopenmp). TEST: a test's own code: compiled at -O1 in
# optimised builds and, under TESSERA_SANITIZE, without instrumentation of
# its own (it links the sanitizers' runtime, and the code it tests is
# instrumented): the sanitizers check Tessera, not the assertions, and
# instrumenting the tests' code doubled their compile time.
function(tessera_target_options target)
  cmake_parse_arguments(ARG "TEST" "PCH" "" ${ARGN})
  if(NOT ARG_PCH)
    set(ARG_PCH tessera_pch)
  endif()
  if(TESSERA_PCH AND ARG_PCH STREQUAL "OWN")
    get_property(headers GLOBAL PROPERTY TESSERA_PCH_HEADERS)
    target_precompile_headers(${target} PRIVATE ${headers})
  elseif(TESSERA_PCH AND NOT ARG_PCH STREQUAL "NONE")
    target_precompile_headers(${target} REUSE_FROM ${ARG_PCH})
  endif()
  # -std=c++20, not gnu++20, whatever the project around Tessera sets (a
  # program adding Tessera with add_subdirectory keeps CMake's default,
  # extensions on): the precompiled header is only used under the dialect
  # it was built with.
  set_target_properties(${target} PROPERTIES CXX_EXTENSIONS OFF)
  # Every target compiles with -pthread (gRPC's targets ask for it): one
  # set of predefined macros (_REENTRANT), so the shared header stays valid.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-pthread>)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unused-parameter>)
  # Headers are included from the checkout's root ("core/status.h"); an
  # installed Tessera has them under PREFIX/include/tessera
  # (cmake/TesseraInstall.cmake).
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/tessera>)
  # errno is never read; without this GCC keeps sqrt scalar (a libm call on
  # negative inputs) and loops using it do not vectorise.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fno-math-errno>)
  if(TESSERA_NATIVE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native -mprefer-vector-width=512>)
  endif()
  if(TESSERA_SANITIZE)
    if(NOT ARG_TEST)
      target_compile_options(${target} PRIVATE
        $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
    endif()
    target_link_options(${target} PUBLIC -fsanitize=address,undefined)
  endif()
  if(ARG_TEST AND CMAKE_BUILD_TYPE MATCHES "^(Release|RelWithDebInfo|MinSizeRel)$")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O1>)
  endif()
endfunction()

# tessera_checkout_paths(TARGET): the target knows the checkout's path
# (TESSERA_SOURCE_DIR; the tests add TESSERA_BINARY and the like). GCC 12
# warns falsely about std::string concatenations of a string literal (its
# bugs 105329, 105651), and whether it does depends on the literal's
# length: a test that built in /work/main failed to build in
# /check/work/main. So a target with the checkout's paths in literals is
# built without those three warnings; the library's literals do not depend
# on where it is built, and keep them.
function(tessera_checkout_paths target)
  target_compile_definitions(${target} PRIVATE TESSERA_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wno-array-bounds -Wno-stringop-overflow -Wno-stringop-overread -Wno-restrict>)
  endif()
endfunction()

# tessera_library(NAME SOURCES a.cc b.cc DEPS x y PUBLIC_DEPS z [PCH ...] [HOT])
# HOT: the library's loops are what a run spends its time in (kernels,
# reductions): built at the build type's level (-O3 in Release). Others are
# built at -O2 in optimised builds, which compiles faster and runs their
# control code as fast.
function(tessera_library name)
  cmake_parse_arguments(ARG "HOT" "PCH" "SOURCES;DEPS;PUBLIC_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  if(ARG_PCH)
    tessera_target_options(${name} PCH ${ARG_PCH})
  else()
    tessera_target_options(${name})
  endif()
  if(NOT ARG_HOT AND CMAKE_BUILD_TYPE MATCHES "^(Release|RelWithDebInfo)$")
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O2>)
  endif()
  target_link_libraries(${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_DEPS})
  tessera_exported_library(${name})
endfunction()

# tessera_exported_library(NAME): NAME (tessera_X) is part of the installed
# package as Tessera::X, and has that name in this build too, so a program
# links the same names in Tessera's tree and against an installed Tessera.
function(tessera_exported_library name)
  string(REGEX REPLACE "^tessera_" "" short ${name})
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${short})
  add_library(Tessera::${short} ALIAS ${name})
  set_property(GLOBAL APPEND PROPERTY TESSERA_EXPORTED_LIBRARIES ${name})
endfunction()

# Precompiled headers (TESSERA_PCH): the third-party and standard headers
# nearly every translation unit parses (JSON, spdlog and fmt, Abseil's
# status types, protobuf's runtime, the standard library) cost several
# seconds of each compile. tessera_pch holds them, built once with the
# flags every Tessera target shares, and every target reuses it;
# tessera_test_pch adds GoogleTest and gMock for the tests (built as the
# tests are, at -O1 in optimised builds). Call after the dependencies are
# found.
function(tessera_add_pch_targets)
  if(NOT TESSERA_PCH)
    return()
  endif()
  set(common
    <algorithm> <atomic> <chrono> <cmath> <cstdint> <cstring> <filesystem> <fstream> <functional> <map>
    <memory> <mutex> <optional> <set> <sstream> <string> <string_view> <thread> <unordered_map> <utility> <vector>
    <absl/status/status.h> <absl/status/statusor.h> <absl/strings/str_cat.h>
    <nlohmann/json.hpp> <spdlog/spdlog.h> <fmt/format.h>
    <google/protobuf/message.h> <google/protobuf/repeated_field.h>)
  set_property(GLOBAL PROPERTY TESSERA_PCH_HEADERS ${common})
  file(WRITE ${CMAKE_BINARY_DIR}/tessera_pch.cc "// The translation unit tessera_pch's header is compiled for.\n")
  # What tessera_core (which every target links) passes on: the same
  # definitions, so the header is valid wherever it is reused.
  set(core_usage absl::status absl::statusor absl::strings absl::str_format absl::synchronization
      nlohmann_json::nlohmann_json spdlog::spdlog fmt::fmt Threads::Threads)
  add_library(tessera_pch OBJECT ${CMAKE_BINARY_DIR}/tessera_pch.cc)
  tessera_target_options(tessera_pch PCH NONE)
  target_link_libraries(tessera_pch PRIVATE ${core_usage})
  if(TESSERA_CUDA_CODE)
    target_compile_definitions(tessera_pch PRIVATE TESSERA_WITH_CUDA=1)
  endif()
  target_precompile_headers(tessera_pch PRIVATE ${common})
  if(TESSERA_BUILD_TESTS)
    add_library(tessera_test_pch OBJECT ${CMAKE_BINARY_DIR}/tessera_pch.cc)
    tessera_target_options(tessera_test_pch PCH NONE TEST)
    target_link_libraries(tessera_test_pch PRIVATE ${core_usage} GTest::gtest GTest::gmock)
    if(TESSERA_CUDA_CODE)
      target_compile_definitions(tessera_test_pch PRIVATE TESSERA_WITH_CUDA=1)
    endif()
    target_precompile_headers(tessera_test_pch PRIVATE ${common} <gtest/gtest.h> <gmock/gmock.h>)
  endif()
endfunction()
