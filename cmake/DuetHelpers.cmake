# duet_library(NAME name ALIAS ns::alias SRCS ... DEPS ...)
# One static library per folder, with a duet:: alias and the project warnings.
function(duet_library)
  cmake_parse_arguments(D "" "NAME;ALIAS" "SRCS;DEPS" ${ARGN})
  add_library(${D_NAME} STATIC ${D_SRCS})
  add_library(${D_ALIAS} ALIAS ${D_NAME})
  target_include_directories(${D_NAME} PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_options(${D_NAME} PRIVATE ${DUET_WARNINGS})
  target_link_libraries(${D_NAME} PUBLIC ${D_DEPS})
endfunction()

# Sets the ctest LABELS of every test gtest_discover_tests found in `target`.
# gtest_discover_tests' own PROPERTIES cannot carry a list: "k8s;integration"
# reaches set_tests_properties as LABELS k8s plus a stray argument, so only
# the first label stuck (and a TIMEOUT after it was lost). This runs after the
# discovered tests are included.
function(duet_test_labels target labels)
  set(f "${CMAKE_CURRENT_BINARY_DIR}/${target}_labels.cmake")
  file(WRITE "${f}" "if(DEFINED ${target}_TESTS)\n"
                    "  set_tests_properties(\${${target}_TESTS} PROPERTIES LABELS \"${labels}\")\n"
                    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${f}")
endfunction()

# duet_test(NAME name SRCS ... DEPS ... [LABELS ...])
function(duet_test)
  cmake_parse_arguments(D "" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${D_NAME} ${D_SRCS})
  target_compile_options(${D_NAME} PRIVATE ${DUET_WARNINGS})
  target_link_libraries(${D_NAME} PRIVATE ${D_DEPS} GTest::gmock GTest::gtest_main)
  gtest_discover_tests(${D_NAME} DISCOVERY_TIMEOUT 60)
  if(D_LABELS)
    duet_test_labels(${D_NAME} "${D_LABELS}")
  else()
    duet_test_labels(${D_NAME} unit)
  endif()
endfunction()
