"""Stream overlap estimates (plan/stream.py): the pipelined time against an event-by-event
schedule of the two stages, the chunk count chosen against every count tried, and the choices
on Megatron / Megatron-SP plans of a Llama at a realistic size."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardlayout import Mesh, Sharding
from shardlayout.execute.simulator import run_moves
from shardlayout.plan import plan
from shardlayout.plan.estimate import compute_seconds, op_flops
from shardlayout.plan.stream import (
    CHUNKS,
    chunk_layout,
    pipelined,
    ring_pipelined,
    ring_sharding,
    run_ring_move,
    run_streamed_move,
    stream_plan,
    stream_text,
)
from shardlayout.program.models import llama, style_pins

BIG = dict(layers=1, dim=4096, seq=4096, batch=1, heads=32, ffn=11008)


def schedule(a: float, m: float, k: int) -> float:
    """Two stages in a pipeline, event by event: chunk i's second stage starts when its first
    stage is done and the second stage is free."""
    first_done, second_free = 0.0, 0.0
    for _ in range(k):
        first_done += a
        second_free = max(first_done, second_free) + m
    return second_free


@given(st.floats(1e-7, 1e-2), st.floats(1e-7, 1e-2), st.integers(1, 32))
def test_pipelined_time_is_the_schedule(a, m, k):
    assert math.isclose(pipelined(a, m, k), schedule(a, m, k), rel_tol=1e-12)
    assert pipelined(a * k, m * k, 1) == pytest.approx(a * k + m * k)


def ring_schedule(a: float, m: float, n: int) -> float:
    """The ring pipeline, event by event: chunk 0 (the rank's own shard) is there at once; step
    s's transfer starts when step s-1's has arrived (it passes on what that one brought), and
    chunk s computes once it has arrived and the matmul is free."""
    arrived, free = 0.0, 0.0
    for s in range(n):
        if s:
            arrived += a
        free = max(arrived, free) + m
    return free


@given(st.floats(1e-7, 1e-2), st.floats(1e-7, 1e-2), st.integers(1, 32))
def test_ring_pipelined_time_is_the_schedule(a, m, n):
    assert math.isclose(ring_pipelined(a, m, n), ring_schedule(a, m, n), rel_tol=1e-12)


@pytest.mark.parametrize("mesh,src,dst", [("tp=8", "[~tp*64, 32]", "[~8*64, 32]"),
                                          ("dp=2,tp=4", "[dp*2, 2*~tp*3, 5]", "[dp*2, 2*~4*3, 5]")])
def test_a_ring_is_its_steps_and_pays_the_all_gathers_hops_and_bytes(mesh, src, dst):
    """plan_move of a ring is k - 1 neighbour steps of one shard each; priced step by step they pay
    exactly the all_gather's hops and bytes, and the launch latency k - 1 times instead of once."""
    from shardlayout import plan_move
    from shardlayout.sharding.cost import CostModel, cost

    m = Mesh.parse(mesh)
    a, b = Sharding.parse(src, m), Sharding.parse(dst, m)
    whole = plan_move(a.without_stream(), b.without_stream())
    steps = plan_move(a, b)
    n = a.stream_axis.size
    assert len(steps) == n - 1 and {c.kind.value for c in steps} == {"permute"}
    assert all(c.bytes * n == whole[0].bytes and c.axes == whole[0].axes for c in steps)
    for cm in (CostModel(), CostModel(latency=3e-5, bandwidth={"tp": 1e9}, hop_latency={"tp": 2e-6})):
        assert cost(steps, cm) == pytest.approx(cost(whole, cm) + (n - 2) * cm.latency)


def test_a_ring_stream_is_written_on_the_axis_and_read_back():
    """A stream whose chunks are a mesh axis's blocks (chunk j = rank j's shard) is ``~tp``:
    ``with_stream(d, axis size, outer)`` where the axis factor sits right after the outer blocks."""
    from shardlayout.errors import ShardingSpecError

    m = Mesh.parse("dp=2,tp=8")
    s = Sharding.parse("[tp*512, 32]", m).with_stream(0, 8, outer=1)
    assert str(s) == "[~tp*512, 32]" and Sharding.parse(str(s), m) == s and s.stream == (0, 1, 8)
    assert s.stream_axis.axis == "tp" and s.local_shape(0) == (512, 32) and s.without_stream().stream_axis is None
    assert str(Sharding.parse("[2*~dp*64]", m)) == "[2*~dp*64]"
    assert Sharding.parse("[~8*512, 32]", m).stream_axis is None  # chunks of a local factor: no ring
    with pytest.raises(ShardingSpecError, match="one mesh axis of size 4"):
        Sharding.parse("[tp*512, 32]", m).with_stream(0, 4, outer=1)  # would cut tp
    with pytest.raises(ShardingSpecError, match="nor ~axis"):
        Sharding.parse("[~xp*512, 32]", m)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_the_ring_steps_reproduce_the_all_gather(data):
    """Each rank starts with its own shard and passes on what it got last: after the k - 1 steps
    every rank holds exactly what the whole all_gather gives it (any mesh, outer blocks, other dims)."""
    mesh = data.draw(st.sampled_from(["tp=2", "tp=3", "tp=4", "dp=2,tp=2", "tp=2,dp=3", "dp=2,tp=4"]), label="mesh")
    m = Mesh.parse(mesh)
    axis = data.draw(st.sampled_from(m.names), label="axis")
    other = [a for a in m.names if a != axis]
    outer = data.draw(st.sampled_from([1, 2, 3]), label="outer")
    inner = data.draw(st.sampled_from([1, 2, 5]), label="inner")
    pre = f"{outer}*" if outer > 1 else ""
    rest = f"{other[0]}*2" if other and data.draw(st.booleans(), label="other dim sharded") else "3"
    src = Sharding.parse(f"[{pre}~{axis}*{inner}, {rest}]", m)
    dst = Sharding.parse(f"[{pre}~{m.axis_size(axis)}*{inner}, {rest}]", m)
    x = np.random.default_rng(0).standard_normal(src.shape)
    got = run_ring_move(src, dst, src.shard(x))
    want = dst.shard(x)
    assert all(np.array_equal(got[r], want[r]) for r in m.ranks())


def _plan(style, mesh="tp=8", **sizes):
    prog, m = llama(**{**BIG, **sizes}), Mesh.parse(mesh)
    return plan(prog, m, style_pins(prog, m, style))


@pytest.mark.parametrize("style", ["megatron-sp", "megatron"])
@pytest.mark.parametrize("rings", [False, True])
def test_each_choice_is_the_best_chunk_count(style, rings):
    p = _plan(style)
    sp = stream_plan(p, ring=rings)
    assert sp.choices and sp.overlapped_seconds < sp.serial_seconds
    cm = p.cost_model
    saved = 0.0
    for c in sp.choices:
        moves = [x for (t, _), cs in p.moves.items() if t == c.tensor for x in cs if x.kind.communicates]
        comp = math.fsum(compute_seconds(op_flops(po.target, po.params, po.input_targets, po.outputs), "inference",
                                         1e14) for po in p.ops if po.name in c.ops)
        assert c.compute_seconds == pytest.approx(comp)
        times = {k: schedule(sum(cm.seconds(replace(x, bytes=math.ceil(x.bytes / k))) for x in moves) / 1, comp / k, k)
                 for k in (1,) + CHUNKS if c.sharding.shape[c.dim] % k == 0}
        best = min(times, key=lambda k: (times[k], k))
        src = p.shardings[c.tensor]
        tgt = next(t for (n, t) in p.moves if n == c.tensor)
        ring = ring_sharding(src, tgt, moves, c.dim) if c.side == "before" and rings else None
        if ring is not None:  # a ring: k - 1 steps of one shard each, priced as the cost model prices a send/recv
            n = ring.stream_axis.size
            shard = moves[0].bytes // n
            ring_t = ring_schedule(cm.seconds(replace(moves[0], kind=type(moves[0].kind)("permute"), bytes=shard)),
                                   comp / n, n)
            assert (c.style == "ring") == (ring_t < times[best]), (c.tensor, ring_t, times[best])
        if c.style == "ring":
            assert c.sharding == ring and c.overlapped == pytest.approx(ring_t) and c.serial == pytest.approx(times[1])
        else:
            assert c.chunks == best
            assert c.overlapped == pytest.approx(times[c.chunks]) and c.serial == pytest.approx(times[1])
        saved += c.serial - c.overlapped
    assert sp.serial_seconds - sp.overlapped_seconds == pytest.approx(saved)
    assert len({o for c in sp.choices for o in c.ops}) == sum(len(c.ops) for c in sp.choices)  # each matmul once


def test_megatron_sp_overlaps_its_gathers_and_reduce_scatters():
    p = _plan("megatron-sp")
    sp = stream_plan(p, ring=True)
    sides = sorted((c.side, len(c.ops), c.style) for c in sp.choices)
    # q|k|v, gate|up fed by rings (chunk j = rank j's shard); the two outs' reduce-scatters in chunks
    assert sides == [("after", 1, "chunks"), ("after", 1, "chunks"), ("before", 2, "ring"), ("before", 3, "ring")]
    assert all(c.dim == 1 and c.chunks > 1 for c in sp.choices)  # the sequence
    assert [c.text for c in sp.choices if c.style == "ring"] == ["[1, ~tp*512, 4096]"] * 2
    without = stream_plan(p)  # rings only when asked (torch runs none yet): the chunk counts, slower
    assert without.choices == stream_plan(p, ring=False).choices
    assert {c.style for c in without.choices} == {"chunks"} and without.overlapped_seconds > sp.overlapped_seconds
    assert [c.sharding for c in without.choices if c.side == "after"] == [c.sharding for c in sp.choices
                                                                           if c.side == "after"]


def test_a_ring_is_not_chosen_unless_strictly_faster():
    """A launch latency of 100 µs: the seven the ring pays lose to a few chunks, and the plan keeps them."""
    from shardlayout.sharding.cost import CostModel

    p = _plan("megatron-sp")
    slow = replace(p, cost_model=CostModel(latency=1e-4))
    assert {c.style for c in stream_plan(slow, ring=True).choices} == {"chunks"}
    assert stream_plan(slow, ring=True).choices == stream_plan(slow).choices and len(stream_plan(slow).choices) == 3


def test_a_megatron_sp_layer_with_ring_streams_simulates_to_the_unsharded_run():
    """The rings run step by step on the numpy simulator (each rank its own shard first, then each
    neighbour step's) inside the whole plan, and every tensor equals the unsharded run."""
    from shardlayout.execute import simulator as sim
    from shardlayout.execute.stream import segments
    from shardlayout.execute.verify import verify_full

    for mesh in ("tp=4", "dp=2,tp=2"):
        p = replace(_plan("megatron-sp", mesh=mesh, layers=1, dim=32, seq=16, batch=2, heads=4, ffn=64), flop_rate=1e9,
                    ring=True)
        rings = [c for c in p.stream_choices() if c.style == "ring"]
        segs, skipped = segments(p)
        assert len(rings) == 2 and skipped == () and sum(s.order is not None for s in segs) == 2
        seen: list = []
        real = sim.ring_shift

        def counted(c, pieces, seen=seen, real=real):
            seen.append(c)
            return real(c, pieces)

        try:
            sim.ring_shift = counted
            v = verify_full(p)
        finally:
            sim.ring_shift = real
        n = Mesh.parse(mesh).axis_size("tp")
        assert v.ok and v.checked > 40 and len(seen) == 2 * (n - 1), v


@pytest.mark.parametrize("style", ["megatron-sp", "megatron"])
def test_the_choices_alone_are_the_stream_plans_choices(style):
    p = _plan(style, layers=3)
    assert p.stream_choices() == stream_plan(p).choices and len(p.stream_choices()) >= 2
    assert p.stream_choices(1e9) == stream_plan(p, 1e9).choices


def test_moves_are_visited_by_tensor_then_target_text():
    from shardlayout.plan.stream import _in_order

    m = Mesh.parse("tp=2")
    a, b, c = (Sharding.parse(t, m) for t in ("[tp*2, 4]", "[2, tp*2]", "[2, 4]"))
    moves = {("y", a): 1, ("x", b): 2, ("x", a): 3, ("z", c): 4, ("x", c): 5}
    assert _in_order(moves) == sorted(moves.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))
    assert _in_order({}) == []


