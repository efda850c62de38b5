"""Checks and times the GEMM+bias+GELU kernels on their own (no ONNX Runtime): lab/kernels/harness.cu
compiled by build.sh into one .so, called through ctypes on torch CUDA tensors, on torch's current stream.

    python3 lab/kernels/run_device.py LIB.so OUT.json [check] [time] [tactics] [fp16all]

check   : every dtype x activation x transB x bias over aligned, misaligned, odd, tiny and empty shapes;
          error vs a float64 reference against the unfused path's error (mm in the dtype, bias add, GELU:
          what ORT runs), with the output poisoned with NaN first.
tactics : every tactic forced on a shape it takes: same check (a tactic the dispatch never picks still
          has to be right); OFK_TACTICS_MATCH=substring checks only the tactics whose name has it, and
          OFK_TACTICS_SHAPES="MxNxK,..." replaces the one problem (1000x1032x776: a tile per CTA) with others.
fp16all : all 65,536 fp16 (and bf16) bit patterns through the GEMM (identity W), every activation: finite
          wherever float64 is finite.
time    : GPU kernel time (CUPTI via torch.profiler, mean of 30 calls after 5 warm-up, as
          shared/anchors/kernel_time.py) of the dispatch and of every sm90 tactic that fits, against cuBLAS
          (torch.mm) and cuBLASLt's tanh-GELU epilogue (torch._addmm_activation) in the same process.
clocks  : (only when named; a build with OFK_EXPLORE=sched) fp16, W [N, K], shapes OFK_SCHED_SHAPES: cuBLAS and
          the dispatch's tactic with each activation and none, each run back to back for ~1 s while nvidia-smi
          samples the SM clock and the power draw: whether the epilogue's arithmetic costs clock (power) or
          time at the same clock.
swizzle : (only when named; a build with OFK_EXPLORE=sched) fp16, W [N, K], shapes OFK_SCHED_SHAPES: the
          dispatch's tactic with tile-scheduler swizzle 1, 2, 4 and 8 and cuBLAS, in interleaved rounds (the
          H200 runs these shapes at its power cap, so the clock drifts between back-to-back blocks), medians.
sched   : (only when named; a build with OFK_EXPLORE=sched) fp16, W [N, K], shapes OFK_SCHED_SHAPES: cuBLAS and
          the dispatch's tactic with L2 hot (the same X and W every call) and cold (rotating copies, > 120 MB
          together, as inside a model), the tactic with no activation (what the epilogue's math costs), each
          raster order and swizzle size, and the stream-K tiles forced to stream-K / split-K.
forms   : (only when named; a build with OFK_EXPLORE=gelu) fp16, W [N, K], shapes OFK_SCHED_SHAPES: issue #20's
          activation forms (VARIANTS) against the shipped ones, no activation and cuBLAS, on the dispatch's tactic
          and those matching OFK_GROUPS_TACTICS, in interleaved rounds; each variant's error on the problem and
          over all 65,536 fp16 and bf16 values against the shipped form's and the unfused path's.
groups  : (only when named; a build with OFK_EXPLORE=sched) fp16, W [N, K], shapes OFK_SCHED_SHAPES: the dispatch's
          tactic with each activation form as shipped and in chained groups (GROUPS), no activation and
          cuBLAS, in interleaved rounds (OFK_ROUNDS, default 5), medians; each grouped output compared bit
          for bit with the shipped form's.
trace   : (only when named; a build with OFK_EXPLORE=sched) fp16, W [N, K], shapes OFK_SCHED_SHAPES: one launch of
          the dispatch's tactic with the epilogue timeline (erf and none): per SM clock cycles of the math of
          each epilogue step, between the steps of one tile, between one warpgroup's tiles, and from one
          warpgroup's last step to the other's first.
host    : (only when named) host microseconds per call of the launch path (tactic choice, CUTLASS's argument
          set-up, the launch) at row counts where the GPU work is tiny, against launching an empty kernel.
"""
import ctypes
import json
import math
import os
import re
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from cupti import kernel_times_us  # noqa: E402  (bench/cupti.py)

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

LIB = ctypes.CDLL(sys.argv[1])
OUT = sys.argv[2]
MODES = set(sys.argv[3:]) or {"check", "tactics", "fp16all", "time"}  # the others only when named
for fn in ("ofk_launch", "ofk_can_implement", "ofk_workspace"):
    getattr(LIB, fn).restype = ctypes.c_int if fn != "ofk_workspace" else ctypes.c_ulonglong
LIB.ofk_tactic_name.restype = ctypes.c_char_p
LIB.ofk_dispatch_name.restype = ctypes.c_char_p
NTACTICS = LIB.ofk_tactic_count()
TACTICS = [LIB.ofk_tactic_name(i).decode() for i in range(NTACTICS)]
DT = {"fp16": (1, torch.float16), "bf16": (2, torch.bfloat16), "fp32": (0, torch.float32)}
ACTS = {"erf": 0, "tanh": 1, "sigmoid": 2, "none": -1}  # none: OFK_EXPLORE=sched builds only (run_sched)
# OFK_EXPLORE=sched builds only: the fast forms in chained groups of 2-8 elements (run_groups), the erf form
# and no activation with the epilogue timeline (run_trace) (lab/kernels/explore/epilogue_groups.h)
GROUPS = {"erf_g2": -2, "erf_g4": -3, "erf_g8": -4, "tanh_g8": -5, "sigmoid_g8": -6}
ACTS.update(GROUPS, erf_traced=-7, none_traced=-8)
# OFK_EXPLORE=gelu (or sched) builds only: issue #20's erf forms with one MUFU op per element (run_forms;
# explore/epilogue_groups.h): Newton reciprocals with 2 or 3 steps, half the elements so, the shipped arithmetic
# software-pipelined, and the tanh form with 2 Newton steps
VARIANTS = {"erf_nt2": -9, "erf_nt3": -10, "erf_half_nt2": -11, "erf_pipe8": -12, "tanh_nt2": -13}
ACTS.update(VARIANTS)
FORMS = ("erf", "tanh", "sigmoid")  # what the op computes: check, tactics and fp16all go over these
ALPHA = 1.702
RESULTS = {"tactics": TACTICS, "device": torch.cuda.get_device_name(), "check": [], "tactic_check": [],
           "fp16all": [], "time": [], "sched": []}


