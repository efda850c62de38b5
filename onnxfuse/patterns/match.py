"""The matching toolkit every rule shares: one refusal exception and compact path reading.

A rule's stages walk the read-only :class:`~.graph.GraphView` and, where a candidate cannot be rewritten
exactly, raise :class:`Refused` with a reason written for the user; the rule's ``match`` turns it into a
:class:`~.rule.Refusal` (``Refused.as_refusal``). Exceptions that a stage catches to choose another form
(the attention's separate projections when Q, K and V cannot be packed, a value the symbolic evaluator
cannot follow) subclass it, so every reason reaches the user the same way.

:func:`parent_path` reads a chain of producers the way ONNX Runtime's fusions do
(``match_parent_path(node, ["Add", "MatMul"], [0, None])``), so that a rule states the path it expects
instead of walking it by hand. Nodes a proof may read past — those that pass a value on unchanged (Identity,
ONNX Runtime's device copies, a Cast to the type the tensor has) and an Expand to a shape its reader broadcasts
to anyway — are read past by :func:`~.graph.value_source`, one walk for every rule.

The Linear in front of a tensor, in every form exporters write it (MatMul [+ Add], Gemm, a trailing Reshape,
the tensordot), is read by one matcher in the sibling module :mod:`.linear_match`
(:func:`~.linear_match.find_linear`): the GELU rule and the packed attention projection use it, and a rule
with more Linears calls it once for each.
"""

from __future__ import annotations

from collections.abc import Sequence

from .graph import GraphView, is_op


class Refused(Exception):
    """A candidate that cannot be rewritten exactly; ``str(e)`` is the reason, written for the user."""

    @property
    def reason(self) -> str:
        return str(self)

    def as_refusal(self, rule: str, nodes: Sequence[str] = ()):
        from .rule import Refusal  # (rule imports graph only; this keeps the toolkit below it)

        return Refusal(rule, self.reason, tuple(nodes))


Step = str | tuple[str, str]  # op_type, or (domain, op_type)


def _is(node, step: Step) -> bool:
    if isinstance(step, tuple):
        domain, op_type = step
        return is_op(node, op_type, domain)
    return is_op(node, step)


def parent_path(view: GraphView, name: str, ops: Sequence[Step],
                inputs: Sequence[int | None] | None = None) -> list[int] | None:
    """The producers along ``ops``, read upward from tensor ``name``, as node indices; None where the path
    breaks.

    ``ops[0]`` must produce ``name``; ``ops[k + 1]`` must produce input ``inputs[k]`` of the node matched at
    step ``k`` (None: whichever input it is, the first that matches). A step is an op type of the default
    domain or a ``(domain, op_type)`` pair. ``inputs`` may be shorter than ``len(ops) - 1`` only when it is
    omitted (every step then reads input 0)."""
    if inputs is None:
        inputs = [0] * max(len(ops) - 1, 0)
    if len(inputs) != max(len(ops) - 1, 0):
        raise ValueError(f"parent_path: {len(ops)} ops need {len(ops) - 1} input indices, got {len(inputs)}")
    found: list[int] = []

    def walk(tensor: str, k: int) -> bool:
        i = view.producer.get(tensor)
        if i is None or not _is(view.nodes[i], ops[k]):
            return False
        found.append(i)
        if k + 1 == len(ops):
            return True
        node = view.nodes[i]
        slots = range(len(node.input)) if inputs[k] is None else [inputs[k]]
        for s in slots:
            if s < len(node.input) and node.input[s] and walk(node.input[s], k + 1):
                return True
        found.pop()
        return False

    return list(found) if ops and walk(name, 0) else None

