"""The pass driver knows no fusion by name: a rule written here, outside the package, plugs into it and is
fused, reported, refused with its reasons and checked like the built-in ones, with no edit to the driver.

The test-only rule: SiLU, ``x · Sigmoid(x)``, becomes ORT's ``com.microsoft.QuickGelu(alpha=1)``, which
computes exactly ``x · σ(1·x)`` (a real contrib op with a CPU kernel, so the result runs in ORT)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxfuse.domain import DOMAIN, OP_TYPE
from onnxfuse.errors import ProviderPlacementError
from onnxfuse.fuse import fuse_model
from onnxfuse.patterns import Plan, Refusal, default_rules
from onnxfuse.patterns.graph import GraphView, is_op
from onnxfuse.patterns.rule import operand_orders
from tests.graphs import build

MS = "com.microsoft"


@dataclass(frozen=True)
class SiluPlan(Plan):
    x: str

    op = (MS, "QuickGelu")

    def emit(self, out, name):
        return [helper.make_node("QuickGelu", [self.x], list(self.outputs), name=name, domain=MS, alpha=1.0)]

    def details(self):
        return {"alpha": 1.0}


class SiluRule:
    name = "silu"
    anchors = (("", "Sigmoid"),)
    emits = ((MS, "QuickGelu"),)

    def match(self, view: GraphView, i: int):
        sigmoid = view.nodes[i]
        x = sigmoid.input[0]
        # Whether the Sigmoid's output is read elsewhere is the driver's check (closedness), not the rule's.
        muls = [c for c in view.consumers_of(sigmoid.output[0]) if is_op(view.nodes[c], "Mul")
                and any(a == x and b == sigmoid.output[0] for a, b in operand_orders(view.nodes[c]))]
        if not muls:
            return None
        mul = muls[0]
        nodes = (view.node_name(i), view.node_name(mul))
        if view.dtype(x) != TensorProto.FLOAT:
            return Refusal(self.name, "QuickGelu is registered for float32 only here", nodes)
        return SiluPlan(rule=self.name, form="x*Sigmoid(x)", nodes=frozenset({i, mul}),
                        outputs=(view.nodes[mul].output[0],), name_hint=view.node_name(mul), x=x)


def _silu_model(dtype=TensorProto.FLOAT, sigmoid_is_output=False) -> onnx.ModelProto:
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sig"), helper.make_node("Mul", ["s", "x"], ["y"], name="mul")]
    outputs = [helper.make_tensor_value_info("y", dtype, [2, 8])]
    if sigmoid_is_output:
        outputs.append(helper.make_tensor_value_info("s", dtype, [2, 8]))
    graph = helper.make_graph(nodes, "silu", [helper.make_tensor_value_info("x", dtype, [2, 8])], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


RULES = (*default_rules(), SiluRule())


def test_a_new_rule_fuses_and_is_reported():
    result = fuse_model(_silu_model(), rules=RULES)
    (node,) = result.model.graph.node
    assert (node.domain, node.op_type, list(node.input), list(node.output)) == (MS, "QuickGelu", ["x"], ["y"])
    assert {o.domain: o.version for o in result.model.opset_import}[MS] == 1  # the driver imports the domain
    (block,) = result.report.fused
    assert (block.rule, block.op, block.form, block.replaced) == ("silu", "com.microsoft.QuickGelu", "x*Sigmoid(x)",
                                                                 ("sig", "mul"))
    report = result.report.to_dict()
    assert report["fused_by_op"] == {"com.microsoft.QuickGelu": 1}
    assert report["blocks"][0] == {"name": block.name, "rule": "silu", "op": "com.microsoft.QuickGelu",
                                   "form": "x*Sigmoid(x)", "replaced": ["sig", "mul"], "alpha": 1.0}
    onnx.checker.check_model(result.model, full_check=True)


def test_the_rewritten_model_runs_and_computes_the_same():
    original = _silu_model()
    fused = fuse_model(original, rules=RULES).model
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(run(fused)[0], run(original)[0], rtol=1e-6, atol=1e-7)


def test_the_rules_own_refusal_is_reported_and_the_graph_kept():
    model = _silu_model(dtype=TensorProto.DOUBLE)
    result = fuse_model(model, rules=RULES)
    assert result.model.SerializeToString() == model.SerializeToString()
    (refusal,) = result.report.refused
    assert (refusal.rule, refusal.reason, refusal.nodes) == ("silu", "QuickGelu is registered for float32 only here",
                                                            ("sig", "mul"))


def test_the_driver_refuses_a_block_whose_intermediate_escapes():
    model = _silu_model(sigmoid_is_output=True)
    result = fuse_model(model, rules=RULES)
    assert result.model.SerializeToString() == model.SerializeToString()
    (refusal,) = result.report.refused
    assert refusal.rule == "single-use" and "'s' is a graph output" in refusal.reason


def test_rules_of_different_fusions_share_one_pass():
    """A Linear+GELU block and a SiLU in one model: each rule fuses its own; the domains are both imported."""
    model = build("erf:pytorch:div", "matmul")
    g = model.graph
    y = g.output[0].name
    g.node.extend([helper.make_node("Sigmoid", [y], ["s2"], name="sig2"),
                   helper.make_node("Mul", [y, "s2"], ["z"], name="mul2")])
    out = onnx.ValueInfoProto()
    out.CopyFrom(g.output[0])
    out.name = "z"
    del g.output[:]
    g.output.append(out)
    result = fuse_model(model, rules=RULES)
    assert result.report.fused_by_op == {f"{DOMAIN}.{OP_TYPE}": 1, "com.microsoft.QuickGelu": 1}
    assert {o.domain for o in result.model.opset_import} >= {DOMAIN, MS}
    assert [n.op_type for n in result.model.graph.node] == [OP_TYPE, "QuickGelu"]


class QuickGeluTwiceRule:
    """A second-pass rule: QuickGelu(QuickGelu(x)) as the test's marker op, matched on what SiluRule wrote."""

    name = "quick-gelu-twice"
    anchors = ((MS, "QuickGelu"),)
    emits = ((MS, "QuickGelu"),)
    after_rewrites = True
    seen: list = []

    def match(self, view: GraphView, i: int):
        self.seen.append(view.nodes[i].name)
        return None


