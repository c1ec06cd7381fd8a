# Data-parallel weft-train gives the bits of one process with the same shards: runs
# 'weft-run -n RANKS weft-train ARGS --strategy multiworker --shards SHARDS --save a' and
# 'weft-train ARGS --strategy multiworker --shards SHARDS --save b' (one rank), and fails
# unless both exit 0 and the two checkpoints (weights and optimizer state) are equal bytes.
# With -DRANKS_ARGS="--strategy|pipeline|..." the ranks run those options instead (a pipeline
# trains the bits of multiworker with as many shards as micro-batches on one rank).
# With -DDEVICES=D instead of RUN and RANKS, the first run is one process,
# 'weft-train ARGS --strategy mirrored --devices D --shards SHARDS --save a' (Mirrored).
# cmake -DRUN=weft-run -DEXE=weft-train -DRANKS=N -DSHARDS=S -DARGS="a|b" -DTAG=name -P dp_check.cmake
string(REPLACE "|" ";" args "${ARGS}")
set(a ${TAG}-ranks.safetensors)
set(b ${TAG}-one.safetensors)
file(REMOVE ${a} ${b})
if(DEFINED DEVICES)
  set(first ${EXE} ${args} --strategy mirrored --devices ${DEVICES} --shards ${SHARDS})
  set(what "${DEVICES} devices")
elseif(DEFINED RANKS_ARGS)
  string(REPLACE "|" ";" ranks_args "${RANKS_ARGS}")
  set(first ${RUN} -n ${RANKS} ${EXE} ${args} ${ranks_args})
  set(what "${RANKS} ranks (${ranks_args})")
else()
  set(first ${RUN} -n ${RANKS} ${EXE} ${args} --strategy multiworker --shards ${SHARDS})
  set(what "${RANKS} ranks")
endif()
execute_process(COMMAND ${first} --save ${a}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "${what} exited with ${rc}")
endif()
execute_process(COMMAND ${EXE} ${args} --strategy multiworker --shards ${SHARDS} --save ${b}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "one rank exited with ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${a} ${b} RESULT_VARIABLE same)
if(NOT same EQUAL 0)
  message(FATAL_ERROR "${what} x ${SHARDS} shards saved other bytes than 1 rank x ${SHARDS} shards")
endif()
message("${what} and 1 rank, ${SHARDS} shards: the same checkpoint bytes")
