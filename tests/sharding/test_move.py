"""plan_move: every plan run on numpy pieces (each rank using only its group's pieces) gives
exactly the target's shards; kinds, typed axes, dims and bytes as DTensor counts them."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardlayout import Mesh, Sharding, ShardingError
from shardlayout.execute import run_moves
from shardlayout.sharding.collective import AxisPiece, CollectiveKind
from shardlayout.sharding.cost import CostModel, cost
from shardlayout.sharding.move import plan_move

from .strategies import meshes


@st.composite
def placement_pairs(draw):
    mesh = draw(meshes())
    nd = draw(st.integers(1, 3))
    shape = tuple(draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16])) for _ in range(nd))

    def placements():
        out = []
        for _ in range(mesh.ndim):
            k = draw(st.integers(0, 9))
            if k < 2:
                out.append("R")
            elif k < 7:
                out.append(f"S({draw(st.integers(0, nd - 1))})")
            elif k < 8:
                out.append(f"SS({draw(st.integers(0, nd - 1))},{draw(st.sampled_from([2, 3]))})")
            else:
                out.append("P(sum)")
        return out

    return (Sharding.from_placements(mesh, shape, placements()),
            Sharding.from_placements(mesh, shape, placements()))


def check_plan(a, b):
    steps = plan_move(a, b)
    x = np.random.default_rng(1).standard_normal(a.shape)
    got = run_moves(steps, a.shard(x))
    want = b.shard(x)
    for r in a.mesh.ranks():
        assert got[r].shape == want[r].shape and np.allclose(got[r], want[r]), (str(a), str(b), r, steps)
    if steps:
        assert steps[0].src == a and steps[-1].dst == b
    return steps


@given(placement_pairs())
def test_every_plan_simulates_to_the_target(ab):
    check_plan(*ab)


def test_plans_on_sub_axes_strided_and_uneven():
    m = Mesh.parse("dp=2,tp=4")
    cases = [
        ("[dp*4*tp:(1)2, tp:(2)2*3]", "[dp*8, 6]"),
        ("[dp*8, 6]", "[dp*4*tp:(1)2, tp:(2)2*3]"),
        ("[tp*dp*2, 12]", "[dp*tp*2, 12]"),
        ("[dp*tp*3 of 22, 5]", "[22, tp*2 of 5] +sum(dp)"),
        ("[16, 6] +sum(dp,tp)", "[dp*4*tp:(1)2, tp:(2)2*3]"),
    ]
    for a, b in cases:
        check_plan(Sharding.parse(a, m), Sharding.parse(b, m))


def test_kinds_and_costs():
    m = Mesh.parse("dp=2,tp=4")
    s = lambda t: Sharding.parse(t, m)  # noqa: E731
    kinds = lambda a, b: [(x.kind.value, x.axes_text()) for x in plan_move(s(a), s(b))]  # noqa: E731
    assert kinds("[dp*4, tp*3]", "[dp*4, tp*3]") == []
    assert kinds("[dp*4, tp*3]", "[dp*4, 12]") == [("all_gather", "tp")]
    assert kinds("[8, 12] +sum(tp)", "[8, 12]") == [("all_reduce", "tp")]
    assert kinds("[8, 12] +sum(tp)", "[tp*2, 12]") == [("reduce_scatter", "tp")]
    assert kinds("[tp*2, 12]", "[8, tp*3]") == [("all_to_all", "tp")]
    assert kinds("[8, 12]", "[dp*4, tp*3]") == [("local", "")]
    assert kinds("[dp*4*tp:(1)2, tp:(2)2*3]", "[dp*4*tp:(1)2, 6]") == [("all_gather", "tp:(2)2")]
    steps = plan_move(s("[dp*4, tp*3]"), s("[dp*4, 12]"))
    c = steps[0]
    assert c.kind is CollectiveKind.ALL_GATHER and c.axes == (AxisPiece("tp", 4),) and c.dims == (1,)
    # DTensor's allgather_cost: 6.6 + hops*0.6 µs + bytes*hops/n / 87.7 GiB/s; bytes = gathered size
    nbytes = 4 * 12 * 4
    assert c.bytes == nbytes and c.group_size == 4
    assert cost(steps) == pytest.approx(6.6e-6 + 3 * 0.6e-6 + nbytes / 2**30 * 3 / 4 / 87.7, rel=1e-12)
    slow = CostModel(bandwidth={"tp": 1e9}, hop_latency={"tp": 5e-6})
    assert cost(steps, slow) > cost(steps)
    rs = plan_move(s("[8, 12] +sum(tp)"), s("[tp*2, 12]"))[0]
    assert rs.reduce_op == "sum" and rs.dims == (0,) and rs.bytes == 8 * 12 * 4


def test_mismatched_tensors_are_refused():
    m = Mesh.parse("x=2")
    with pytest.raises(ShardingError, match="not the same tensor"):
        plan_move(Sharding.parse("[x*2]", m), Sharding.parse("[x*3]", m))


def test_random_plans_with_dtensor_programs():
    rng = random.Random(5)
    for _ in range(200):
        mesh = Mesh((rng.choice([2, 3, 4]), rng.choice([2, 4])), ("a", "b"))
        shape = (rng.randint(1, 13), rng.randint(1, 9))
        pl = lambda: [rng.choice(["R", "S(0)", "S(1)", "SS(0,2)", "SS(0,4)", "P"]) for _ in range(2)]  # noqa: E731
        check_plan(Sharding.from_placements(mesh, shape, pl()), Sharding.from_placements(mesh, shape, pl()))


@given(st.data())
def test_plans_between_sub_axis_strided_uneven_and_placement_shardings(data):
    from .strategies import shardings

    a = data.draw(shardings())
    pl = []
    for _ in range(a.mesh.ndim):
        k = data.draw(st.integers(0, 9))
        if k < 3:
            pl.append("R")
        elif k < 8:
            pl.append(f"S({data.draw(st.integers(0, a.ndim - 1))})")
        elif k < 9:
            pl.append(f"SS({data.draw(st.integers(0, a.ndim - 1))},2)")
        else:
            pl.append("P")
    b = Sharding.from_placements(a.mesh, a.shape, pl)
    check_plan(a, b)
    check_plan(b, a)


def test_partials_are_reduced_before_pieces_move_when_that_is_cheaper():
    m = Mesh.parse("dp=2,tp=4")
    a, b = Sharding.parse("[dp*64, 64] +sum(tp)", m), Sharding.parse("[128, 64]", m)
    moves = plan_move(a, b)
    assert [c.kind.value for c in moves] == ["all_reduce", "all_gather"]
    assert moves[0].bytes == 64 * 64 * 4  # the reduction runs on the un-gathered piece
    check_plan(a, b)
    # where the target shards on the partial axis, the gather goes first and a reduce-scatter lands
    c = Sharding.parse("[tp*32, 64]", m)
    assert [x.kind.value for x in plan_move(Sharding.parse("[dp*64, 64] +sum(tp)", m), c)][-1] == "reduce_scatter"
    check_plan(Sharding.parse("[dp*64, 64] +sum(tp)", m), c)


def test_the_order_is_chosen_under_the_given_cost_model():
    m = Mesh.parse("dp=2,tp=4")
    a, b = Sharding.parse("[dp*64, 64] +sum(tp)", m), Sharding.parse("[128, 64]", m)
    for cm in (CostModel(), CostModel(bandwidth={"dp": 1e6}), CostModel(bandwidth={"tp": 1e6})):
        got = plan_move(a, b, cost_model=cm)
        assert cost(got, cm) <= cost(plan_move(a, b), cm) + 1e-15
        check_plan(a, b)


@pytest.mark.parametrize("n,text", [(6, "[2, tp of 6, 16]"), (5, "[2, tp of 5, 16]"), (8, "[2, tp*2, 16]"),
                                    (7, "[2, tp*2 of 7, 16]")])
def test_a_partial_whole_dim_reduce_scatters_to_uneven_shards(n, text):
    """torch.chunk-uneven targets are reduce-scattered too (not all-reduced and sliced): exact on
    every rank, half the bytes of an all-reduce's two passes."""
    import numpy as np

    from shardlayout.execute.simulator import run_moves

    m = Mesh.parse("tp=4")
    a, b = Sharding.parse(f"[2, {n}, 16] +sum(tp)", m), Sharding.parse(text, m)
    cs = plan_move(a, b)
    assert [c.kind.value for c in cs] == ["reduce_scatter"]
    vals = {r: np.random.default_rng(r).standard_normal(a.shape) for r in m.ranks()}
    got, want = run_moves(cs, vals), sum(vals.values())
    assert all(np.allclose(got[r], b.shard(want)[r]) for r in m.ranks())