def ptr(t):
    return ctypes.c_void_p(t.data_ptr() if t is not None else 0)


def common(dt, act, trans_b, tf32, M, N, K, x, w, b, y):
    return (DT[dt][0], ACTS[act], ctypes.c_float(ALPHA), int(trans_b), int(tf32), ctypes.c_longlong(M),
            ctypes.c_longlong(N), ctypes.c_longlong(K), ptr(x), ptr(w), ptr(b), ptr(y))


WS = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")


def launch(tactic, dt, act, trans_b, tf32, M, N, K, x, w, b, y):
    args = common(dt, act, trans_b, tf32, M, N, K, x, w, b, y)
    need = LIB.ofk_workspace(*args)
    assert need <= WS.numel(), need
    rc = LIB.ofk_launch(tactic, *args, ptr(WS), ctypes.c_ulonglong(WS.numel()),
                        ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    return rc


def act64(z, act):
    if act == "erf":
        return 0.5 * z * (1.0 + torch.special.erf(z / math.sqrt(2.0)))
    if act == "tanh":
        return 0.5 * z * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z ** 3)))
    return z * torch.sigmoid(ALPHA * z)


def act_lowp(z, act):
    if act == "erf":
        return torch.nn.functional.gelu(z)
    if act == "tanh":
        return torch.nn.functional.gelu(z, approximate="tanh")
    return z * torch.sigmoid(ALPHA * z)


def make(dt, M, N, K, trans_b, bias, offset_elems=0):
    tt = DT[dt][1]
    g = torch.Generator(device="cuda").manual_seed(1234 + M * 7 + N * 13 + K)
    x = torch.randn(M * K + offset_elems, device="cuda", generator=g, dtype=torch.float32).to(tt)[offset_elems:].view(M, K)
    wv = (torch.randn(N * K + offset_elems, device="cuda", generator=g) / math.sqrt(max(K, 1))).to(tt)[offset_elems:]
    w = wv.view(N, K) if trans_b else wv.view(K, N)
    b = (torch.randn(N, device="cuda", generator=g) * 0.1).to(tt) if bias else None
    return x, w, b


def errors(y, ref):
    d = (y.double() - ref)
    fin = torch.isfinite(ref)
    rel = (d[fin].norm() / ref[fin].norm().clamp_min(1e-30)).item() if ref.numel() else 0.0
    return rel, (d[fin].abs().max().item() if ref.numel() else 0.0)


def check_one(tactic, dt, act, trans_b, tf32, M, N, K, bias, offset=0):
    x, w, b = make(dt, M, N, K, trans_b, bias, offset)
    y = torch.full((M, N), float("nan"), device="cuda", dtype=DT[dt][1])
    rc = launch(tactic, dt, act, trans_b, tf32, M, N, K, x, w, b, y)
    torch.cuda.synchronize()
    wt = w.double().t() if trans_b else w.double()
    z = x.double() @ wt + (b.double() if b is not None else 0.0)
    ref = act64(z, act)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = bool(tf32) and dt == "fp32"
    wl = w.t() if trans_b else w
    zl = x @ wl
    if b is not None:
        zl = zl + b
    unf = act_lowp(zl, act)
    torch.backends.cuda.matmul.allow_tf32 = old
    torch.cuda.synchronize()
    fused_rel, fused_max = errors(y, ref)
    unf_rel, unf_max = errors(unf, ref)
    unwritten = int((~torch.isfinite(y) & torch.isfinite(ref)).sum().item())
    name = LIB.ofk_dispatch_name(*common(dt, act, trans_b, tf32, M, N, K, x, w, b, y)).decode() if tactic < 0 else TACTICS[tactic]
    ok = rc == 0 and unwritten == 0 and (M * N == 0 or fused_rel <= 1.05 * unf_rel + 1e-7)
    return dict(tactic=name, dt=dt, tf32=tf32, act=act, trans_b=trans_b, bias=bias, M=M, N=N, K=K, offset=offset,
                rc=rc, fused_rel=fused_rel, unfused_rel=unf_rel, fused_max=fused_max, unfused_max=unf_max,
                ratio=fused_rel / unf_rel if unf_rel > 0 else 0.0, unwritten=unwritten, ok=ok)


