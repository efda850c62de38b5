#!/usr/bin/env bash
# Builds the standalone kernel harness (lab/kernels/harness.cu + every kernel source listed in
# custom_ops/src/cuda/sources.cmake) into one shared library for run_device.py, on a machine without a GPU.
#   lab/kernels/build.sh [BUILD_DIR]      (default .device/kbuild; JOBS=2 by default)
#   OFK_EXPLORE=tiles|epi lab/kernels/build.sh   adds candidate tiles of lab/kernels/explore/tiles.h (float16,
#                                                  W [N, K]): other tiles and clusters, or other epilogue subtiles
#   OFK_EXPLORE=sched lab/kernels/build.sh       the stream-K tiles, and every sm90 kernel reads its tile
#                                                  scheduler's arguments from the environment
#                                                  (explore/scheduler_knobs.h; run_device.py's sched mode)
# Objects are rebuilt only when a source or header is newer. Per-file compile times and the -Xptxas -v
# resource report land in BUILD_DIR/ptxas_<file>.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-.device/kbuild}
jobs=${JOBS:-2}
mkdir -p "$out"
CUTLASS=${CUTLASS_DIR:-$(python3 -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source"))')}
export NVFLAGS="-std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -Xcompiler=-fPIC -Xptxas=-v
  -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80
  -I$CUTLASS/include -I$CUTLASS/tools/util/include -Icustom_ops/src/cuda -Icustom_ops/src"
srcs=$(sed -n "s/^ *\([A-Za-z0-9_]*\.cu\).*/custom_ops\/src\/cuda\/\1/p" custom_ops/src/cuda/sources.cmake)
srcs="$srcs lab/kernels/harness.cu"
case "${OFK_EXPLORE:-}" in
  tiles) NVFLAGS="$NVFLAGS -DOFK_EXPLORE_TILES_BUILD -Ilab/kernels"
         srcs="$srcs $(ls lab/kernels/explore/explore_[a-e].cu | tr '\n' ' ')" ;;
  epi)   NVFLAGS="$NVFLAGS -DOFK_EXPLORE_EPI_BUILD -Ilab/kernels"
         srcs="$srcs $(ls lab/kernels/explore/explore_[f-i].cu | tr '\n' ' ')" ;;
  sched) NVFLAGS="$NVFLAGS -DOFK_EXPLORE_SCHED_BUILD -Ilab/kernels"
         srcs="$srcs lab/kernels/explore/explore_e.cu lab/kernels/explore/explore_j.cu lab/kernels/explore/explore_k.cu lab/kernels/explore/explore_l.cu lab/kernels/explore/explore_m.cu lab/kernels/explore/explore_n.cu" ;;
  "") ;;
  *) echo "OFK_EXPLORE=tiles|epi|sched"; exit 2 ;;
esac
export out
newest_header=$(ls -t custom_ops/src/cuda/*.cuh custom_ops/src/cuda/*.h custom_ops/src/*.h lab/kernels/explore/*.h | head -1)
export newest_header
compile() {
  src=$1; base=$(basename "$src" .cu); obj="$out/$base.o"
  if [ -f "$obj" ] && [ "$obj" -nt "$src" ] && [ "$obj" -nt "$newest_header" ]; then return 0; fi
  # sm90 files carry sm_90a code only (their kernels are guarded for sm_90a); the rest carry sm_80 too.
  flags=$NVFLAGS
  case "$base" in sm90_*|explore_*) flags=$(echo "$NVFLAGS" | sed 's/-gencode=arch=compute_80,code=sm_80//');; esac
  s=$(date +%s)
  # shellcheck disable=SC2086
  nvcc $flags -c "$src" -o "$obj" > "$out/ptxas_$base.log" 2>&1 || { cat "$out/ptxas_$base.log"; exit 1; }
  echo "$base: $(( $(date +%s) - s )) s" | tee -a "$out/compile_times.txt"
}
export -f compile
echo "$srcs" | tr ' ' '\n' | grep -v '^$' | xargs -P "$jobs" -I{} bash -c 'compile {}'
objs=$(for s in $srcs; do echo "$out/$(basename "$s" .cu).o"; done)
# shellcheck disable=SC2086
nvcc -shared -cudart static -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80 $objs -o "$out/libgemm_gelu_harness.so"
echo "built $out/libgemm_gelu_harness.so"
