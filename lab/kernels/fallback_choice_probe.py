"""How much the fallback's once-per-session algorithm choice moves its GPU time, for two builds of the library: one
fresh session after another on the same few-rows problem (each settles its own timed choice on its first calls),
GPU time per call by CUPTI. For grid cells that flip between grids, this tells a library change from the spread
of the choice itself. Each library runs in its own process (both register the same op).

    python3 lab/kernels/fallback_choice_probe.py LIB_A.so LIB_B.so [--sessions 8] [--shape 4095x1023]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))  # onnxfuse.domain
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))  # cupti.py


def _model(dtype, k, n, w, b):
    from onnx import TensorProto, helper, numpy_helper

    from onnxfuse.domain import DOMAIN, DOMAIN_VERSION

    t = TensorProto.FLOAT16 if dtype == "float16" else TensorProto.FLOAT
    node = helper.make_node("FusedLinearGelu", ["X", "W", "B"], ["Y"], domain=DOMAIN, approximate="tanh", transB=1)
    g = helper.make_graph([node], "probe", [helper.make_tensor_value_info("X", t, ["M", k])],
                          [helper.make_tensor_value_info("Y", t, ["M", n])],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
                             ir_version=10)


def run_one(library, k, n, sessions):
    import onnxruntime as ort
    from cupti import kernel_times_us

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    out = {}
    rng = np.random.default_rng(0)
    for dtype in ("float16", "float32"):
        np_t = np.float16 if dtype == "float16" else np.float32
        w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np_t)
        b = (rng.standard_normal(n) * 0.1).astype(np_t)
        model = _model(dtype, k, n, w, b).SerializeToString()
        for m in (1, 2, 4, 8):
            x = rng.standard_normal((m, k)).astype(np_t)
            times = []
            for _ in range(sessions):
                so = ort.SessionOptions()
                so.register_custom_ops_library(library)
                sess = ort.InferenceSession(model, so, providers=["CUDAExecutionProvider"])
                for _ in range(3):  # the fallback settles its timed choice on its first calls
                    sess.run(None, {"X": x})
                times.append(sum(kernel_times_us(lambda: sess.run(None, {"X": x}), reps=20, warmup=3).values()))
            out[f"{dtype} {m}x{k}x{n}"] = times
    return out


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        json.dump(run_one(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])), sys.stdout)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib_a")
    ap.add_argument("lib_b")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--shape", default="4095x1023", help="K x N")
    a = ap.parse_args()
    k, n = (int(v) for v in a.shape.split("x"))
    runs = []
    for lib in (a.lib_a, a.lib_b):
        cmd = [sys.executable, os.path.abspath(__file__), "--one", os.path.abspath(lib), str(k), str(n), str(a.sessions)]
        runs.append(json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout))
    print(f"GPU us per call over {a.sessions} fresh sessions each: median [min, max]")
    for case in runs[0]:
        cells = [f"{statistics.median(r[case]):.1f} [{min(r[case]):.1f}, {max(r[case]):.1f}]" for r in runs]
        print(f"{case}: A {cells[0]} | B {cells[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
