"""A row-parallel Linear with a bias (addmm, linear) stays partial with the bias added once; a
split of a fused (strided) dim is carved without moving data; convolution shards batch and
output channels and contracts input channels. Each checked by simulation on every rank."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from shardlayout import Mesh, OpError, Sharding, propagate
from shardlayout.execute import run_moves
from shardlayout.ops.families import _np_conv
from shardlayout.ops.resize import carve
from shardlayout.sharding import Factor
from shardlayout.sharding.move import plan_move

from .checks import random_pieces
from .test_families_more import simulate_all

M = Mesh.parse("dp=2,tp=2")
rng = np.random.default_rng(0)


def S(text):
    return Sharding.parse(text, M)


def test_addmm_row_parallel_with_bias_is_partial_and_free():
    c, a, b = S("[16]"), S("[dp*4, tp*4]"), S("[tp*4, 16]")
    p = propagate("addmm", [c, a, b])
    assert [str(t) for t in p.input_targets] == ["[16] +sum(tp)", "[dp*4, tp*4]", "[tp*4, 16]"]
    assert str(p.outputs[0]) == "[dp*4, 16] +sum(tp)" and not p.collectives
    x = [rng.standard_normal(s.shape) for s in (c, a, b)]
    simulate_all(p, x, lambda c, a, b: c + a @ b)
    q = propagate("addmm", [c, a, b], beta=0.5, alpha=2.0)
    simulate_all(q, x, lambda c, a, b: 0.5 * c + 2.0 * (a @ b))


def test_addmm_column_parallel_keeps_the_bias_sharded():
    p = propagate("addmm", [S("[tp*8]"), S("[dp*4, 16]"), S("[16, tp*8]")])
    assert str(p.outputs[0]) == "[dp*4, tp*8]" and not p.collectives


def test_addmm_bias_joins_a_partial_product_once():
    c, a, b = S("[8, 16]"), S("[8, 8] +sum(tp)"), S("[8, 16]")
    p = propagate("addmm", [c, a, b])
    assert str(p.outputs[0]) == "[8, 16] +sum(tp)" and str(p.input_targets[0]) == "[8, 16] +sum(tp)"
    x = [rng.standard_normal(s.shape) for s in (c, a, b)]
    simulate_all(p, x, lambda c, a, b: c + a @ b, lambda c, a, b: c + a @ b)


def test_linear_with_bias_row_parallel():
    x, w, bias = S("[dp*4, tp*4]"), S("[16, tp*4]"), S("[16]")
    p = propagate("linear", [x, w, bias])
    assert str(p.outputs[0]) == "[dp*4, 16] +sum(tp)" and not p.collectives
    vals = [rng.standard_normal(s.shape) for s in (x, w, bias)]
    simulate_all(p, vals, lambda x, w, b: x @ w.T + b)


def test_carve_cuts_the_outer_local_factor():
    fs = (Factor(3), Factor(2, "tp"), Factor(8))
    assert [c.factors for c in carve(fs, 48, [16, 16, 16])] == [(Factor(2, "tp"), Factor(8))] * 3
    assert [c.factors for c in carve(fs, 48, [32, 16])] == [(Factor(2), Factor(2, "tp"), Factor(8)),
                                                            (Factor(2, "tp"), Factor(8))]
    assert isinstance(carve(fs, 48, [24, 24]), str)  # a cut inside the sharded part
    assert isinstance(carve((Factor(2, "tp"), Factor(24)), 48, [16, 16, 16]), str)


@pytest.mark.parametrize("op,params", [("split_with_sizes", {"split_sizes": [16, 16, 16]}),
                                       ("split", {"split_size": 16}), ("chunk", {"chunks": 3})])
def test_split_of_a_fused_dim_moves_nothing(op, params):
    s = S("[dp*4, 3*tp*8]")
    p = propagate(op, [s], dim=1, **params)
    assert [str(o) for o in p.outputs] == ["[dp*4, tp*8]"] * 3 and not p.collectives
    x = rng.standard_normal(s.shape)
    simulate_all(p, [x], lambda a: tuple(np.split(a, 3, axis=1)), lambda a: tuple(np.split(a, 3, axis=1)))


def test_split_of_a_plainly_sharded_fused_dim_gathers():
    p = propagate("split_with_sizes", [S("[8, tp*24]")], split_sizes=[16, 16, 16], dim=1)
    assert [c.kind.value for c in p.collectives] == ["all_gather"]


@pytest.mark.parametrize("kw", [dict(stride=1, padding=0, dilation=1, groups=1),
                                dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)])
def test_numpy_convolution_matches_torch(kw):
    torch = pytest.importorskip("torch")
    x, w, b = torch.randn(2, 6, 9, 8), torch.randn(4, 6 // kw["groups"], 3, 2), torch.randn(4)
    want = torch.nn.functional.conv2d(x, w, b, **kw).numpy()
    assert np.allclose(_np_conv(x.numpy(), w.numpy(), b.numpy(), **kw), want, atol=1e-5)
    x1, w1 = torch.randn(2, 3, 10), torch.randn(5, 3, 3)
    assert np.allclose(_np_conv(x1.numpy(), w1.numpy(), None, 2, 1),
                       torch.nn.functional.conv1d(x1, w1, None, 2, 1).numpy(), atol=1e-5)


CONV = dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], transposed=False, output_padding=[0, 0], groups=1)


@pytest.mark.parametrize("xs,ws,out", [
    ("[dp, tp*3, 8, 8]", "[8, tp*3, 3, 3]", "[dp, 8, 8, 8] +sum(tp)"),  # input channels contract: partial
    ("[dp, 6, 8, 8]", "[tp*4, 6, 3, 3]", "[dp, tp*4, 8, 8]"),  # output channels shard
])
def test_convolution_shards_batch_and_channels(xs, ws, out):
    x, w, b = S(xs), S(ws), S("[8]")
    p = propagate("convolution", [x, w, b], **CONV)
    assert str(p.outputs[0]) == out and not p.collectives
    vals = [rng.standard_normal(s.shape) for s in (x, w, b)]
    simulate_all(p, vals, lambda x, w, b: _np_conv(x, w, b, 1, 1))


def test_convolution_space_stays_whole_and_bad_calls_are_refused():
    p = propagate("conv2d", [S("[2, 6, tp*4, 8]"), S("[8, 6, 3, 3]")], padding=1)
    assert str(p.outputs[0]) == "[2, 8, 8, 8]" and [c.kind.value for c in p.collectives] == ["all_gather"]
    with pytest.raises(OpError, match="transposed convolution"):
        propagate("convolution", [S("[2, 6, 8, 8]"), S("[6, 8, 3, 3]")], **{**CONV, "transposed": True})
    with pytest.raises(OpError, match="input channels 6 != weight's 4"):
        propagate("conv2d", [S("[2, 6, 8, 8]"), S("[8, 4, 3, 3]")])


BIASED = [("addmm", [(4,), (4, 4), (4, 4)], lambda c, a, b: c + a @ b),
          ("linear", [(4, 4), (4, 4), (4,)], lambda x, w, b: x @ w.T + b)]


@pytest.mark.parametrize("mesh", ["tp=2", "dp=2,tp=2"])
@pytest.mark.parametrize("op,shapes,fn", BIASED, ids=[b[0] for b in BIASED])
def test_a_biased_product_with_any_operands_partial_computes_its_value(mesh, op, shapes, fn):
    """Every operand replicated or partial on any axis (a partial bias alone included: the product
    must then be made partial too, or it would be counted once per rank), simulated on every rank."""
    m = Mesh.parse(mesh)
    rng = np.random.default_rng(0)
    for combo in itertools.product([None, *m.names], repeat=3):
        ins = [Sharding.parse("[" + ", ".join(map(str, s)) + "]" + (f" +sum({c})" if c else ""), m)
               for s, c in zip(shapes, combo)]
        vals = [rng.standard_normal(s) for s in shapes]
        p = propagate(op, ins)
        pcs = [run_moves(plan_move(s, t), random_pieces(s, v, rng)) for s, t, v in zip(ins, p.input_targets, vals)]
        got = p.outputs[0].unshard({r: fn(*(pc[r] for pc in pcs)) for r in m.ranks()}, tolerance=1e-9)
        assert np.allclose(got, fn(*vals)), (op, combo, [str(t) for t in p.input_targets], str(p.outputs[0]))
