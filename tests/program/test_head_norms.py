"""A LayerNorm per head, run on each head split off (StableLM's ``qk_layernorm``), read as one
norm with a per-head weight: the same values, and a cut of the heads needs no collective."""

from __future__ import annotations

import numpy as np
import pytest

from shardlayout import Mesh
from shardlayout.execute.verify import reference_run
from shardlayout.plan import plan
from shardlayout.program import ProgramBuilder
from shardlayout.program.head_norms import merge_head_norms

HEADS, SEQ, HD = 4, 3, 8


def _per_head(bias: bool = True, sizes=(1, 1, 1, 1), cat_dim: int = 1, read_stat: bool = False):
    """q [2, heads, seq, hd] split into heads, each normed with its own weight (and bias), joined."""
    b = ProgramBuilder()
    q = b.input("q", (2, HEADS, SEQ, HD))
    parts = b.op("split_with_sizes", [q], name="qn.split", n_out=len(sizes), split_sizes=sizes, dim=1)
    normed = []
    for h, x in enumerate(parts):
        ps = [b.param(f"qn.norms.{h}.weight", (HD,))] + ([b.param(f"qn.norms.{h}.bias", (HD,))] if bias else [])
        outs = b.op("native_layer_norm", [x, *ps], name=f"qn.norms.{h}.ln", n_out=3,
                    normalized_shape=(HD,), eps=1e-5)
        normed.append(outs[0])
        if read_stat and h == 0:
            b.output(outs[1])
    b.output(b.op("mul", [b.op("cat", normed, name="qn.cat", dim=cat_dim), 2.0], name="y"))
    return b.build()


def _values(prog, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(prog.tensors[n].shape) for n in prog.inputs()}


@pytest.mark.parametrize("bias", [True, False])
def test_merged_norm_computes_what_the_norms_of_each_head_did(bias):
    prog = _per_head(bias)
    merged = merge_head_norms(prog)
    assert [op.target for op in merged.ops].count("native_layer_norm") == 1
    assert not any("split" in op.target for op in merged.ops)
    mesh = Mesh.parse("tp=2")
    inputs = _values(prog)
    want = reference_run(plan(prog, mesh), inputs)["y"]
    got = reference_run(plan(merged, mesh), inputs)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_merged_norm_lets_the_heads_be_cut_without_a_collective():
    """q's heads on tp: each rank norms its own heads with its heads' weights, sliced locally."""
    merged = merge_head_norms(_per_head())
    mesh = Mesh.parse("tp=2")
    p = plan(merged, mesh, {"q": "[2, tp*2, 3, 8]", "y": "[2, tp*2, 3, 8]"})
    assert p.collectives == [] and str(p.shardings["qn.cat"]) == "[2, tp*2, 3, 8]"
    assert p.verify().ok


@pytest.mark.parametrize("kw", [dict(sizes=(2, 2)), dict(cat_dim=2), dict(read_stat=True)])
def test_other_shapes_are_left_as_they_are(kw):
    """Pieces of two heads, a cat along another dim, a norm's statistic read elsewhere: not the pattern."""
    prog = _per_head(**kw)
    assert merge_head_norms(prog) is prog
