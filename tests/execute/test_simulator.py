"""The executor seam: walk() with the numpy simulator, collectives run per group."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardlayout import Mesh, Sharding, ShardMismatch, plan_move
from shardlayout.execute import NumpySimulator, run_collective, walk
from shardlayout.execute.simulator import group_of
from shardlayout.plan import plan
from shardlayout.program import ProgramBuilder
from shardlayout.sharding.collective import AxisPiece, Collective, CollectiveKind

from ..sharding.strategies import shardings


def test_groups_of_whole_axes_and_sub_axes():
    m = Mesh.parse("dp=2,tp=4")  # rank = dp*4 + tp
    assert group_of(m, 5, (AxisPiece("tp", 4),)) == [4, 5, 6, 7]
    assert group_of(m, 5, (AxisPiece("dp", 2),)) == [1, 5]
    # tp:(1)2 is the major digit of tp (tp // 2), tp:(2)2 the minor one (tp % 2)
    assert group_of(m, 5, (AxisPiece("tp", 2, pre=1),)) == [5, 7]
    assert group_of(m, 5, (AxisPiece("tp", 2, pre=2),)) == [4, 5]
    assert group_of(m, 5, ()) == [5]


def test_a_collective_that_asks_for_data_outside_its_group_is_refused():
    m = Mesh.parse("tp=4")
    a, b = Sharding.parse("[tp*2]", m), Sharding.parse("[8]", m)
    wrong = Collective(CollectiveKind.ALL_GATHER, (AxisPiece("tp", 2, pre=2),), (0,), 32, a, b)
    with pytest.raises(ShardMismatch, match="does not hold"):
        run_collective(wrong, a.shard(np.arange(8.0)))


@given(shardings(), st.data())
def test_every_move_runs_to_the_target_on_every_rank(a, data):
    pl = [data.draw(st.sampled_from(["R", "P"] + [f"S({d})" for d in range(a.ndim)])) for _ in a.mesh.names]
    b = Sharding.from_placements(a.mesh, a.shape, pl)
    x = np.random.default_rng(0).standard_normal(a.shape)
    got = a.shard(x)
    for c in plan_move(a, b):
        got = run_collective(c, got)
    want = b.shard(x)
    for r in a.mesh.ranks():
        assert np.allclose(got[r], want[r]), (str(a), str(b), r)


def test_walk_yields_every_produced_tensor_in_its_planned_sharding():
    b = ProgramBuilder()
    x, w = b.input("x", (4, 8)), b.param("w", (8, 6))
    y = b.op("mm", [x, w], name="y")
    b.output(b.op("relu", [y], name="z"))
    m = Mesh.parse("tp=2")
    p = plan(b.build(), m, {"x": Sharding.parse("[4, tp*4]", m), "w": Sharding.parse("[tp*4, 6]", m)})
    xs = {"x": np.arange(32.0).reshape(4, 8) - 10, "w": np.ones((8, 6))}
    out = dict(walk(p, NumpySimulator(m), {n: p.shardings[n].shard(v) for n, v in xs.items()}))
    assert list(out) == ["y", "z"]
    assert np.allclose(p.shardings["z"].unshard(out["z"]), np.maximum(xs["x"] @ xs["w"], 0))


class CountingExecutor(NumpySimulator):
    """An executor that records what walk asks of it (the seam is all it sees)."""

    def __init__(self, mesh):
        super().__init__(mesh)
        self.calls = []

    def op(self, opdef, inputs, params, outputs):
        self.calls.append(("op", opdef.name))
        return super().op(opdef, inputs, params, outputs)

    def collective(self, c, value):
        self.calls.append((c.kind.value, c.axes_text()))
        return super().collective(c, value)


def test_walk_runs_exactly_the_planned_collectives():
    from shardlayout.program.models import llama, style_pins

    prog = llama(layers=1)
    m = Mesh.parse("dp=2,tp=2")
    p = plan(prog, m, style_pins(prog, m, "megatron"))
    ex = CountingExecutor(m)
    rng = np.random.default_rng(0)
    inputs = {n: p.shardings[n].shard(rng.standard_normal(prog.tensors[n].shape)) for n in prog.inputs()}
    list(walk(p, ex, inputs))  # run the whole walk
    ran = [c for c in ex.calls if c[0] not in ("op", "local")]
    assert sorted(ran) == sorted((c.kind.value, c.axes_text()) for c in p.collectives)
    assert sum(1 for c in ex.calls if c[0] == "op") == len(prog.ops)


def test_an_all_reduce_of_a_whole_tensors_statistic_runs_on_every_rank():
    """A weight cut on tp, scaled by the mean of its magnitudes over the whole weight (BitNet's ternary
    scale): each rank's mean is a partial sum, all-reduced as a 0-d tensor — each rank's piece a
    number, not an array to place into."""
    b = ProgramBuilder()
    w = b.param("w", (8, 4))
    m = b.op("mean", [b.op("abs", [w], name="a")], name="m")
    b.output(b.op("div", [w, b.op("clamp", [m], name="c", min=1e-5)], name="q"))
    p = plan(b.build(), Mesh.parse("tp=2"), {"w": "[tp*4, 4]", "q": "[tp*4, 4]"})
    assert [(c.kind.value, c.tensor, c.bytes) for c in p.collectives] == [("all_reduce", "m", 4)]
    assert p.verify().ok