def run_check():
    shapes = [(1, 3072, 768), (7, 136, 64), (4097, 3072, 768), (128, 4096, 1024), (33, 3074, 770),
              (5, 131, 77), (3, 40, 0), (0, 64, 64), (64, 0, 64), (300, 1000, 17)]
    bad = 0
    for dt, tf32 in (("fp16", 1), ("bf16", 1), ("fp32", 1), ("fp32", 0)):
        for trans_b in (1, 0):
            for act in FORMS:
                for bias in (True, False):
                    for (M, N, K) in shapes:
                        r = check_one(-1, dt, act, trans_b, tf32, M, N, K, bias)
                        RESULTS["check"].append(r)
                        bad += not r["ok"]
                        if not r["ok"]:
                            print("FAIL", r)
    # views at odd element offsets: 16-byte-unaligned pointers must fall back, not fault
    for dt in ("fp16", "fp32"):
        r = check_one(-1, dt, "erf", 1, 1, 100, 256, 128, True, offset=1)
        RESULTS["check"].append(r)
        bad += not r["ok"]
        if not r["ok"]:
            print("FAIL", r)
    worst = {}
    for r in RESULTS["check"]:
        if r["M"] * r["N"] and r["unfused_rel"] > 0:
            k = (r["dt"], r["tf32"])
            worst[k] = max(worst.get(k, 0), r["ratio"])
    print(f"check: {len(RESULTS['check'])} cases, {bad} failed; worst fused/unfused rel-L2 ratio per dtype:",
          {f"{k[0]}{'' if k[1] else '-strict'}": round(v, 3) for k, v in worst.items()})


def run_tactics():
    bad = 0
    only = os.environ.get("OFK_TACTICS_MATCH", "")  # a substring: check just those tactics
    # OFK_TACTICS_SHAPES="MxNxK,..." (default one problem of 72 tiles of 128x128: under a wave, a tile per CTA);
    # more tiles than SMs reach what a persistent kernel does between tiles.
    problems = [tuple(int(v) for v in s.split("x")) for s in os.environ.get("OFK_TACTICS_SHAPES", "1000x1032x776").split(",")]
    for i, name in enumerate(TACTICS):
        if only not in name:
            continue
        for dt, tf32 in (("fp16", 1), ("bf16", 1), ("fp32", 1), ("fp32", 0)):
            for trans_b, (M, N, K) in ((t, p) for t in (1, 0) for p in problems):
                x, w, b = make(dt, M, N, K, trans_b, True)
                y = torch.empty(M, N, device="cuda", dtype=DT[dt][1])
                if not LIB.ofk_can_implement(i, *common(dt, "erf", trans_b, tf32, M, N, K, x, w, b, y)):
                    continue
                # A single row is checked on the 16-bit and strict-fp32 paths only: cuBLAS computes an fp32
                # [1, K] x [K, N] product without TF32 even when allowed (so its error is fp32-level), and the
                # dispatch does the same (M <= 16 never runs TF32), but a TF32 tactic forced here cannot.
                rows = ((M, True), (129, True)) if dt == "fp32" and tf32 else ((M, True), (1, False), (129, True))
                for act in FORMS:
                    for (MM, bias) in rows:
                        r = check_one(i, dt, act, trans_b, tf32, MM, N, K, bias)
                        RESULTS["tactic_check"].append(r)
                        bad += not r["ok"]
                        if not r["ok"]:
                            print("FAIL", r)
    print(f"tactics: {len(RESULTS['tactic_check'])} cases over {len(set(r['tactic'] for r in RESULTS['tactic_check']))} tactics, {bad} failed")


def run_fp16all():
    for dt in ("fp16", "bf16"):
        tt = DT[dt][1]
        vals = torch.arange(-32768, 32768, dtype=torch.int32, device="cuda").to(torch.int16).view(tt)
        M, K, N = vals.numel(), 8, 8
        x = torch.zeros(M, K, dtype=tt, device="cuda")
        x[:, 0] = vals
        w = torch.eye(N, K, dtype=tt, device="cuda")
        for act in FORMS:
            y = torch.full((M, N), float("nan"), dtype=tt, device="cuda")
            rc = launch(-1, dt, act, 1, 1, M, N, K, x, w, None, y)
            torch.cuda.synchronize()
            ref = act64(vals.double(), act)
            got = y[:, 0].double()
            fin = torch.isfinite(ref)
            nonfinite = int((~torch.isfinite(got) & fin).sum().item())
            # error in units of the output dtype's rounding: |got - ref| / ulp(ref)
            err = (got[fin] - ref[fin]).abs()
            # one output ulp at |ref| (at least the smallest fp16 subnormal, so the far negative tail counts as 0)
            tol = (ref[fin].abs() * torch.finfo(tt).eps).clamp_min(2.0 ** -24)
            nan_in = torch.isnan(vals.double())
            nan_ok = bool(torch.isnan(got[nan_in]).all().item())
            r = dict(dt=dt, act=act, rc=rc, nonfinite_where_ref_finite=nonfinite, max_err_in_eps=(err / tol).max().item(),
                     nan_propagates=nan_ok)
            RESULTS["fp16all"].append(r)
            print("all-values", r)


def run_sanitize():
    """A size sweep for compute-sanitizer (memcheck / racecheck): run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so
    every tensor is its own exact-size cudaMalloc and an overrun past any buffer is seen. Every tactic, forced,
    on every shape it takes."""
    import os
    n = 0
    shapes = [(1, 8, 8), (7, 136, 72), (129, 264, 64), (65, 24, 136), (3, 131, 77), (2, 40, 0), (300, 520, 200)]
    if os.environ.get("OFK_SAN_SMALL"):  # racecheck is slow: one aligned and one odd shape
        shapes = [(129, 264, 64), (3, 131, 77)]
    # OFK_SAN_SHAPES="MxNxK,..." adds problems; OFK_TACTICS_MATCH (a substring) sweeps just those tactics.
    shapes += [tuple(int(v) for v in s.split("x")) for s in os.environ.get("OFK_SAN_SHAPES", "").split(",") if s]
    only = os.environ.get("OFK_TACTICS_MATCH", "")
    for i, name in enumerate(TACTICS + ["dispatch"]):
        if only not in name:
            continue
        tactic = -1 if name == "dispatch" else i
        for dt, tf32 in (("fp16", 1), ("bf16", 1), ("fp32", 1), ("fp32", 0)):
            for trans_b in (1, 0):
                for (M, N, K) in shapes:
                    x, w, b = make(dt, M, N, K, trans_b, True)
                    y = torch.empty(M, N, device="cuda", dtype=DT[dt][1])
                    if tactic >= 0 and not LIB.ofk_can_implement(tactic, *common(dt, "erf", trans_b, tf32, M, N, K, x, w, b, y)):
                        continue
                    for bias in (b, None):
                        rc = launch(tactic, dt, "erf" if n % 2 else "tanh", trans_b, tf32, M, N, K, x, w, bias, y)
                        assert rc == 0, (name, dt, M, N, K, rc)
                        n += 1
    torch.cuda.synchronize()
    print(f"sanitize sweep: {n} launches")