def test_tiny_models_do_not_stream():
    p = _plan("megatron-sp", layers=2, dim=16, seq=8, batch=2, heads=4, ffn=32)
    sp = stream_plan(p)
    assert sp.choices == () and sp.overlapped_seconds == sp.serial_seconds
    assert json.loads(p.to_json())["streams"]["choices"] == []


def test_stream_text():
    m = Mesh.parse("tp=2")
    assert stream_text(Sharding.parse("[64, 32]", m), 0, 4) == "[~4*16, 32]"
    assert stream_text(Sharding.parse("[8, 32] +sum(tp)", m), 0, 8) == "[~8, 32] +sum(tp)"
    assert stream_text(Sharding.parse("[tp*8, 32]", m), 0, 2) == "[tp*~2*4, 32]"
    assert stream_text(Sharding.parse("[2*tp*8, 32]", m), 0, 4) == "[2*tp*~4*2, 32]"
    assert chunk_layout(Sharding.parse("[8*tp, 32]", m).dims[0], 16, 2) is None  # tp innermost: no local part


@pytest.mark.parametrize("style,mesh", [("megatron-sp", "tp=4"), ("megatron", "tp=4"), ("megatron-sp", "dp=2,tp=2")])
def test_streamed_moves_equal_the_whole_moves_on_every_rank(style, mesh):
    """Every gather / reduce-scatter / all-reduce of a Llama plan run as k stream chunks (each a
    plan_move between the chunks' shardings on the numpy simulator) lands exactly where the
    whole move does, on every rank."""
    p = _plan(style, mesh=mesh, layers=1, dim=32, seq=16, batch=2, heads=4, ffn=64)
    rng = np.random.default_rng(0)
    tried = 0
    for (name, tgt), moves in p.moves.items():
        cs = [c for c in moves if c.kind.communicates]
        src = p.shardings[name]
        dims = {d for c in cs for d in c.dims} or {d for d in range(src.ndim) if src.shape[d] > 1}
        for d in sorted(dims)[:1]:
            sharded = src if any(f.axis is not None for f in src.dims[d]) else tgt
            for k in (2, 4):
                if not cs or chunk_layout(sharded.dims[d], sharded.shape[d], k) is None:
                    continue
                pieces = {r: rng.standard_normal(src.local_shape(r)) for r in src.mesh.ranks()}
                whole = run_moves(moves, pieces)
                got = run_streamed_move(src, tgt, d, k, pieces)
                assert all(np.allclose(got[r], whole[r]) for r in src.mesh.ranks()), (name, str(src), str(tgt), k)
                tried += 1
    assert tried >= 2