def test_megatron_sp_on_an_uneven_sequence_reduce_scatters():
    from shardlayout.plan import plan
    from shardlayout.program.models import llama, style_pins

    prog, m = llama(layers=1, seq=6), Mesh.parse("tp=4")
    p = plan(prog, m, style_pins(prog, m, "megatron-sp"))
    assert p.counts() == {("all_gather", ("tp",)): 2, ("reduce_scatter", ("tp",)): 2}
    assert p.verify().proven


_M = Mesh.parse("dp=2,tp=4")
_S = Sharding.parse("[dp*4, tp*3]", _M)


@pytest.mark.parametrize("call,needle", [
    (lambda: plan_move(_S, "x"), "plan_move: dst 'x' on src's mesh dp=2,tp=4: Sharding.parse: 'x' is not"),
    (lambda: plan_move(None, _S), "plan_move: src is NoneType None, not a Sharding"),
    (lambda: plan_move(_S, 5), "plan_move: dst is int 5, not a Sharding"),
    (lambda: plan_move(_S, _S, dtype="float99"), "dtype 'float99' is not one of float64"),
    (lambda: plan_move(_S, Sharding.parse("[8, 12]", _M), cost_model=5), "plan_move: cost_model 5 is not a "
                                                                          "CostModel"),
])
def test_plan_move_bad_arguments(call, needle):
    from shardlayout.errors import ShardingSpecError

    with pytest.raises(ShardingSpecError) as e:
        call()
    assert needle in str(e.value), str(e.value)


