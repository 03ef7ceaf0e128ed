# cmake -DCONVEYORCTL=path -DOUTPUT_DIR=dir -P ConveyorCompletion.cmake
# Writes conveyorctl's bash completion to OUTPUT_DIR/conveyorctl and its zsh
# completion to OUTPUT_DIR/_conveyorctl (the names bash-completion and zsh
# look up), as `conveyorctl completion SHELL` prints them. Run at build time
# by cmake/ConveyorInstall.cmake; a script rather than a shell redirection so
# that a failing conveyorctl fails the build instead of installing an empty
# file.
foreach(var CONVEYORCTL OUTPUT_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "ConveyorCompletion.cmake: -D${var}=... is required")
  endif()
endforeach()
file(MAKE_DIRECTORY "${OUTPUT_DIR}")
foreach(shell bash zsh)
  if(shell STREQUAL "bash")
    set(out "${OUTPUT_DIR}/conveyorctl")
  else()
    set(out "${OUTPUT_DIR}/_conveyorctl")
  endif()
  execute_process(COMMAND "${CONVEYORCTL}" completion ${shell}
                  OUTPUT_FILE "${out}.tmp"
                  RESULT_VARIABLE rc)
  file(SIZE "${out}.tmp" size)
  if(NOT rc EQUAL 0 OR size EQUAL 0)
    file(REMOVE "${out}.tmp")
    message(FATAL_ERROR "`${CONVEYORCTL} completion ${shell}` failed (${rc})")
  endif()
  file(RENAME "${out}.tmp" "${out}")
endforeach()