def test_a_rule_after_rewrites_sees_what_the_first_pass_wrote():
    rule = QuickGeluTwiceRule()
    rule.seen = []
    result = fuse_model(_silu_model(), rules=(rule, SiluRule()))  # listed first, it still runs second
    assert [b.rule for b in result.report.fused] == ["silu"]
    (node,) = result.model.graph.node
    assert rule.seen == [node.name]  # the QuickGelu SiluRule wrote, in the second pass's view


def test_a_second_pass_with_nothing_to_match_leaves_the_first_passs_model():
    model = build("erf:pytorch:div", "matmul")  # no SiLU: nothing writes a QuickGelu
    plain = fuse_model(model, rules=default_rules())
    result = fuse_model(model, rules=(*default_rules(), QuickGeluTwiceRule()))
    assert result.model.SerializeToString() == plain.model.SerializeToString()
    assert result.report.to_dict() == plain.report.to_dict()


def test_the_default_rules_leave_silu_alone():
    model = _silu_model()
    result = fuse_model(model)
    assert result.model.SerializeToString() == model.SerializeToString()
    assert not result.report.fused and not result.report.refused


def test_approximate_configures_the_default_rules_only():
    with pytest.raises(ValueError, match="configures the default rules"):
        fuse_model(_silu_model(), rules=RULES, approximate="tanh")


def test_placement_checks_every_op_the_rules_write(tmp_path):
    """bench's placement check holds the nodes of every rule to the requested provider, by what the rules
    say they emit: a real ORT profile of the SiLU-fused model on the CPU."""
    from onnxfuse.measure.placement import profile_placement
    from onnxfuse.patterns import emitted_op_types

    assert "FusedLinearGelu" in emitted_op_types()  # the default rules
    fused = fuse_model(_silu_model(), rules=RULES).model.SerializeToString()
    feeds = {"x": np.ones((2, 8), np.float32)}
    placement = profile_placement(fused, "cpu", feeds, fused_ops=emitted_op_types(RULES))
    assert placement.fused_by_op == {"QuickGelu": 1} and placement.fused_nodes == 1
    placement.elsewhere.append({"node": "mul/QuickGelu", "op": "QuickGelu", "provider": "XnnpackExecutionProvider"})
    with pytest.raises(ProviderPlacementError, match=r"1 of 1 QuickGelu nodes ran on Xnnpack instead of CPU"):
        placement.check_fused()
