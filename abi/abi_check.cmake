# abi_check.cmake: the ABI check of libmoetune.so. Compares the symbols the
# library exports (`nm -D --defined-only`) with the committed list
# abi/libmoetune.symbols, and fails, saying what differs, when they are not
# the same or when a name outside the API (not moetune_*) is exported.
# Run after every link of the library (a post-build step) and as the ctest
# test test_api_abi:
#   cmake -DNM=nm -DLIB=libmoetune.so -DSYMBOLS=abi/libmoetune.symbols -P abi/abi_check.cmake
foreach(var NM LIB SYMBOLS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "abi_check: -D${var}=... is required")
  endif()
endforeach()
execute_process(COMMAND ${NM} -D --defined-only ${LIB}
                OUTPUT_VARIABLE nm_out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "abi_check: ${NM} -D --defined-only ${LIB} failed (${rc})")
endif()
string(REPLACE "\n" ";" lines "${nm_out}")
set(exported "")
foreach(line ${lines})
  # "0000000000012340 T moetune_version"; a version suffix (@@V) is cut off.
  if(line MATCHES "^[0-9a-fA-F]* *[A-Za-z] ([^ @]+)")
    list(APPEND exported "${CMAKE_MATCH_1}")
  endif()
endforeach()
list(SORT exported)
list(REMOVE_DUPLICATES exported)
file(STRINGS ${SYMBOLS} committed REGEX "^[^#]")
list(SORT committed)
set(outside "")
foreach(s ${exported})
  if(NOT s MATCHES "^moetune_")
    list(APPEND outside ${s})
  endif()
endforeach()
set(added ${exported})
if(committed)
  list(REMOVE_ITEM added ${committed})
endif()
set(removed ${committed})
if(exported)
  list(REMOVE_ITEM removed ${exported})
endif()
if(outside OR added OR removed)
  string(REPLACE ";" " " outside "${outside}")
  string(REPLACE ";" " " added "${added}")
  string(REPLACE ";" " " removed "${removed}")
  message(FATAL_ERROR "ABI check failed for ${LIB}:\n"
    "  exported outside the API (not moetune_*): ${outside}\n"
    "  exported but not in ${SYMBOLS}: ${added}\n"
    "  in ${SYMBOLS} but not exported: ${removed}\n"
    "The exported symbols are the ABI. If the change is intended, update "
    "${SYMBOLS} in the same commit (one name per line, sorted: "
    "nm -D --defined-only ${LIB} | awk '{print $3}' | sort), and raise "
    "MOETUNE_API_VERSION in include/moetune/moetune.h; a removed or changed "
    "symbol also needs a new soname.")
endif()
