#!/usr/bin/env python3
"""What onnxfuse fuses today on the attention export corpus: per export, the architecture's attention blocks,
how many ``inspect`` fuses, every refusal's reason verbatim, whether ``optimize --verify`` passes, and the
fused model's largest error against the original on ONNX Runtime's CPU provider with padded masks.

    python scripts/exports/tally_corpus.py --corpus /work/exports \\
        --out bench/results/attention_export_corpus_cpu.md --json bench/results/attention_export_corpus_cpu.json

Runs in onnxfuse's own environment (not an export one); reads ``<corpus>/<configuration>/records.json`` as
``export_corpus.py`` wrote them. The markdown has the summary per configuration and exporter, every export's
row, the misses grouped by reason (names of tensors and nodes in a reason are elided for the grouping; the
JSON keeps them verbatim) and the exports that failed. The JSON is gzipped (``gzip -9n``) when over 40 KB.

Counting: ``blocks`` is the architecture's (layers x attentions per layer, from records.json), never what a
rewriter finds; ``fused`` is the attention blocks ``inspect`` fuses; ``by ORT`` the attention ops ORT's
transformers optimizer already wrote into the input (``com.microsoft`` Attention / MultiHeadAttention);
``unexplained`` is what is left with neither a fusion nor a refusal.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import sys
import tempfile
import zlib
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent.parent
ATTENTION_OPS = {("com.microsoft", "Attention"), ("com.microsoft", "MultiHeadAttention"),
                 ("com.microsoft", "GroupQueryAttention"), ("com.microsoft", "PackedAttention")}
ANCHORS = {("", "Softmax"), ("", "Attention")}
TOLERANCE = {"float32": 1e-4, "float16": 1e-2}  # relative to the reference output's largest magnitude
BATCH = 3  # rows: no padding, right padding, left padding


def _key(n: onnx.NodeProto) -> tuple[str, str]:
    return ("" if n.domain == "ai.onnx" else n.domain, n.op_type)


def feeds_for(specs: list[dict], model: onnx.ModelProto, seed: int) -> tuple[dict, np.ndarray | None]:
    """Inputs after the record's specs, batch 3 where the graph leaves it free; the mask padded on the right
    in row 1 and on the left in row 2. Returns (feeds, the mask or None)."""
    rng = np.random.default_rng(seed)
    free = {i.name: [not d.HasField("dim_value") for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    feeds, mask = {}, None
    for spec in specs:
        shape = list(spec["shape"])
        if free.get(spec["name"], [False])[:1] == [True]:
            shape[0] = BATCH
        kind = spec["kind"]
        if kind == "int":
            a = rng.integers(spec["low"], spec["high"], size=shape)
        elif kind == "mask":
            a = np.ones(shape)
            if shape[0] >= 2 and shape[-1] >= 4:
                a[1, -3:] = 0
            if shape[0] >= 3 and shape[-1] >= 4:
                a[2, :2] = 0
            mask = a.astype(bool)
        elif kind == "positions":
            a = np.broadcast_to(np.arange(shape[-1]), shape)
        else:
            a = rng.standard_normal(shape)
        feeds[spec["name"]] = np.ascontiguousarray(a.astype(spec["dtype"]))
    return feeds, mask


def _error(want: list[np.ndarray], got: list[np.ndarray], mask: np.ndarray | None) -> float:
    """The largest difference relative to the reference's largest magnitude, over the outputs; where an
    output is [batch, sequence, ...] of the mask's shape, at the positions the mask keeps (a padded query
    row's output is whatever each implementation makes of a row that sees no key)."""
    worst = 0.0
    for w, g in zip(want, got):
        w, g = np.asarray(w, np.float64), np.asarray(g, np.float64)
        if w.shape != g.shape:
            return float("inf")
        if mask is not None and w.shape[:2] == mask.shape:
            w, g = w[mask], g[mask]
        if w.size == 0:
            continue
        both_nan = np.isnan(w) & np.isnan(g)
        diff = np.where(both_nan, 0.0, np.abs(w - g))
        if np.isnan(diff).any():
            return float("inf")
        scale = max(1.0, float(np.nanmax(np.abs(w))))
        worst = max(worst, float(diff.max()) / scale)
    return worst


