# Writes OUT (a header defining SPW_VERSION) from VERSION and `git describe` of SOURCE_DIR, run at every
# build (src/cli/CMakeLists.txt), so `spillway --version` names the commit that was built, not the one
# that was configured. OUT is rewritten only when the text changes, so nothing recompiles otherwise.
set(text "${VERSION}")
if(GIT_EXECUTABLE)
  execute_process(COMMAND ${GIT_EXECUTABLE} describe --tags --always --dirty WORKING_DIRECTORY ${SOURCE_DIR}
                  OUTPUT_VARIABLE describe OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE result)
  if(result EQUAL 0 AND describe)
    set(text "${VERSION} (${describe})")
  endif()
endif()
file(WRITE "${OUT}.tmp" "#pragma once\n#define SPW_VERSION \"${text}\"\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
