#!/usr/bin/env bash
# Builds the CPU tile-kernel A/B library: several variants of custom_ops/src/cpu/gemm's packed GEMM (other source
# trees, K slice depths, tile shapes, -D switches) side by side in one .so, for ab.py to time against ORT's
# MLAS in one process. AVX2 only (the variants run Tile<Avx2, 1 panel>).
#
#   lab/cpu_gemm_ab/build.sh OUT.so NAME:SRC_DIR:KC:TILE_M:TILE_N[:DEF=1,DEF=2] ...
#   e.g. lab/cpu_gemm_ab/build.sh /tmp/ab.so cur:custom_ops/src:256:144:128 kc128:custom_ops/src:128:144:128
#
# SRC_DIR is a tree laid out like custom_ops/src (a copy with an edited packed_gemm_kernel.h, say); the weight
# packing comes from the first variant's tree. NAME must be a C identifier.
set -euo pipefail
out=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags="-O3 -std=c++17 -mavx2 -mfma -mf16c -fno-math-errno -fPIC"
objs=(); pids=(); variants=""; tiles=""; first_src=""
for spec in "$@"; do
  IFS=: read -r name src kc tile_m tile_n defines <<<"$spec"
  [ -n "$first_src" ] || first_src=$src
  extra=""; for d in ${defines//,/ }; do extra+=" -D$d"; done
  # shellcheck disable=SC2086
  g++ $flags -I"$src" -Donnxfuse="ab_$name" -DTILE_FN="$name" -DKC="$kc" $extra -c "$here/variant.cc" -o "$work/$name.o" &
  pids+=($!)
  objs+=("$work/$name.o"); variants+="V($name) "; tiles+=" -DTM_$name=$tile_m -DTN_$name=$tile_n"
done
# shellcheck disable=SC2086
g++ $flags -I"$first_src" -c "$first_src/cpu/gemm/packed_gemm_avx2.cc" -o "$work/pack.o" &
pids+=($!)
for pid in "${pids[@]}"; do wait "$pid"; done  # a failed compile stops the build here
# shellcheck disable=SC2086
g++ $flags -shared -I"$first_src" "-DVARIANTS=$variants" $tiles "$here/ab_lib.cc" "$work/pack.o" "${objs[@]}" \
  -o "$out" -lpthread
echo "built $out: $variants"