def gpu_us(fn, n=30):
    """Sum of the GPU kernel time per call (0 when ``fn`` launched nothing, e.g. a tactic that refused)."""
    return sum(kernel_times_us(fn, reps=n, warmup=5).values())


SHAPES = [(128, 768, 3072), (1024, 768, 3072), (4096, 768, 3072), (16384, 768, 3072), (128, 1024, 4096),
          (4096, 1024, 4096), (16384, 1024, 4096), (128, 4096, 16384), (2048, 4096, 16384), (8192, 4096, 16384)]
# OFK_EXTRA_SHAPES="197x768x3072,1576x768x3072" (M x K x N) adds shapes, e.g. the end-to-end models' MLPs.
SHAPES += [tuple(int(v) for v in s.split("x")) for s in os.environ.get("OFK_EXTRA_SHAPES", "").split(",") if s]


def run_time():
    rows = []
    sets = [(c[:-1], int(c[-1])) for c in os.environ.get("OFK_TIME_SET", "fp161,bf161,bf160,fp321").split(",")]
    for dt, trans_b in sets:
        tt = DT[dt][1]
        for (M, K, N) in SHAPES:
            x, w, b = make(dt, M, N, K, trans_b, True)
            wl = w.t() if trans_b else w
            y = torch.empty(M, N, device="cuda", dtype=tt)
            r = {"dt": dt, "trans_b": trans_b, "M": M, "K": K, "N": N}
            torch.backends.cuda.matmul.allow_tf32 = dt == "fp32"
            r["cublas_mm"] = gpu_us(lambda: torch.mm(x, wl))
            if dt != "fp32":
                r["cublaslt_tanh"] = gpu_us(lambda: torch._addmm_activation(b, x, wl, use_gelu=True))
            torch.backends.cuda.matmul.allow_tf32 = False
            r["dispatch_name"] = LIB.ofk_dispatch_name(*common(dt, "erf", trans_b, 1, M, N, K, x, w, b, y)).decode()
            r["fused"] = gpu_us(lambda: launch(-1, dt, "erf", trans_b, 1, M, N, K, x, w, b, y))
            r["tactics"] = {}
            for i, name in enumerate(TACTICS):
                if name.startswith("fallback"):
                    continue
                if LIB.ofk_can_implement(i, *common(dt, "erf", trans_b, 1, M, N, K, x, w, b, y)):
                    r["tactics"][name] = gpu_us(lambda: launch(i, dt, "erf", trans_b, 1, M, N, K, x, w, b, y))
            if trans_b and (M, K, N) in ((4096, 768, 3072), (128, 4096, 16384), (16384, 1024, 4096)):
                for act in ("tanh", "sigmoid"):
                    r["fused_" + act] = gpu_us(lambda: launch(-1, dt, act, 1, 1, M, N, K, x, w, b, y))
                r["fused_nobias"] = gpu_us(lambda: launch(-1, dt, "erf", 1, 1, M, N, K, x, w, None, y))
            r["best_tactic"] = min(r["tactics"], key=r["tactics"].get) if r["tactics"] else None
            r["fused_over_mm"] = r["fused"] / r["cublas_mm"]
            rows.append(r)
            RESULTS["time"].append(r)
            del x, w, b, y, wl
            torch.cuda.empty_cache()
    print(f"{'dt':5} tB {'M':>6} {'K':>5} {'N':>6} {'mm':>8} {'lt_tanh':>8} {'fused':>8} {'f/mm':>6} {'f/lt':>6}  dispatch -> best tactic (us)")
    for r in rows:
        lt = r.get("cublaslt_tanh")
        bt = r["best_tactic"]
        print(f"{r['dt']:5} {r['trans_b']:2} {r['M']:6} {r['K']:5} {r['N']:6} {r['cublas_mm']:8.1f} {lt if lt else float('nan'):8.1f} "
              f"{r['fused']:8.1f} {r['fused_over_mm']:6.3f} {(r['fused'] / lt) if lt else float('nan'):6.3f}  "
              f"{r['dispatch_name'].split('_', 3)[-1]} -> {bt.split('_', 3)[-1] if bt else '-'} "
              f"{r['tactics'].get(bt, float('nan')):.1f}")


def fp16_problems(default_shapes):
    """The OFK_SCHED_SHAPES problems (fp16, W [N, K], with bias): (M, K, N, x, w, b, y, dispatch's tactic index)."""
    for spec in os.environ.get("OFK_SCHED_SHAPES", default_shapes).split(","):
        M, K, N = (int(v) for v in spec.split("x"))
        x, w, b = make("fp16", M, N, K, 1, True)
        y = torch.empty(M, N, device="cuda", dtype=torch.float16)
        d = TACTICS.index(LIB.ofk_dispatch_name(*common("fp16", "erf", 1, 1, M, N, K, x, w, b, y)).decode())
        yield M, K, N, x, w, b, y, d


