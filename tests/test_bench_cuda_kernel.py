"""bench/cuda_kernel.py without a GPU: the grid timing (the GPU time of a segment is the sum of the kernels it
launched, per call: torch.profiler also mirrors each labelled host range on the GPU timeline as a device-side
annotation spanning those kernels; counting it as a kernel doubled long segments and added the launch gaps to
short ones), the order of the interleaved wall replays (every variant once a round, the first rotating, so that
drift between measurements is not read as one variant being slower), which forced paths run at which rows (gemv
at most 16), and the tables and verdicts over them."""

from __future__ import annotations


import pytest

from tests.bench_scripts import load_bench_script

cuda_kernel = load_bench_script("cuda_kernel")


class _Range:
    def __init__(self, start, end):
        self.start, self.end = start, end


class _Event:
    def __init__(self, name, device_type, start, end):
        self.name, self.device_type, self.time_range = name, device_type, _Range(start, end)


def test_segment_time_counts_kernels_only_and_divides_by_calls():
    labels = ["seg_0", "seg_1"]
    events = [
        _Event("seg_0", "DeviceType.CPU", 0, 100),  # host range of segment 0
        _Event("seg_0", "DeviceType.CUDA", 10, 90),  # its GPU-side mirror: not a kernel
        _Event("gemm", "DeviceType.CUDA", 10, 30),
        _Event("gelu", "DeviceType.CUDA", 40, 45),
        _Event("gemm", "DeviceType.CUDA", 60, 80),
        _Event("gelu", "DeviceType.CUDA", 85, 90),
        _Event("cudaLaunchKernel", "DeviceType.CPU", 12, 13),  # host work is never GPU time
        _Event("seg_1", "DeviceType.CPU", 200, 300),
        _Event("seg_1", "DeviceType.CUDA", 210, 260),
        _Event("gemm", "DeviceType.CUDA", 210, 260),
    ]
    assert cuda_kernel._segment_gpu_us(events, labels, calls=2) == pytest.approx([25.0, 25.0])


def test_busy_time_merges_overlapping_kernels_and_the_sum_does_not():
    # A kernel launched with programmatic dependent launch may start before the one before it ends.
    overlapping = [(10, 30), (25, 40), (50, 55), (52, 54)]
    assert cuda_kernel.kernel_sum_us(overlapping) == pytest.approx(42.0)
    assert cuda_kernel.kernel_busy_us(overlapping) == pytest.approx(35.0)  # 10-40 and 50-55
    apart = [(0, 5), (10, 20)]
    assert cuda_kernel.kernel_busy_us(apart) == cuda_kernel.kernel_sum_us(apart) == pytest.approx(15.0)
    assert cuda_kernel.kernel_busy_us([]) == 0.0


def test_segment_busy_time_is_per_call_like_the_sum():
    labels = ["seg_0"]
    events = [
        _Event("seg_0", "DeviceType.CPU", 0, 100),
        _Event("gemm", "DeviceType.CUDA", 10, 30),
        _Event("gelu", "DeviceType.CUDA", 28, 33),  # starts 2 µs before the GEMM ends
        _Event("gemm", "DeviceType.CUDA", 60, 80),
        _Event("gelu", "DeviceType.CUDA", 78, 83),
    ]
    assert cuda_kernel._segment_gpu_us(events, labels, calls=2) == pytest.approx([25.0])
    assert cuda_kernel._segment_gpu_us(events, labels, calls=2, measure=cuda_kernel.kernel_busy_us) == \
        pytest.approx([23.0])


