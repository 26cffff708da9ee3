"""Verify shares work between representatives and between the members of a group only where the
work is the same call on the same arrays: a wrong plan or a wrong local op in a shared class is
still caught, by the numeric oracle alone and by the proof alone."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from shardlayout import AxisPiece, Mesh, Sharding, plan_move, register_op
from shardlayout.execute.classes import rank_classes, representatives
from shardlayout.execute.indexmap import index_map
from shardlayout.execute.proof import check_collective
from shardlayout.execute.verify import Operand, hashed, run_collective_classes, run_op, summand, summands, verify_plan
from shardlayout.ops.registry import get_op
from shardlayout.ops.strategy import FactorMap, factor_rule
from shardlayout.plan import plan
from shardlayout.program import ProgramBuilder

BIG = Mesh.parse("dp=256,tp=32")


def _mm_plus_one(a, b):
    return a @ b + 1.0  # +1 on every rank: a partial sum over 32 ranks adds 32


def _mm_plan(target: str):
    b = ProgramBuilder()
    x, w = b.input("x", (16, 64)), b.param("w", (64, 16))
    b.output(b.op("relu", [b.op(target, [x, w], name="y")], name="z"))
    return plan(b.build(), BIG, {"x": Sharding.parse("[16, tp*2]", BIG), "w": Sharding.parse("[tp*2, 16]", BIG)})


def test_a_wrong_partial_sum_is_caught_where_representatives_share_their_group_runs():
    register_op("test_share_mm_plus_one", "a, b",
                factor_rule(lambda n, i, p: FactorMap(("mk", "kn"), "mn", linear="multi")), _mm_plus_one,
                replace_existing=True)
    a, w = Sharding.parse("[16, tp*2]", BIG), Sharding.parse("[tp*2, 16]", BIG)
    out = Sharding.parse("[16, 16] +sum(tp)", BIG)
    reps = representatives(rank_classes(BIG, (a, w, out)))
    assert reps == (0, 8191)  # two representatives, both reading the same 32-member group's pieces
    good = run_op(get_op("mm"), {}, (a, w), (out,), ("float32",) * 2, index_map("mm", (a, w), {}))
    assert good.status == "ok" and good.simulated == 32  # the group ran once for both representatives
    bad = run_op(get_op("test_share_mm_plus_one"), {}, (a, w), (out,), ("float32",) * 2,
                 index_map("test_share_mm_plus_one", (a, w), {}))
    assert bad.status == "failed" and round(bad.max_error) == 31  # 32 ranks add 1 where the op adds 1 once
    p = _mm_plan("test_share_mm_plus_one")
    v = p.verify()
    assert not v.ok and v.first_mismatch.startswith("y (op y)")
    assert _mm_plan("mm").verify().ok


def test_a_sharded_claim_on_whole_inputs_is_caught_though_the_local_run_is_the_reference_call():
    b = ProgramBuilder()
    x = b.input("x", (8, 64))
    b.output(b.op("relu", [b.op("neg", [x], name="y")], name="z"))
    p = plan(b.build(), BIG, {"x": Sharding.parse("[8, 64]", BIG), "y": Sharding.parse("[8, 64]", BIG)})
    assert p.verify().ok
    i = next(k for k, op in enumerate(p.program.ops) if op.name == "y")
    q = _claimed(p, i, Sharding.parse("[8, tp*2]", BIG))  # neg on whole inputs names a piece it does not make
    assert not verify_plan(q, numeric=False).ok
    numeric = verify_plan(q, proof=False)
    assert not numeric.ok and "names a piece of shape (8, 2)" in numeric.first_mismatch


def _claimed(p, i: int, out: Sharding):
    """``p`` with op ``i`` claiming output ``out``, and its consumers reading ``out`` as planned."""
    import copy

    q = copy.copy(p)
    q.ops, q.shardings, q.moves = list(p.ops), dict(p.shardings), dict(p.moves)
    name = p.program.ops[i].outputs[0]
    q.ops[i] = replace(p.ops[i], outputs=(out,))
    q.shardings[name] = out
    for cop, cpo in zip(p.program.ops, p.ops):
        for n, t in zip(cop.inputs, cpo.input_targets):
            if n == name and t != out:
                q.moves[(name, t)] = plan_move(out, t)
    return q


def test_a_gather_over_part_of_a_large_group_is_caught_though_empty_members_share_one_piece():
    src, dst = Sharding.parse("[dp of 2, 8, 16]", BIG), Sharding.parse("[2, 8, 16]", BIG)
    c = plan_move(src, dst)[0]
    assert c.axes == (AxisPiece("dp", 256),) and run_collective_classes(c).status == "ok"
    half = replace(c, axes=(AxisPiece("dp", 128, pre=2),))  # the minor 128 of dp: ranks 0 and 1 never meet
    assert check_collective(half).failed
    got = run_collective_classes(half)
    assert got.status == "failed" and "does not hold" in got.message


def test_a_reduction_over_a_shared_group_keeps_each_members_summand():
    src, dst = Sharding.parse("[2, 8, 16] +sum(tp)", BIG), Sharding.parse("[2, tp of 8, 16]", BIG)
    c = plan_move(src, dst)[0]
    assert c.reduce_op == "sum" and run_collective_classes(c).status == "ok"
    assert run_collective_classes(replace(c, reduce_op="max")).status == "failed"  # 32 summands, not one


def test_summands_of_many_ranks_are_drawn_as_each_rank_draws_its_own():
    s = Sharding.parse("[8, 4] +sum(tp)", BIG)
    op = Operand(s, 7)
    lists = [np.arange(8), np.arange(4)]
    ranks = (0, 5, 31, 8191)
    got = summands(op, lists, ranks)
    assert got.shape == (4, 8, 4)
    for q, g in zip(ranks, got):
        assert np.array_equal(g, summand(op, lists, q))
    rows = hashed(3, np.arange(5), (0, 2))
    assert np.array_equal(rows[1], hashed(3, np.arange(5), 2)) and np.array_equal(rows[0], hashed(3, np.arange(5)))
