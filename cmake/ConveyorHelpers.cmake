# conveyor_cc_library / conveyor_cc_test / conveyor_cc_binary: one place that
# sets warnings and include paths, so module CMakeLists stay declarative
# (a library, then its test right after it).

# .cu files get -Wall -Wextra for their host half but not -Wpedantic: nvcc's
# generated code uses GCC-style #line directives, which -Wpedantic flags.
# CONVEYOR_THREAD_SAFETY (clang only, checked in the top-level CMakeLists.txt)
# makes clang check the ABSL_GUARDED_BY / ABSL_*_LOCKS_* annotations and fail
# the build on a violation, whatever CONVEYOR_WERROR says: an unchecked
# annotation is only a comment. The beta checks (ABSL_ACQUIRED_BEFORE order,
# among others) are clean too, so they are kept that way.
# scripts/check-thread-safety builds this way.
function(conveyor_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${CONVEYOR_WERROR}>>:-Werror>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${CONVEYOR_THREAD_SAFETY}>>:-Wthread-safety -Wthread-safety-beta -Werror=thread-safety -Werror=thread-safety-beta>
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

# conveyor_cc_test(NAME name SRCS ... [DEPS ...] [LABELS ...])
# Each test case is labelled with the binary's name and LABELS. `numerics`
# marks tests that compare numbers with a reference across summation orders
# (other backends, devices, stage cuts, PyTorch): .ci/run runs them again
# under other OpenBLAS kernels, since a verdict that depends on the kernel
# is a defect (docs/development.md).
function(conveyor_cc_test)
  if(NOT CONVEYOR_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  conveyor_set_warnings(${ARG_NAME})
  gtest_discover_tests(${ARG_NAME} DISCOVERY_TIMEOUT 60
                       TEST_LIST ${ARG_NAME}_TESTS
                       PROPERTIES LABELS "${ARG_NAME}")
  if(ARG_LABELS)
    # gtest_discover_tests cannot pass a list-valued property (each item
    # becomes an argument of its own), so the labels are set by a file that
    # ctest includes after the discovered tests.
    set(labels_file "${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}_labels.cmake")
    file(WRITE "${labels_file}"
         "set_tests_properties(\${${ARG_NAME}_TESTS} PROPERTIES LABELS "
         "[[${ARG_NAME};${ARG_LABELS}]])\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${labels_file}")
  endif()
endfunction()

# conveyor_cc_binary(NAME name SRCS ... [DEPS ...])
function(conveyor_cc_binary)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
  conveyor_set_warnings(${ARG_NAME})
endfunction()
