# Runs EXE (with ARGS, '|'-separated) and fails unless it exits 0 and its output contains each
# of EXPECT's '|'-separated strings. ctest's PASS_REGULAR_EXPRESSION would ignore the exit
# code, so a crash after the expected line would pass; this checks both.
# With -DEXIT=N it must exit with N instead (a program's clear failure on bad input), and
# EXPECT is searched in stdout and stderr together.
# cmake -DEXE=path [-DARGS="a|b"] -DEXPECT="x|y" [-DEXIT=1] -P run_and_check.cmake
string(REPLACE "|" ";" args "${ARGS}")
string(REPLACE "|" ";" expect "${EXPECT}")
execute_process(COMMAND ${EXE} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT DEFINED EXIT)
  set(EXIT 0)
else()
  set(out "${out}${err}")
endif()
if(NOT rc STREQUAL "${EXIT}")
  message(FATAL_ERROR "${EXE} exited with ${rc}, expected ${EXIT}")
endif()
foreach(e IN LISTS expect)
  string(FIND "${out}" "${e}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${EXE}: the output lacks '${e}'")
  endif()
endforeach()
