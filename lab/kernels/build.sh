#!/usr/bin/env bash
# Builds the standalone kernel harness (lab/kernels/harness.cu + every kernel source listed in
# custom_ops/src/cuda/sources.cmake) into one shared library for run_device.py, on a machine without a GPU.
#   lab/kernels/build.sh [BUILD_DIR]          (default .device/kbuild; JOBS=2 by default)
#   OFK_EXPLORE=tiles|epi lab/kernels/build.sh  adds candidate tiles of lab/kernels/explore/tiles.h (float16,
#                                               W [N, K]): other tiles and clusters, or other epilogue subtiles
#   OFK_EXPLORE=sched lab/kernels/build.sh      the stream-K tiles and the later rounds' candidates (the split-N
#                                               kernel among them), with every kernel built on the lab's hook
#                                               points (lab/kernels/hooks/kernel_hooks.cuh in place of the shipped
#                                               no-op custom_ops/src/cuda/hooks/kernel_hooks.cuh): tile-scheduler
#                                               arguments from the environment (run_device.py's sched mode), extra
#                                               activation codes, the epilogue timeline
#   OFK_EXPLORE=intra lab/kernels/build.sh      the shipped kernels as shipped (no lab hook points) and group O: the
#                                               two-accumulator (intra-warpgroup overlap) kernel of issue #20
#   OFK_EXPLORE=three lab/kernels/build.sh      the shipped kernels as shipped and group Q: the overlapped ping-pong
#                                               kernel with three consumer warpgroups (issue #20)
#   OFK_EXPLORE=gelu lab/kernels/build.sh       the sched build's hook points with one small group (L) of candidates:
#                                               issue #20's activation forms on the shipped kernels
# Objects are rebuilt only when a source or header is newer, or the mode changed. Per-file compile times and the -Xptxas -v
# resource report land in BUILD_DIR/ptxas_<file>.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-.device/kbuild}
jobs=${JOBS:-2}
mkdir -p "$out"
CUTLASS=${CUTLASS_DIR:-$(python3 -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source"))')}
export NVFLAGS="-std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -Xcompiler=-fPIC -Xptxas=-v
  -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80
  -I$CUTLASS/include -I$CUTLASS/tools/util/include -Icustom_ops/src"
# The kernels find kernel_hooks.cuh through the include path: the first folder that has one wins.
hooks="-Icustom_ops/src/cuda/hooks"
case "${OFK_EXPLORE:-}" in
  tiles) NVFLAGS="$NVFLAGS -DOFK_EXPLORE_TILES_BUILD -Ilab/kernels"; mode=TILES ;;
  epi)   NVFLAGS="$NVFLAGS -DOFK_EXPLORE_EPI_BUILD -Ilab/kernels"; mode=EPI ;;
  intra) NVFLAGS="$NVFLAGS -DOFK_EXPLORE_INTRA_BUILD -Ilab/kernels"; mode=INTRA ;;
  three) NVFLAGS="$NVFLAGS -DOFK_EXPLORE_THREE_BUILD -Ilab/kernels"; mode=THREE ;;
  sched) NVFLAGS="$NVFLAGS -DOFK_EXPLORE_SCHED_BUILD -Ilab/kernels"; mode=SCHED
         hooks="-Ilab/kernels/hooks $hooks" ;;
  gelu)  NVFLAGS="$NVFLAGS -DOFK_EXPLORE_SCHED_BUILD -DOFK_EXPLORE_GELU_BUILD -Ilab/kernels"; mode=GELU
         hooks="-Ilab/kernels/hooks $hooks" ;;
  "") mode="" ;;
  *) echo "OFK_EXPLORE=tiles|epi|intra|three|sched|gelu"; exit 2 ;;
esac
NVFLAGS="$NVFLAGS $hooks"
# One compile per line: SOURCE OBJECT_NAME [EXTRA_FLAG]. The shipped kernels (sources.cmake lists them relative to
# src/cuda/, in subfolders; the object is named after the file), the harness, and explore.cu once per candidate
# group of the mode (explore/tiles.h's OFK_EXPLORE_MODE_<mode> line names the groups).
units=$(sed -n "s/^ *\(\([a-z_]*\/\)*\)\([A-Za-z0-9_]*\)\.cu.*/custom_ops\/src\/cuda\/\1\3.cu \3/p" \
  custom_ops/src/cuda/sources.cmake)
units="$units
lab/kernels/harness.cu harness"
if [ -n "$mode" ]; then
  groups=$(sed -n "s/^#define OFK_EXPLORE_MODE_$mode(GROUP) //p" lab/kernels/explore/tiles.h | grep -o 'GROUP([A-Z])' | cut -c7)
  [ -n "$groups" ] || { echo "lab/kernels/explore/tiles.h has no OFK_EXPLORE_MODE_$mode line"; exit 2; }
  for g in $groups; do
    units="$units
lab/kernels/explore/explore.cu explore_$(echo "$g" | tr A-Z a-z) -DOFK_EXPLORE_GROUP=$g"
  done
fi
# Objects of another mode were built with other flags (the hook header among them): rebuild all of them.
if [ "$(cat "$out/nvflags" 2>/dev/null)" != "$NVFLAGS" ]; then
  rm -f "$out"/*.o
  echo "$NVFLAGS" > "$out/nvflags"
fi
export out
newest_header=$(ls -t custom_ops/src/cuda/*/*.cuh custom_ops/src/cuda/*/*.h custom_ops/src/*.h \
  lab/kernels/hooks/*.cuh lab/kernels/*.h lab/kernels/explore/*.h lab/kernels/explore/*.cuh | head -1)
export newest_header
compile() {
  src=$1; base=$2; extra=${3:-}; obj="$out/$base.o"
  if [ -f "$obj" ] && [ "$obj" -nt "$src" ] && [ "$obj" -nt "$newest_header" ]; then return 0; fi
  # sm90 files carry sm_90a code only (their kernels are guarded for sm_90a); the rest carry sm_80 too.
  flags=$NVFLAGS
  case "$base" in sm90_*|explore_*) flags=$(echo "$NVFLAGS" | sed 's/-gencode=arch=compute_80,code=sm_80//');; esac
  s=$(date +%s)
  # shellcheck disable=SC2086
  nvcc $flags $extra -c "$src" -o "$obj" > "$out/ptxas_$base.log" 2>&1 || { cat "$out/ptxas_$base.log"; exit 1; }
  echo "$base: $(( $(date +%s) - s )) s" | tee -a "$out/compile_times.txt"
}
export -f compile
echo "$units" | xargs -P "$jobs" -L1 bash -c 'compile "$@"' compile
objs=$(echo "$units" | while read -r _ base _; do echo "$out/$base.o"; done)
# shellcheck disable=SC2086
nvcc -shared -cudart static -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80 $objs -o "$out/libgemm_gelu_harness.so"
echo "built $out/libgemm_gelu_harness.so"
