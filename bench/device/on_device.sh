#!/usr/bin/env bash
# Runs ON the H200 machine, from the project's root there, after the kit is installed into /tmp/site, with
# .device/lib carried (bench/device/build_library.sh made it here) or built there first with `build`.
# Everything it makes goes under $OUT.
#
#   bash bench/device/on_device.sh build   build the library there (carry .device/buildkit), into /tmp/onnxfuse-lib
#   bash bench/device/on_device.sh tests   onnxfuse doctor, the GPU tests (pytest tests/test_op_cuda.py), then
#                                          compute-sanitizer memcheck and racecheck over bench/device/sanitize_sweep.py
#   bash bench/device/on_device.sh all     tests, bench (fewer repetitions) and sanitizers in one call
#   bash bench/device/on_device.sh bench   bench/cuda_kernel.py over the issue's shape grid, fp16 bf16 fp32
#   bash bench/device/on_device.sh cpu     the CPU kernel on the host's CPU (AVX-512 where it has it, which this
#                                          project's own machines lack): its tests, then bench/cpu_kernel.py
#
# Each fits in one 10-minute call. Back here, the bench's JSON goes to bench/results/:
#   cp <files_at>/cuda_kernel.json bench/results/cuda_kernel_h200.json
set -uo pipefail
OUT=${OUT:-/tmp/onnxfuse-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
command -v nvcc >/dev/null && command -v compute-sanitizer >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
# The library: carried in .device/lib (built here), or built there by `on_device.sh build` into /tmp.
lib_dir=$PWD/.device/lib
[ -f "$lib_dir/libonnxfuse_ops.so" ] || lib_dir=/tmp/onnxfuse-lib
export ONNXFUSE_LIBRARY=$lib_dir/libonnxfuse_ops.so
# The library's OpenBLAS (its CPU kernel) travels beside it.
export LD_LIBRARY_PATH=$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
python3 -c "import onnxruntime as o; assert 'CUDAExecutionProvider' in o.get_available_providers()" ||
  { echo "onnxruntime-gpu is not in /tmp/site: install the kit first"; exit 2; }
[ "${1:-}" = build ] || [ -f "$ONNXFUSE_LIBRARY" ] ||
  { echo "no op library: carry .device/lib, or run 'on_device.sh build' (carrying .device/buildkit) first"; exit 2; }

case "${1:-}" in
  build)
    # The same CMake build as here, on the GPU machine's cores; ORT headers and OpenBLAS from the carried
    # .device/buildkit, CUTLASS headers from the kit's nvidia-cutlass wheel in /tmp/site.
    kit=$PWD/.device/buildkit
    [ -d "$kit" ] || { echo "carry .device/buildkit (CONFIGURE_ONLY=1 bench/device/build_library.sh makes it)"; exit 2; }
    cutlass=/tmp/site/cutlass_library/source
    s=$(date +%s)
    cmake -S custom_ops -B /tmp/onnxfuse-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DONNXFUSE_CUDA=ON \
      -DONNXRUNTIME_INCLUDE_DIR="$kit/ort-include" -DONNXFUSE_OPENBLAS_INCLUDE_DIR="$kit/openblas/include" \
      -DONNXFUSE_OPENBLAS_LIBRARY="$kit/openblas/lib/libscipy_openblas.so" \
      -DCUTLASS_INCLUDE_DIR="$cutlass/include" -DCUTLASS_UTIL_INCLUDE_DIR="$cutlass/tools/util/include" \
      -DCUBLAS_INCLUDE_DIR="$kit/cublas-include" \
      > "$OUT/build.log" 2>&1 && cmake --build /tmp/onnxfuse-build -j "$(nproc)" >> "$OUT/build.log" 2>&1
    rc=$?
    tail -n 15 "$OUT/build.log"
    [ $rc -eq 0 ] || exit $rc
    mkdir -p /tmp/onnxfuse-lib
    cp /tmp/onnxfuse-build/libonnxfuse_ops.so "$kit/openblas/lib/libscipy_openblas.so" /tmp/onnxfuse-lib/
    cp /tmp/onnxfuse-build/libonnxfuse_ops.so "$OUT/"
    echo "built /tmp/onnxfuse-lib/libonnxfuse_ops.so in $(( $(date +%s) - s )) s"
    ;;
  tests)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
    rc=0
    # doctor's GPU rows come from pycuda (the kit installs it): the [gpu] extra at work.
    python3 -m onnxfuse.cli doctor > "$OUT/doctor.txt" 2>&1 || rc=1
    python3 -m onnxfuse.cli doctor --json >> "$OUT/doctor.txt" 2>&1
    cat "$OUT/doctor.txt"
    timeout 300 python3 -m pytest tests/test_op_cuda.py -q -rA -p no:cacheprovider \
      --junitxml="$OUT/test_op_cuda.xml" 2>&1 | tee "$OUT/pytest.log" | tail -n 60
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    for tool in memcheck racecheck; do
      timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 20 \
        python3 bench/device/sanitize_sweep.py > "$OUT/$tool.log" 2>&1
      t=$?
      echo "compute-sanitizer $tool: exit $t ($(grep -c '^FAIL' "$OUT/$tool.log") wrong results)"
      tail -n 4 "$OUT/$tool.log"
      [ "$t" -eq 0 ] || rc=1
    done
    exit $rc
    ;;
  all)
    # One call of at most ~9.5 minutes for a short device budget: tests, the benchmark (fewer repetitions,
    # every shape), then the sanitizers, each time-boxed so that the call ends inside its 10-minute limit.
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt"
    python3 -m onnxfuse.cli doctor > "$OUT/doctor.txt" 2>&1
    python3 -m onnxfuse.cli doctor --json >> "$OUT/doctor.txt" 2>&1
    head -n 20 "$OUT/doctor.txt"
    timeout 180 python3 -m pytest tests/test_op_cuda.py -q -rA -p no:cacheprovider > "$OUT/pytest.log" 2>&1
    echo "pytest exit $?"; grep -E "passed|failed|error" "$OUT/pytest.log" | tail -n 25
    timeout 220 python3 bench/cuda_kernel.py --json "$OUT/cuda_kernel.json" --warmup 3 --reps 30 --prof-reps 15 \
      > "$OUT/cuda_kernel.log" 2>&1
    echo "bench exit $?"; tail -n 45 "$OUT/cuda_kernel.log"
    for tool in memcheck racecheck; do
      timeout 50 compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 20 \
        python3 bench/device/sanitize_sweep.py > "$OUT/$tool.log" 2>&1
      echo "compute-sanitizer $tool: exit $?"; tail -n 3 "$OUT/$tool.log"
    done
    ;;
  cpu)
    lscpu | grep -E "Model name|^CPU\(s\)" | tee "$OUT/cpu.txt"
    grep -o -w -m1 avx512f /proc/cpuinfo >> "$OUT/cpu.txt" || echo "no avx512f" >> "$OUT/cpu.txt"
    tail -n 1 "$OUT/cpu.txt"
    rc=0
    timeout 300 python3 -m pytest tests/test_op_cpu.py tests/test_error_statistics.py tests/test_cpu_tile_loop.py \
      tests/test_concurrency.py -q -p no:cacheprovider > "$OUT/pytest_cpu.log" 2>&1 || rc=1
    grep -E "passed|failed|error" "$OUT/pytest_cpu.log" | tail -n 15
    timeout 200 python3 bench/cpu_kernel.py --reps 21 --out "$OUT/cpu_kernel" 2>&1 | tail -n 8 || rc=1
    exit $rc
    ;;
  bench)
    python3 bench/cuda_kernel.py --json "$OUT/cuda_kernel.json" "${@:2}" 2>&1 | tee "$OUT/cuda_kernel.log" | tail -n 60
    exit "${PIPESTATUS[0]}"
    ;;
  *)
    echo "usage: on_device.sh build | tests | all | cpu | bench [cuda_kernel.py options]"; exit 2 ;;
esac
