#!/usr/bin/env python3
"""Compares the device code of two builds of the CUDA kernels, object file by object file: each kernel's SASS
per architecture, its resource usage, and each file's PTX. For a change that must leave the shipped kernels as
they are (a refactor, a move of lab code out of the product), the answer is "identical" or the diff.

    python3 lab/kernels/sass_diff.py BEFORE_OBJ_DIR AFTER_OBJ_DIR [--rename 'REGEX=>REPLACEMENT' ...] [--out FILE]

The object folders are a CMake build's CMakeFiles/onnxfuse_cuda_kernels.dir/src/cuda (its subfolders included:
objects are matched by file name) or any two folders of like-named .o files, such as build.sh's. Needs cuobjdump
and nvdisasm on PATH (the CUDA toolkit's, or PyPI's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm) and c++filt.

Normalised away, as they differ between any two builds of the same code: instruction offsets (/*0a30*/), and
the per-module id nvcc puts in the names of internal-linkage symbols (_INTERNAL_<hash>_..._cu_<hash>, derived
from the source path). Kernels are matched by demangled name; --rename rewrites the "before" names first, for
a change that renames a kernel type on purpose (its code must still match). Encodings stay in the SASS
compared: a kernel is the same when every instruction word is.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import re
import subprocess
import sys
from pathlib import Path

# nvcc's per-module id: _INTERNAL_<hash>_<len>_<file>_cu_<hash>[_<n>] (and _GLOBAL__N__..., anonymous namespaces).
_MODULE_ID = r"(?:_INTERNAL_|_GLOBAL__N__)[0-9a-f]{8}_\d+_\w+?_cu_[0-9a-f]{8}(?:_\d+)?"
_MODULE_ID_MANGLED = re.compile(r"(\d+)(?=_INTERNAL_|_GLOBAL__N__)")  # a source name: its length, then the name
_MODULE_ID_EXACT = re.compile(_MODULE_ID + "$")
_MODULE_ID_DEMANGLED = re.compile(_MODULE_ID + r"(?=::|$|[^\w])")
_OFFSET = re.compile(r"/\*[0-9a-f]{4,}\*/")


def _run(args: list[str]) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def _unmodule(text: str) -> str:
    """text with every module id replaced by <module>: in mangled names, where a length prefix says where the id
    ends (its last number runs into the next name's length), and in demangled ones."""
    out, pos = [], 0
    for m in _MODULE_ID_MANGLED.finditer(text):
        digits = m.group(1)
        for k in range(len(digits)):  # the length is a suffix of the digits (a template argument may precede)
            end = m.end() + int(digits[k:])
            if m.start() + k >= pos and _MODULE_ID_EXACT.match(text, m.end(), end):
                out.append(text[pos:m.start() + k] + "<module>")
                pos = end
                break
    out.append(text[pos:])
    return _MODULE_ID_DEMANGLED.sub("<module>", "".join(out))


def _demangle(names: list[str]) -> list[str]:
    if not names:
        return []
    out = subprocess.run(["c++filt", "--no-recurse-limit"], input="\n".join(names) + "\n", check=True,
                         capture_output=True, text=True)
    return out.stdout.splitlines()


def _sections(dump: str) -> list[tuple[str, list[str]]]:
    """cuobjdump output split into (arch, lines) per fatbin entry."""
    entries: list[tuple[str, list[str]]] = []
    for block in re.split(r"\n(?=Fatbin (?:elf|ptx) code:)", dump):
        m = re.search(r"^arch = (\S+)", block, re.M)
        if m:
            kind = "ptx" if block.startswith("Fatbin ptx") else "elf"
            entries.append((f"{kind}:{m.group(1)}", block.splitlines()))
    return entries


def kernels(obj: Path) -> dict[tuple[str, str], str]:
    """(arch, mangled name) -> normalised SASS of each kernel of one object file."""
    result: dict[tuple[str, str], str] = {}
    for arch, lines in _sections(_run(["cuobjdump", "-sass", str(obj)])):
        name, body = None, []
        for line in lines + ["\t\tFunction : <end>"]:
            m = re.match(r"\s*Function : (\S+)", line)
            if m:
                if name is not None:
                    result[(arch, name)] = "\n".join(body)
                name, body = m.group(1), []
            elif name is not None and line.strip():
                body.append(" ".join(_unmodule(_OFFSET.sub("", line)).split()))
    return result


def resources(obj: Path) -> dict[tuple[str, str], str]:
    """(arch, mangled name) -> cuobjdump's resource line (registers, stack, shared, local, constant banks)."""
    result: dict[tuple[str, str], str] = {}
    for arch, lines in _sections(_run(["cuobjdump", "-res-usage", str(obj)])):
        for i, line in enumerate(lines):
            m = re.match(r"\s*Function (\S+):", line)
            if m and i + 1 < len(lines):
                result[(arch, m.group(1))] = " ".join(lines[i + 1].split())
    return result


def ptx(obj: Path) -> dict[str, str]:
    """arch -> the object's PTX for it (what later GPUs JIT-compile), comments dropped."""
    result = {}
    for arch, lines in _sections(_run(["cuobjdump", "-ptx", str(obj)])):
        if arch.startswith("ptx:"):
            result[arch] = "\n".join(_unmodule(l) for l in lines if l.strip() and not l.lstrip().startswith("//"))
    return result


def label(demangled: str) -> str:
    """A short description of a kernel for the record: its kernel layer, tile, cluster, stages and element."""
    sm90 = re.search(r"MainloopSm90TmaGmmaWarpSpecialized<(\d+), cute::tuple<cute::C<(\d+)>, cute::C<(\d+)>, "
                     r"cute::C<1> >, cutlass::gemm::KernelTmaWarpSpecialized(\w+)>, cute::tuple<cute::C<(\d+)>, "
                     r"cute::C<(\d+)>, cute::C<(\d+)> >, ([\w:]+),", demangled)
    if sm90:
        stages, cm, cn, sched, tm, tn, tk, elem = sm90.groups()
        layer = "Sm90WarpEpilogueKernel" if "Sm90WarpEpilogueKernel" in demangled else "GemmUniversal"
        epi = re.search(r"CollectiveEpilogue<cutlass::epilogue::Sm90TmaWarpSpecialized<[^>]*>, "
                        r"cute::tuple<cute::C<\d+>, cute::C<\d+>, cute::C<\d+> >, cute::tuple<cute::C<(\d+)>, "
                        r"cute::C<(\d+)> >", demangled)
        epi_text = f" epilogue {epi.group(1)}x{epi.group(2)}" if epi else ""
        if "StreamK" in demangled:
            sched += "+StreamK"
        return f"{layer} {elem.split('::')[-1]} {tm}x{tn}x{tk} c{cm}x{cn} {stages} stages {sched}{epi_text}"
    sm80 = re.search(r"GemmShape<(\d+), (\d+), (\d+)>", demangled)
    if sm80:
        elem = re.search(r"DefaultGemmUniversal<([\w:]+),", demangled)
        math = "3xTF32" if "OpMultiplyAddFastF32" in demangled else "TensorOp"
        return f"Sm80 GemmUniversal {elem.group(1).split('::')[-1] if elem else '?'} {'x'.join(sm80.groups())} {math}"
    plain = demangled.replace("(anonymous namespace)", "{anonymous}").removeprefix("void ").split("(")[0]
    return plain.replace("{anonymous}", "(anonymous namespace)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rename", action="append", default=[],
                        help="REGEX=>REPLACEMENT applied to the before build's demangled kernel names")
    parser.add_argument("--out", type=Path, help="write the record here as well as to stdout")
    args = parser.parse_args(argv)
    renames = [(re.compile(r.split("=>", 1)[0]), r.split("=>", 1)[1]) for r in args.rename]

    # By file name wherever it lies: a CMake build keeps each object under its source's subfolder of src/cuda/.
    before_objs = {p.name: p for p in args.before.rglob("*.o")}
    after_objs = {p.name: p for p in args.after.rglob("*.o")}
    objs = sorted(set(before_objs) | set(after_objs))
    lines = [f"sass_diff.py {args.before} {args.after}" + "".join(f" --rename '{r}'" for r in args.rename), ""]
    differences: list[str] = []
    count = 0
    for name in objs:
        a, b = before_objs.get(name), after_objs.get(name)
        if a is None or b is None:
            differences.append(f"{name}: only in {'after' if b is not None else 'before'}")
            continue
        sides = []
        for side, obj in (("before", a), ("after", b)):
            code, res = kernels(obj), resources(obj)
            keys = sorted(code)
            demangled = _demangle([k[1] for k in keys])
            table = {}
            for key, dem in zip(keys, demangled):
                dem = _unmodule(dem)
                if side == "before":
                    for pattern, repl in renames:
                        dem = pattern.sub(repl, dem)
                table[(key[0], dem)] = (code[key], res.get(key, "?"))
            sides.append((table, ptx(obj)))
        (ka, pa), (kb, pb) = sides
        lines.append(f"{name}:")
        for key in sorted(set(ka) | set(kb), key=lambda k: (k[0], label(k[1]), k[1])):
            arch, dem = key
            digest = hashlib.sha256(dem.encode()).hexdigest()[:10]
            if key not in ka or key not in kb:
                side = "after" if key in kb else "before"
                differences.append(f"{name} {arch} {label(dem)} [name {digest}]: only {side}")
                continue
            (sa, ra), (sb, rb) = ka[key], kb[key]
            count += 1
            same = sa == sb and ra == rb
            lines.append(f"  {arch} sass {hashlib.sha256(sb.encode()).hexdigest()} {'same' if same else 'DIFFERS'}  "
                         f"{label(dem)} [name {digest}] {rb}")
            if sa != sb:
                differences.append(f"{name} {arch} {label(dem)}:\n" + "\n".join(
                    difflib.unified_diff(sa.splitlines(), sb.splitlines(), "before", "after", lineterm="", n=2)))
            if ra != rb:
                differences.append(f"{name} {arch} {label(dem)}: resources {ra} -> {rb}")
        for arch in sorted(set(pa) | set(pb)):
            same = pa.get(arch) == pb.get(arch)
            lines.append(f"  {arch} ptx  {hashlib.sha256(pb.get(arch, '').encode()).hexdigest()} "
                         f"{'same' if same else 'DIFFERS'}")
            if not same:
                differences.append(f"{name} {arch} PTX:\n" + "\n".join(difflib.unified_diff(
                    pa.get(arch, "").splitlines(), pb.get(arch, "").splitlines(), "before", "after", lineterm="", n=2)))
    lines.append("")
    verdict = "identical" if not differences else f"{len(differences)} differences"
    lines.append(f"{count} kernels compared: {verdict}")
    lines.extend(differences)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        args.out.write_text(text)
    return 0 if not differences else 1


if __name__ == "__main__":
    sys.exit(main())