def test_cli_prints_both_estimates(capsys):
    from shardlayout.cli import main

    argv = ["plan", "--model", "llama", "--layers", "1", "--size", "dim=4096,seq=4096,batch=1,heads=32,ffn=11008",
            "--mesh", "tp=8", "--style", "megatron-sp"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "µs serial" in out and "stream overlap(s)" in out and "[1, tp*~8*64, 4096]" in out and "ring" not in out
    assert main(argv + ["--ring"]) == 0
    out = capsys.readouterr().out
    assert "8 chunks [1, ~tp*512, 4096] (ring: 7 send/recv steps): the all_gather of layers.0.attn_norm.n" in out
    assert main(["plan", "--model", "llama", "--size", "dim=x", "--mesh", "tp=2"]) == 2


def test_only_the_matmuls_that_read_the_moved_tensor_count():
    """x is gathered for mm1 only; mm2 reads x as it is (no move): its compute is not overlapped."""
    from shardlayout.program import ProgramBuilder

    m = Mesh.parse("tp=8")
    b = ProgramBuilder()
    x = b.input("x", (8192, 4096))
    w1, w2 = b.param("w1", (4096, 8192)), b.param("w2", (4096, 8192))
    b.output(b.op("mm", [x, w1], name="mm1"))
    b.output(b.op("mm", [x, w2], name="mm2"))
    p = plan(b.build(), m, {"x": "[tp*1024, 4096]", "w1": "[4096, tp*1024]", "w2": "[4096, 8192]",
                            "mm1": "[8192, tp*1024]", "mm2": "[tp*1024, 8192]"})
    sp = stream_plan(p)
    assert [c.ops for c in sp.choices] == [("mm1",)] and sp.choices[0].kinds == ("all_gather",)


def test_a_move_cut_on_both_sides_is_not_streamed():
    m = Mesh.parse("tp=2")
    src, dst = Sharding.parse("[tp*4]", m), Sharding.parse("[2*tp*2]", m)
    with pytest.raises(ValueError, match="both"):
        run_streamed_move(src, dst, 0, 2, src.shard(np.arange(8.0)))


def test_a_pinned_outputs_move_is_shown_from_what_the_op_made():
    p = _plan("megatron-sp", mesh="dp=2,tp=2", layers=1, dim=512, seq=1024, batch=1, heads=8, ffn=1376)
    for c in stream_plan(p).choices:
        assert "tp*~" in c.text  # cut after the tp axis the moved tensor is sequence-sharded on


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_streamed_sharding_reads_back_what_it_writes(data):
    m = Mesh.parse("dp=2,tp=4")
    n = data.draw(st.sampled_from([16, 32, 48, 64]), label="n")
    axes = data.draw(st.sampled_from(["", "tp", "dp", "dp*tp"]), label="axes")
    size = n // (8 if axes == "dp*tp" else 4 if axes == "tp" else 2 if axes == "dp" else 1)
    s = Sharding.parse(f"[{axes + '*' if axes else ''}{size}, 4]", m)
    ks = [k for k in CHUNKS if chunk_layout(s.dims[0], s.shape[0], k) is not None]
    assume(ks)
    k = data.draw(st.sampled_from(ks), label="k")
    text = stream_text(s, 0, k)
    back = Sharding.parse(text, m)
    assert back == s.with_stream(0, k) and back.stream[::2] == (0, k) and str(back) == text
    assert back.without_stream() == s and back != s
    assert Sharding.parse(str(s), m).stream == ()


@pytest.mark.parametrize("text,words", [("[tp*~4*16, ~2*32]", "more than one stream factor"),
                                        ("[tp*~x*16, 3]", "not ~k with k an int"),
                                        ("[tp*~\u0664*16, 3]", "non-ASCII"),
                                        ("[~1*128, 3]", "no stream"), ("[tp*~1*64, 3]", "no stream"),
                                        ("[tp*~2*3 of 5, 3]", "uneven"),
                                        ("[~2*tp*3, 3]", None), ("[tp*~3*5, 3]", None), ("[4*~2*tp, 3]", None)])
def test_a_stream_factor_reads_as_written_or_is_refused_naming_the_fix(text, words):
    """``~k`` is a local factor of the dim run in k chunks, wherever it is written (before a mesh
    axis: each chunk spans the ranks of that axis); one per tensor, k >= 2, in an even dim."""
    from shardlayout.errors import ShardingSpecError

    m = Mesh.parse("tp=2")
    if words is None:
        s = Sharding.parse(text, m)
        assert str(s) == text and s.stream[0] == 0
        return
    with pytest.raises(ShardingSpecError, match=words):
        Sharding.parse(text, m)


def test_a_stream_that_would_cut_a_mesh_axis_is_refused_naming_the_fix():
    from shardlayout.errors import ShardingSpecError

    m = Mesh.parse("tp=2")
    with pytest.raises(ShardingSpecError, match="local factors only"):
        Sharding.parse("[8*tp, 3]", m).with_stream(0, 2)  # nothing local after tp
    with pytest.raises(ShardingSpecError, match="local factors only"):
        Sharding(m, (16, 3), [["tp", 8], []], stream=(0, 1, 4))  # the first 4 chunks would cut tp
    assert str(Sharding(m, (16, 3), [["tp", 8], []], stream=(0, 2, 4))) == "[tp*~4*2, 3]"


def test_megatron_sp_streams_round_trip_through_the_domain_layer():
    """Each stream choice of a Megatron-SP layer is one Sharding with its stream (the choice's dim
    and chunk count are read off it); its loop domain has the Stream ID nvFuser would, and the
    domain gives the same Sharding back."""
    from shardlayout.domain import loop_domain_of, ring_domains, ring_of, sharding_of
    from shardlayout.domain.iterdomain import Kind

    p = _plan("megatron-sp", mesh="tp=8", layers=1, dim=4096, seq=4096, batch=1, heads=32, ffn=11008)
    choices = stream_plan(p, ring=True).choices + stream_plan(p).choices
    assert {c.style for c in choices} == {"ring", "chunks"}
    for c in choices:
        assert c.sharding.stream[::2] == (c.dim, c.chunks) and c.text == str(c.sharding)
        if c.style == "ring":  # nvFuser's collective-based pipeline: producer DIDx, consumer Stream, one split
            prod, cons = ring_domains(c.sharding, c.tensor)
            dim_ids = [x for x in cons.loop if x.id.startswith(f"{c.tensor}_gathered.{c.dim}")]
            assert dim_ids[0].ptype.kind is Kind.STREAM and dim_ids[0].extent == p.mesh.axis_size("tp") == c.chunks
            dev = [x for x in prod.loop if x.id.startswith(f"{c.tensor}.{c.dim}")][0]
            assert dev.ptype.kind is Kind.DEVICE and dev.ptype.axis == "tp" and dev.extent == c.chunks
            assert ring_of(prod, cons, p.mesh) == c.sharding
            assert sharding_of(prod, p.mesh) == c.sharding.without_stream()
            continue
        td = loop_domain_of(c.sharding, c.tensor)
        assert [x.extent for x in td.loop if x.ptype.kind is Kind.STREAM] == [c.chunks]
        assert sharding_of(td, p.mesh) == c.sharding


def test_a_stream_of_local_factors_is_no_ring_in_the_domain():
    from shardlayout.domain import loop_domain_of, ring_domains, ring_of
    from shardlayout.errors import DomainError

    m = Mesh.parse("tp=4")
    s = Sharding.parse("[tp*~4*2, 3]", m)
    with pytest.raises(DomainError, match="no ring stream"):
        ring_domains(s)
    with pytest.raises(DomainError, match="not a ring"):
        ring_of(loop_domain_of(Sharding.parse("[tp*8, 3]", m)), loop_domain_of(Sharding.parse("[4*~4*2, 3]", m)), m)


def test_a_pin_with_a_stream_factor_is_refused_naming_the_fix():
    from shardlayout.errors import ShardingSpecError

    prog, m = llama(layers=1), Mesh.parse("tp=2")
    with pytest.raises(ShardingSpecError, match=r"plan chooses its streams: pin \[2, 8, 16\]"):
        plan(prog, m, {"x": "[~2*1, 8, 16]"})
