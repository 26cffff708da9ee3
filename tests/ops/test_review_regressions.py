"""Regressions from review: each once gave wrong numbers, paid for a free move, or accepted a
call torch refuses. Checked by simulation on every rank where numbers are involved."""

from __future__ import annotations

import numpy as np
import pytest

from shardlayout import Mesh, OpError, Sharding, propagate

from .test_strategy import simulate_op


def test_mean_over_an_uneven_strided_dim_is_exact():
    s = Sharding.from_placements(Mesh.parse("a=2"), (10,), ["SS(0,4)"])  # pieces of 7 and 3
    p = propagate("mean", [s], dim=0)
    simulate_op(p, [np.arange(10.0)], lambda v: np.mean(v, axis=0), lambda v: np.mean(v, axis=0))
    s3 = Sharding.from_placements(Mesh.parse("a=3"), (3,), ["SS(0,4)"])
    simulate_op(propagate("amax", [s3], dim=0), [np.arange(3.0)], lambda v: np.max(v, axis=0))


@pytest.mark.parametrize("mode", ["floor", "trunc"])
def test_rounding_division_reduces_its_partial_first(mode):
    m = Mesh.parse("tp=2")
    p = propagate("div", [Sharding.parse("[4] +sum(tp)", m), Sharding.parse("[4]", m)], rounding_mode=mode)
    assert not p.outputs[0].partial
    fn = {"floor": np.floor_divide, "trunc": lambda u, v: np.trunc(u / v)}[mode]
    simulate_op(p, [np.array([1.0, 2, 3, 4]) * 1.7, np.full(4, 1.1)], fn)


@pytest.mark.parametrize("dtype,partial", [("int64", False), ("bool", False), ("bfloat16", True), (None, True)])
def test_casts_keep_partials_only_to_float_types(dtype, partial):
    m = Mesh.parse("tp=2")
    p = propagate("_to_copy", [Sharding.parse("[4] +sum(tp)", m)], dtype=dtype)
    assert bool(p.outputs[0].partial) == partial


def test_histc_without_a_range_keeps_its_input_whole():
    m = Mesh.parse("tp=4")
    x = np.array([0, 1, 2, 3, 4, 5, 6, 100.0])
    p = propagate("histc", [Sharding.parse("[tp*2]", m)], bins=2)
    simulate_op(p, [x], lambda v: np.histogram(v, bins=2, range=(v.min(), v.max()))[0].astype(float))


def test_max_partials_pass_through_max_ops_for_free():
    m = Mesh.parse("tp=2")
    P = Sharding.parse("[4, 6] +max(tp)", m)
    p = propagate("amax", [P], dim=1)
    assert p.cost == 0 and p.outputs[0].partial == (("tp", "max"),)
    simulate_op(p, [np.arange(24.0).reshape(4, 6)], lambda v: np.max(v, axis=1))
    q = propagate("maximum", [P, Sharding.parse("[4, 6]", m)])
    assert q.cost == 0 and q.outputs[0].partial == (("tp", "max"),)
    simulate_op(q, [np.arange(24.0).reshape(4, 6), np.full((4, 6), 10.0)], np.maximum)


@pytest.mark.parametrize("op,shapes,params,match", [
    ("mm", [(4, 1), (8, 5)], {}, "input 1 dim 0 has size 8 where input 0 has 1"),
    ("bmm", [(1, 4, 8), (4, 8, 5)], {}, "input 1 dim 0 has size 4 where input 0 has 1"),
    ("narrow", [(4, 6)], {"dim": 1, "start": -7, "length": 2}, "exceeds dim 1"),
    ("gather", [(4, 6), (4,)], {"dim": 1}, "must have the input's rank"),
    ("index_select", [(4, 6), (2, 2)], {"dim": 0}, "must be 1-D"),
    ("index_put", [(4, 6), (3,), (3, 5)], {}, "do not broadcast"),
])
def test_calls_torch_refuses_are_refused(op, shapes, params, match):
    m = Mesh.parse("x=1")
    with pytest.raises(OpError, match=match):
        propagate(op, [Sharding(m, s) for s in shapes], **params)


def test_narrow_with_a_negative_start_counts_from_the_end():
    m = Mesh.parse("x=2")
    p = propagate("narrow", [Sharding.parse("[x*2, 6]", m)], dim=1, start=-2, length=2)
    assert p.outputs[0].shape == (4, 2)
    simulate_op(p, [np.arange(24.0).reshape(4, 6)], lambda v: v[:, 4:6])


def test_pointwise_still_broadcasts_size_one_dims():
    m = Mesh.parse("x=2")
    p = propagate("add", [Sharding.parse("[x*4, 6]", m), Sharding(m, (1, 6))])
    assert p.outputs[0].shape == (8, 6)


def test_a_pinned_output_is_priced_in_its_own_dtype():
    m = Mesh.parse("tp=4")
    x = Sharding.parse("[tp*64, 64]", m)
    pin = Sharding.parse("[256, 64]", m)
    p = propagate("_to_copy", [x], dtype="bfloat16", out_pins=[pin], tensor_dtype=("float32", "bfloat16"))
    (gather,) = p.collectives
    assert gather.bytes == 256 * 64 * 2  # the bf16 output is gathered, not the fp32 input


@pytest.mark.parametrize("op,fn", [("add", np.add), ("mul", np.multiply)])
def test_sub_axis_layouts_split_across_dims_flow_through_pointwise_ops_for_free(op, fn):
    m = Mesh.parse("dp=2,tp=4")
    s = Sharding.parse("[dp*4*tp:(1)2, tp:(2)2*3]", m)
    p = propagate(op, [s, s])
    assert p.cost == 0 and p.outputs[0] == s
    x, y = np.arange(96.0).reshape(16, 6), np.arange(96.0).reshape(16, 6) / 3
    simulate_op(p, [x, y], fn)


def test_sub_axes_on_two_letters_of_a_matmul_need_no_communication():
    m = Mesh.parse("tp=4")
    p = propagate("mm", [Sharding.parse("[tp:(1)2*4, 8]", m), Sharding.parse("[8, tp:(2)2*4]", m)])
    assert p.cost == 0 and str(p.outputs[0]) == "[tp:(1)2*4, tp:(2)2*4]"
    simulate_op(p, [np.arange(64.0).reshape(8, 8), np.arange(64.0).reshape(8, 8) / 5], np.matmul)
