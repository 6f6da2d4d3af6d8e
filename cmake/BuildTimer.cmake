# Script mode (cmake -P): a wall-clock timer across build steps.
#   cmake -DACTION=start -DSTAMP=<file> -P BuildTimer.cmake             records the time in <file>
#   cmake -DACTION=stop -DSTAMP=<file> -DWHAT=<what> -P BuildTimer.cmake  prints "flashcute: <what> built in N s"
string(TIMESTAMP _now "%s" UTC)
if(ACTION STREQUAL "start")
  file(WRITE "${STAMP}" "${_now}")
elseif(ACTION STREQUAL "stop" AND EXISTS "${STAMP}")
  file(READ "${STAMP}" _start)
  math(EXPR _elapsed "${_now} - ${_start}")
  message(STATUS "flashcute: ${WHAT} built in ${_elapsed} s")
endif()