def tally_one(path: Path, record: dict) -> dict:
    import onnxruntime as ort
    from click.testing import CliRunner

    from onnxfuse.cli import main as cli
    from onnxfuse.fuse import fuse_model
    from onnxfuse.pipeline import inspect_file, load_input
    from onnxfuse.runtime import create_session

    model = onnx.load(str(path), load_external_data=False)
    ops = Counter(_key(n) for n in model.graph.node)
    report = inspect_file(path)
    names = {n.name: _key(n) for n in model.graph.node}
    fused = [b for b in report.fused if b.rule == "attention"]
    refusals = [r for r in report.refused
                if r.rule == "attention" or any(names.get(n) in ANCHORS for n in r.nodes)]
    by_ort = sum(ops[k] for k in ATTENTION_OPS)
    row = {
        "softmax": ops[("", "Softmax")], "onnx_attention": ops[("", "Attention")], "by_ort": by_ort,
        "fused": len(fused), "fused_ops": dict(Counter(b.op for b in fused)),
        "refusals": [{"rule": r.rule, "reason": r.reason} for r in refusals],
    }
    row["unexplained"] = max(0, record["attention_blocks"] - len(fused) - by_ort - len(refusals))
    runner = CliRunner()
    with tempfile.TemporaryDirectory() as tmp:
        run = runner.invoke(cli, ["optimize", str(path), "-o", str(Path(tmp) / "out.onnx"), "--verify"])
        row["verify_exit"] = run.exit_code
        if run.exit_code != 0:
            row["verify_says"] = (run.output.strip().splitlines() or [repr(run.exception)])[-1][:300]
    # the differential: the original as written against the fused model as users run it, padded masks
    full = load_input(path, load_external_data=True)
    result = fuse_model(full)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    reference = ort.InferenceSession(full.SerializeToString(), so, providers=["CPUExecutionProvider"])
    optimized = create_session(result.model, providers=["CPUExecutionProvider"], intra_op_num_threads=1, quiet=True)
    feeds, mask = feeds_for(record["inputs"], full, zlib.crc32(record["file"].encode()))
    row["max_error"] = _error(reference.run(None, feeds), optimized.run(None, feeds), mask)
    dtype = "float16" if record["post"] == "ort-fp16" else "float32"
    row["matches"] = row["max_error"] <= TOLERANCE[dtype]
    return row


def normalized(reason: str) -> str:
    """A reason with the model's own tensor and node names elided, for grouping."""
    reason = re.sub(r"(?<![A-Za-z])'[^']*'", "'…'", reason)  # (not the apostrophe of "attention's")
    reason = re.sub(r"\(\S+\)", "(…)", reason)  # a single dimension or tensor name in parentheses
    return re.sub(r"\b(read by|is also read by) \S+", r"\1 …", reason)


def _fmt_error(e: float) -> str:
    return "inf" if e == float("inf") else f"{e:.1e}"