def test_interleaved_rounds_time_each_variant_once_a_round_and_rotate_the_first():
    variants = ["auto", "fused", "fallback", "gemv", "unfused"]
    order = cuda_kernel.interleaved_rounds(variants, 7)
    assert len(order) == 7 * len(variants)
    assert all(sum(v == w for _, v in order) == 7 for w in variants)  # every variant exactly `rounds` times
    for r in range(7):  # round r: each variant once, starting at variant r mod n and going round
        assert [v for rr, v in order if rr == r] == variants[r % 5:] + variants[:r % 5]
    assert [rr for rr, _ in order] == sorted(rr for rr, _ in order)  # round by round, never mixed
    firsts = [order[i * 5][1] for i in range(7)]
    assert firsts == ["auto", "fused", "fallback", "gemv", "unfused", "auto", "fused"]
    assert len(set(firsts)) == len(variants)  # no variant is always first
    # fewer variants (gemv skipped above 16 rows) and a single one rotate the same way; none is no calls
    assert cuda_kernel.interleaved_rounds(["auto", "unfused"], 3) == [(0, "auto"), (0, "unfused"), (1, "unfused"),
                                                                        (1, "auto"), (2, "auto"), (2, "unfused")]
    assert cuda_kernel.interleaved_rounds(["auto"], 2) == [(0, "auto"), (1, "auto")]
    assert cuda_kernel.interleaved_rounds([], 4) == []


def test_interleaved_wall_times_the_calls_in_rounds_and_takes_each_variants_median():
    calls_made, now = [], [0.0]

    def clock():
        return now[0]

    def call(v, seconds):
        def fn():
            calls_made.append(v)
            now[0] += seconds[len([c for c in calls_made if c == v]) - 1]
        return fn

    # a: 1, 9, 2 µs (median 2); b: 5 µs every time; c: 3, 4, 100 µs (median 4)
    calls = {"a": call("a", [1e-6, 9e-6, 2e-6]), "b": call("b", [5e-6] * 3), "c": call("c", [3e-6, 4e-6, 100e-6])}
    wall = cuda_kernel.interleaved_wall_us(calls, 3, clock=clock)
    assert calls_made == [v for _, v in cuda_kernel.interleaved_rounds(["a", "b", "c"], 3)]
    assert calls_made == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert wall == pytest.approx({"a": 2.0, "b": 5.0, "c": 4.0})


def test_gemv_is_measured_up_to_its_row_bound_and_skipped_above():
    from onnxfuse.domain import GEMV_MAX_ROWS

    assert cuda_kernel.GEMV_MAX_ROWS == GEMV_MAX_ROWS == 16
    assert cuda_kernel.CUDA_PATHS == ("fused", "fallback", "gemv")
    assert [cuda_kernel.path_skip_reason("gemv", m) for m in (1, 16)] == [None, None]
    assert cuda_kernel.path_skip_reason("gemv", 17) == "not applicable: gemv runs at most 16 rows (M=17)"
    assert all(cuda_kernel.path_skip_reason(p, m) is None for p in ("fused", "fallback", "auto", "unfused")
               for m in (1, 17, 16384))
    assert {m for m in cuda_kernel.GRID_ROWS if cuda_kernel.path_skip_reason("gemv", m) is None} == {1, 2, 4, 8, 16}


def _cell(M, auto, unfused, gemv=None):
    r = {"dtype": "fp16", "approximate": "none", "M": M, "K": 768, "N": 3072, "auto_gpu_us": auto,
         "fused_gpu_us": auto, "fallback_gpu_us": auto * 1.5, "unfused_gpu_us": unfused, "auto_wall_us": auto,
         "unfused_wall_us": unfused, "auto_relerr": 1e-3, "unfused_relerr": 2e-3, "auto_finite": True}
    if gemv is None:
        return r | {"gemv_skipped": cuda_kernel.path_skip_reason("gemv", M)}
    return r | {"gemv_gpu_us": gemv, "gemv_wall_us": gemv, "gemv_relerr": 5e-4, "gemv_finite": True}


def test_grid_verdicts_judge_auto_and_never_a_forced_path():
    assert cuda_kernel.grid_verdicts(_cell(8, 10.0, 12.0, gemv=30.0)) == []  # gemv slower than ORT: measured only
    assert cuda_kernel.grid_verdicts(_cell(128, 10.0, 12.0)) == []
    # auto slower than ORT's GPU time is a miss, however fast gemv was (its wall kept even, to miss once)
    (miss,) = cuda_kernel.grid_verdicts(_cell(8, 13.0, 12.5, gemv=5.0) | {"unfused_wall_us": 13.0})
    assert miss == "fp16 none 8x768x3072: GPU 13.0 us > ORT unfused 12.5 us"


