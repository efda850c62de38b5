# ONNX Runtime's C/C++ API headers. The onnxruntime wheels do not ship them and they are never committed,
# so they are fetched at configure time into the build tree (once; later configures reuse them).
#
#   ONNXRUNTIME_INCLUDE_DIR   a folder holding onnxruntime_cxx_api.h; when set, nothing is fetched.
#   ONNXFUSE_ORT_HEADERS_NPM  the npm package that carries the official headers (API 29, loads into
#                             onnxruntime 1.29 and newer); `npm pack` fetches it, npm's cache keeps it.
#
# Defines ONNXRUNTIME_INCLUDE_DIR (cache) and ONNXRUNTIME_API_VERSION.

set(ONNXRUNTIME_INCLUDE_DIR "" CACHE PATH "Folder holding onnxruntime_c_api.h/onnxruntime_cxx_api.h (empty: fetch)")
set(ONNXFUSE_ORT_HEADERS_NPM "com.github.asus4.onnxruntime@0.4.9" CACHE STRING
    "npm package whose tarball carries ONNX Runtime's C/C++ headers")

set(_ort_fix "Set -DONNXRUNTIME_INCLUDE_DIR=<folder with onnxruntime_cxx_api.h> (e.g. the include/ folder of an \
onnxruntime release tarball), or make the npm registry reachable.")

if(NOT ONNXRUNTIME_INCLUDE_DIR)
  set(_ort_root "${CMAKE_BINARY_DIR}/_deps/onnxruntime-headers")
  set(_ort_include "${_ort_root}/include")
  if(NOT EXISTS "${_ort_include}/onnxruntime_cxx_api.h")
    find_program(ONNXFUSE_NPM NAMES npm)
    if(NOT ONNXFUSE_NPM)
      message(FATAL_ERROR "ONNX Runtime headers: npm is not installed, so ${ONNXFUSE_ORT_HEADERS_NPM} cannot be "
                          "fetched. ${_ort_fix}")
    endif()
    set(_ort_download "${_ort_root}/download")
    file(REMOVE_RECURSE "${_ort_download}")
    file(MAKE_DIRECTORY "${_ort_download}")
    message(STATUS "Fetching ONNX Runtime headers: npm pack ${ONNXFUSE_ORT_HEADERS_NPM}")
    execute_process(
      COMMAND "${ONNXFUSE_NPM}" pack --silent "${ONNXFUSE_ORT_HEADERS_NPM}"
      WORKING_DIRECTORY "${_ort_download}"
      RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
    file(GLOB _tgz "${_ort_download}/*.tgz")
    if(NOT _rc EQUAL 0 OR NOT _tgz)
      string(STRIP "${_err}" _err)
      message(FATAL_ERROR "ONNX Runtime headers: `npm pack ${ONNXFUSE_ORT_HEADERS_NPM}` failed (${_err}). ${_ort_fix}")
    endif()
    list(GET _tgz 0 _tgz)
    # Only the header folders: the tarball is mostly prebuilt iOS/macOS binaries.
    file(ARCHIVE_EXTRACT INPUT "${_tgz}" DESTINATION "${_ort_download}/x"
         PATTERNS "package/Plugins/iOS~/onnxruntime.xcframework/*/onnxruntime.framework/Headers/*")
    file(GLOB_RECURSE _api "${_ort_download}/x/onnxruntime_cxx_api.h")
    if(NOT _api)
      message(FATAL_ERROR "ONNX Runtime headers: ${_tgz} holds no onnxruntime.framework/Headers/. ${_ort_fix}")
    endif()
    list(GET _api 0 _api)
    get_filename_component(_headers "${_api}" DIRECTORY)
    file(GLOB _header_files "${_headers}/*.h")
    file(MAKE_DIRECTORY "${_ort_include}")
    file(COPY ${_header_files} DESTINATION "${_ort_include}")
    file(REMOVE_RECURSE "${_ort_download}")
  endif()
  set(ONNXRUNTIME_INCLUDE_DIR "${_ort_include}" CACHE PATH
      "Folder holding onnxruntime_c_api.h/onnxruntime_cxx_api.h (empty: fetch)" FORCE)
endif()

foreach(_h onnxruntime_c_api.h onnxruntime_cxx_api.h onnxruntime_cxx_inline.h onnxruntime_float16.h)
  if(NOT EXISTS "${ONNXRUNTIME_INCLUDE_DIR}/${_h}")
    message(FATAL_ERROR "ONNXRUNTIME_INCLUDE_DIR=${ONNXRUNTIME_INCLUDE_DIR} has no ${_h}. ${_ort_fix}")
  endif()
endforeach()

file(STRINGS "${ONNXRUNTIME_INCLUDE_DIR}/onnxruntime_c_api.h" _api_line REGEX "^#define ORT_API_VERSION [0-9]+")
string(REGEX MATCH "[0-9]+" ONNXRUNTIME_API_VERSION "${_api_line}")
# KernelContext_ParallelFor (the CPU kernel's threading) arrived in API 17.
if(NOT ONNXRUNTIME_API_VERSION OR ONNXRUNTIME_API_VERSION LESS 17)
  message(FATAL_ERROR "ONNX Runtime headers in ${ONNXRUNTIME_INCLUDE_DIR} are API '${ONNXRUNTIME_API_VERSION}'; "
                      "onnxfuse needs API 17 or newer. ${_ort_fix}")
endif()
message(STATUS "ONNX Runtime headers: ${ONNXRUNTIME_INCLUDE_DIR} (API ${ONNXRUNTIME_API_VERSION})")
