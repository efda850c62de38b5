# The CPU kernel's GEMM: OpenBLAS from PyPI's scipy-openblas32 (a build requirement and a runtime
# dependency of the package, so the same library is found when building and when running). Its symbols
# carry a `scipy_` prefix, so it never clashes with another BLAS loaded into the same process.
#
#   ONNXFUSE_OPENBLAS_INCLUDE_DIR / ONNXFUSE_OPENBLAS_LIBRARY   use another scipy-openblas32 tree.
#
# Defines the imported target onnxfuse::openblas and ONNXFUSE_OPENBLAS_RPATH, the install RUNPATH that
# finds the library in an installed layout (site-packages/onnxfuse/lib -> site-packages/scipy_openblas32/lib).

set(ONNXFUSE_OPENBLAS_INCLUDE_DIR "" CACHE PATH "scipy-openblas32 include folder (empty: ask the Python package)")
set(ONNXFUSE_OPENBLAS_LIBRARY "" CACHE FILEPATH "scipy-openblas32 shared library (empty: ask the Python package)")

# Asked again at every configure, never cached: under pip's build isolation the package lives in a
# temporary build environment that is gone by the next build.
if(ONNXFUSE_OPENBLAS_INCLUDE_DIR AND ONNXFUSE_OPENBLAS_LIBRARY)
  set(_openblas_include "${ONNXFUSE_OPENBLAS_INCLUDE_DIR}")
  set(_openblas_library "${ONNXFUSE_OPENBLAS_LIBRARY}")
else()
  execute_process(
    COMMAND "${ONNXFUSE_PYTHON}" -c "import scipy_openblas32 as s, os; print(s.get_include_dir()); print(os.path.join(s.get_lib_dir(), 'lib' + s.get_library() + '.so'))"
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "OpenBLAS: `import scipy_openblas32` failed with ${ONNXFUSE_PYTHON} (${_err}). "
                        "Install it (`pip install scipy-openblas32`) or set -DONNXFUSE_OPENBLAS_INCLUDE_DIR "
                        "and -DONNXFUSE_OPENBLAS_LIBRARY.")
  endif()
  string(REPLACE "\n" ";" _out "${_out}")
  list(GET _out 0 _openblas_include)
  list(GET _out 1 _openblas_library)
endif()
if(NOT EXISTS "${_openblas_include}/cblas.h" OR NOT EXISTS "${_openblas_library}")
  message(FATAL_ERROR "OpenBLAS: no cblas.h in ${_openblas_include} or no ${_openblas_library}")
endif()
message(STATUS "OpenBLAS: ${_openblas_library}")

add_library(onnxfuse::openblas SHARED IMPORTED)
set_target_properties(onnxfuse::openblas PROPERTIES
  IMPORTED_LOCATION "${_openblas_library}"
  INTERFACE_INCLUDE_DIRECTORIES "${_openblas_include}")
set(ONNXFUSE_OPENBLAS_RPATH "$ORIGIN/../../scipy_openblas32/lib")
