#!/usr/bin/env bash
# One visit to the H200: checks, timings, sanitizers and one ncu reading of the kernel harness built by
# build.sh (carry the folder holding libgemm_gelu_harness.so). Writes everything under $OUT.
#   lab/kernels/device_run.sh LIBDIR TAG
set -uo pipefail
lib=$1/libgemm_gelu_harness.so
tag=$2
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,temperature.gpu,power.draw --format=csv
python3 lab/kernels/run_device.py "$lib" "$OUT/kernels_$tag.json" check tactics fp16all time 2>&1 | tee "$OUT/log_$tag.txt" | grep -v "^FAIL\|UserWarning\|_warn_once"
echo "FAIL lines: $(grep -c '^FAIL' "$OUT/log_$tag.txt")"; grep '^FAIL' "$OUT/log_$tag.txt" | head -5 | cut -c1-300
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 lab/kernels/run_device.py "$lib" /tmp/san.json sanitize > "$OUT/memcheck_$tag.txt" 2>&1
echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY|sanitize sweep' "$OUT/memcheck_$tag.txt" | tr '\n' ' ')"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 OFK_SAN_SMALL=1 timeout 120 compute-sanitizer --tool racecheck --print-limit 20 python3 lab/kernels/run_device.py "$lib" /tmp/san.json sanitize > "$OUT/racecheck_$tag.txt" 2>&1
echo "racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|sanitize sweep' "$OUT/racecheck_$tag.txt" | tr '\n' ' ')"
timeout 90 ncu --clock-control none --kernel-name regex:device_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy python3 lab/kernels/run_device.py "$lib" /tmp/ncu.json ncu > "$OUT/ncu_$tag.txt" 2>&1
echo "ncu rc=$?"; grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy" "$OUT/ncu_$tag.txt" | head -8
