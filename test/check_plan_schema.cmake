# Fails when the plan schema (runtime/plan/plan.fbs.in with the opcodes of
# kernels/common/op_table.def, as the build generates it) changed without a new
# plan format version:
# the schema's hash (comments and whitespace aside) must be the one that
# runtime/plan/schema-versions.txt lists for plan_format.h's kFormatVersion,
# and every version there has a schema of its own. Changing the schema means
# bumping kFormatVersion and adding a line (never editing one).
#   cmake -DSOURCE_DIR=<repo> -P check_plan_schema.cmake
cmake_minimum_required(VERSION 3.20)
include("${SOURCE_DIR}/runtime/plan/plan_schema.cmake")
ptc_plan_schema(schema "${SOURCE_DIR}")
string(REGEX REPLACE "//[^\n]*" "" schema "${schema}")
string(REGEX REPLACE "[ \t\r\n]+" " " schema "${schema}")
string(STRIP "${schema}" schema)
string(SHA256 hash "${schema}")

file(STRINGS "${SOURCE_DIR}/runtime/plan/plan_format.h" line REGEX "kFormatVersion = [0-9]+")
string(REGEX MATCH "kFormatVersion = ([0-9]+)" unused "${line}")
set(version "${CMAKE_MATCH_1}")

file(STRINGS "${SOURCE_DIR}/runtime/plan/schema-versions.txt" entries REGEX "^[0-9]+ [0-9a-f]+$")
set(previous 0)
set(seen "")
set(listed "")
foreach(entry IN LISTS entries)
  string(REPLACE " " ";" parts "${entry}")
  list(GET parts 0 v)
  list(GET parts 1 h)
  if(NOT v GREATER previous)
    message(FATAL_ERROR "schema-versions.txt: version ${v} does not follow ${previous}")
  endif()
  if(h IN_LIST seen)
    message(FATAL_ERROR "schema-versions.txt: version ${v} repeats an earlier schema")
  endif()
  list(APPEND seen "${h}")
  set(previous ${v})
  if(v EQUAL version)
    set(listed "${h}")
  endif()
endforeach()
if(NOT previous EQUAL version)
  message(FATAL_ERROR "plan_format.h says kFormatVersion = ${version}, but the last version in "
                      "schema-versions.txt is ${previous}")
endif()
if(NOT listed STREQUAL hash)
  message(FATAL_ERROR "the plan schema (plan.fbs.in, op_table.def's opcodes) changed (schema hash ${hash}) without a new plan "
                      "format version: bump kFormatVersion in plan_format.h, say what changed "
                      "there, and add the line '<version> ${hash}' to schema-versions.txt")
endif()
message(STATUS "plan schema matches format version ${version}")
