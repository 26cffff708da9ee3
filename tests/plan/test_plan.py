"""Whole-program plans: styles on 1-D, 2-D and 3-D meshes verify by simulation; exact collective
counts for Megatron; determinism; nvFuser's propagation cases in our terms."""

from __future__ import annotations

import pytest

from shardlayout import Mesh, Sharding, ShardingError
from shardlayout.plan import plan
from shardlayout.program import ProgramBuilder
from shardlayout.program.models import llama, style_pins

MESHES = {
    "dp": ["dp=4", "dp=2,tp=2", "pp=2,dp=2,tp=2"],
    "fsdp": ["dp=4", "dp=2,tp=4", "pp=2,dp=2,tp=2"],
    "megatron": ["tp=4", "dp=2,tp=4", "pp=2,dp=2,tp=2"],
    "megatron-sp": ["tp=2", "dp=2,tp=4", "pp=2,dp=2,tp=2"],
}


@pytest.mark.parametrize("style", sorted(MESHES))
def test_every_style_verifies_on_1d_2d_3d_meshes(style):
    prog = llama(layers=2)
    for text in MESHES[style]:
        mesh = Mesh.parse(text)
        p = plan(prog, mesh, style_pins(prog, mesh, style))
        v = p.verify()
        assert v.ok, (style, text, v)
        assert p.verified is True


def test_megatron_is_exactly_four_all_reduces_on_tp():
    prog = llama(layers=2)
    m = Mesh.parse("dp=2,tp=4")
    assert plan(prog, m, style_pins(prog, m, "megatron")).counts() == {("all_reduce", ("tp",)): 4}
    assert plan(prog, m, style_pins(prog, m, "megatron-sp")).counts() == {
        ("all_gather", ("tp",)): 4, ("reduce_scatter", ("tp",)): 4}
    assert plan(prog, m, style_pins(prog, m, "dp")).counts() == {}
    # FSDP: each of the 9 weights of each layer is gathered on dp before use
    assert plan(prog, m, style_pins(prog, m, "fsdp")).counts() == {("all_gather", ("dp",)): 18}


def test_plans_are_deterministic():
    prog = llama(layers=2)
    m = Mesh.parse("dp=2,tp=4")
    a = plan(prog, m, style_pins(prog, m, "megatron-sp")).to_json(include_timing=False)
    b = plan(prog, m, style_pins(prog, m, "megatron-sp")).to_json(include_timing=False)
    assert a == b


def test_pins_are_checked_and_never_overwritten():
    prog = llama(layers=1)
    m = Mesh.parse("tp=2")
    with pytest.raises(ShardingError, match="no such tensor"):
        plan(prog, m, {"nope": Sharding(m, (2,))})
    with pytest.raises(ShardingError, match="has shape"):
        plan(prog, m, {"x": Sharding(m, (2, 8))})
    pin = Sharding.parse("[2, tp*4, 16]", m)
    p = plan(prog, m, {"layers.0.resid1": pin})
    assert p.shardings["layers.0.resid1"] == pin and p.verify().ok


# nvFuser propagation cases (shared/conformance/nvfuser_cases.md), a DID axis being a mesh axis


def test_nvfuser_case1_output_follows_the_first_sharded_input():
    b = ProgramBuilder()
    a, c = b.input("a", (3, 4, 6)), b.input("b", (3, 4, 6))
    b.output(b.op("add", [a, c], name="c"))
    m = Mesh.parse("d=3")
    # equal costs either way: ties keep input order, so c follows a (nvFuser: the same)
    p = plan(b.build(), m, {"a": Sharding.parse("[d, 4, 6]", m), "b": Sharding.parse("[3, 4, d*2]", m)})
    assert p.shardings["c"].dims[0][0].axis == "d" and p.verify().ok


def test_nvfuser_case3_one_device_axis_per_tensor():
    b = ProgramBuilder()
    t0, t1 = b.input("t0", (4, 6)), b.input("t1", (4, 6))
    b.output(b.op("add", [t0, t1], name="t2"))
    m = Mesh.parse("d=2")
    p = plan(b.build(), m, {"t0": Sharding.parse("[d*2, 6]", m), "t1": Sharding.parse("[4, d*3]", m)})
    assert len(p.shardings["t2"].axes_used()) == 1 and p.verify().ok


def test_nvfuser_case8_propagation_does_not_overwrite_pins():
    b = ProgramBuilder()
    t0, t1 = b.input("t0", (6, 4)), b.input("t1", (6, 4))
    t2 = b.op("clone", [t1], name="t2")
    b.output(b.op("add", [t0, t2], name="t3"))
    m = Mesh((2, 3), ("dy", "dx"))
    pins = {"t0": Sharding.parse("[dx*2, 4]", m), "t1": Sharding.parse("[dy*3, 4]", m),
            "t2": Sharding.parse("[dy*3, 4]", m)}
    p = plan(b.build(), m, pins)
    assert p.shardings["t2"] == pins["t2"] and p.verify().ok