def test_plan_move_reads_a_target_text_on_the_source_mesh():
    assert plan_move(_S, "[dp*4, 12]") == plan_move(_S, Sharding.parse("[dp*4, 12]", _M))


@pytest.mark.parametrize("src,dst,k", [("[tp*~4*16, 8]", "[2*~4*16, 8]", 4),  # a gather in 4 chunks
                                       ("[2*~2*8, 8] +sum(tp)", "[tp*~2*8, 8]", 2),  # a reduce-scatter in 2
                                       ("[~2*16, 8] +sum(tp)", "[~2*16, 8]", 2)])  # an all-reduce in 2
def test_a_move_inside_one_stream_is_the_chunks_moves_one_after_another(src, dst, k):
    """Both sides in the same stream: the move is each chunk's move (``plan_move`` between the
    chunks' own shardings, ``execute.stream.chunk_sharding``), k times; the chunks, moved one by
    one on every rank, give what the whole move gives (``plan.stream.run_streamed_move``)."""
    from shardlayout.execute.stream import chunk_sharding
    from shardlayout.plan.stream import run_streamed_move

    m = Mesh.parse("tp=2")
    a, b = Sharding.parse(src, m), Sharding.parse(dst, m)
    assert a.stream == b.stream and a.stream[2] == k
    got = plan_move(a, b)
    pa, pb = a.without_stream(), b.without_stream()
    n = pa.shape[0] // k
    chunk = plan_move(chunk_sharding(pa, 0, n, k), chunk_sharding(pb, 0, n, k))
    assert [(c.kind, c.axes, c.bytes) for c in got] == [(c.kind, c.axes, c.bytes) for c in chunk] * k
    pieces = pa.shard(np.random.default_rng(0).standard_normal(pa.shape))
    whole, streamed = run_moves(plan_move(pa, pb), pieces), run_streamed_move(pa, pb, 0, k, pieces)
    assert all(np.allclose(streamed[r], whole[r]) for r in m.ranks())
    assert plan_move(a, pb) == plan_move(pa, pb) == plan_move(pa, b)  # a stream on one side: the whole move
