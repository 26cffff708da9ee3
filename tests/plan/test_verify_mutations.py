"""Mutation tests: a plan broken on purpose — a swapped shard order, a missing reduction, a rule
that forgets a partial output, a wrong sub-axis, an off-by-one uneven chunk, an op whose index
map lies — is caught by ``Plan.verify`` at 8 ranks and at 8192 ranks, by the index-level proof
and by the numeric oracle each on their own (and, at 8 ranks, by the full simulation)."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest

from shardlayout import AxisPiece, Collective, CollectiveKind, Mesh, Sharding, plan_move, register_op
from shardlayout.execute.verify import verify_plan
from shardlayout.ops.strategy import FactorMap, factor_rule
from shardlayout.plan import plan
from shardlayout.program import ProgramBuilder
from shardlayout.program.models import llama, style_pins

MESHES = ["dp=2,tp=4", "dp=256,tp=32"]


def claim(p, op_name: str, inputs=None, outputs=None):
    """``p`` with op ``op_name`` claiming other input targets and/or output shardings (a broken
    rule); every move is re-planned from the claims, so only the op itself is wrong."""
    q = copy.copy(p)
    q.ops, q.shardings, q.moves = list(p.ops), dict(p.shardings), dict(p.moves)
    i = next(k for k, op in enumerate(p.program.ops) if op.name == op_name)
    op, po = p.program.ops[i], p.ops[i]
    q.ops[i] = replace(po, input_targets=tuple(inputs or po.input_targets), outputs=tuple(outputs or po.outputs))
    for name, tgt in zip(op.inputs, q.ops[i].input_targets):
        if isinstance(name, str) and tgt != q.shardings[name]:
            q.moves[(name, tgt)] = plan_move(q.shardings[name], tgt)
    for name, new in zip(op.outputs, q.ops[i].outputs):
        q.moves.pop((name, p.shardings[name]), None)
        q.shardings[name] = new
        for cop, cpo in zip(p.program.ops, p.ops):
            for n, t in zip(cop.inputs, cpo.input_targets):
                if n == name and t != new:
                    q.moves[(name, t)] = plan_move(new, t)
    return q


def edit_moves(p, tensor: str, fn):
    """``p`` with ``fn`` applied to every planned chain of moves of ``tensor``."""
    q = copy.copy(p)
    q.moves = {k: (fn(v) if k[0] == tensor else v) for k, v in p.moves.items()}
    return q


def caught(q, mesh: Mesh) -> dict:
    """Which oracles reject ``q``: the default verification, the proof alone, the numeric runs
    alone, and (8 ranks) the full simulation."""
    out = {"classes": not q.verify().ok,
           "proof": not verify_plan(q, numeric=False).ok,
           "numeric": not verify_plan(q, proof=False).ok}
    if mesh.size <= 64:
        out["full"] = not q.verify(mode="full").ok
    return out


def llama_plan(text: str):
    m = Mesh.parse(text)
    prog = llama(layers=1)
    p = plan(prog, m, style_pins(prog, m, "megatron-sp"))
    assert p.verify().ok
    return p, m


@pytest.mark.parametrize("text", MESHES)
def test_swapped_shard_order_is_caught(text):
    m = Mesh.parse(text)
    t = m.axis_size("tp")
    b = ProgramBuilder()
    x = b.input("x", (2 * m.axis_size("dp"), 2 * t, 8))
    y = b.op("view", [x], name="y", shape=(4 * m.axis_size("dp") * t, 8))
    b.output(b.op("relu", [y], name="z"))
    p = plan(b.build(), m, {"x": Sharding.parse("[dp*2, tp*2, 8]", m)})
    assert str(p.shardings["y"]) == "[dp*2*tp*2, 8]" and p.verify().ok
    swapped = Sharding.parse("[tp*2*dp*2, 8]", m)  # the same factors, tp and dp in the other order
    got = caught(claim(p, "y", outputs=[swapped]), m)
    assert all(got.values()), got
    assert "the local reshape is not the global one" in claim(p, "y", outputs=[swapped]).verify().first_mismatch


def first_chain(p, want):
    """The first tensor (in program order) with a planned chain of moves in which ``want(c)`` holds."""
    for op in p.program.ops:
        for name in list(op.inputs) + list(op.outputs):
            if any(k[0] == name and any(want(c) for c in v) for k, v in p.moves.items()):
                return name
    raise AssertionError("no such move in the plan")


@pytest.mark.parametrize("text", MESHES)
def test_missing_reduce_is_caught(text):
    p, m = llama_plan(text)

    def local_instead_of_reduce(chain):  # the reduction replaced by a local step to the same target
        return tuple(Collective(CollectiveKind.LOCAL, (), (), 0, c.src, c.dst) if c.reduce_op else c for c in chain)

    q = edit_moves(p, first_chain(p, lambda c: c.reduce_op is not None), local_instead_of_reduce)
    got = caught(q, m)
    assert all(got.values()), got
    assert "without a reduction" in q.verify().first_mismatch


@pytest.mark.parametrize("text", MESHES)
def test_rule_that_forgets_the_partial_sum_is_caught(text):
    p, m = llama_plan(text)
    i = next(i for i, po in enumerate(p.ops) if po.target == "mm" and po.outputs[0].partial)
    out = p.ops[i].outputs[0]
    assert out.partial == (("tp", "sum"),)
    q = claim(p, p.ops[i].name, outputs=[out.with_partial(())])
    got = caught(q, m)
    assert all(got.values()), got
    assert "must be partial(sum) on tp" in q.verify().first_mismatch


@pytest.mark.parametrize("text", MESHES)
def test_wrong_sub_axis_is_caught(text):
    p, m = llama_plan(text)
    n = m.axis_size("tp")

    def gathers_tp(c):
        return c.axes == (AxisPiece("tp", n),) and c.reduce_op is None

    def minor_half(chain):  # gather over tp's minor half only
        return tuple(replace(c, axes=(AxisPiece("tp", n // 2, pre=2),)) if gathers_tp(c) else c for c in chain)

    q = edit_moves(p, first_chain(p, gathers_tp), minor_half)
    assert q.moves != p.moves
    got = caught(q, m)
    assert all(got.values()), got
    assert f"tp:(2){n // 2}" in q.verify().first_mismatch


@pytest.mark.parametrize("text", MESHES)
def test_off_by_one_uneven_chunk_is_caught(text):
    m = Mesh.parse(text)
    t = m.axis_size("tp")
    b = ProgramBuilder()
    x = b.input("x", (4, 2 * t))
    y = b.op("slice", [x], name="y", dim=1, start=0, end=2 * t - 1)
    b.output(b.op("relu", [y], name="z"))
    p = plan(b.build(), m, {"x": Sharding.parse("[4, tp*2]", m)})
    assert p.verify().ok and p.verify().proven
    # the planner keeps the shard ([tp of 2t-1]: the last rank keeps the head of its shard, 1
    # column, ops.resize); a slice rule that claims the same output but runs the global bounds on
    # every rank's 2 columns gives the last rank 2 columns, not 1
    assert p.shardings["y"] == Sharding.parse(f"[4, tp of {2 * t - 1}]", m) and not p.collectives
    q = claim(p, "y", inputs=[p.shardings["x"]], outputs=[Sharding.parse(f"[4, tp of {2 * t - 1}]", m)])
    i = next(k for k, op in enumerate(p.program.ops) if op.name == "y")
    q.ops[i] = replace(q.ops[i], local=())
    got = caught(q, m)
    assert all(got.values()), got
    assert "must be whole" in q.verify().first_mismatch
    assert "shape" in verify_plan(q, proof=False).first_mismatch


def _prefix_sum_map(name, inputs, params):
    """A lie on purpose: a prefix sum declared pointwise (its last dim does not pass through)."""
    return FactorMap(("ab",), "ab")


@pytest.mark.parametrize("text", MESHES)
def test_index_map_that_lies_is_caught_by_the_numeric_oracle(text):
    register_op("test_prefix_sum_as_pointwise", "x", factor_rule(_prefix_sum_map),
                lambda a: np.cumsum(a, axis=-1), replace_existing=True)
    m = Mesh.parse(text)
    b = ProgramBuilder()
    x = b.input("x", (4, 2 * m.axis_size("tp")))
    b.output(b.op("test_prefix_sum_as_pointwise", [x], name="y"))
    p = plan(b.build(), m, {"x": Sharding.parse("[4, tp*2]", m), "y": Sharding.parse("[4, tp*2]", m)})
    got = caught(p, m)
    # the proof trusts the map; the numeric oracle runs the last chunk too, where the local
    # prefix sum misses the chunks before it (the first chunk alone would pass)
    assert got == {"classes": True, "proof": False, "numeric": True, **({"full": True} if m.size <= 64 else {})}
