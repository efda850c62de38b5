"""A model as ONNX Runtime saves it after placing it on its CUDA provider: with the host/device copies it inserts.

ORT's transformers optimizer with ``use_gpu=True`` (``opt_level`` 1 or more) saves the graph of a CUDA session,
which holds ``MemcpyFromHost``/``MemcpyToHost`` nodes wherever a tensor is read on another device than the one it
is made on. :func:`with_device_copies` writes them into a model the same way, without a GPU, following ORT's two
steps:

1. placement (``onnxruntime/core/framework/fallback_cpu_capability.cc``, ``GetCpuPreferredNodes``): every node
   runs on CUDA, except the small shape arithmetic ORT moves to the CPU. Starting from the readers of the tensors
   CUDA kernels write to host memory (``Shape``, ``Size``), in topological order, a node goes to the CPU when
   none of its inputs is float16 or bfloat16 and each is a small initializer (at most 100 elements), a graph input,
   or a tensor already on the CPU that its CUDA kernel does not itself take from host memory (a Reshape's target,
   a Range's bounds: ``_CPU_INPUTS``); the readers of what it writes are candidates in turn;
2. copies (``onnxruntime/core/optimizer/transformer_memcpy.cc``): a tensor a CPU node makes and a CUDA node reads
   (other than from host memory) gets ``MemcpyFromHost`` into ``<tensor>_CUDAExecutionProvider``, which the CUDA
   readers read instead; so does a graph input read by nodes on both devices (one read on one device only is
   copied by the session itself). Nodes are named ``Memcpy``, ``Memcpy_1``, ... in the default domain, as ORT
   names them.

ORT's own CPU provider runs these ops as copies, so such a model runs on it: a test compares its outputs with the
fused model's directly. What this does not reproduce is everything else the session does: its constant folding
first turns the Shape of a shape vector into a constant, so it copies fewer tensors than this writes (a superset:
``test_patterns_attention_seethrough`` checks that the copies ORT 1.31's CUDA session wrote are among them), and it
duplicates an initializer read on both devices instead of copying it. The copies are what the rules must see
through.
:func:`copy_to_host` adds the other direction, a ``MemcpyToHost`` in front of a tensor's readers (ORT writes one
where a node without a CUDA kernel reads a CUDA tensor).
"""

from __future__ import annotations

import heapq

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper

from onnxfuse.patterns.graph import GraphView, infer_types