def interleaved_rounds(runs):
    """Each of ``runs`` (name -> fn returning us) once per round, OFK_ROUNDS rounds: (medians, all values)."""
    import statistics
    got = {k: [] for k in runs}
    for _ in range(int(os.environ.get("OFK_ROUNDS", "5"))):
        for k, fn in runs.items():
            got[k].append(fn())
    return {k: statistics.median(v) for k, v in got.items()}, got


def run_sched():
    shapes = "1024x768x3072,1576x768x3072,4096x768x3072,16384x768x3072,4096x1024x4096"
    for M, K, N, x, w, b, y, d in fp16_problems(shapes):
        copies = max(2, math.ceil(120e6 / (2 * (M * K + N * K))))  # rotating operands: > 120 MB, twice L2
        xs = [x.clone() for _ in range(copies)]
        ws = [w.clone() for _ in range(copies)]
        turn = [0]

        def nxt():
            turn[0] = (turn[0] + 1) % copies
            return turn[0]

        def fused(tactic, act="erf", cold=False, env=None):
            saved = {k: os.environ.get(k) for k in (env or {})}
            os.environ.update({k: str(v) for k, v in (env or {}).items()})
            try:
                if not LIB.ofk_can_implement(tactic, *common("fp16", act, 1, 1, M, N, K, x, w, b, y)):
                    return None
                if cold:
                    return gpu_us(lambda: (lambda i: launch(tactic, "fp16", act, 1, 1, M, N, K, xs[i], ws[i], b, y))(nxt()))
                return gpu_us(lambda: launch(tactic, "fp16", act, 1, 1, M, N, K, x, w, b, y))
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v

        name = TACTICS[d]
        r = {"M": M, "K": K, "N": N, "dispatch": name, "cold_copies": copies,
             "cublas_hot": gpu_us(lambda: torch.mm(x, w.t())),
             "cublas_cold": gpu_us(lambda: (lambda i: torch.mm(xs[i], ws[i].t()))(nxt())),
             "fused_hot": fused(d), "fused_cold": fused(d, cold=True),
             "identity_hot": fused(d, "none"), "identity_cold": fused(d, "none", cold=True)}
        for raster in (1, 2):
            r[f"raster{raster}_cold"] = fused(d, cold=True, env={"OFK_RASTER": raster})
        for swizzle in (2, 4, 8):
            r[f"swizzle{swizzle}_cold"] = fused(d, cold=True, env={"OFK_SWIZZLE": swizzle})
        for i, tname in enumerate(TACTICS):  # every other fp16 W [N, K] tile, cold
            if tname.startswith("sm90_f16_tn_") and "_sk_" not in tname and i != d:
                r[f"{tname.split('_tn_')[-1]}_cold"] = fused(i, cold=True)
        for i, tname in enumerate(TACTICS):
            if "_sk_" not in tname:
                continue
            for label, env in (("streamk", {"OFK_DECOMP": 3}), ("splitk2", {"OFK_DECOMP": 2, "OFK_SPLITS": 2}),
                               ("splitk3", {"OFK_DECOMP": 2, "OFK_SPLITS": 3}), ("heuristic", {})):
                r[f"{tname.split('_tn_')[-1]}_{label}_cold"] = fused(i, cold=True, env=env)
        RESULTS["sched"].append(r)
        del xs, ws
        torch.cuda.empty_cache()
        others = {k: v for k, v in r.items()
                  if k.endswith("_cold") and k not in ("cublas_cold", "fused_cold", "identity_cold") and v is not None}
        best = min(others, key=others.get, default=None)
        print(f"{M}x{K}x{N} {name.split('_tn_')[-1]}: cuBLAS hot {r['cublas_hot']:.1f} cold {r['cublas_cold']:.1f} | "
              f"fused hot {r['fused_hot']:.1f} cold {r['fused_cold']:.1f} | no activation hot {r['identity_hot']:.1f} "
              f"cold {r['identity_cold']:.1f} | best other (cold) {best} {r[best] if best else float('nan'):.1f}",
              flush=True)


def run_swizzle():
    for M, K, N, x, w, b, y, d in fp16_problems("8192x4096x16384,2048x4096x16384,16384x1024x4096"):

        def fused(swizzle):
            os.environ["OFK_SWIZZLE"] = str(swizzle)
            try:
                return gpu_us(lambda: launch(d, "fp16", "erf", 1, 1, M, N, K, x, w, b, y), n=10)
            finally:
                os.environ.pop("OFK_SWIZZLE", None)

        runs = {"cublas": lambda: gpu_us(lambda: torch.mm(x, w.t()), n=10)}
        runs.update({f"swizzle{s}": (lambda s: lambda: fused(s))(s) for s in (1, 2, 4, 8)})
        medians, got = interleaved_rounds(runs)
        r = {"M": M, "K": K, "N": N, "dispatch": TACTICS[d], **medians,
             "all": got}
        RESULTS.setdefault("swizzle", []).append(r)
        print(f"{M}x{K}x{N} {TACTICS[d].split('_tn_')[-1]}: " +
              " | ".join(f"{k} {r[k]:.1f}" for k in runs), flush=True)


def record_rounds(mode, shape, dispatch, runs, same):
    """Times ``runs`` in interleaved rounds and records them under RESULTS[mode], with ``same`` (variant -> whether
    its output was bit-identical to its reference)."""
    M, K, N = shape
    medians, got = interleaved_rounds(runs)
    r = {"M": M, "K": K, "N": N, "dispatch": TACTICS[dispatch], **medians, "bit_identical": same, "all": got}
    RESULTS.setdefault(mode, []).append(r)
    print(f"{M}x{K}x{N} {TACTICS[dispatch].split('_tn_')[-1]}: " + " | ".join(f"{k} {r[k]:.1f}" for k in runs) +
          f" | bit-identical: {all(same.values())} {[k for k, v in same.items() if not v]}", flush=True)


