"""Scale benchmark of the rewriter: a synthetic GPT-style model with its weights as external data is
optimized by ``onnxfuse optimize`` in a child process; wall time and the child's peak RSS are measured
against the budget (default: 48 layers, d_model 1600, ~1.56 B parameters, ~6.2 GB; ≤ 60 s, ≤ 1.5 GB).

    python bench/optimize_scale.py                       # the full model (needs ~13 GB free in --workdir)
    python bench/optimize_scale.py --layers 4 --d-model 512 --vocab 8000   # a quick run
    python bench/optimize_scale.py --json bench/results/optimize_scale.json

The model is written tensor by tensor (never all weights in memory): token and position embeddings, then
per layer LayerNorm → QKV MatMul+Add → single-head attention → projection + residual → LayerNorm →
MatMul+Add → tanh GELU (GPT-2's ``gelu_new``, with Pow) → MatMul+Add + residual; a final LayerNorm. Each
layer has one Linear+GELU block to fuse, whose [K, N] weight the optimizer stores as [N, K] while saving.

After the run the output is checked: one FusedLinearGelu per layer, every byte of the data file belongs
to exactly one tensor or to the alignment padding before it (no orphan bytes), and ``--run`` also opens
it in ONNX Runtime on the CPU and runs one token.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30


class ExternalWriter:
    """Appends tensors to one data file, page-aligned, from a fixed random block (no weights in memory)."""

    def __init__(self, path: Path, seed: int = 0):
        self.path = path
        self.f = open(path, "wb")
        self.block = np.random.default_rng(seed).standard_normal(1 << 22).astype(np.float32)  # 16 MiB
        self.written = 0

    def tensor(self, name: str, shape: tuple[int, ...], scale: float) -> TensorProto:
        pad = -self.f.tell() % 4096
        self.f.write(b"\0" * pad)
        offset = self.f.tell()
        count = int(np.prod(shape))
        block = self.block * np.float32(scale)
        start = (hash(name) & 0xFFFF) % block.size
        done = 0
        while done < count:
            take = min(count - done, block.size - start)
            self.f.write(block[start:start + take].tobytes())
            done += take
            start = 0
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(offset)), ("length", str(count * 4))):
            t.external_data.add(key=key, value=value)
        self.written += count * 4
        return t

    def close(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()


def write_gpt(folder: Path, *, layers: int = 48, d_model: int = 1600, vocab: int = 50257, positions: int = 1024,
              name: str = "gpt.onnx") -> tuple[Path, int]:
    """Write the model; returns (path, parameter count)."""
    folder.mkdir(parents=True, exist_ok=True)
    d, ff = d_model, 4 * d_model
    w = ExternalWriter(folder / f"{name}.data")
    inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    params = 0

    def weight(nm: str, shape, scale=0.02) -> str:
        nonlocal params
        inits.append(w.tensor(nm, tuple(shape), scale))
        params += int(np.prod(shape))
        return nm

    def const(nm: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), nm))
        return nm

    def node(op, inputs, out, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def layer_norm(prefix: str, x: str) -> str:
        ones = weight(f"{prefix}.weight", (d,), 1.0)
        zeros = weight(f"{prefix}.bias", (d,), 0.0)
        return node("LayerNormalization", [x, ones, zeros], f"{prefix}/ln", axis=-1, epsilon=1e-5)

    def linear(prefix: str, x: str, k: int, n: int) -> str:
        mm = node("MatMul", [x, weight(f"{prefix}.weight", (k, n))], f"{prefix}/MatMul")
        return node("Add", [mm, weight(f"{prefix}.bias", (n,), 0.01)], f"{prefix}/Add")

    half, one = const("c_half", np.float32(0.5)), const("c_one", np.float32(1.0))
    three, cubic = const("c_three", np.float32(3.0)), const("c_cubic", np.float32(0.044715))
    s2pi = const("c_sqrt_2_over_pi", np.float32(np.sqrt(2 / np.pi)))
    att_scale = const("c_att_scale", np.float32(1 / np.sqrt(d)))
    split = const("c_split", np.array([d, d, d], dtype=np.int64))

    tok = node("Gather", [weight("wte", (vocab, d)), "input_ids"], "embed/tokens")
    pos = node("Gather", [weight("wpe", (positions, d)), "position_ids"], "embed/positions")
    h = node("Add", [tok, pos], "embed/sum")
    for i in range(layers):
        p = f"h.{i}"
        a = layer_norm(f"{p}.ln_1", h)
        qkv = linear(f"{p}.attn.c_attn", a, d, 3 * d)
        nodes.append(helper.make_node("Split", [qkv, split], [f"{p}/q", f"{p}/k", f"{p}/v"], name=f"{p}/Split",
                                      axis=-1))
        kt = node("Transpose", [f"{p}/k"], f"{p}/kT", perm=[0, 2, 1])
        scores = node("Mul", [node("MatMul", [f"{p}/q", kt], f"{p}/QK"), att_scale], f"{p}/scaled")
        ctx = node("MatMul", [node("Softmax", [scores], f"{p}/softmax", axis=-1), f"{p}/v"], f"{p}/ctx")
        h = node("Add", [h, linear(f"{p}.attn.c_proj", ctx, d, d)], f"{p}/res1")
        m = layer_norm(f"{p}.ln_2", h)
        x = linear(f"{p}.mlp.c_fc", m, d, ff)
        # gelu_new: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
        inner = node("Add", [x, node("Mul", [node("Pow", [x, three], f"{p}/gelu/pow"), cubic], f"{p}/gelu/cube")],
                     f"{p}/gelu/inner")
        t = node("Tanh", [node("Mul", [inner, s2pi], f"{p}/gelu/scale")], f"{p}/gelu/tanh")
        g = node("Mul", [node("Mul", [half, x], f"{p}/gelu/halfx"), node("Add", [t, one], f"{p}/gelu/onep")],
                 f"{p}/gelu/out")
        h = node("Add", [h, linear(f"{p}.mlp.c_proj", g, ff, d)], f"{p}/res2")
    out = layer_norm("ln_f", h)
    w.close()
    graph = helper.make_graph(
        nodes, "gpt",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", "seq", d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], producer_name="bench.optimize_scale")
    model.ir_version = 9
    path = folder / name
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path, params


def data_file_accounting(model_path: Path) -> dict:
    """Every byte of the model's data file(s) is in exactly one tensor or in the zero padding (< 4096
    bytes) before one; raises AssertionError otherwise. Returns sizes."""
    model = onnx.load_model(str(model_path), load_external_data=False)
    spans: dict[str, list[tuple[int, int, str]]] = {}
    from onnxfuse.model_io import all_tensors

    for t in all_tensors(model):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        spans.setdefault(info["location"], []).append((int(info.get("offset", 0)), int(info["length"]), t.name))
    total = {"files": 0, "bytes": 0, "tensor_bytes": 0, "padding_bytes": 0}
    for location, items in spans.items():
        path = model_path.parent / location
        size = path.stat().st_size
        items.sort()
        pos, padding = 0, 0
        with open(path, "rb") as f:
            for offset, length, name in items:
                assert offset >= pos, f"{location}: tensor {name} overlaps the one before it"
                gap = offset - pos
                assert gap < 4096, f"{location}: {gap} orphan bytes before tensor {name}"
                if gap:
                    f.seek(pos)
                    assert f.read(gap) == b"\0" * gap, f"{location}: non-zero padding before tensor {name}"
                padding += gap
                pos = offset + length
        assert pos == size, f"{location}: {size - pos} orphan bytes after the last tensor"
        total["files"] += 1
        total["bytes"] += size
        total["tensor_bytes"] += sum(length for _, length, _ in items)
        total["padding_bytes"] += padding
    return total


def run_measured(cmd: list[str], env: dict | None = None) -> tuple[float, int, int, bytes, bytes]:
    """(wall seconds, peak RSS in bytes, exit code, stdout, stderr) of one child, via ``os.wait4``."""
    out_f, err_f = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    out_f.seek(0)
    err_f.seek(0)
    return seconds, usage.ru_maxrss * 1024, proc.returncode, out_f.read(), err_f.read()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--d-model", type=int, default=1600)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--workdir", default=None, help="where to write the model (default: a temp dir, deleted after)")
    ap.add_argument("--keep", action="store_true", help="keep the workdir")
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--max-rss-gb", type=float, default=1.5)
    ap.add_argument("--run", action="store_true", help="also run one token of the optimized model in ORT (CPU)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="onnxfuse-scale-", dir=os.environ.get("TMPDIR", "/tmp")))
    try:
        t0 = time.perf_counter()
        src, params = write_gpt(work / "src", layers=args.layers, d_model=args.d_model, vocab=args.vocab)
        gen_s = time.perf_counter() - t0
        data_bytes = (work / "src" / "gpt.onnx.data").stat().st_size
        print(f"model: {args.layers} layers, d_model {args.d_model}, {params / 1e9:.3f} B parameters, "
              f"{data_bytes / 1e9:.2f} GB external data (written in {gen_s:.1f} s)", flush=True)
        out = work / "out" / "gpt.fused.onnx"
        out.parent.mkdir()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-m", "onnxfuse.cli", "optimize", str(src), "-o", str(out), "--json", "-"]
        seconds, rss, code, stdout, stderr = run_measured(cmd, env)
        if code != 0:
            print(stderr.decode(errors="replace"), file=sys.stderr)
            return 1
        report = json.loads(stdout)
        baseline_s, baseline_rss, *_ = run_measured([sys.executable, "-c", "import onnxfuse.fuse, onnxfuse.model_io"], env)
        accounting = data_file_accounting(out)
        assert report["fused"] == args.layers, report
        figures = {
            "layers": args.layers, "d_model": args.d_model, "vocab": args.vocab, "parameters": params,
            "data_bytes": data_bytes, "generate_seconds": round(gen_s, 2),
            "optimize_wall_seconds": round(seconds, 2), "optimize_report_seconds": report["seconds"],
            "peak_rss_bytes": rss, "import_only_wall_seconds": round(baseline_s, 2),
            "import_only_peak_rss_bytes": baseline_rss, "fused": report["fused"], "refused": report["refused"],
            "output_data": accounting, "max_seconds": args.max_seconds, "max_rss_bytes": int(args.max_rss_gb * 1e9),
            "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "load_average_1min_after": round(os.getloadavg()[0], 2),
        }
        if args.run:
            figures["run"] = run_one_token(out, args.d_model)
            print(f"ran one 4-token sequence on the CPU: session opened in {figures['run']['session_seconds']} s")
        ok_time = seconds <= args.max_seconds
        ok_rss = rss <= args.max_rss_gb * 1e9
        figures["verdict"] = "pass" if ok_time and ok_rss else "fail"
        print(f"optimize: {seconds:.1f} s wall (report {report['seconds']} s; interpreter start-up and imports "
              f"{baseline_s:.1f} s), peak RSS {rss / 1e6:.0f} MB (imports alone {baseline_rss / 1e6:.0f} MB); "
              f"{report['fused']} fused, {report['refused']} refused")
        print(f"output data: {accounting['bytes'] / 1e9:.2f} GB, {accounting['tensor_bytes'] / 1e9:.2f} GB tensors, "
              f"{accounting['padding_bytes']} bytes alignment padding, 0 orphan bytes")
        print(f"verdict: time {'PASS' if ok_time else 'FAIL'} ({seconds:.1f} s ≤ {args.max_seconds:g} s), "
              f"memory {'PASS' if ok_rss else 'FAIL'} ({rss / 1e9:.2f} GB ≤ {args.max_rss_gb:g} GB)")
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
        return 0 if ok_time and ok_rss else 3
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def run_one_token(model_path: Path, d_model: int) -> dict:
    from onnxfuse.runtime import create_session

    start = time.perf_counter()
    session = create_session(str(model_path), providers="cpu")
    opened = time.perf_counter() - start
    ids = np.array([[1, 2, 3, 4]], dtype=np.int64)
    (y,) = session.run(None, {"input_ids": ids, "position_ids": np.arange(4, dtype=np.int64)[None]})
    assert y.shape == (1, 4, d_model) and np.isfinite(y).all()
    return {"session_seconds": round(opened, 2), "output_shape": list(y.shape)}


if __name__ == "__main__":
    sys.exit(main())
