# conveyor_cc_library / conveyor_cc_test / conveyor_cc_binary: one place that
# sets warnings and include paths, so module CMakeLists stay declarative
# (a library, then its test right after it).

# .cu files get -Wall -Wextra for their host half but not -Wpedantic: nvcc's
# generated code uses GCC-style #line directives, which -Wpedantic flags.
function(conveyor_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${CONVEYOR_WERROR}>>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${CONVEYOR_WERROR}>>:-Werror=all-warnings -Xcompiler=-Werror>)
endfunction()

# conveyor_cc_library(NAME name SRCS ... [HDRS ...] [DEPS ...])
# Creates conveyor_<name> with the alias conveyor::<name>.
function(conveyor_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;HDRS;DEPS" ${ARGN})
  set(target conveyor_${ARG_NAME})
  if(ARG_SRCS)
    add_library(${target} STATIC ${ARG_SRCS} ${ARG_HDRS})
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${target} PUBLIC ${ARG_DEPS})
    conveyor_set_warnings(${target})
  else()
    add_library(${target} INTERFACE ${ARG_HDRS})
    target_include_directories(${target} INTERFACE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${target} INTERFACE ${ARG_DEPS})
  endif()
  add_library(conveyor::${ARG_NAME} ALIAS ${target})
endfunction()

# conveyor_cc_test(NAME name SRCS ... [DEPS ...])
function(conveyor_cc_test)
  if(NOT CONVEYOR_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  conveyor_set_warnings(${ARG_NAME})
  gtest_discover_tests(${ARG_NAME} DISCOVERY_TIMEOUT 60
                       PROPERTIES LABELS "${ARG_NAME}")
endfunction()

# conveyor_cc_binary(NAME name SRCS ... [DEPS ...])
function(conveyor_cc_binary)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
  conveyor_set_warnings(${ARG_NAME})
endfunction()