def test_grid_verdicts_judge_gpu_time_inside_the_interleaved_replays_too():
    cell = _cell(8, 10.0, 12.0) | {"auto_replay_gpu_us": 13.0, "unfused_replay_gpu_us": 12.0}
    assert cuda_kernel.grid_verdicts(cell) == ["fp16 none 8x768x3072: GPU in replays 13.0 us > ORT unfused 12.0 us"]
    assert cuda_kernel.grid_verdicts(cell | {"auto_replay_gpu_us": 11.9}) == []


def test_error_noise_is_three_deviations_of_an_error_ratio_over_the_outputs_compared():
    assert cuda_kernel.error_noise(1023) == pytest.approx(3 / 1023 ** 0.5)  # one row of N = 1023: 9.4 %
    assert cuda_kernel.error_noise(512 * 3072) == pytest.approx(0.0024, abs=1e-4)
    assert cuda_kernel.reference_outputs({"M": 16384, "N": 3072}) == 512 * 3072  # the reference's rows
    assert cuda_kernel.reference_outputs({"M": 8, "N": 3072}) == 8 * 3072


def test_grid_verdicts_judge_error_beyond_its_noise_only():
    base = _cell(128, 10.0, 12.0) | {"unfused_relerr": 3.0e-4}
    noise = cuda_kernel.error_noise(128 * 3072)  # 0.48 %
    assert cuda_kernel.grid_verdicts(base | {"auto_relerr": 3.0e-4 * (1 + noise / 2)}) == []
    (miss,) = cuda_kernel.grid_verdicts(base | {"auto_relerr": 3.0e-4 * (1 + 2 * noise)})
    assert miss.startswith("fp16 none 128x768x3072: error 3.03e-04 > ORT unfused 3.00e-04 beyond the measurement's noise")


def test_grid_table_shows_gemv_where_it_ran_and_a_dash_above():
    text = cuda_kernel.grid_table([_cell(8, 10.0, 12.0, gemv=4.0), _cell(128, 11.0, 12.0)])
    head, rows = text.splitlines()[1], text.splitlines()[3:]
    assert "gemv" in head.split()
    gemv_col = head.split().index("gemv")
    cols = {int(r.split()[2]): r.split() for r in rows}
    assert cols[8][gemv_col] == "4.0" and cols[128][gemv_col] == "-"


def test_paths_table_shows_each_forced_path_and_a_dash_where_gemv_was_skipped():
    def row(M, gemv):
        r = {"dtype": "fp16", "M": M, "K": 768, "N": 3072, "fused_gpu_us": 9.0, "fused_wall_us": 19.0,
             "path_fused_gpu_us": 9.5, "path_fused_wall_us": 19.5, "path_fallback_gpu_us": 11.0,
             "path_fallback_wall_us": 21.0}
        if gemv is None:
            return r | {"path_gemv_skipped": cuda_kernel.path_skip_reason("gemv", M)}
        return r | {"path_gemv_gpu_us": gemv, "path_gemv_wall_us": gemv + 10}

    lines = cuda_kernel.paths_table([row(4, 3.0), row(64, None)]).splitlines()
    assert lines[1].split()[6:9] == ["fusedGPU", "fallbackGPU", "gemvGPU"]
    assert lines[3].split() == ["fp16", "4", "768", "3072", "|", "9.0", "9.5", "11.0", "3.0", "|", "19.0", "19.5",
                                "21.0", "13.0"]
    assert lines[4].split() == ["fp16", "64", "768", "3072", "|", "9.0", "9.5", "11.0", "-", "|", "19.0", "19.5",
                                "21.0", "-"]