def render(corpus: dict, command: str) -> str:
    configs = corpus["configurations"]
    rows = [(c, r) for c, body in configs.items() for r in body["exports"]]
    ok = [(c, r) for c, r in rows if r["status"] == "ok"]
    out = io.StringIO()
    w = out.write
    w("# The attention export corpus on the CPU: what onnxfuse fuses today\n\n")
    w("Issue #54. Tiny random-weight models of the families users export, exported by the transformers, torch "
      "and optimum versions people pin (one virtual environment each, `scripts/exports/make_venvs.py`; the "
      "exports by `scripts/exports/export_corpus.py`), then read by this checkout's onnxfuse "
      "(`scripts/exports/tally_corpus.py`): `inspect`'s attention blocks fused and every refusal, "
      "`onnxfuse optimize --verify`'s exit code, and the fused model's largest error against the original on "
      "ONNX Runtime's CPU provider (batch 3: no padding, right padding, left padding; relative to the output's "
      "largest magnitude, at the positions the mask keeps). `blocks` is the architecture's count (layers x "
      "attentions per layer), never the rewriter's.\n\n")
    w(f"onnxfuse at `{corpus['onnxfuse_commit']}`; ONNX Runtime {corpus['onnxruntime']} (CPU provider). "
      "No GPU: ORT's optimizer ran with `use_gpu=False` only.\n\n")
    w("## Environments\n\n| configuration | python | torch | transformers | onnx | onnxruntime (its optimizer) | "
      "optimum | exporters |\n|---|---|---|---|---|---|---|---|\n")
    for c, body in configs.items():
        v = body["versions"]
        opt = v.get("optimum", "-") + (f" + optimum-onnx {v['optimum-onnx']}" if v.get("optimum-onnx") else "")
        w(f"| {c} | {v['python']} | {v['torch']} | {v['transformers']} | {v['onnx']} | {v['onnxruntime']} | "
          f"{opt} | {', '.join(body['exporters'])} |\n")
    w("\n## Summary\n\nAttention blocks fused (by onnxfuse, or already by ORT's optimizer in the input) over the "
      "architecture's blocks, per configuration and exporter (ORT's optimizer and float16 converter rows: "
      "`+ort`).\n\n| configuration | exporter | exports | blocks fused / total | exports with a miss | "
      "verify fails | outputs differ |\n|---|---|---|---|---|---|---|\n")
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for c, r in ok:
        groups[(c, r["exporter"] + ("" if r["post"] == "raw" else "+ort"))].append(r)
    tot = Counter()
    for (c, e), rs in sorted(groups.items()):
        blocks = sum(r["attention_blocks"] for r in rs)
        done = sum(min(r["attention_blocks"], r["tally"]["fused"] + r["tally"]["by_ort"]) for r in rs)
        miss = sum(r["tally"]["fused"] + r["tally"]["by_ort"] < r["attention_blocks"] for r in rs)
        vfail = sum(r["tally"]["verify_exit"] != 0 for r in rs)
        differ = sum(not r["tally"]["matches"] for r in rs)
        tot.update(exports=len(rs), blocks=blocks, done=done, miss=miss, vfail=vfail, differ=differ)
        w(f"| {c} | {e} | {len(rs)} | {done} / {blocks} | {miss} | {vfail} | {differ} |\n")
    w(f"| **all** | | {tot['exports']} | **{tot['done']} / {tot['blocks']}** | {tot['miss']} | {tot['vfail']} | "
      f"{tot['differ']} |\n")
    w("\n## Misses by reason (the work list)\n\nEach distinct refusal, names elided; the exports it keeps "
      "unfused (blocks refused for it). `no refusal listed`: blocks neither fused nor refused.\n\n")
    by_reason: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    for c, r in ok:
        t = r["tally"]
        for reason, n in Counter(normalized(x["reason"]) for x in t["refusals"]).items():
            by_reason[reason].append((c, r["file"], n))
        if t["unexplained"]:
            by_reason["no refusal listed"].append((c, r["file"], t["unexplained"]))
    for reason, where in sorted(by_reason.items(), key=lambda kv: -sum(n for *_, n in kv[1])):
        w(f"### {sum(n for *_, n in where)} blocks in {len(where)} exports: {reason}\n\n")
        w(", ".join(f"`{c}/{f}` ({n})" for c, f, n in sorted(where)) + "\n\n")
    w("## Every export\n\n| configuration | file | attention | post | opset | blocks | softmax | fused | by ORT | "
      "refused | verify | max error |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for c, r in sorted(ok, key=lambda cr: (cr[0], cr[1]["file"])):
        t = r["tally"]
        static = " (static shapes)" if r.get("static") else ""
        w(f"| {c} | `{r['file']}`{static} | {r['attn_used']} | {r['post']} | {r.get('opset') or '-'} | "
          f"{r['attention_blocks']} | {t['softmax'] + t['onnx_attention']} | {t['fused']} | {t['by_ort']} | "
          f"{len(t['refusals'])} | {'ok' if t['verify_exit'] == 0 else 'exit ' + str(t['verify_exit'])} | "
          f"{_fmt_error(t['max_error'])}{'' if t['matches'] else ' DIFFERS'} |\n")
    failed = [(c, r) for c, r in rows if r["status"] != "ok"]
    if failed or any(body["unsupported"] for body in configs.values()):
        w("\n## Not exported\n\n| configuration | export | why |\n|---|---|---|\n")
        for c, body in configs.items():
            for fam, why in sorted(body["unsupported"].items()):
                w(f"| {c} | {fam} (every exporter) | {why} |\n")
        for c, r in sorted(failed, key=lambda cr: (cr[0], cr[1]["file"])):
            err = r["error"].replace("|", "\\|").replace("\x1b", "")
            err = re.sub(r"\[\d+m", "", err)
            w(f"| {c} | `{r['file']}` ({r['status']}) | {err} |\n")
    w(f"\n## How it was made\n\n```bash\n{command}\n```\n")
    return out.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="the folder with one subfolder per configuration")
    ap.add_argument("--out", type=Path, required=True, help="the markdown table")
    ap.add_argument("--json", type=Path, help="the raw tally (gzipped beside it when over 40 KB)")
    ap.add_argument("--command", default="", help="the commands that made the corpus, for the markdown")
    args = ap.parse_args()
    import subprocess

    import onnxruntime

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    corpus = {"onnxfuse_commit": commit, "onnxruntime": onnxruntime.__version__, "configurations": {}}
    for folder in sorted(p for p in args.corpus.iterdir() if (p / "records.json").exists()):
        body = json.loads((folder / "records.json").read_text())
        corpus["configurations"][folder.name] = body
        for r in body["exports"]:
            if r["status"] != "ok":
                continue
            try:
                r["tally"] = tally_one(folder / r["file"], r)
            except Exception as e:  # noqa: BLE001 (recorded: a model onnxfuse cannot read is a result)
                r["status"] = "tally failed"
                r["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            t = r.get("tally")
            print(f"{folder.name}/{r['file']}: " + (f"{t['fused']}+{t['by_ort']}/{r['attention_blocks']} fused, "
                  f"verify {t['verify_exit']}, error {_fmt_error(t['max_error'])}" if t else r["error"]),
                  file=sys.stderr, flush=True)
    command = args.command or " ".join(["python", *sys.argv])
    args.out.write_text(render(corpus, command))
    if args.json:
        text = json.dumps(corpus, indent=1, sort_keys=True) + "\n"
        if len(text) > 40_000:
            with open(str(args.json) + ".gz", "wb") as f:
                with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0, filename="") as z:
                    z.write(text.encode())
        else:
            args.json.write_text(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
