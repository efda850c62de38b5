"""Atomic output under SIGKILL: whenever ``optimize`` dies, the target is absent, the old model, or the new
model complete and valid — never an old model beside a new data file, never half a file — and the
temporary files a killed save leaves are removed by the next save to the same target.

Three ways of killing, on a model with ~32 MB of external data (transposed weights are derived while
saving, untouched ones copied by the kernel):

* at every file-system step of ``save_model`` in turn (a ``sys.audit`` hook SIGKILLs its own process just
  before the k-th open/mkdir/rename/unlink/rmtree), so the narrow windows are hit for certain;
* at 24 random moments of saving, in forked children (the kill lands within the measured save time);
* at random moments of the real command line (``python -m onnxfuse.cli optimize``).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import model_save
from onnxfuse.pipeline import optimize, optimize_file

REPO = Path(__file__).resolve().parent.parent
OUT = "out.onnx"
DATA = OUT + ".data"
# the file-system steps the kill hook counts (Python audit events)
FS_EVENTS = {"open", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree", "tempfile.mkdtemp",
             "os.listdir", "os.scandir", "os.truncate", "os.link", "os.symlink", "os.chmod"}


def write_model(folder: Path, *, seed: int, k: int = 1024, n: int = 2048, blocks: int = 2) -> Path:
    """x → [MatMul(W[k,n]) + B → Gelu → MatMul(W2[n,k]) + residual] × blocks, weights external."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(blocks):
        w = numpy_helper.from_array((rng.standard_normal((k, n)) / 32).astype(np.float32), f"w{i}")
        b = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), f"b{i}")
        w2 = numpy_helper.from_array((rng.standard_normal((n, k)) / 45).astype(np.float32), f"w2_{i}")
        inits += [w, b, w2]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"], name=f"fc{i}"),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"pre{i}"], name=f"bias{i}"),
                  helper.make_node("Gelu", [f"pre{i}"], [f"act{i}"], name=f"gelu{i}"),
                  helper.make_node("MatMul", [f"act{i}", f"w2_{i}"], [f"down{i}"], name=f"proj{i}"),
                  helper.make_node("Add", [x, f"down{i}"], [f"h{i}"], name=f"res{i}")]
        x = f"h{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["m", k])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    path = folder / "model.onnx"
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    return path


def digest(path: Path) -> str | None:
    if not path.exists():
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def state(folder: Path) -> tuple[str | None, str | None]:
    return digest(folder / OUT), digest(folder / DATA)