def bit_identical(problem, ref, other):
    """Whether tactic/form ``other`` writes exactly the fp16 bits of ``ref`` (each a (tactic index, form) pair)."""
    M, K, N, x, w, b, y = problem
    want = torch.empty_like(y)
    assert launch(ref[0], "fp16", ref[1], 1, 1, M, N, K, x, w, b, want) == 0
    y.fill_(float("nan"))
    assert launch(other[0], "fp16", other[1], 1, 1, M, N, K, x, w, b, y) == 0
    return bool(torch.equal(y.view(torch.int16), want.view(torch.int16)))


def with_extra_tactics(d, M, K, N, x, w, b, y):
    """The dispatch's tactic ``d``, then the fp16 W [N, K] tactics whose names match OFK_GROUPS_TACTICS (a regex)
    and that take the problem."""
    extra = os.environ.get("OFK_GROUPS_TACTICS")
    return [d] + ([i for i, t in enumerate(TACTICS) if "_f16_tn_" in t and re.search(extra, t) and i != d and
                   LIB.ofk_can_implement(i, *common("fp16", "erf", 1, 1, M, N, K, x, w, b, y))] if extra else [])


def run_groups():
    """The activation in chained groups (sparser issue, same values) on the dispatch's tactic, and on the tactics
    whose names match OFK_GROUPS_TACTICS (a regex; e.g. the overlapped ping-pong kernel's "ppo_128")."""
    default = "1024x768x3072,4096x768x3072,6304x768x3072,16384x768x3072,4096x1024x4096,2048x4096x16384"
    for M, K, N, x, w, b, y, d in fp16_problems(os.environ.get("OFK_SCHED_SHAPES", default)):
        tactics = with_extra_tactics(d, M, K, N, x, w, b, y)
        same = {}
        runs = {"cublas": lambda: gpu_us(lambda: torch.mm(x, w.t()), n=10)}
        for i in tactics:
            tag = "" if i == d else TACTICS[i].split("_tn_")[-1] + " "
            for act in GROUPS:
                shipped = act.split("_")[0]  # the same values, bit for bit
                same[tag + act] = bit_identical((M, K, N, x, w, b, y), (d, shipped), (i, act))
            for act in ("none", "erf", "tanh", "sigmoid", *GROUPS):
                runs[tag + act] = (lambda i, a: lambda: gpu_us(
                    lambda: launch(i, "fp16", a, 1, 1, M, N, K, x, w, b, y), n=10))(i, act)
        record_rounds("groups", (M, K, N), d, runs, same)


def run_overlap():
    """The per-warp-epilogue kernels (overlapped ping-pong "ppo_*", split-N "coopn_*") against the dispatch's tactic,
    the CUTLASS tiles they replaced, and cuBLAS: outputs bit for bit (same math, same rounding, another store path)
    and GPU time in interleaved rounds. OFK_OVERLAP_MATCH (a regex on tactic names) picks the tactics."""
    default = ("128x768x3072,197x768x3072,1024x768x3072,1576x768x3072,4096x768x3072,6304x768x3072,16384x768x3072,"
               "4096x1024x4096,2048x4096x16384")
    for M, K, N, x, w, b, y, d in fp16_problems(os.environ.get("OFK_SCHED_SHAPES", default)):
        runs = {"cublas": lambda: gpu_us(lambda: torch.mm(x, w.t()), n=10)}
        same = {}
        match = re.compile(os.environ.get("OFK_OVERLAP_MATCH", "_f16_tn_(ppo_|pp_64x|pp_128x128_c1x2_e|coop_128x192_c2x1_e|coopn_)"))
        for i in [d] + [i for i, t in enumerate(TACTICS) if match.search(t) and i != d]:
            if not LIB.ofk_can_implement(i, *common("fp16", "erf", 1, 1, M, N, K, x, w, b, y)):
                continue
            name = TACTICS[i].split("_tn_")[-1]
            for act in FORMS if i != d else ():
                same[f"{name} {act}"] = bit_identical((M, K, N, x, w, b, y), (d, act), (i, act))
            for act in ("erf", "tanh"):
                runs[f"{name} {act}"] = (lambda i, a: lambda: gpu_us(
                    lambda: launch(i, "fp16", a, 1, 1, M, N, K, x, w, b, y), n=10))(i, act)
        record_rounds("overlap", (M, K, N), d, runs, same)


