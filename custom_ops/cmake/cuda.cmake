# The CUDA half of the op library: included by CMakeLists.txt when ONNXFUSE_CUDA is on, after the op
# library target exists. Adds the CUDA kernels (src/cuda/sources.cmake), the ORT CUDA kernels (src/cuda/ops/) and
# the host side of the dispatch (src/cuda/dispatch/*.cc) to that target.
#
# It must configure and compile on machines with nvcc but no GPU and no libcuda (CI): nothing here runs
# device code or links the driver; cudart is linked statically and loads libcuda itself at run time.
#
# Knobs (cache variables):
#   ONNXFUSE_OPS_TARGET   the op library target to extend (default onnxfuse_ops)
#   CUTLASS_INCLUDE_DIR   a CUTLASS include tree (the folder holding cutlass/ and cute/); when empty, the
#                         headers of PyPI's nvidia-cutlass==${ONNXFUSE_CUTLASS_VERSION} are fetched into the
#                         build tree once (pip download) and reused by every later configure.
#   CUTLASS_UTIL_INCLUDE_DIR  CUTLASS's tools/util/include tree (derived from the fetched wheel when empty)
#   CUBLAS_INCLUDE_DIR    cuBLASLt's headers for the fallback path (cmake/cublas.cmake; default: fetched from PyPI)

set(ONNXFUSE_OPS_TARGET "onnxfuse_ops" CACHE STRING "The op library target the CUDA sources are added to")
set(ONNXFUSE_CUTLASS_VERSION "4.2.0.0" CACHE STRING "nvidia-cutlass version whose headers are fetched from PyPI")
set(CUTLASS_INCLUDE_DIR "" CACHE PATH "CUTLASS include tree (holds cutlass/ and cute/); empty: fetch from PyPI")
set(CUTLASS_UTIL_INCLUDE_DIR "" CACHE PATH "CUTLASS tools/util/include tree; empty: next to the fetched headers")

if(NOT TARGET ${ONNXFUSE_OPS_TARGET})
  message(FATAL_ERROR "cmake/cuda.cmake: include it after the '${ONNXFUSE_OPS_TARGET}' target is defined "
                      "(or set ONNXFUSE_OPS_TARGET to the op library's target name)")
endif()

# We name the targets with explicit -gencode flags below, so CMake must not add its own architecture flags.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES OFF)
endif()
set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
if(CUDAToolkit_VERSION VERSION_LESS 12.0)
  message(FATAL_ERROR "CUDA ${CUDAToolkit_VERSION}: the Hopper (sm_90a) GEMM kernels need CUDA 12.0 or newer "
                      "(configure with -DONNXFUSE_CUDA=OFF for a CPU-only library)")
endif()

include("${CMAKE_CURRENT_LIST_DIR}/cublas.cmake")

