# cuBLASLt's headers, for the CUDA kernel's fallback path (src/cuda/dispatch/cublaslt_gemm_bias.cc). Included from
# cmake/cuda.cmake after find_package(CUDAToolkit).
#
# Headers only: the library is never linked. The op library loads libcublasLt.so.<CUDA major> with dlopen at
# run time (ORT's CUDA provider has loaded it into the process already), so the library still loads, and its
# fused path still runs, on machines without cuBLAS (CI has neither a GPU nor the cuBLAS libraries).
#
# The CUDA toolkits on these machines ship without cuBLAS, so the headers come from PyPI's cuBLAS wheel
# (nvidia-cublas for CUDA 13, nvidia-cublas-cu12 for CUDA 12), fetched once into the build tree and reused by
# every later configure. Never vendored.
#
# Knobs (cache variables):
#   CUBLAS_INCLUDE_DIR        a folder holding cublasLt.h (a CUDA toolkit's include/, say); when set, nothing is
#                             fetched
#   ONNXFUSE_CUBLAS_VERSION   the cuBLAS wheel's version (its major must be the toolkit's)
#
# Defines ONNXFUSE_CUBLAS_INCLUDE_DIR (what the sources are compiled against) and ONNXFUSE_CUDA_MAJOR.

set(CUBLAS_INCLUDE_DIR "" CACHE PATH "Folder holding cublasLt.h (empty: fetch the headers of PyPI's cuBLAS wheel)")

string(REGEX MATCH "^[0-9]+" ONNXFUSE_CUDA_MAJOR "${CUDAToolkit_VERSION}")
# The wheel that carries the headers for this toolkit, and where in it they are.
if(ONNXFUSE_CUDA_MAJOR EQUAL 12)
  set(_cublas_package "nvidia-cublas-cu12")
  set(_cublas_default_version "12.9.1.4")
  set(_cublas_wheel_include "nvidia/cublas/include")
else()
  set(_cublas_package "nvidia-cublas")
  set(_cublas_default_version "13.1.1.3")
  set(_cublas_wheel_include "nvidia/cu${ONNXFUSE_CUDA_MAJOR}/include")
endif()
set(ONNXFUSE_CUBLAS_VERSION "${_cublas_default_version}" CACHE STRING
    "Version of PyPI's ${_cublas_package} whose headers are fetched (major = the CUDA toolkit's)")

set(_cublas_fix "Point -DCUBLAS_INCLUDE_DIR=<folder with cublasLt.h> at a CUDA toolkit's include/ (or an \
extracted ${_cublas_package} wheel's ${_cublas_wheel_include}), or configure with -DONNXFUSE_CUDA=OFF.")

if(CUBLAS_INCLUDE_DIR)
  set(ONNXFUSE_CUBLAS_INCLUDE_DIR "${CUBLAS_INCLUDE_DIR}")
else()
  string(REGEX MATCH "^[0-9]+" _cublas_major "${ONNXFUSE_CUBLAS_VERSION}")
  if(NOT _cublas_major EQUAL ONNXFUSE_CUDA_MAJOR)
    message(FATAL_ERROR "ONNXFUSE_CUBLAS_VERSION=${ONNXFUSE_CUBLAS_VERSION} is cuBLAS ${_cublas_major}, but the "
                        "CUDA toolkit is ${CUDAToolkit_VERSION}: the run-time library is libcublasLt.so."
                        "${ONNXFUSE_CUDA_MAJOR}, so the headers must be cuBLAS ${ONNXFUSE_CUDA_MAJOR}.x")
  endif()
  set(_cublas_root "${CMAKE_BINARY_DIR}/_deps/${_cublas_package}-${ONNXFUSE_CUBLAS_VERSION}")
  set(ONNXFUSE_CUBLAS_INCLUDE_DIR "${_cublas_root}/${_cublas_wheel_include}")
  if(NOT EXISTS "${ONNXFUSE_CUBLAS_INCLUDE_DIR}/cublasLt.h")
    message(STATUS "Fetching cuBLAS headers: pip download ${_cublas_package}==${ONNXFUSE_CUBLAS_VERSION}")
    set(_cublas_download "${_cublas_root}/wheel")
    file(REMOVE_RECURSE "${_cublas_download}")
    file(MAKE_DIRECTORY "${_cublas_download}")
    execute_process(
      # As for CUTLASS (cuda.cmake): pip is a build requirement, so this works under pip's build isolation.
      COMMAND "${ONNXFUSE_PYTHON}" -m pip download --quiet --no-deps --only-binary=:all: --disable-pip-version-check
              --dest "${_cublas_download}" "${_cublas_package}==${ONNXFUSE_CUBLAS_VERSION}"
      RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
    string(REPLACE "-" "_" _cublas_wheel_stem "${_cublas_package}")
    file(GLOB _wheel "${_cublas_download}/${_cublas_wheel_stem}-${ONNXFUSE_CUBLAS_VERSION}-*.whl")
    if(NOT _rc EQUAL 0 OR NOT _wheel)
      string(STRIP "${_err}" _err)
      message(FATAL_ERROR "Could not fetch ${_cublas_package}==${ONNXFUSE_CUBLAS_VERSION} from PyPI for the cuBLAS "
                          "headers (${_err}). ${_cublas_fix}")
    endif()
    # Only the header tree (a few hundred KB): the wheel's libraries (~600 MB) are neither kept nor linked.
    list(GET _wheel 0 _wheel)
    file(ARCHIVE_EXTRACT INPUT "${_wheel}" DESTINATION "${_cublas_root}" PATTERNS "${_cublas_wheel_include}/*")
    file(REMOVE_RECURSE "${_cublas_download}")
    if(NOT EXISTS "${ONNXFUSE_CUBLAS_INCLUDE_DIR}/cublasLt.h")
      message(FATAL_ERROR "${_wheel} has no ${_cublas_wheel_include}/cublasLt.h. ${_cublas_fix}")
    endif()
  endif()
endif()
if(NOT EXISTS "${ONNXFUSE_CUBLAS_INCLUDE_DIR}/cublasLt.h")
  message(FATAL_ERROR "CUBLAS_INCLUDE_DIR=${ONNXFUSE_CUBLAS_INCLUDE_DIR} holds no cublasLt.h. ${_cublas_fix}")
endif()
message(STATUS "cuBLAS headers: ${ONNXFUSE_CUBLAS_INCLUDE_DIR} (libcublasLt.so.${ONNXFUSE_CUDA_MAJOR} is loaded "
               "at run time, never linked)")
