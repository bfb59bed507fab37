# Third-party dependencies, all from Debian 12's packages (scripts/install_deps.sh).
find_package(absl REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
# Debian's dnnl-config.cmake insists on OpenCL headers (its GPU runtime); the
# CPU GEMM needs only the library and its C headers, so find those directly.
find_path(DNNL_INCLUDE_DIR dnnl.h REQUIRED)
find_library(DNNL_LIBRARY dnnl REQUIRED)
add_library(tessera_dnnl INTERFACE)
tessera_exported_library(tessera_dnnl)
target_include_directories(tessera_dnnl SYSTEM INTERFACE ${DNNL_INCLUDE_DIR})
target_link_libraries(tessera_dnnl INTERFACE ${DNNL_LIBRARY})
# xxHash (libxxhash-dev) for checkpoint checksums (core/checksum.h), inlined
# from its header: nothing to link, no run-time package.
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_package(OpenMP REQUIRED)
find_package(Threads REQUIRED)
# Unicode for the tokenizers (data/): PCRE2 runs GPT-2's pre-tokenizer
# pattern (\p{L}, \p{N}, lookahead); ICU gives BERT's normalisation and
# character classes.
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
find_package(ICU REQUIRED COMPONENTS uc i18n)
# Boost.Asio for the actor bus and the master's /metrics endpoint
# (header-only; Boost.System is header-only since 1.69).
find_package(Boost 1.74 REQUIRED)
# The control plane (cluster/): gRPC's own CMake config.
find_package(gRPC CONFIG REQUIRED)
# OpenSSL's libcrypto (the one gRPC links on Debian) reads TLS material
# before gRPC does, so what gRPC cannot use is a clear error
# (cluster/tls_material.h).
find_package(OpenSSL 3 REQUIRED)
if(TESSERA_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(TESSERA_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
# gloo (libgloo-dev) ships neither a CMake config nor a pkg-config file. Its
# headers warn under -Wall -Wextra, so they come in as SYSTEM.
find_path(GLOO_INCLUDE_DIR gloo/context.h REQUIRED)
find_library(GLOO_LIBRARY gloo REQUIRED)
add_library(tessera_gloo INTERFACE)
tessera_exported_library(tessera_gloo)
target_include_directories(tessera_gloo SYSTEM INTERFACE ${GLOO_INCLUDE_DIR})
target_link_libraries(tessera_gloo INTERFACE ${GLOO_LIBRARY} Threads::Threads)
