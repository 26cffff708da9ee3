"""The backward plan's gradient sums (``plan.backward``): one all-reduce per consumed value and set
of axes its readers leave partial, read only by those readers. Numeric truth is in
tests/run/test_launch.py (a tied embedding on dp trains equal to the unsharded run); these pin
the structure, and that the estimate and the auto search price exactly what runs."""

from __future__ import annotations

import math

from shardlayout import Mesh, Sharding
from shardlayout.plan import plan
from shardlayout.plan.backward import gradient_reductions, reduction_at
from shardlayout.plan.estimate import estimate, reduction_seconds
from shardlayout.program import ProgramBuilder


def _tied(mesh):
    """x @ w and y @ w.T with x, y sharded on the batch: w's gradient arrives partial over dp at the
    first matmul; at the transpose's output (then read by the second) — the transpose reads w with
    a complete gradient."""
    b = ProgramBuilder()
    x, y = b.input("x", (4, 6)), b.input("y", (4, 8))
    w = b.param("w", (6, 8))
    h = b.op("mm", [x, w], name="h")
    wt = b.op("permute", [w], name="wt", dims=(1, 0))
    b.output(b.op("add", [h, b.op("mm", [b.op("mm", [y, wt], name="g"), w], name="k")], name="out"))
    prog = b.build()
    pins = {"x": Sharding.parse("[dp*2, 6]", mesh), "y": Sharding.parse("[dp*2, 8]", mesh),
            "w": Sharding.parse("[6, 8]", mesh)}
    return plan(prog, mesh, pins)


def test_a_reader_whose_gradient_is_complete_is_not_summed_again():
    m = Mesh.parse("dp=2")
    p = _tied(m)
    red = gradient_reductions(p)
    readers = {(p.program.ops[i].name, k): (name, [pc.axis for pc in pieces])
               for (name, _, pieces), rs in red.items() for i, k in rs}
    # w: read by the two mm's (partial over dp, one sum for both); not through the transpose
    assert readers[("h", 1)] == readers[("k", 1)] == ("w", ["dp"])
    assert ("wt", 0) not in readers
    assert readers[("g", 1)] == ("wt", ["dp"])  # the transpose's output is summed where it is read
    at = reduction_at(red)
    assert at[(_index(p, "h"), 1)] == at[(_index(p, "k"), 1)] and (_index(p, "wt"), 0) not in at


def test_readers_partial_over_different_axes_get_one_sum_each():
    m = Mesh.parse("dp=2,tp=2")
    b = ProgramBuilder()
    x = b.op("add", [b.input("x0", (4, 6)), b.param("p0", (4, 6))], name="x")
    a = b.op("mm", [x, b.param("w1", (6, 8))], name="a")  # column-parallel: x's gradient partial over tp
    c = b.op("mm", [b.input("z", (4, 4)), x], name="c")  # row-sharded z: partial over dp
    b.output(a)
    b.output(c)
    rep = "[4, 6]"
    p = plan(b.build(), m, {"x0": Sharding.parse(rep, m), "p0": Sharding.parse(rep, m), "x": Sharding.parse(rep, m),
                            "z": Sharding.parse("[dp*2, 4]", m), "w1": Sharding.parse("[6, tp*4]", m),
                            "a": Sharding.parse("[4, tp*4]", m), "c": Sharding.parse("[dp*2, 6]", m)})
    red = gradient_reductions(p)
    on_x = sorted(tuple(pc.axis for pc in pieces) for name, _, pieces in red if name == "x")
    # one sum per reader's axes: a sum of both over dp and tp would count each contribution twice
    assert on_x == [("dp",), ("tp",)]


def test_the_estimate_prices_one_all_reduce_per_sum():
    m = Mesh.parse("dp=2")
    p = _tied(m)
    red = gradient_reductions(p)
    assert sorted(name for name, _, _ in red) == ["w", "wt"] and not p.collectives
    want = math.fsum(reduction_seconds(t, {pc.axis for pc in pieces}, "float32", p.cost_model)
                     for _, t, pieces in red)
    assert estimate(p, training="sgd").backward == want > 0


def _index(p, name):
    return next(i for i, op in enumerate(p.program.ops) if op.name == name)
