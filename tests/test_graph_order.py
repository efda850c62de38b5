"""graph_order: the one dependency order both the loader and the rewrite use, and what a node reads."""

from __future__ import annotations

from onnx import TensorProto as T
from onnx import helper

from onnxfuse.graph_order import node_reads, stable_order


def test_a_list_in_order_comes_out_as_it_went_in():
    assert stable_order([set(), {0}, {0}, {1, 2}]) == [0, 1, 2, 3]
    assert stable_order([set(), set(), set()]) == [0, 1, 2]  # independent nodes keep their places


def test_a_node_that_must_move_waits_only_until_what_it_reads_exists():
    # node 0 reads what node 3 computes: it goes right after 3, and 1, 2 keep their places before it
    assert stable_order([{3}, set(), set(), set(), {0}]) == [1, 2, 3, 0, 4]


def test_ties_go_to_the_earlier_position():
    # 2 and 3 both become ready once 1 is placed; 0 waits on 3
    assert stable_order([{3}, set(), {1}, {1}]) == [1, 2, 3, 0]


def test_positions_in_a_cycle_are_never_placed():
    order = stable_order([set(), {2}, {1}, {0}])
    assert order == [0, 3] and len(order) < 4
    assert stable_order([{0}]) == []  # a node waiting on itself


def test_node_reads_includes_outer_names_read_inside_subgraphs():
    body = helper.make_graph([helper.make_node("Add", ["outer_w", "local"], ["y"])], "body", [],
                             [helper.make_tensor_value_info("y", T.FLOAT, [1])])
    node = helper.make_node("If", ["cond", ""], ["out"], then_branch=body, else_branch=body)
    assert node_reads(node) == {"cond", "outer_w", "local"}  # the empty optional input is no read
