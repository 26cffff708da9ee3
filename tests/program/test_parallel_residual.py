"""``residual + attn + mlp`` (Cohere, StableLM's parallel residual) summed branches first: the same
values, and Megatron reduces the two branches' partial sums once."""

from __future__ import annotations

import numpy as np

from shardlayout import Mesh
from shardlayout.execute.verify import reference_run
from shardlayout.plan import plan
from shardlayout.program import ProgramBuilder
from shardlayout.program.parallel_residual import sum_branches_first

TP2 = Mesh.parse("tp=2")
PINS = {"x": "[4, 8]", "out": "[4, 8]", "a1": "[8, tp*8]", "m1": "[8, tp*8]", "a2": "[tp*8, 8]", "m2": "[tp*8, 8]"}


def _layer(order: str = "residual first"):
    """Two column-then-row branches of one input x, added to x: ``(x + a) + m`` or ``(a + m) + x``."""
    b = ProgramBuilder()
    x = b.input("x", (4, 8))
    a1, a2, m1, m2 = (b.param(n, s) for n, s in (("a1", (8, 16)), ("a2", (16, 8)), ("m1", (8, 16)), ("m2", (16, 8))))
    a = b.op("mm", [b.op("relu", [b.op("mm", [x, a1])]), a2], name="attn")
    m = b.op("mm", [b.op("relu", [b.op("mm", [x, m1])]), m2], name="mlp")
    if order == "residual first":
        out = b.op("add", [b.op("add", [x, a], name="h"), m], name="out")
    else:
        out = b.op("add", [b.op("add", [a, m], name="h"), x], name="out")
    b.output(out)
    return b.build()


def test_branches_summed_first_are_reduced_once():
    prog = _layer()
    # megatron pins each block's residual add replicated: x + attn reduces attn there, and mlp at out
    assert plan(prog, TP2, {**PINS, "h": "[4, 8]"}).counts() == {("all_reduce", ("tp",)): 2}
    summed = sum_branches_first(prog)
    assert [op.inputs for op in summed.ops[-2:]] == [("attn", "mlp"), ("x", "h_branches")]
    p = plan(summed, TP2, PINS)
    assert p.counts() == {("all_reduce", ("tp",)): 1} and p.verify().ok
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(prog.tensors[n].shape) for n in prog.inputs()}
    want = reference_run(plan(prog, TP2), inputs)["out"]
    np.testing.assert_allclose(reference_run(plan(summed, TP2), inputs)["out"], want, rtol=1e-12, atol=1e-12)


def test_branches_already_summed_first_and_a_sequential_residual_are_left_as_they_are():
    """GPT-J's ``(attn + mlp) + residual``, and ``h = x + a; h + mlp(h)`` (h read twice: Llama's)."""
    gptj = _layer("branches first")
    assert sum_branches_first(gptj) is gptj
    b = ProgramBuilder()
    x = b.input("x", (4, 8))
    h = b.op("add", [x, b.op("relu", [x], name="a")], name="h")
    b.output(b.op("add", [h, b.op("neg", [h], name="m")], name="out"))
    sequential = b.build()
    assert sum_branches_first(sequential) is sequential