# --- CUTLASS headers ---------------------------------------------------------------------------------
# Header-only, so the wheel's source tree is all we need. Never vendored: fetched into the build tree.
if(NOT CUTLASS_INCLUDE_DIR)
  set(_cutlass_root "${CMAKE_BINARY_DIR}/_deps/nvidia-cutlass-${ONNXFUSE_CUTLASS_VERSION}")
  set(_cutlass_src "${_cutlass_root}/cutlass_library/source")
  if(NOT EXISTS "${_cutlass_src}/include/cutlass/cutlass.h")
    if(DEFINED Python_EXECUTABLE)  # scikit-build-core passes the interpreter that drives the build
      set(_py "${Python_EXECUTABLE}")
    else()
      find_package(Python3 REQUIRED COMPONENTS Interpreter)
      set(_py "${Python3_EXECUTABLE}")
    endif()
    message(STATUS "Fetching CUTLASS headers: pip download nvidia-cutlass==${ONNXFUSE_CUTLASS_VERSION}")
    file(MAKE_DIRECTORY "${_cutlass_root}/wheel")
    execute_process(
      # Under pip's build isolation the interpreter sees only the build requirements, so pip itself is one
      # of them (pyproject.toml); without isolation the environment's own pip answers.
      COMMAND "${_py}" -m pip download --quiet --no-deps --only-binary=:all: --disable-pip-version-check
              --dest "${_cutlass_root}/wheel" "nvidia-cutlass==${ONNXFUSE_CUTLASS_VERSION}"
      RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
    file(GLOB _wheel "${_cutlass_root}/wheel/nvidia_cutlass-${ONNXFUSE_CUTLASS_VERSION}-*.whl")
    if(NOT _rc EQUAL 0 OR NOT _wheel)
      message(FATAL_ERROR "Could not fetch nvidia-cutlass==${ONNXFUSE_CUTLASS_VERSION} from PyPI (${_err}). "
                          "Point -DCUTLASS_INCLUDE_DIR=<cutlass>/include at a CUTLASS checkout, "
                          "or configure with -DONNXFUSE_CUDA=OFF for a CPU-only library.")
    endif()
    # Only the two header trees: the wheel also carries CUTLASS's Python sources and examples.
    list(GET _wheel 0 _wheel)
    file(ARCHIVE_EXTRACT INPUT "${_wheel}" DESTINATION "${_cutlass_root}"
         PATTERNS "cutlass_library/source/include/*" "cutlass_library/source/tools/util/include/*")
    if(NOT EXISTS "${_cutlass_src}/include/cutlass/cutlass.h")
      message(FATAL_ERROR "${_wheel} has no cutlass_library/source/include/cutlass/cutlass.h")
    endif()
  endif()
  set(CUTLASS_INCLUDE_DIR "${_cutlass_src}/include" CACHE PATH "CUTLASS include tree" FORCE)
  if(NOT CUTLASS_UTIL_INCLUDE_DIR)
    set(CUTLASS_UTIL_INCLUDE_DIR "${_cutlass_src}/tools/util/include" CACHE PATH "CUTLASS util tree" FORCE)
  endif()
endif()
if(NOT EXISTS "${CUTLASS_INCLUDE_DIR}/cutlass/cutlass.h")
  message(FATAL_ERROR "CUTLASS_INCLUDE_DIR=${CUTLASS_INCLUDE_DIR} holds no cutlass/cutlass.h")
endif()
if(NOT CUTLASS_UTIL_INCLUDE_DIR)
  get_filename_component(_cutlass_parent "${CUTLASS_INCLUDE_DIR}" DIRECTORY)
  set(CUTLASS_UTIL_INCLUDE_DIR "${_cutlass_parent}/tools/util/include" CACHE PATH "CUTLASS util tree" FORCE)
endif()
message(STATUS "CUTLASS headers: ${CUTLASS_INCLUDE_DIR}")

# --- sources -------------------------------------------------------------------------------------------
# The kernel files are listed by their owner in src/cuda/sources.cmake (ONNXFUSE_CUDA_KERNEL_SOURCES,
# paths relative to src/cuda/); the host-compiled files (the ORT-facing kernels, the path choice, the cuBLASLt
# fallback, the device signature) are listed below.
set(_cuda_dir "${CMAKE_CURRENT_LIST_DIR}/../src/cuda")
get_filename_component(_cuda_dir "${_cuda_dir}" ABSOLUTE)
include("${_cuda_dir}/sources.cmake")
if(NOT ONNXFUSE_CUDA_KERNEL_SOURCES)
  message(FATAL_ERROR "src/cuda/sources.cmake defines no ONNXFUSE_CUDA_KERNEL_SOURCES")
endif()
set(_kernel_sources "")
foreach(_src IN LISTS ONNXFUSE_CUDA_KERNEL_SOURCES)
  if(NOT IS_ABSOLUTE "${_src}")
    set(_src "${_cuda_dir}/${_src}")
  endif()
  list(APPEND _kernel_sources "${_src}")
  # Target code per file. sm90_* files hold Hopper-only kernels (TMA + wgmma), whose dispatch refuses any
  # device but compute capability 9.0: they need sm_90a machine code alone, and skipping the sm_80 pass over
  # their CUTLASS 3 templates cuts their (long) compile by about a third. Every other file also gets sm_80
  # machine code and compute_80 PTX, so the portable kernels run on Ampere and, JIT-compiled, on later GPUs.
  get_filename_component(_name "${_src}" NAME)
  if(_name MATCHES "^sm90_")
    set_source_files_properties("${_src}" PROPERTIES COMPILE_OPTIONS "-gencode=arch=compute_90a,code=sm_90a")
  else()
    set_source_files_properties("${_src}" PROPERTIES COMPILE_OPTIONS
      "-gencode=arch=compute_90a,code=sm_90a;-gencode=arch=compute_80,code=[sm_80,compute_80]")
  endif()
endforeach()

# The kernels live in their own object library so their (long) nvcc compiles run in parallel with each
# other and with the C++ files, and so their flags stay off the host compiler's command line.
add_library(onnxfuse_cuda_kernels OBJECT ${_kernel_sources})
set_target_properties(onnxfuse_cuda_kernels PROPERTIES
  POSITION_INDEPENDENT_CODE ON
  CUDA_ARCHITECTURES OFF
  CUDA_STANDARD 17
  CUDA_STANDARD_REQUIRED ON
  CUDA_SEPARABLE_COMPILATION OFF)
target_include_directories(onnxfuse_cuda_kernels SYSTEM PRIVATE "${CUTLASS_INCLUDE_DIR}" "${CUTLASS_UTIL_INCLUDE_DIR}")
target_include_directories(onnxfuse_cuda_kernels PRIVATE "${_cuda_dir}/..")
# The kernels' hook points (src/cuda/hooks/kernel_hooks.cuh: the shipped no-op definitions) are found through
# the include path, never beside the kernels, so that a build with its own kernel_hooks.cuh earlier on the
# path (the kernel lab's) compiles that one instead.
target_include_directories(onnxfuse_cuda_kernels PRIVATE "${_cuda_dir}/hooks")
# The -gencode flags are per file (above): Hopper's wgmma + TMA kernels need the arch-specific sm_90a target.
target_compile_options(onnxfuse_cuda_kernels PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-fvisibility=hidden>)

target_sources(${ONNXFUSE_OPS_TARGET} PRIVATE
  "${_cuda_dir}/ops/fused_linear_gelu_cuda.cc"
  "${_cuda_dir}/ops/fused_linear_gelu_cuda_paths.cc"
  "${_cuda_dir}/ops/staging.cc"
  "${_cuda_dir}/ops/fill_masked_rows_cuda.cc"
  "${_cuda_dir}/ops/masked_skip_layer_norm_cuda.cc"
  "${_cuda_dir}/dispatch/path_choice.cc"
  "${_cuda_dir}/dispatch/cublaslt_gemm_bias.cc"
  "${_cuda_dir}/dispatch/device_signature.cc"
  $<TARGET_OBJECTS:onnxfuse_cuda_kernels>)
target_compile_definitions(${ONNXFUSE_OPS_TARGET} PRIVATE ONNXFUSE_WITH_CUDA)
# The library version in the device signature; on that one file only, so a version bump rebuilds nothing else.
set_source_files_properties("${_cuda_dir}/dispatch/device_signature.cc" PROPERTIES
  COMPILE_DEFINITIONS "ONNXFUSE_LIBRARY_VERSION=\"${ONNXFUSE_VERSION}\"")
# cuBLASLt: headers only. cublaslt_gemm_bias.cc dlopens the library at run time (hence libdl on older glibc).
target_include_directories(${ONNXFUSE_OPS_TARGET} SYSTEM PRIVATE "${ONNXFUSE_CUBLAS_INCLUDE_DIR}")
target_link_libraries(${ONNXFUSE_OPS_TARGET} PRIVATE ${CMAKE_DL_LIBS})
# The op library existed before CUDA was enabled, so CMake gave it no architectures; its own sources are
# C++ only (the .cu objects carry their -gencode flags), so it needs none.
set_target_properties(${ONNXFUSE_OPS_TARGET} PROPERTIES CUDA_ARCHITECTURES OFF)
# Static cudart: the library needs no CUDA runtime beside it and links nothing that requires libcuda.
# --exclude-libs keeps cudart's symbols private, so they never bind to (or replace) the libcudart.so
# that onnxruntime's CUDA provider loads into the same process.
target_link_libraries(${ONNXFUSE_OPS_TARGET} PRIVATE CUDA::cudart_static)
target_link_options(${ONNXFUSE_OPS_TARGET} PRIVATE "LINKER:--exclude-libs,ALL")
