"""Write the fuzzer's seed inputs into ``fuzz/corpus/``: small valid models from ``tests/graphs.py`` (every
GELU family, Linear form and dtype), one with external data, one with a git-LFS pointer and a few broken ones.

    python fuzz/make_corpus.py        # from the repository root
"""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.graphs import build, build_gated, build_mlp  # noqa: E402

CORPUS = os.path.join(ROOT, "fuzz", "corpus")


def external_seed() -> bytes:
    """MatMul(x, W) + B → Gelu with W [4, 8] float32 in ``weights.bin`` (128 bytes: size byte 2 × 64)."""
    w = onnx.TensorProto(name="W", data_type=onnx.TensorProto.FLOAT, dims=[4, 8])
    w.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", "128")):
        w.external_data.add(key=key, value=value)
    b = numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["mm"], name="mm"),
         helper.make_node("Add", ["mm", "B"], ["pre"], name="add"),
         helper.make_node("Gelu", ["pre"], ["y"], name="gelu")],
        "ext", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["m", 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["m", 8])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return bytes([1, 2]) + model.SerializeToString()


def seeds() -> list[bytes]:
    models = [
        build("onnx:none", "matmul", k=4, n=8),
        build("erf:pytorch:div", "matmul", k=4, n=8, rank=4),
        build("erf:keras:mul", "gemm:transB0", k=4, n=8, swap=True, const_style="node"),
        build("tanh:pow", "gemm:transB1", k=4, n=8, alpha=0.5, beta=2.0),
        build("tanh:bloom", "reshape_gemm", k=4, n=8, const_style="one_element"),
        build("sigmoid", "matmul", k=4, n=8, dtype="float16", cast_wrap=True),
        build("ms:BiasGelu", "matmul", k=4, n=8),
        build("ms:FastGelu+bias", "matmul", k=4, n=8, dtype="bfloat16"),
        build("ms:QuickGelu", "matmul", k=4, n=8, bias=False),
        build("erf:assoc:div", "matmul", k=4, n=8, perturb={"sqrt2": 1.4143}),
        build_gated("tanh:mul", k=4, n=8),
        build_mlp(layers=2, k=4, n=8),
    ]
    out = [bytes([0]) + m.SerializeToString() for m in models]
    out.append(external_seed())
    out.append(bytes([0]) + b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 1\n")
    out.append(bytes([0]) + models[0].SerializeToString()[:-7])  # truncated
    out.append(bytes([0]))  # empty model file
    return out


def main() -> None:
    os.makedirs(CORPUS, exist_ok=True)
    for data in seeds():
        with open(os.path.join(CORPUS, hashlib.sha1(data).hexdigest()), "wb") as f:
            f.write(data)
    print(f"{len(seeds())} seeds in {CORPUS}")


if __name__ == "__main__":
    main()
