"""Auto chooses streams jointly with shardings (``plan.overlap``): a stream is an option of a move
priced by the overlap model inside the ILP, the plan runs exactly the streams the search priced,
and ``estimate`` counts them for auto and styles alike.

Llama widths of 1024 (1 layer, batch 2 x seq 1024): big enough for streams to pay at the default
100 TFLOP/s, planned in a fraction of a second.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from shardlayout import Mesh
from shardlayout.plan import plan
from shardlayout.plan.auto import ModelMismatch, auto_plan, install_streams
from shardlayout.plan.estimate import estimate
from shardlayout.program.models import llama, style_pins

WIDE = dict(layers=1, dim=1024, seq=1024, batch=2, heads=8, ffn=4096)


def _pipeline(a: float, m: float, k: int) -> float:
    """Two-stage pipeline of k chunks, written out chunk by chunk (not plan.stream.pipelined)."""
    comm_done = comp_done = 0.0
    for _ in range(k):
        comm_done += a
        comp_done = max(comp_done, comm_done) + m
    return comp_done


def test_joint_choice_picks_other_shardings_than_choose_then_stream_and_is_strictly_faster():
    prog, mesh = llama(**WIDE), Mesh.parse("tp=2")
    joint = auto_plan(prog, mesh, training="inference")
    first = auto_plan(prog, mesh, training="inference", streams=False)  # shardings chosen without streams
    then = estimate(plan(prog, mesh, dict(first.plan.shardings)), "inference")  # ... then streamed greedily
    assert joint.plan.shardings != first.plan.shardings
    assert joint.estimate.seconds < then.seconds
    assert joint.estimate.seconds == joint.predicted
    assert first.estimate.overlap == 0.0 and first.plan.stream_choices() == ()  # no streams asked, none run


def test_the_plans_streams_are_the_priced_ones_and_each_saving_is_the_pipeline():
    prog, mesh = llama(**WIDE), Mesh.parse("tp=2")
    a = auto_plan(prog, mesh, training="inference")
    chosen = a.plan.stream_choices()
    assert chosen, "the wide layer streams"
    ops = [o for c in chosen for o in c.ops]
    sides = [(c.tensor, c.side) for c in chosen]
    assert len(ops) == len(set(ops)) and len(sides) == len(set(sides))  # each op, each side once
    for c in chosen:  # each overlapped time is the pipeline of its chunks, written out by hand
        assert c.overlapped == pytest.approx(_pipeline(c.chunk_seconds, c.compute_seconds / c.chunks, c.chunks),
                                             rel=1e-12)
        assert c.serial == pytest.approx(c.collective_seconds + c.compute_seconds, rel=1e-12)
    e = a.estimate
    assert e.overlap == pytest.approx(sum(c.serial - c.overlapped for c in chosen), rel=1e-12)
    assert e.seconds == pytest.approx(e.forward + e.backward + e.compute - e.overlap, rel=1e-12)
    assert e.overlap > 0


@pytest.mark.parametrize("training,mesh", [("adam", "tp=2"), ("inference", "tp=4"), ("adam", "dp=2,tp=2")])
def test_auto_is_never_costlier_than_a_style_with_the_styles_streams_counted(training, mesh):
    prog, m = llama(**WIDE), Mesh.parse(mesh)
    a = auto_plan(prog, m, training=training)
    assert a.estimate.seconds == a.predicted
    for s in a.styles:
        if s.estimate is not None:
            p = plan(prog, m, style_pins(prog, m, s.style))
            greedy = sum(c.serial - c.overlapped for c in p.stream_choices())
            assert s.estimate.overlap == pytest.approx(greedy, rel=1e-12)  # a style's estimate counts its streams
            assert a.estimate.seconds <= s.estimate.seconds
    assert any(s.estimate is not None and s.estimate.overlap > 0 for s in a.styles)


def test_the_search_prices_a_styles_shardings_at_least_as_well_as_the_greedy_overlap():
    """Every tensor pinned to megatron-sp's sharding: the ILP chooses that plan's streams, and its
    choice saves at least what the greedy one does."""
    prog, m = llama(**WIDE), Mesh.parse("tp=2")
    p = plan(prog, m, style_pins(prog, m, "megatron-sp"))
    pinned = auto_plan(prog, m, dict(p.shardings), training="inference")
    assert pinned.plan.shardings == p.shardings
    assert pinned.estimate.overlap >= estimate(p, "inference").overlap > 0
    assert pinned.estimate.seconds == pinned.predicted


def test_chain_and_full_ilp_agree_with_streams():
    prog, m = llama(**{**WIDE, "layers": 2}), Mesh.parse("tp=2")
    chain = auto_plan(prog, m, training="inference", method="chain")
    full = auto_plan(prog, m, training="inference", method="full")
    assert chain.estimate.seconds == full.estimate.seconds == chain.predicted
    assert chain.estimate.overlap > 0


def test_a_stream_the_planner_does_not_price_alike_is_an_internal_error():
    prog, mesh = llama(**WIDE), Mesh.parse("tp=2")
    a = auto_plan(prog, mesh, training="inference")
    from shardlayout.plan.overlap import StreamOption

    c = a.plan.stream_choices()[0]
    p = plan(prog, mesh, dict(a.plan.shardings))
    good = StreamOption(c.tensor, None, None, (), (), c.serial - c.overlapped, c)
    install_streams(p, (good,), a.estimate.flop_rate)  # the plan's own candidate: accepted
    off = replace(good, saving=math.nextafter(good.saving, math.inf))
    with pytest.raises(ModelMismatch, match="saves"):
        install_streams(plan(prog, mesh, dict(a.plan.shardings)), (off,), a.estimate.flop_rate)
    twice = replace(good, choice=replace(c, tensor=c.tensor))
    with pytest.raises(ModelMismatch, match="twice"):
        install_streams(plan(prog, mesh, dict(a.plan.shardings)), (good, twice), a.estimate.flop_rate)
