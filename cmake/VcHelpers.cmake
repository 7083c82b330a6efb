# Small helpers in the manner of Abseil's CMake: each target names its own sources and dependencies.
#
#   vc_cc_library(NAME name SRCS a.cc b.cc [HDRS a.h] DEPS target...)
#   vc_cc_binary(NAME name SRCS main.cc DEPS target...)
#   vc_cc_test(NAME name SRCS a_test.cc DEPS target... [LABELS l...] [TIMEOUT s])
#   vc_cc_test_again(NAME name OF test ENV VAR=value... [TIMEOUT s])   the same binary, another setting
#
# Libraries are named vc_<name> with an alias vc::<name>; the repository root is the include root.

function(vc_cc_library)
  cmake_parse_arguments(VC "" "NAME" "SRCS;HDRS;DEPS" ${ARGN})
  set(target vc_${VC_NAME})
  if(VC_SRCS)
    add_library(${target} STATIC ${VC_SRCS} ${VC_HDRS})
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${target} PUBLIC ${VC_DEPS})
  else()
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
    target_link_libraries(${target} INTERFACE ${VC_DEPS})
  endif()
  add_library(vc::${VC_NAME} ALIAS ${target})
endfunction()

function(vc_cc_binary)
  cmake_parse_arguments(VC "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${VC_NAME} ${VC_SRCS})
  target_link_libraries(${VC_NAME} PRIVATE ${VC_DEPS})
endfunction()

function(vc_cc_test)
  cmake_parse_arguments(VC "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${VC_NAME} ${VC_SRCS})
  target_link_libraries(${VC_NAME} PRIVATE ${VC_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${VC_NAME} PRIVATE VC_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  add_test(NAME ${VC_NAME} COMMAND ${VC_NAME})
  vc_test_timeout(timeout "${VC_TIMEOUT}")
  set_tests_properties(${VC_NAME} PROPERTIES TIMEOUT ${timeout} LABELS "${VC_LABELS}")
endfunction()

# A test's time limit: `given` seconds or 300, four times as long under the sanitizers.
function(vc_test_timeout out given)
  if(NOT given)
    set(given 300)
  endif()
  if(VC_SANITIZE)
    math(EXPR given "${given} * 4")
  endif()
  set(${out} ${given} PARENT_SCOPE)
endfunction()

function(vc_cc_test_again)
  cmake_parse_arguments(VC "" "NAME;OF;TIMEOUT" "ENV" ${ARGN})
  add_test(NAME ${VC_NAME} COMMAND ${VC_OF})
  vc_test_timeout(timeout "${VC_TIMEOUT}")
  set_tests_properties(${VC_NAME} PROPERTIES TIMEOUT ${timeout} ENVIRONMENT "${VC_ENV}")
endfunction()
