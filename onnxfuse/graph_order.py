"""What a node reads, and the one order nodes are put in: every node after the producers of what it reads.

Two places need that order. Loading (``model_io``) sorts an input whose node list is out of order (ONNX
Runtime sorts a graph itself, so exporters and converters write such models and ORT runs them), after
refusing what no order can fix; the rewrite (``fuse``) puts a node list back in order where a block's
replacement, which takes the place of the block's last node, now stands after a reader of its outputs. Both
are :func:`stable_order` on the nodes' dependencies: Kahn's order with the list position as priority, so a
list already in order comes out as it went in, and a node that must move waits only until what it reads
exists.

Nothing of the package is imported here: the loader, the rules' graph view and the rewrite all build on it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import onnx


def node_reads(node: onnx.NodeProto) -> set[str]:
    """Every tensor ``node`` reads, including outer-scope names read inside its subgraphs."""
    names = {i for i in node.input if i}
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            names |= subgraph_references(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            for g in a.graphs:
                names |= subgraph_references(g)
    return names


def subgraph_references(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name a subgraph reads (over-approximate: also names it defines itself).

    Outer-scope tensors read inside an If/Loop/Scan body are consumers the flat node list does not show;
    counting them keeps a tensor used inside a body from being treated as single-use."""
    names: set[str] = set()
    for node in graph.node:
        names |= node_reads(node)
    return names


def stable_order(waits_on: Sequence[set[int]]) -> list[int]:
    """The positions ``0 .. len(waits_on) - 1`` in dependency order: ``waits_on[i]`` holds the positions
    node ``i`` must come after. Each step takes the first position (in the original order) whose
    dependencies are all placed, so positions already in order keep their places relative to each other.

    Positions caught in a cycle, or waiting on one, are never placed: the result is then shorter than
    ``waits_on``, and the caller says what that means for its graph."""
    readers: dict[int, list[int]] = {}
    for i, deps in enumerate(waits_on):
        for j in deps:
            readers.setdefault(j, []).append(i)
    pending = [len(deps) for deps in waits_on]
    ready = [i for i, n in enumerate(pending) if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for r in readers.get(i, ()):
            pending[r] -= 1
            if pending[r] == 0:
                heapq.heappush(ready, r)
    return order
