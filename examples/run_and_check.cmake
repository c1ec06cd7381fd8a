# Runs EXE (with ARGS, '|'-separated) and fails unless it exits 0 and its output contains each
# of EXPECT's '|'-separated strings. ctest's PASS_REGULAR_EXPRESSION would ignore the exit
# code, so a crash after the expected line would pass; this checks both.
# cmake -DEXE=path [-DARGS="a|b"] -DEXPECT="x|y" -P run_and_check.cmake
string(REPLACE "|" ";" args "${ARGS}")
string(REPLACE "|" ";" expect "${EXPECT}")
execute_process(COMMAND ${EXE} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "${EXE} exited with ${rc}")
endif()
foreach(e IN LISTS expect)
  string(FIND "${out}" "${e}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${EXE}: the output lacks '${e}'")
  endif()
endforeach()