CUDA = "CUDAExecutionProvider"
# Outputs CUDA kernels write to host memory (KernelDefBuilder().OutputMemoryType<OrtMemTypeCPUOutput>).
_CPU_OUTPUTS = {"Shape": (0,), "Size": (0,)}
# Inputs CUDA kernels read from host memory (InputMemoryType<OrtMemTypeCPUInput>), for the ops exporters write
# around attention: shape targets, axes, bounds, sizes.
_CPU_INPUTS = {"Reshape": (1,), "Expand": (1,), "Unsqueeze": (1,), "Squeeze": (1,), "Slice": (1, 2, 3, 4),
               "ConstantOfShape": (0,), "Range": (0, 1, 2), "Tile": (1,), "Split": (1,), "ReduceSum": (1,),
               "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "Pad": (1, 2, 3), "TopK": (1,)}
_SMALL_INITIALIZER = 100  # kSmallInitializerThreshold
_HALF = (T.FLOAT16, T.BFLOAT16)


def cpu_nodes(model: onnx.ModelProto) -> set[int]:
    """Indices of the nodes ORT's CUDA session places on the CPU (module docstring, step 1)."""
    graph = model.graph
    view = GraphView(graph, inferred=list(infer_types(model).value_info))
    small = {t.name for t in graph.initializer if int(np.prod(t.dims, dtype=np.int64)) <= _SMALL_INITIALIZER}
    for node in graph.node:  # a Constant node is an initializer to ORT (it converts them when it loads a model)
        if node.op_type == "Constant" and node.attribute and \
                int(np.prod(node.attribute[0].t.dims, dtype=np.int64)) <= _SMALL_INITIALIZER:
            small.add(node.output[0])
    inputs = {v.name for v in graph.input}
    on_cpu: set[str] = set()
    candidates: list[int] = []
    for node in graph.node:
        for k in _CPU_OUTPUTS.get(node.op_type, ()):
            on_cpu.add(node.output[k])
            candidates += view.consumers_of(node.output[k])
    heapq.heapify(candidates)
    placed, visited = set(), set()
    while candidates:
        i = heapq.heappop(candidates)
        if i in visited:
            continue
        visited.add(i)
        node = graph.node[i]
        if node.op_type == "Constant":
            continue
        place = True
        for k, name in enumerate(node.input):
            if not name:
                continue
            if view.dtype(name) in _HALF:
                place = False
                break
            if name in small or name in inputs:
                continue
            if name not in on_cpu or k in _CPU_INPUTS.get(node.op_type, ()):
                place = False
                break
        if place:
            placed.add(i)
            for out in node.output:
                on_cpu.add(out)
                for r in view.consumers_of(out):
                    heapq.heappush(candidates, r)
    return placed


def with_device_copies(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with the ``MemcpyFromHost`` nodes ORT's CUDA session inserts (module docstring)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    on_cpu = cpu_nodes(model)
    inputs = {v.name for v in graph.input}
    made_on_cpu = {o for i in on_cpu for o in graph.node[i].output} | inputs
    read_on: dict[str, set[bool]] = {}  # tensor -> the devices that read it (True: the CPU)
    for i, node in enumerate(graph.node):
        for k, name in enumerate(node.input):
            if name:
                read_on.setdefault(name, set()).add(i in on_cpu or k in _CPU_INPUTS.get(node.op_type, ()))
    copied = sorted(t for t, devices in read_on.items() if t in made_on_cpu and False in devices
                    and (t not in inputs or True in devices))
    names = _Names(graph)
    copies = {t: f"{t}_{CUDA}" for t in copied}
    for i, node in enumerate(graph.node):
        if i in on_cpu:
            continue
        for k, name in enumerate(node.input):
            if name in copies and k not in _CPU_INPUTS.get(node.op_type, ()):
                node.input[k] = copies[name]
    for t in copied:
        graph.node.append(helper.make_node("MemcpyFromHost", [t], [copies[t]], name=names.next()))
    return _sorted(out)


def copy_to_host(model: onnx.ModelProto, tensor: str) -> onnx.ModelProto:
    """A copy of ``model`` whose readers of ``tensor`` read it through a ``MemcpyToHost`` (ORT's form: the
    producer writes ``<tensor>_CUDAExecutionProvider`` and the copy writes ``tensor``)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    device = f"{tensor}_{CUDA}"
    producer = next(n for n in graph.node if tensor in n.output)
    producer.output[list(producer.output).index(tensor)] = device
    graph.node.append(helper.make_node("MemcpyToHost", [device], [tensor], name=_Names(graph).next()))
    return _sorted(out)


class _Names:
    def __init__(self, graph: onnx.GraphProto):
        self.taken = {n.name for n in graph.node}
        self.k = 0

    def next(self) -> str:
        while True:
            name = "Memcpy" if self.k == 0 else f"Memcpy_{self.k}"
            self.k += 1
            if name not in self.taken:
                self.taken.add(name)
                return name


def _sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """The nodes in a topological order (the copies were appended at the end)."""
    graph = model.graph
    known = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        ready = [k for k, n in enumerate(pending) if all(x in known for x in n.input)]
        if not ready:
            raise ValueError("the graph has a cycle or reads a tensor nothing makes")
        for k in ready:
            ordered.append(pending[k])
            known.update(pending[k].output)
        pending = [n for k, n in enumerate(pending) if k not in set(ready)]
    del graph.node[:]
    graph.node.extend(ordered)
    return model
