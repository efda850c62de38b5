#!/usr/bin/env bash
# Run here (nvcc, no GPU needed): build libonnxfuse_ops.so with its CUDA kernels into .device/build and gather
# what the GPU machine needs to load it into .device/lib: the library and the OpenBLAS its CPU kernel links.
#
#   bash bench/device/build_library.sh            (JOBS=2 by default; CMAKE_ARGS="..." adds configure flags)
#   CONFIGURE_ONLY=1 bash bench/device/build_library.sh   configure, and gather .device/buildkit for a build
#                                                         on the GPU machine (on_device.sh build) instead
#
# The whole visit to the H200, in order (each `run` call brings the one folder named; see on_device.sh):
#   1. here:   bash bench/device/build_library.sh
#   2. here:   bash ../shared/device/stage.sh     (onnxruntime-gpu in six pieces + pycuda/graphsurgeon wheels)
#   3. device: bash .device/kit/on-device.sh kit                              carry .device/kit
#              bash /tmp/onnxfuse-kit/on-device.sh receive 0 ... receive 5   carry .device/ort0 ... .device/ort5
#              (the last one followed by `&& bash /tmp/onnxfuse-kit/on-device.sh install`)
#   4. device: bash bench/device/on_device.sh tests                           carry .device/lib
#   5. device: bash bench/device/on_device.sh bench                           carry .device/lib
#   (with CONFIGURE_ONLY=1: first `on_device.sh build` carrying .device/buildkit; then steps 4-5 carry nothing)
#   6. here:   copy the returned cuda_kernel.json to bench/results/ (bench/device/on_device.sh says how).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
# Keep .device/ out of git: in a linked worktree .git is a file, so ask git where info/exclude lives (the
# main checkout's, shared by its worktrees).
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.device/' "$exclude" 2>/dev/null || echo '/.device/' >> "$exclude"

# shellcheck disable=SC2086
cmake -S custom_ops -B .device/build -DCMAKE_BUILD_TYPE=Release -DONNXFUSE_CUDA=ON ${CMAKE_ARGS:-}

# The build kit for building on the GPU machine instead (on_device.sh build: 16 cores there against 2 here):
# the ORT and cuBLAS headers this configure fetched (that machine reaches no package registry) and the
# OpenBLAS the CPU kernel links; CUTLASS comes with the kit.
rm -rf .device/buildkit
mkdir -p .device/buildkit/openblas/lib
cp -r "$(sed -n 's/^ONNXRUNTIME_INCLUDE_DIR:PATH=//p' .device/build/CMakeCache.txt)" .device/buildkit/ort-include
# cuBLAS: the folder given as CUBLAS_INCLUDE_DIR, else the one cmake/cublas.cmake fetched into the build tree
cublas_include=$(sed -n 's/^CUBLAS_INCLUDE_DIR:PATH=//p' .device/build/CMakeCache.txt)
[ -n "$cublas_include" ] || cublas_include=$(dirname "$(find .device/build/_deps -name cublasLt.h -print -quit)")
cp -r "$cublas_include" .device/buildkit/cublas-include
# The OpenBLAS cache entries are empty when CMake asked the scipy-openblas32 package itself: ask it too.
blas_include=$(sed -n 's/^ONNXFUSE_OPENBLAS_INCLUDE_DIR:PATH=//p' .device/build/CMakeCache.txt)
blas_library=$(sed -n 's/^ONNXFUSE_OPENBLAS_LIBRARY:FILEPATH=//p' .device/build/CMakeCache.txt)
[ -n "$blas_include" ] || blas_include=$(python3 -c "import scipy_openblas32 as s; print(s.get_include_dir())")
[ -n "$blas_library" ] || blas_library=$(python3 -c "import scipy_openblas32 as s, os; print(os.path.join(s.get_lib_dir(), 'lib' + s.get_library() + '.so'))")
cp -r "$blas_include" .device/buildkit/openblas/include
cp "$blas_library" .device/buildkit/openblas/lib/
[ "${CONFIGURE_ONLY:-0}" = 1 ] && { echo "ready to carry: .device/buildkit ($(du -sh .device/buildkit | cut -f1))"; exit 0; }

cmake --build .device/build -j "${JOBS:-2}"
rm -rf .device/lib
mkdir -p .device/lib
cp .device/build/libonnxfuse_ops.so .device/lib/
blas=$(python3 -c "import scipy_openblas32 as s, os; print(os.path.join(s.get_lib_dir(), 'lib' + s.get_library() + '.so'))")
cp "$blas" .device/lib/
echo "ready to carry: .device/lib ($(du -sh .device/lib | cut -f1)): $(ls .device/lib | tr '\n' ' ')"
