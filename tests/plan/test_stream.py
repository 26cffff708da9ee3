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
from shardlayout.plan.stream import CHUNKS, chunk_layout, pipelined, run_streamed_move, stream_plan, stream_text
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


def _plan(style, mesh="tp=8", **sizes):
    prog, m = llama(**{**BIG, **sizes}), Mesh.parse(mesh)
    return plan(prog, m, style_pins(prog, m, style))


@pytest.mark.parametrize("style", ["megatron-sp", "megatron"])
def test_each_choice_is_the_best_chunk_count(style):
    p = _plan(style)
    sp = stream_plan(p)
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
        assert c.chunks == min(times, key=lambda k: (times[k], k))
        assert c.overlapped == pytest.approx(times[c.chunks]) and c.serial == pytest.approx(times[1])
        saved += c.serial - c.overlapped
    assert sp.serial_seconds - sp.overlapped_seconds == pytest.approx(saved)
    assert len({o for c in sp.choices for o in c.ops}) == sum(len(c.ops) for c in sp.choices)  # each matmul once


def test_megatron_sp_overlaps_its_gathers_and_reduce_scatters():
    sp = stream_plan(_plan("megatron-sp"))
    sides = sorted((c.side, len(c.ops)) for c in sp.choices)
    assert sides == [("after", 1), ("after", 1), ("before", 2), ("before", 3)]  # q|k|v, gate|up; the two outs
    assert all(c.dim == 1 and c.chunks > 1 for c in sp.choices)  # the sequence


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

    assert main(["plan", "--model", "llama", "--layers", "1", "--size", "dim=4096,seq=4096,batch=1,heads=32,ffn=11008",
                 "--mesh", "tp=8", "--style", "megatron-sp"]) == 0
    out = capsys.readouterr().out
    assert "µs serial" in out and "stream overlap(s)" in out and "[1, tp*~8*64, 4096]" in out
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
    from shardlayout.domain import loop_domain_of, sharding_of
    from shardlayout.domain.iterdomain import Kind

    p = _plan("megatron-sp", mesh="tp=8", layers=1, dim=4096, seq=4096, batch=1, heads=32, ffn=11008)
    choices = stream_plan(p).choices
    assert choices
    for c in choices:
        assert c.sharding.stream[::2] == (c.dim, c.chunks) and c.text == str(c.sharding)
        td = loop_domain_of(c.sharding, c.tensor)
        assert [x.extent for x in td.loop if x.ptype.kind is Kind.STREAM] == [c.chunks]
        assert sharding_of(td, p.mesh) == c.sharding


def test_a_pin_with_a_stream_factor_is_refused_naming_the_fix():
    from shardlayout.errors import ShardingSpecError

    prog, m = llama(layers=1), Mesh.parse("tp=2")
    with pytest.raises(ShardingSpecError, match=r"plan chooses its streams: pin \[2, 8, 16\]"):
        plan(prog, m, {"x": "[~2*1, 8, 16]"})
