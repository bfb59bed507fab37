# Per-target settings for Tessera's own targets. Global CMAKE_CXX_FLAGS are
# never touched: everything goes through tessera_target_options().

function(tessera_target_options target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unused-parameter>)
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  # errno is never read; without this GCC keeps sqrt scalar (a libm call on
  # negative inputs) and loops using it do not vectorise.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fno-math-errno>)
  if(TESSERA_NATIVE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native -mprefer-vector-width=512>)
  endif()
  if(TESSERA_SANITIZE)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
    target_link_options(${target} PUBLIC -fsanitize=address,undefined)
  endif()
endfunction()

# tessera_library(NAME SOURCES a.cc b.cc DEPS x y PUBLIC_DEPS z)
function(tessera_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PUBLIC_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  tessera_target_options(${name})
  target_link_libraries(${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_DEPS})
endfunction()