def run_trace():
    import statistics
    LIB.ofk_set_trace.argtypes = [ctypes.c_void_p]
    cap = 1 << 20
    for M, K, N, x, w, b, y, d in fp16_problems(os.environ.get("OFK_SCHED_SHAPES", "4096x768x3072,16384x768x3072")):
        for act in ("erf_traced", "none_traced"):
            for _ in range(3):
                launch(d, "fp16", act, 1, 1, M, N, K, x, w, b, y)  # warm, untraced
            buf = torch.zeros(1 + 2 * cap, dtype=torch.int64, device="cuda")
            LIB.ofk_set_trace(ctypes.c_void_p(buf.data_ptr()))
            assert launch(d, "fp16", act, 1, 1, M, N, K, x, w, b, y) == 0
            torch.cuda.synchronize()
            LIB.ofk_set_trace(None)
            n = min(int(buf[0].item()), cap)
            rec = buf[1:1 + 2 * n].view(n, 2).cpu().tolist()
            # per (SM, warp): the start and end clocks of each call, in order
            calls = {}
            for clock, meta in rec:
                sm, warp, end = meta & 0xFF, (meta >> 8) & 0xFF, (meta >> 16) & 0xF
                calls.setdefault((sm, warp), {0: [], 1: []})[end].append(clock)
            math, step, tile, handoff = [], [], [], []
            warps = sorted({wp for _, wp in calls})
            first = [wp for wp in warps if wp % 4 == 0]  # warp 0 of each consumer warpgroup
            for (sm, warp), c in calls.items():
                if warp not in first:
                    continue
                st, en = sorted(c[0]), sorted(c[1])
                math += [e - s0 for s0, e in zip(st, en)]
                step += [st[i + 1] - st[i] for i in range(0, len(st) - 1, 2)]        # step 0 -> step 1 of a tile
                tile += [st[i + 2] - st[i] for i in range(0, len(st) - 2, 2)]        # tile -> this warpgroup's next
            for sm in {s for s, _ in calls}:
                if len(first) < 2 or (sm, first[0]) not in calls or (sm, first[1]) not in calls:
                    continue
                a, bq = sorted(calls[(sm, first[0])][1]), sorted(calls[(sm, first[1])][0])
                # each epilogue of the second warpgroup against the last math end of the first before it
                for s0 in bq[0::2]:
                    prev = [e for e in a if e <= s0]
                    if prev:
                        handoff.append(s0 - prev[-1])
            med = lambda v: statistics.median(v) if v else float("nan")
            r = {"M": M, "K": K, "N": N, "dispatch": TACTICS[d], "act": act, "records": n, "warps": warps,
                 "math_cycles": med(math), "step_to_step_cycles": med(step), "tile_to_tile_cycles": med(tile),
                 "other_wg_math_end_to_start_cycles": med(handoff),
                 "gpu_us": gpu_us(lambda: launch(d, "fp16", act, 1, 1, M, N, K, x, w, b, y), n=10)}
            RESULTS.setdefault("trace", []).append(r)
            print(f"{M}x{K}x{N} {act}: {n} records, warps {warps}; median cycles: math {r['math_cycles']:.0f}, "
                  f"step 0 -> 1 {r['step_to_step_cycles']:.0f}, tile -> next tile (same warpgroup) "
                  f"{r['tile_to_tile_cycles']:.0f}, other warpgroup's math end -> start "
                  f"{r['other_wg_math_end_to_start_cycles']:.0f}; {r['gpu_us']:.1f} us", flush=True)


