#!/usr/bin/env bash
# One H200 visit for lab/kernels/NOTES.md v10 (issue #20): the overlapped ping-pong kernel with three consumer
# warpgroups and its 5-stage two-warpgroup control (explore/tiles.h groups Q and R, built by
# `OFK_EXPLORE=three lab/kernels/build.sh DIR`) checked, memchecked,
# timed against the shipped two-warpgroup kernel and cuBLAS, one ncu reading each; and the shipped swapped kernel
# memchecked at 17-32 rows (two X tiles). Torch only, no ONNX Runtime: about 8 minutes, each step capped so that
# the whole fits one device call (a step with no time left is skipped, and says so).
#   lab/kernels/visit_three_groups.sh LIBDIR      (LIBDIR holds libgemm_gelu_harness.so; a path starting with ./)
# Writes under $OUT: v10_tactics{ppo3,_s5}.json, v10_memcheck_{ppo3,swap}.txt, v10_overlap.{json,txt}, v10_ncu_*.txt.
set -u
export PYTHONUNBUFFERED=1
lib=$1/libgemm_gelu_harness.so
run=lab/kernels/run_device.py
nvidia-smi --query-gpu=name,clocks.max.sm,temperature.gpu --format=csv,noheader
t0=$(date +%s)
# A device call ends at 600 s: each step gets what is left (less a margin), the most telling first, so that a
# slow step cuts the least telling ones.
# step SECONDS COMMAND...: runs COMMAND under timeout, for SECONDS or what is left, or skips it (exit 124) when
# less than 20 s are left (timeout 0 would mean no limit at all).
step() {
  local want=$1 left=$(( 570 - ($(date +%s) - t0) ))
  shift
  [ "$left" -lt "$want" ] && want=$left
  if [ "$want" -lt 20 ]; then echo "skipped, no time left: $*" >&2; return 124; fi
  timeout "$want" "$@"
}
# Every form, both edges, one tile per CTA and many (20000 rows: 10+ tiles per consumer warpgroup).
for m in ppo3 _s5; do  # group Q, then the control (group R)
  OFK_TACTICS_MATCH=$m OFK_TACTICS_SHAPES="1000x1032x776,4096x1536x384,777x1544x392,129x264x64,20000x1536x384" \
    step 150 python3 $run "$lib" "$OUT/v10_tactics$m.json" tactics 2>&1 | grep -v -i "warn" | tail -4
done
echo "tactics: $(( $(date +%s) - t0 )) s"
# Bit-identical to the dispatch's tactic in all forms, then GPU time in interleaved rounds (erf, tanh) with cuBLAS.
OFK_OVERLAP_MATCH="_f16_tn_(ppo_128x128|ppo3_)" OFK_ROUNDS=5 \
  OFK_SCHED_SHAPES="${V10_SHAPES:-4096x384x1536,32768x384x1536,4096x512x2048,1024x768x3072,4096x768x3072,16384x768x3072,4096x1024x4096,16384x1024x4096}" \
  step 300 python3 $run "$lib" "$OUT/v10_overlap.json" overlap 2>&1 | grep -v -i "warn" | tee "$OUT/v10_overlap.txt"
echo "timing: $(( $(date +%s) - t0 )) s"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 OFK_TACTICS_MATCH=_tn_ppo3 OFK_SAN_SHAPES="1000x1032x776,4000x1536x392" \
  step 120 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $run "$lib" /tmp/san.json sanitize \
  > "$OUT/v10_memcheck_ppo3.txt" 2>&1
echo "memcheck ppo3 rc=$?: $(grep -E 'ERROR SUMMARY|sanitize sweep' "$OUT/v10_memcheck_ppo3.txt" | tr '\n' ' ')"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 OFK_TACTICS_MATCH=swap \
  OFK_SAN_SHAPES="17x1536x384,24x1544x392,32x4096x1024,31x3072x768,21x512x256,32x8200x1032" \
  step 120 compute-sanitizer --tool memcheck --error-exitcode 9 python3 $run "$lib" /tmp/san.json sanitize \
  > "$OUT/v10_memcheck_swap.txt" 2>&1
echo "memcheck swap rc=$?: $(grep -E 'ERROR SUMMARY|sanitize sweep' "$OUT/v10_memcheck_swap.txt" | tr '\n' ' ')"
echo "sanitizers: $(( $(date +%s) - t0 )) s"
for t in ppo3_128x128_c1x2 ppo_128x128_c1x2; do
  OFK_NCU="32768x384x1536:sm90_f16_tn_$t" step 80 ncu --clock-control none --kernel-name regex:device_kernel \
    --launch-skip 2 --launch-count 1 --cache-control all --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section SchedulerStats --section WarpStateStats python3 $run "$lib" /tmp/ncu.json ncu \
    > "$OUT/v10_ncu_32768x384x1536_$t.txt" 2>&1
  echo "ncu $t rc=$?"
done
echo "done: $(( $(date +%s) - t0 )) s"