def test_nvfuser_case7_reshape_with_independent_splits_in_a_program():
    b = ProgramBuilder()
    x = b.input("x", (9, 5, 14, 9))
    b.output(b.op("reshape", [x], name="y", shape=(45, 126)))
    m = Mesh((2, 3), ("dy", "dx"))
    p = plan(b.build(), m, {"x": Sharding.parse("[dx*3, 5, dy*7, 9]", m)})
    assert str(p.shardings["y"]) == "[dx*15, dy*63]" and not p.collectives and p.verify().ok


def test_nvfuser_case17_column_and_sequence_parallel_linear():
    # in [t, h] sequence-parallel, w [4h, h] column-parallel; out = linear(in, w): the weight's
    # sharding wins (out features on d) and the input's sequence shards are gathered
    b = ProgramBuilder()
    x, w = b.input("in", (8, 4)), b.param("w", (16, 4))
    b.output(b.op("linear", [x, w], name="out"))
    m = Mesh.parse("d=2")
    p = plan(b.build(), m, {"in": Sharding.parse("[d*4, 4]", m), "w": Sharding.parse("[d*8, 4]", m)})
    assert str(p.shardings["out"]) == "[8, d*8]"
    assert [(c.kind, c.tensor) for c in p.collectives] == [("all_gather", "in")]
    assert p.verify().ok


@pytest.mark.parametrize("mesh", ["ep=4", "dp=2,tp=2", "ep=2,dp=2,tp=2"])
def test_moe_expert_parallel_dispatches_and_combines(mesh):
    # routed MoE: one all_to_all from token sources to expert owners and its inverse, each of the
    # ideal size (tokens/ep) * top_k * dim * itemsize; no all_gather of tokens or weights
    from shardlayout.program.models import moe

    tokens, dim, top_k = 256, 64, 2
    prog = moe(tokens=tokens, dim=dim, experts=8, ffn=128, top_k=top_k)
    m = Mesh.parse(mesh)
    p = plan(prog, m, style_pins(prog, m, "ep"))
    axis = "ep" if "ep" in m.names else "dp"
    assert p.counts() == {("all_to_all", (axis,)): 2}  # dispatch, combine
    shards = m.axis_size(axis) * (m.axis_size("dp") if axis == "ep" and "dp" in m.names else 1)
    ideal = tokens // shards * top_k * dim * 4  # tokens on dp x ep when both: each moves within its ep group
    assert [c.bytes for c in p.collectives] == [ideal, ideal]
    assert [c.tensor for c in p.collectives] == ["dispatch", "expert_out"]
    assert p.shardings["experts.w1"].dims[0][0].axis == axis
    v = p.verify()
    assert v.ok and any("real routing" in n for n in v.notes)


def test_nvfuser_case13_forward_from_a_sharded_weight():
    # in [M,K], w [K,N] with w split on N (nvFuser: Stream; here a mesh axis): out follows w
    b = ProgramBuilder()
    x, w = b.input("in", (4, 6)), b.param("w", (6, 8))
    b.output(b.op("mm", [x, w], name="out"))
    m = Mesh.parse("s=2")
    p = plan(b.build(), m, {"w": Sharding.parse("[6, s*4]", m)})
    assert str(p.shardings["out"]) == "[4, s*4]" and not p.collectives and p.verify().ok


def test_nvfuser_case14_backward_pass_shards_what_forward_left_unsharded():
    # tv1 = add(tv0, 1.0); tv2 = add(tv1, tv1); only tv2 is split: the backward pass gives tv0
    # (a program input) and tv1 the same split, for free
    b = ProgramBuilder()
    t0 = b.input("tv0", (8, 4))
    t1 = b.op("add", [t0, 1.0], name="tv1")
    b.output(b.op("add", [t1, t1], name="tv2"))
    m = Mesh.parse("s=2")
    pin = Sharding.parse("[s*4, 4]", m)
    p = plan(b.build(), m, {"tv2": pin})
    assert p.shardings["tv0"] == p.shardings["tv1"] == p.shardings["tv2"] == pin
    assert not p.collectives and p.verify().ok
    q = plan(b.build(), m, {"tv2": pin}, backward=False)
    assert q.shardings["tv0"] == Sharding(m, (8, 4))  # forward alone leaves the input replicated


def test_creation_ops_take_their_sharding_from_consumers():
    b = ProgramBuilder()
    x = b.input("x", (8, 4))
    z = b.op("full", [], name="z", size=(8, 4), fill_value=2.0)
    b.output(b.op("mul", [x, z], name="y"))
    m = Mesh.parse("d=2")
    p = plan(b.build(), m, {"x": Sharding.parse("[d*4, 4]", m)})
    assert str(p.shardings["z"]) == "[d*4, 4]" and not p.collectives and p.verify().ok


def test_an_op_with_a_list_param_is_planned_and_not_shared():
    """Params built by hand may hold a list (unhashable): the op is resolved every time instead of
    sharing a memo row, and planned the same."""
    from shardlayout.program import Op, Program, TensorSpec

    prog = Program({"x": TensorSpec("x", (4, 8), kind="input"), "y": TensorSpec("y", (2, 16))},
                   (Op("view", ("x",), (("size", [2, 16]),), ("y",), "v"),), ("y",))
    p = plan(prog, Mesh.parse("tp=2"), {"x": "[tp*2, 8]"})
    assert str(p.shardings["y"]) == "[tp, 16]" and p.verify().ok