def run_clocks():
    import statistics
    import subprocess
    query = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"
    if subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv"], capture_output=True).returncode:
        query = query.replace("clocks_event_reasons", "clocks_throttle_reasons")  # older drivers' name
    for M, K, N, x, w, b, y, d in fp16_problems("4096x768x3072,16384x768x3072,2048x4096x16384"):
        runs = {"cublas": lambda: torch.mm(x, w.t())}
        for act in ("none", "sigmoid", "tanh", "erf"):
            runs[act] = (lambda a: lambda: launch(d, "fp16", a, 1, 1, M, N, K, x, w, b, y))(act)
        for label, fn in runs.items():
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            per_call = gpu_us(fn)
            calls = max(50, int(1.2e6 / per_call))
            smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits",
                                    "-lms", "50"], stdout=subprocess.PIPE, text=True)
            time.sleep(0.2)
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            stop.record()
            torch.cuda.synchronize()
            smi.terminate()
            rows = [r.split(", ") for r in smi.communicate()[0].strip().splitlines()]
            rows = rows[len(rows) // 4:]  # the loop's steady state: skip the first quarter
            clk = statistics.median(float(r[0]) for r in rows)
            pwr = statistics.median(float(r[1]) for r in rows)
            r = {"M": M, "K": K, "N": N, "run": label, "us_per_call_loop": start.elapsed_time(stop) * 1e3 / calls,
                 "us_cupti": per_call, "sm_mhz": clk, "power_w": pwr, "temp_c": float(rows[-1][2]),
                 "event_reasons": sorted({r[3] for r in rows}), "samples": len(rows)}
            RESULTS.setdefault("clocks", []).append(r)
            print(f"{M}x{K}x{N} {label:8s} {r['us_per_call_loop']:8.1f} us/call (CUPTI {per_call:7.1f}) "
                  f"SM {clk:6.0f} MHz  {pwr:5.0f} W  reasons {r['event_reasons']}", flush=True)


def run_forms():
    default = "4096x384x1536,32768x384x1536,4096x768x3072,16384x768x3072,4096x1024x4096"
    for M, K, N, x, w, b, y, d in fp16_problems(os.environ.get("OFK_SCHED_SHAPES", default)):
        tactics = with_extra_tactics(d, M, K, N, x, w, b, y)
        z = x.double() @ w.double().t() + b.double()
        unfused = {f: errors(act_lowp(x @ w.t() + b, f), act64(z, f))[0] for f in ("erf", "tanh")}
        accuracy = {}
        for act in ("erf", "tanh", *VARIANTS):
            form = act.split("_")[0]
            y.fill_(float("nan"))
            assert launch(d, "fp16", act, 1, 1, M, N, K, x, w, b, y) == 0
            rel = errors(y, act64(z, form))[0]
            accuracy[act] = {"rel": rel, "vs_unfused": rel / unfused[form]}
        same = {"erf_pipe8": bit_identical((M, K, N, x, w, b, y), (d, "erf"), (d, "erf_pipe8"))}
        runs = {"cublas": lambda: gpu_us(lambda: torch.mm(x, w.t()), n=10)}
        for i in tactics:
            tag = "" if i == d else TACTICS[i].split("_tn_")[-1] + " "
            for act in ("none", "erf", "tanh", "sigmoid", *VARIANTS):
                runs[tag + act] = (lambda i, a: lambda: gpu_us(
                    lambda: launch(i, "fp16", a, 1, 1, M, N, K, x, w, b, y), n=10))(i, act)
        record_rounds("forms", (M, K, N), d, runs, same)
        RESULTS["forms"][-1]["accuracy"] = accuracy
        print("  accuracy (rel-L2 vs float64; / the unfused path's): " +
              " | ".join(f"{k} {v['rel']:.3g} ({v['vs_unfused']:.3f})" for k, v in accuracy.items()), flush=True)
    for dt in ("fp16", "bf16"):  # every 16-bit value through the GEMM (identity W), as run_fp16all
        tt = DT[dt][1]
        vals = torch.arange(-32768, 32768, dtype=torch.int32, device="cuda").to(torch.int16).view(tt)
        x = torch.zeros(vals.numel(), 8, dtype=tt, device="cuda")
        x[:, 0] = vals
        w = torch.eye(8, 8, dtype=tt, device="cuda")
        for act in ("erf", "tanh", *VARIANTS):
            form = act.split("_")[0]
            y = torch.full((vals.numel(), 8), float("nan"), dtype=tt, device="cuda")
            assert launch(-1, dt, act, 1, 1, vals.numel(), 8, 8, x, w, None, y) == 0
            ref = act64(vals.double(), form)
            fin = torch.isfinite(ref)
            got, unf = y[:, 0].double()[fin], act_lowp(vals, form).double()[fin]
            ulp = (ref[fin].abs() * torch.finfo(tt).eps).clamp_min(2.0 ** -24)
            err, unf_err = (got - ref[fin]).abs(), (unf - ref[fin]).abs()
            r = dict(dt=dt, act=act, nonfinite_where_ref_finite=int((~torch.isfinite(got)).sum().item()),
                     max_err_ulp=(err / ulp).max().item(),
                     rel_l2_vs_unfused=((err.norm() / unf_err.norm().clamp_min(1e-30)).item()),
                     over_unfused_plus_1ulp=int((err > unf_err + ulp).sum().item()))
            RESULTS.setdefault("forms_all_values", []).append(r)
            print("all-values", r, flush=True)


def run_ncu():  # one shape and tactic (OFK_NCU="MxKxN[:tactic name]", default the dispatch's), 5 launches
    act = os.environ.get("OFK_NCU_ACT", "erf")  # "none" in OFK_EXPLORE=sched builds
    dims, _, name = os.environ.get("OFK_NCU", "4096x768x3072").partition(":")
    M, K, N = (int(v) for v in dims.split("x"))
    x, w, b = make("fp16", M, N, K, 1, True)
    y = torch.empty(M, N, device="cuda", dtype=torch.float16)
    for _ in range(5):
        launch(TACTICS.index(name) if name else -1, "fp16", act, 1, 1, M, N, K, x, w, b, y)
    torch.cuda.synchronize()


def run_host():  # host cost of the launch path, fp16 and fp32, at row counts where the GPU work is tiny
    LIB.ofk_host_ns.restype = ctypes.c_int
    out = (ctypes.c_double * 4)()
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    for dt in ("fp16", "fp32"):
        for M, K, N in ((1, 1024, 1024), (16, 768, 3072), (128, 768, 3072), (4096, 768, 3072)):
            x, w, b = make(dt, M, N, K, 1, True)
            y = torch.empty(M, N, device="cuda", dtype=DT[dt][1])
            samples = []
            for _ in range(7):
                torch.cuda.synchronize()
                rc = LIB.ofk_host_ns(DT[dt][0], ACTS["erf"], 1, ctypes.c_longlong(M), ctypes.c_longlong(N),
                                     ctypes.c_longlong(K), ptr(x), ptr(w), ptr(b), ptr(y), stream, 100, out)
                assert rc == 0, rc
                samples.append(tuple(out))
            torch.cuda.synchronize()
            med = [sorted(s[i] for s in samples)[len(samples) // 2] / 1e3 for i in range(4)]
            tactic = LIB.ofk_dispatch_name(*common(dt, "erf", 1, 1, M, N, K, x, w, b, y)).decode()
            r = {"dtype": dt, "M": M, "K": K, "N": N, "tactic": tactic, "plan_and_launch_us": med[0],
                 "plan_us": med[1], "empty_kernel_launch_us": med[2], "two_func_set_attribute_us": med[3]}
            RESULTS.setdefault("host", []).append(r)
            print(f"host {dt} {M}x{K}x{N} {tactic}: plan + launch {med[0]:.2f} us (plan {med[1]:.2f}), empty "
                  f"kernel launch {med[2]:.2f}, 2x cudaFuncSetAttribute {med[3]:.2f}", flush=True)


RUNS = {"check": run_check, "tactics": run_tactics, "fp16all": run_fp16all, "time": run_time,
        "sanitize": run_sanitize, "sched": run_sched, "groups": run_groups, "forms": run_forms, "overlap": run_overlap, "trace": run_trace, "clocks": run_clocks, "swizzle": run_swizzle, "ncu": run_ncu,
        "host": run_host}
t0 = time.time()
try:
    for mode, run in RUNS.items():  # in this order, whatever the order on the command line
        if mode in MODES:
            run()
finally:
    RESULTS["seconds"] = time.time() - t0
    with open(OUT, "w") as f:
        json.dump(RESULTS, f, indent=1)
