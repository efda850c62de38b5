#!/usr/bin/env bash
# One H200 visit for lab/kernels/NOTES.md gemv v6, round 2 (issue #20's few rows): the 16-bit Tensor-Core gemv
# kernel (gemv_mma_lab.cu) checked and timed against the gemv path as shipped and cuBLAS, fp16 and bf16, then
# memchecked. Torch only, no ONNX Runtime; about 5 minutes, each step capped to fit one device call.
#   bash lab/kernels/visit_gemv_mma.sh LIBDIR     (LIBDIR holds libgemv_mma_lab.so, built here as gemv_mma_lab.cu
#                                                  says; without it the library is built there first, from the
#                                                  device kit's CUTLASS headers in /tmp/site)
# Writes under $OUT: gemv_mma_{fp16,bf16}.{txt,json}, gemv_mma_memcheck.txt, gemv_mma_build.log.
set -u
export PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
OUT=${OUT:-/tmp/gemv-mma-out}
mkdir -p "$OUT"
lib=$1/libgemv_mma_lab.so
t0=$(date +%s)
step() {  # step SECONDS COMMAND...: COMMAND under timeout, for SECONDS or what is left of the call's 570 s
  local want=$1 left=$(( 570 - ($(date +%s) - t0) ))
  shift
  [ "$left" -lt "$want" ] && want=$left
  if [ "$want" -lt 20 ]; then echo "skipped, no time left: $*" >&2; return 124; fi
  timeout "$want" "$@"
}
if [ ! -f "$lib" ]; then
  lib=/tmp/gemv-mma/libgemv_mma_lab.so
  mkdir -p /tmp/gemv-mma
  step 200 nvcc -std=c++17 -O3 -DNDEBUG -shared -Xcompiler=-fPIC -Xptxas=-v -gencode=arch=compute_90a,code=sm_90a \
    -I/tmp/site/cutlass_library/source/include -Icustom_ops/src -Icustom_ops/src/cuda/hooks \
    lab/kernels/gemv_mma_lab.cu -o "$lib" > "$OUT/gemv_mma_build.log" 2>&1
  echo "build exit $?"
fi
nvidia-smi --query-gpu=name,clocks.max.sm,temperature.gpu --format=csv,noheader
for dt in fp16 bf16; do
  step 200 python3 lab/kernels/gemv_mma_probe.py "$lib" --dtypes $dt --json "$OUT/gemv_mma_$dt.json" 2>&1 |
    grep -v -i warn > "$OUT/gemv_mma_$dt.txt"
  echo "probe $dt exit ${PIPESTATUS[0]}"
  cut -c1-160 "$OUT/gemv_mma_$dt.txt" | tail -n 52
done
# Every variant at 1-64 rows on a shape with partial blocks and tiles (the probe's tail shape, always checked)
# and one timed shape, under memcheck: cp.async's zero fill past K, the clamped rows past M and N.
step 150 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 python3 lab/kernels/gemv_mma_probe.py \
  "$lib" --check-only --shapes 384,1536 --rows 1 5 8 13 16 33 64 > "$OUT/gemv_mma_memcheck.txt" 2>&1
echo "memcheck exit $?"; tail -n 4 "$OUT/gemv_mma_memcheck.txt"
