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

if(NOT ONNXFUSE_OPENBLAS_INCLUDE_DIR OR NOT ONNXFUSE_OPENBLAS_LIBRARY)
  if(DEFINED Python_EXECUTABLE)  # scikit-build-core passes the interpreter that drives the build
    set(_py "${Python_EXECUTABLE}")
  else()
    find_package(Python3 REQUIRED COMPONENTS Interpreter)
    set(_py "${Python3_EXECUTABLE}")
  endif()
  execute_process(
    COMMAND "${_py}" -c "import scipy_openblas32 as s, os; print(s.get_include_dir()); print(os.path.join(s.get_lib_dir(), 'lib' + s.get_library() + '.so'))"
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "OpenBLAS: `import scipy_openblas32` failed with ${_py} (${_err}). "
                        "Install it (`pip install scipy-openblas32`) or set -DONNXFUSE_OPENBLAS_INCLUDE_DIR "
                        "and -DONNXFUSE_OPENBLAS_LIBRARY.")
  endif()
  string(REPLACE "\n" ";" _out "${_out}")
  list(GET _out 0 _inc)
  list(GET _out 1 _lib)
  set(ONNXFUSE_OPENBLAS_INCLUDE_DIR "${_inc}" CACHE PATH "scipy-openblas32 include folder" FORCE)
  set(ONNXFUSE_OPENBLAS_LIBRARY "${_lib}" CACHE FILEPATH "scipy-openblas32 shared library" FORCE)
endif()
if(NOT EXISTS "${ONNXFUSE_OPENBLAS_INCLUDE_DIR}/cblas.h" OR NOT EXISTS "${ONNXFUSE_OPENBLAS_LIBRARY}")
  message(FATAL_ERROR "OpenBLAS: no cblas.h in ${ONNXFUSE_OPENBLAS_INCLUDE_DIR} or no ${ONNXFUSE_OPENBLAS_LIBRARY}")
endif()
message(STATUS "OpenBLAS: ${ONNXFUSE_OPENBLAS_LIBRARY}")

add_library(onnxfuse::openblas SHARED IMPORTED)
set_target_properties(onnxfuse::openblas PROPERTIES
  IMPORTED_LOCATION "${ONNXFUSE_OPENBLAS_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${ONNXFUSE_OPENBLAS_INCLUDE_DIR}")
set(ONNXFUSE_OPENBLAS_RPATH "$ORIGIN/../../scipy_openblas32/lib")
