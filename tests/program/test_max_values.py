"""max_values: a max over a dim whose indices nobody reads is read as amax — a partial max a cut of
the dim all-reduces as a [batch, seq, 1] statistic, where max's indices need the dim whole."""

from __future__ import annotations

from shardlayout import Mesh
from shardlayout.plan import plan
from shardlayout.program import ProgramBuilder
from shardlayout.program.max_values import max_values

TP2 = Mesh.parse("tp=2")


def _absmax_scaled(read_indices: bool = False):
    """x * (127 / max(|x|, -1).values): per-token absmax scaling (BitNet's 8-bit activations)."""
    b = ProgramBuilder()
    x = b.input("x", (2, 8, 32))
    values, indices = b.op("max", [b.op("abs", [x], name="a")], name="m", n_out=2, dim=-1, keepdim=True)
    y = b.op("mul", [x, b.op("mul", [b.op("reciprocal", [values], name="r"), 127.0], name="s")], name="y")
    b.output(y)
    if read_indices:
        b.output(indices)
    return b.build()


def test_a_max_whose_indices_are_unread_is_an_amax_all_reduced_where_its_dim_is_cut():
    prog = _absmax_scaled()
    got = max_values(prog)
    (m,) = [op for op in got.ops if op.outputs == ("m.0",)]
    assert m.target == "amax" and m.kwargs()["dim"] == (-1,) and m.kwargs()["keepdim"] is True
    # the statistic's input kept cut and the statistic whole, as megatron pins them (at these tiny sizes
    # the planner alone would gather |x|: one hop against the all_reduce's two)
    pins = {"x": "[2, 8, tp*16]", "a": "[2, 8, tp*16]", "y": "[2, 8, tp*16]", "m.0": "[2, 8, 1]"}
    after = plan(got, TP2, pins, keep={"a"})
    before = plan(prog, TP2, pins)  # max's indices need the dim whole: |x| gathered
    assert [(c.kind.value, c.bytes) for c in before.collectives] == [("all_gather", 2 * 8 * 32 * 4)]  # max's dim whole
    assert [(c.kind.value, c.tensor, c.bytes) for c in after.collectives] == [("all_reduce", "m.0", 2 * 8 * 4)]
    assert after.collectives[0].reduce_op == "max"
    assert before.verify().ok and after.verify().ok


def test_a_max_whose_indices_are_read_stays_a_max():
    prog = _absmax_scaled(read_indices=True)
    assert max_values(prog) is prog
