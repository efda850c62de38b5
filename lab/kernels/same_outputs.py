"""Whether two builds of the custom-op library write the same bits: for a change that must not move a value (a new
instruction order, a kernel swapped for one whose arithmetic is the same), the answer is "identical" or the cases
that differ. Each library runs in its own process (both register the same domain and op), on the same inputs.

    python3 lab/kernels/same_outputs.py LIB_A.so LIB_B.so [--shapes MxKxN,...]

Every shape x {float16, bfloat16} x {erf, tanh, sigmoid} x transB {1, 0}, with a bias, through ORT's CUDA provider.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # onnxfuse.domain

SHAPES = "4096x384x1536,4097x384x1544,32768x384x1536,4096x768x3072,4097x768x3000,512x768x3072,16x1024x4096,1x768x3072"
DTYPES = ("float16", "bfloat16")
FORMS = ("none", "tanh", "sigmoid")  # the op's `approximate`: none is the exact erf GELU


def _rounded(a, dtype):
    """float32 values exactly representable in ``dtype``, and their TensorProto bits."""
    import ml_dtypes

    t = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    low = a.astype(t)
    return low.astype(np.float32), low.view(np.uint16).tobytes()


def _model(dtype, k, w, b, approximate, trans_b):
    """X (float32) -> Cast -> FusedLinearGelu -> Cast -> Y (float32): both Casts exact on pre-rounded inputs."""
    from onnx import TensorProto, helper

    from onnxfuse.domain import DOMAIN, DOMAIN_VERSION

    t = getattr(TensorProto, dtype.upper())
    attrs = {"approximate": approximate, "transB": trans_b}
    if approximate == "sigmoid":
        attrs["alpha"] = 1.702
    inits = [helper.make_tensor(name, t, list(a.shape), _rounded(a, dtype)[1], raw=True) for name, a in (("W", w), ("B", b))]
    nodes = [helper.make_node("Cast", ["X"], ["Xc"], to=t),
             helper.make_node("FusedLinearGelu", ["Xc", "W", "B"], ["Yc"], domain=DOMAIN, **attrs),
             helper.make_node("Cast", ["Yc"], ["Y"], to=TensorProto.FLOAT)]
    g = helper.make_graph(nodes, "same", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["M", k])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", b.shape[0]])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
                             ir_version=10)


def run_one(library, shapes):
    """In this process: the sha256 of every case's output bits, keyed by case."""
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    digests = {}
    for spec in shapes.split(","):
        m, k, n = (int(v) for v in spec.split("x"))
        rng = np.random.default_rng(m * 31 + k * 7 + n)
        x32 = rng.standard_normal((m, k)).astype(np.float32)
        w_nk = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        b = (rng.standard_normal(n) * 0.1).astype(np.float32)
        for dtype in DTYPES:
            x = _rounded(x32, dtype)[0]
            for approximate in FORMS:
                for trans_b in (1, 0):
                    w = w_nk if trans_b else np.ascontiguousarray(w_nk.T)
                    so = ort.SessionOptions()
                    so.register_custom_ops_library(library)
                    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
                    sess = ort.InferenceSession(_model(dtype, k, w, b, approximate, trans_b).SerializeToString(), so,
                                                providers=["CUDAExecutionProvider"])
                    (y,) = sess.run(None, {"X": x})
                    key = f"{spec} {dtype} {approximate} transB={trans_b}"
                    digests[key] = hashlib.sha256(np.ascontiguousarray(y).tobytes()).hexdigest()
    return digests


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        json.dump(run_one(sys.argv[2], sys.argv[3]), sys.stdout)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib_a")
    ap.add_argument("lib_b")
    ap.add_argument("--shapes", default=SHAPES)
    a = ap.parse_args()
    runs = []
    for lib in (a.lib_a, a.lib_b):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", os.path.abspath(lib), a.shapes],
                             check=True, stdout=subprocess.PIPE, text=True).stdout
        runs.append(json.loads(out))
    differ = [k for k in runs[0] if runs[0][k] != runs[1].get(k)]
    print(f"{len(runs[0])} cases: " + ("identical" if not differ else f"{len(differ)} differ"))
    for k in differ:
        print("  differs:", k)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