def temp_entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in (OUT, DATA))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The input model, the 'old' target (another model optimized to the same name) and the reference
    'new' target (the input optimized without interruption)."""
    root = tmp_path_factory.mktemp("atomic")
    src = write_model(root / "src", seed=1)
    old_dir = root / "old"
    optimize_file(write_model(root / "other", seed=2, blocks=1), old_dir / OUT) if old_dir.mkdir() is None else None
    ref_dir = root / "ref"
    ref_dir.mkdir()
    start = time.perf_counter()
    optimize_file(src, ref_dir / OUT)
    seconds = time.perf_counter() - start
    onnx.checker.check_model(str(ref_dir / OUT), full_check=True)
    assert temp_entries(ref_dir) == []
    old, new = state(old_dir), state(ref_dir)
    assert None not in old and None not in new and old != new
    return {"root": root, "src": src, "old_dir": old_dir, "old": old, "new": new, "seconds": seconds}


def reset_target(folder: Path, world, with_old: bool) -> None:
    """Put the target back to 'old' or 'absent'; temporary files of killed runs are left in place (the
    next save must clean them)."""
    folder.mkdir(exist_ok=True)
    for name in (OUT, DATA):
        (folder / name).unlink(missing_ok=True)
        if with_old:
            shutil.copyfile(world["old_dir"] / name, folder / name)


KILLED: set[int] = set()


def assert_allowed(folder: Path, world, killed_pid: int) -> str:
    """absent | old | new, else fail. At most one temporary folder may remain, made by a killed process
    (a kill can land before the save removes its predecessor's; the one after it must remove both)."""
    KILLED.add(killed_pid)
    model, data = state(folder)
    if model is None:
        verdict = "absent"
    elif (model, data) == world["old"]:
        verdict = "old"
    elif (model, data) == world["new"]:
        verdict = "new"
        onnx.checker.check_model(str(folder / OUT), full_check=True)
    else:
        which = {world["old"][0]: "old", world["new"][0]: "new"}.get(model, "unknown")
        data_which = {world["old"][1]: "old", world["new"][1]: "new"}.get(data, "unknown")
        raise AssertionError(f"torn target: {which} model with {data_which} data file")
    leftovers = temp_entries(folder)
    assert len(leftovers) <= 1, f"temporary files of earlier runs were not removed: {leftovers}"
    for name in leftovers:
        pid = name[len(f".{OUT}."):].split(".", 1)[0]
        assert name.endswith(".tmp") and pid.isdigit() and int(pid) in KILLED, f"unexpected file {name}"
    return verdict


def run_child(target, *, kill_at_event: int | None = None, events_log: Path | None = None) -> int:
    """Fork; the child runs ``target()`` then ``_exit(0)``. With ``kill_at_event`` it SIGKILLs itself just
    before its k-th file-system step (counted by an audit hook) inside ``target``."""
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            if kill_at_event is not None or events_log is not None:
                count = [0]
                log = open(events_log, "w") if events_log else None

                def hook(event, args):
                    if event not in FS_EVENTS:
                        return
                    if log is not None:
                        log.write(f"{event} {args[0] if args else ''}\n")
                        log.flush()
                    if count[0] == kill_at_event:
                        os.kill(os.getpid(), signal.SIGKILL)
                    count[0] += 1

                sys.addaudithook(hook)
            target()
        except BaseException:  # noqa: BLE001 - report through the exit status
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    return pid


def wait(pid: int, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("the save hung")


def test_kill_at_every_file_system_step_of_save(world, tmp_path):
    result = optimize(world["src"])  # what optimize writes: the rewrite and its provenance stamp
    target = tmp_path / "t"

    def save():
        model_save.save_model(result.model, target / OUT, source_dir=world["src"].parent, derived=result.deferred)

    # a dry run records the steps, from a target holding the old model (the longest path)
    reset_target(target, world, with_old=True)
    log = tmp_path / "events.log"
    status = wait(run_child(save, events_log=log))
    assert os.waitstatus_to_exitcode(status) == 0
    steps = log.read_text().splitlines()
    assert any(s.startswith("os.rename") for s in steps) and len(steps) >= 5, steps
    seen = {}
    for with_old in (True, False):
        for k in range(len(steps) + 1):
            reset_target(target, world, with_old)
            pid = run_child(save, kill_at_event=k)
            status = wait(pid)
            if k < len(steps):
                assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, \
                    f"step {k} ({steps[k]}) not reached"
            verdict = assert_allowed(target, world, pid)
            assert verdict in (("old", "absent", "new") if with_old else ("absent", "new"))
            seen.setdefault(verdict, []).append(k)
    assert {"new", "absent"} <= set(seen), seen
    # one more complete save removes whatever the killed ones left
    reset_target(target, world, with_old=True)
    save()
    assert state(target) == world["new"] and temp_entries(target) == []


def test_random_sigkill_during_save(world, tmp_path):
    """24 kills at random moments of saving (forked children: load and fuse, then a byte on a pipe says
    the save starts; the kill lands uniformly within 1.2 × a measured save)."""
    import select

    rnd = random.Random(20261129)
    target = tmp_path / "t"
    src = world["src"]

    def child(w: int):
        def work():
            result = optimize(src)
            os.write(w, b"s")
            start = time.perf_counter()
            model_save.save_model(result.model, target / OUT, source_dir=src.parent, derived=result.deferred)
            os.write(w, f"{time.perf_counter() - start:.6f}".encode())
        return work

    def start_child():
        r, w = os.pipe()
        pid = run_child(child(w))
        os.close(w)
        ready, _, _ = select.select([r], [], [], 120)
        assert ready and os.read(r, 1) == b"s", "the child did not reach the save"
        return pid, r

    # the save's duration, measured the same way (from an old target: the longest path)
    reset_target(target, world, with_old=True)
    pid, r = start_child()
    assert os.waitstatus_to_exitcode(wait(pid)) == 0
    save_seconds = float(os.read(r, 64).decode())
    os.close(r)
    assert state(target) == world["new"]
    verdicts = []
    for i in range(24):
        reset_target(target, world, with_old=i % 2 == 0)
        pid, r = start_child()
        time.sleep(rnd.uniform(0, 1.2 * save_seconds))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        wait(pid)
        os.close(r)
        verdicts.append(assert_allowed(target, world, pid))
    optimize_file(src, target / OUT)
    assert state(target) == world["new"] and temp_entries(target) == []
    # (how the kills fell, for the log: a loaded machine stretches the save, not the invariant)
    print(f"save {save_seconds:.3f} s; after the kills: " + ", ".join(f"{v} {verdicts.count(v)}" for v in
                                                                      ("absent", "old", "new")))


def test_random_sigkill_of_the_command_line(world, tmp_path):
    """The real process: start-up, load, fuse and save, killed at random moments (a few: each run pays the
    interpreter start-up)."""
    rnd = random.Random(7)
    target = tmp_path / "t"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "onnxfuse.cli", "optimize", str(world["src"]), "-o", str(target / OUT)]
    reset_target(target, world, with_old=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=300)
    whole = time.perf_counter() - start
    assert state(target) == world["new"]
    for i in range(3):
        reset_target(target, world, with_old=i % 2 == 0)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rnd.uniform(0.5, 1.0) * whole)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        assert_allowed(target, world, proc.pid)
