"""The index-level proof: every planned move is proven and runs to its target on its classes'
representatives; broken collectives, op calls and wiring are refused with a message naming the
operand and the fix; a view's layouts agree with enumerating every rank's flat offsets."""

from __future__ import annotations

import copy
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlayout import AxisPiece, Collective, CollectiveKind, Mesh, Sharding, plan_move
from shardlayout.execute.indexmap import index_map
from shardlayout.execute.proof import check_collective, check_op, check_reshape, check_wiring, flat_form
from shardlayout.execute.verify import run_collective_classes
from shardlayout.ops.regroup import regroup
from shardlayout.plan import plan
from shardlayout.program import ProgramBuilder

from ..ops.test_view import prime_factors
from ..sharding.strategies import shardings

M = Mesh.parse("dp=2,tp=4")


def S(text, mesh=M):
    return Sharding.parse(text, mesh)


@settings(max_examples=80)
@given(shardings(), st.data())
def test_every_planned_move_is_proven_and_runs_on_its_representatives(a, data):
    pl = [data.draw(st.sampled_from(["R", "P"] + [f"S({d})" for d in range(a.ndim)])) for _ in a.mesh.names]
    b = Sharding.from_placements(a.mesh, a.shape, pl)
    for c in plan_move(a, b):
        assert check_collective(c).status == "proven", (str(a), str(b), c.kind, c.axes_text())
        assert run_collective_classes(c).status == "ok", (str(a), str(b), c.kind, c.axes_text())


def test_broken_collectives_are_refused():
    a, b = S("[dp*4, tp*3]"), S("[dp*4, 12]")
    (gather,) = plan_move(a, b)
    assert check_collective(gather).status == "proven"
    half = Collective(CollectiveKind.ALL_GATHER, (AxisPiece("tp", 2, 2),), (1,), 0, a, b)
    assert "its group holds only" in check_collective(half).message
    p = S("[8, 12] +sum(tp)")
    dropped = Collective(CollectiveKind.LOCAL, (), (), 0, p, S("[8, tp*3]"))
    assert "without a reduction" in check_collective(dropped).message
    mixed = Collective(CollectiveKind.ALL_GATHER, (AxisPiece("tp", 4),), (0,), 0, p, p)
    assert "mixes partial values" in check_collective(mixed).message
    wrong_op = Collective(CollectiveKind.ALL_REDUCE, (AxisPiece("tp", 4),), (), 0, p, S("[8, 12]"), "max")
    assert "is not partial(max)" in check_collective(wrong_op).message
    for c in (half, dropped):
        assert run_collective_classes(c).status == "failed"


def _op(target, ins, outs, **params):
    return check_op(M, index_map(target, ins, params, len(outs)), ins, outs)


def test_op_calls_are_checked_letter_by_letter():
    a, w = S("[dp*4, tp*4]"), S("[tp*4, 6]")
    assert _op("mm", (a, w), (S("[dp*4, 6] +sum(tp)"),)).status == "proven"
    assert "must be partial(sum) on tp" in _op("mm", (a, w), (S("[dp*4, 6]"),)).message
    got = _op("mm", (S("[dp*4, 16]"), S("[16, tp*2]")), (S("[dp*4, 2*tp]"),)).message
    assert "index 'n'" in got and "sharded alike" in got
    x = S("[dp*4, tp*3]")
    assert "must be whole" in _op("_softmax", (x,), (x,), dim=1).message
    assert _op("_softmax", (x,), (x,), dim=0).message.startswith("input 0 dim 0")
    assert _op("add", (x, S("[tp*3]")), (x,)).status == "proven"  # broadcast: y carries only the last letter
    p = S("[dp*4, 12] +sum(tp)")
    assert _op("mul", (p, S("[dp*4, 12]")), (p,)).status == "proven"  # multilinear: one partial input
    assert "not linear" in _op("add", (p, S("[dp*4, 12]")), (p,)).message  # partial + replicated
    assert "not linear" in _op("relu", (p,), (p,)).message
    assert "no input is partial" in _op("relu", (S("[dp*4, 12]"),), (p,)).message
    assert _op("sum", (S("[dp*4, tp*3]"),), (S("[dp*4] +sum(tp)"),), dim=1).status == "proven"
    uneven = S("[dp*4, tp*3 of 10]")
    assert "unequal or empty" in _op("mean", (uneven,), (S("[dp*4] +avg(tp)"),), dim=1).message


@st.composite
def views(draw):
    s = draw(shardings(uneven=False, partial=False))
    n = math.prod(s.shape)
    dims = [1] * draw(st.integers(1, 3))
    for p in prime_factors(n):
        dims[draw(st.integers(0, len(dims) - 1))] *= p
    return s, tuple(dims)


def _brute_force_same_offsets(a, b) -> bool:
    def offs(s, r):
        return np.ravel_multi_index(np.ix_(*s.indices(r)), s.shape).reshape(-1)

    return all(np.array_equal(offs(a, r), offs(b, r)) for r in a.mesh.ranks())


