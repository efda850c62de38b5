"""Cast wrappers of fp16/bf16 graphs: ``Cast(to=float) → GELU → Cast(to=float16)``.

ORT's float16 converter keeps some ops in float32 by wrapping them in Casts. The fused kernel computes the
activation in float32 on its accumulator and rounds once to the output type, so it computes what the
wrapped graph computes (with one rounding fewer). This normaliser widens a recognised activation to
include its Casts; whether the types agree with the Linear is checked once the Linear is known.
"""

from __future__ import annotations

import dataclasses

from .graph import GraphView, attr, is_op
from .rule import Activation, Refusal, T, upcast_root

RULE = "cast-wrapper"
_DOWNCAST_TYPES = (T.FLOAT16, T.BFLOAT16)


def widen(view: GraphView, act: Activation) -> Activation | Refusal:
    """Include the upcast before and the downcast after ``act`` (if it has them) in the activation."""
    nodes = set(act.nodes)
    root, upcast = upcast_root(view, act.input, nodes)
    upcast |= act.upcast
    if not upcast:
        return act
    consumer = view.single_consumer(act.output)
    cast = view.nodes[consumer] if consumer is not None else None
    if cast is None or not is_op(cast, "Cast") or attr(cast, "to") not in _DOWNCAST_TYPES:
        return Refusal(RULE, f"{act.form} computes in float32 after a Cast but its result is not cast back to "
                             "float16/bfloat16 by a single Cast: fusing would change the output type",
                       tuple(view.node_name(i) for i in sorted(nodes)))
    nodes.add(consumer)
    return dataclasses.replace(act, form=f"Cast({act.form})", input=root, output=cast.output[0],
                               nodes=frozenset(nodes), upcast=True, downcast_to=attr(cast, "to"))