@settings(max_examples=80)
@given(views())
def test_views_are_proven_as_layouts_and_agree_with_every_rank(case):
    s, shape = case
    target, out = regroup(s, shape)
    assert check_reshape(s.mesh, target, out).status == "proven", (str(s), shape)
    assert _brute_force_same_offsets(target, out)
    # a wrong claim: the output's dims reversed (another order of the same factors) is a
    # different layout exactly when some rank lists other offsets
    if out.ndim >= 1 and out.is_even():
        other = Sharding(out.mesh, out.shape, [tuple(reversed(fs)) for fs in out.dims], out.partial)
        if target.is_even():
            assert (flat_form(target) == flat_form(other)) == _brute_force_same_offsets(target, other)
        assert (check_reshape(s.mesh, target, other).status == "proven") == _brute_force_same_offsets(target, other)


def test_broken_wiring_is_refused():
    b = ProgramBuilder()
    x, w = b.input("x", (4, 8)), b.param("w", (8, 6))
    b.output(b.op("mm", [x, w], name="y"))
    m = Mesh.parse("tp=2")
    p = plan(b.build(), m, {"x": Sharding.parse("[4, tp*4]", m), "w": Sharding.parse("[8, 6]", m)})
    assert check_wiring(p, 0).status == "proven"
    q = copy.copy(p)
    q.moves = {}
    assert "no collective is planned" in check_wiring(q, 0).message
    assert not q.verify().ok and "no collective is planned" in q.verify().first_mismatch


def test_wiring_hands_over_exactly_the_moves_it_proved():
    """``check_wiring(..., chains)`` lists each input that moves to its target and each output
    that moves to its final sharding, with the planned moves: what the verifier then proves."""
    from shardlayout.program.models import llama, style_pins

    prog, m = llama(layers=2), Mesh.parse("dp=2,tp=4")
    p = plan(prog, m, style_pins(prog, m, "megatron-sp"))
    seen = 0
    for i, (op, po) in enumerate(zip(prog.ops, p.ops)):
        chains: list = []
        assert check_wiring(p, i, {}, chains).status == "proven"
        want = [(n, p.moves[(n, t)]) for n, t in zip(op.inputs, po.input_targets)
                if isinstance(n, str) and t != p.shardings[n]]
        want += [(n, p.moves[(n, p.shardings[n])]) for n, o in zip(op.outputs, po.outputs) if o != p.shardings[n]]
        assert chains == want
        seen += len(chains)
    assert seen >= len(p.moves) > 0  # every move is some op's (a shared move: several ops')


def test_resize_ops_are_proven_and_a_wrong_cut_fails():
    """A slice / cat run on each rank's own shard is proven rank class by rank class; naming a
    different output sharding (the cut's local run would not make it) fails."""
    from shardlayout import propagate
    from shardlayout.execute.indexmap import index_map
    from shardlayout.execute.proof import check_op

    m = Mesh.parse("dp=2,tp=4")
    x = Sharding.parse("[dp*2, 3*tp*2]", m)
    p = propagate("slice", [x], dim=1, start=8, end=24)
    params = {"dim": 1, "start": 8, "end": 24, "step": 1, **dict(p.local)}  # the planned local run
    im = index_map("slice", (x,), params)
    assert im.kind == "resize" and check_op(m, im, (x,), p.outputs).status == "proven"
    wrong = Sharding.parse("[dp*2, tp*4]", m)  # plain blocks: not what each rank's local slice holds
    assert check_op(m, im, (x,), (wrong,)).failed
    c = propagate("cat", [p.outputs[0], p.outputs[0]], dim=1)
    im = index_map("cat", (p.outputs[0],) * 2, {"dim": 1})
    assert check_op(m, im, (p.outputs[0],) * 2, c.outputs).status == "proven"
    assert check_op(m, im, (p.outputs[0],) * 2, (Sharding.parse("[dp*2, tp*8]", m),)).failed
    w = Sharding.parse("[tp*4]", Mesh.parse("tp=2"))  # a window: tail of rank 0, head of rank 1
    q = propagate("slice", [w], dim=0, start=2, end=6)
    im = index_map("slice", (w,), {"dim": 0, "start": 2, "end": 6, "step": 1, **dict(q.local)})
    assert not q.collectives and check_op(w.mesh, im, (w,), q.outputs).status == "proven"
    # without the planned local run the rank slices global bounds from its shard: not proven
    im = index_map("slice", (w,), {"dim": 0, "start": 2, "end": 6, "step": 1})
    assert check_op(w.mesh, im, (w,), q.outputs).failed


def test_resize_proof_fails_cleanly_on_a_placement_that_cannot_be():
    from shardlayout import propagate
    from shardlayout.execute.indexmap import index_map
    from shardlayout.execute.proof import check_op

    m = Mesh.parse("tp=2")
    g = Sharding.parse("[tp]", m)
    prm = dict(input_sizes=[4], dim=0, start=0, end=2, step=1)
    p = propagate("slice_backward", [g], **prm)
    imap = index_map("slice_backward", (g,), {**prm, **dict(p.local)}, 1)
    assert check_op(m, imap, (g,), p.outputs).status == "proven"
    assert check_op(m, imap, (g,), (Sharding.parse("[4]", m),)).failed  # a wrong output: failed, no crash
