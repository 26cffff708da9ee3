"""View ops: exact regrouping of factors, checked on every rank (hypothesis), the DESIGN and
DTensor regression cases, nvFuser's reshape cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardlayout import Mesh, Sharding, ShardingError, UnsupportedOp, propagate
from shardlayout.config import options

from ..sharding.strategies import shardings
from .checks import local_check, reshape_local


def prime_factors(n):
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@st.composite
def view_shapes(draw, total):
    ps = prime_factors(total)
    ndim = draw(st.integers(1, 4))
    dims = [1] * ndim
    for p in ps:
        dims[draw(st.integers(0, ndim - 1))] *= p
    return tuple(dims)


def check_view(s, shape, **kw):
    p = propagate("view", [s], shape=shape, **kw)
    x = np.arange(int(np.prod(s.shape)), dtype=np.float64).reshape(s.shape)
    local_check(p, x, lambda a: a.reshape(p.outputs[0].shape), reshape_local)
    return p


@st.composite
def view_chains(draw):
    s = draw(shardings(max_ndim=4))
    steps = []
    cur = s.shape
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["view", "view", "transpose", "flatten", "unsqueeze", "squeeze"]))
        if kind == "view":
            shape = draw(view_shapes(int(np.prod(cur))))
            steps.append(("view", {"shape": shape}))
            cur = shape
        elif kind == "transpose" and len(cur) >= 2:
            a, b = draw(st.integers(0, len(cur) - 1)), draw(st.integers(0, len(cur) - 1))
            steps.append(("transpose", {"dim0": a, "dim1": b}))
            cur = list(cur)
            cur[a], cur[b] = cur[b], cur[a]
            cur = tuple(cur)
        elif kind == "flatten" and len(cur) >= 2:
            a = draw(st.integers(0, len(cur) - 2))
            b = draw(st.integers(a, len(cur) - 1))
            steps.append(("flatten", {"start_dim": a, "end_dim": b}))
            cur = cur[:a] + (int(np.prod(cur[a : b + 1])),) + cur[b + 1 :]
        elif kind == "unsqueeze":
            d = draw(st.integers(0, len(cur)))
            steps.append(("unsqueeze", {"dim": d}))
            cur = cur[:d] + (1,) + cur[d:]
        elif kind == "squeeze":
            steps.append(("squeeze", {}))
            cur = tuple(n for n in cur if n != 1)
    return s, steps


def _expressible(s) -> bool:
    from shardlayout import NotRepresentable

    try:
        s.to_placements()
        return True
    except NotRepresentable:
        return False


def apply_global(kind, params, a):
    if kind == "view":
        return a.reshape(params["shape"])
    if kind == "transpose":
        return np.swapaxes(a, params["dim0"], params["dim1"])
    if kind == "flatten":
        s, e = params["start_dim"], params["end_dim"]
        return a.reshape(a.shape[:s] + (-1,) + a.shape[e + 1 :])
    if kind == "unsqueeze":
        return np.expand_dims(a, params["dim"])
    if kind == "squeeze":
        return a.reshape(tuple(n for n in a.shape if n != 1))
    raise AssertionError(kind)


def apply_local(kind, params, piece, out_shape):
    if kind == "transpose":
        return np.swapaxes(piece, params["dim0"], params["dim1"])
    return piece.reshape(out_shape)


@given(view_chains(), st.booleans())
def test_view_chains_are_exact_on_every_rank(chain, subaxes):
    s, steps = chain
    x = np.arange(int(np.prod(s.shape)), dtype=np.float64).reshape(s.shape)
    cur = s
    for kind, params in steps:
        p = propagate(kind, [cur], subaxes=subaxes, **params)
        local_check(p, x, lambda a, k=kind, q=params: apply_global(k, q, a),
                    lambda piece, shape, k=kind, q=params: apply_local(k, q, piece, shape))
        if not subaxes and _expressible(cur):
            p.outputs[0].to_placements()  # DTensor can say it
        if p.input_targets[0] == cur:
            assert not p.collectives
        x = apply_global(kind, params, x)
        cur = p.outputs[0]


@given(shardings(max_ndim=3), st.data())
def test_views_need_communication_only_when_no_exact_regrouping(s, data):
    shape = data.draw(view_shapes(int(np.prod(s.shape))))
    p = check_view(s, shape)
    if p.needs_communication:
        # every gathered piece was really in the way: the target with it is not viewable
        assert p.input_targets[0] != s
    else:
        assert p.input_targets[0] == s


M = Mesh.parse("dp=2,tp=4")


def test_design_example_needs_sub_axes():
    s = Sharding.parse("[dp*4, tp*3]", M)
    p = check_view(s, (96,))
    assert str(p.outputs[0]) == "[dp*4*tp*3]" and p.outputs[0].to_placements() == ("S(0)", "SS(0,4)")
    p = check_view(s, (16, 6))
    assert str(p.outputs[0]) == "[dp*4*tp:(1)2, tp:(2)2*3]" and not p.needs_communication
    p = check_view(s, (16, 6), subaxes=False)
    assert p.needs_communication and [c.axes_text() for c in p.collectives] == ["tp"]
    assert p.outputs[0].to_placements()
    with options(subaxes=False):
        assert propagate("view", [s], shape=(16, 6)).needs_communication


# DTensor 2.13 regressions quoted in the issue: ours exact, checked on every rank


def test_dtensor_wrong_numbers_strided_24():
    s = Sharding.from_placements(Mesh.parse("x=2"), (24,), ["SS(0,3)"])
    p = check_view(s, (4, 6))  # DTensor claims SS(1,3) and computes wrong numbers
    assert p.outputs[0].to_placements() == ("R",)  # no exact sharding exists: gather x
    assert [c.kind for c in p.collectives] == ["all_gather"]


def test_dtensor_wrong_numbers_chain():
    m = Mesh.parse("x=2")
    s = Sharding.from_placements(m, (3, 8), ["S(1)"])
    p1 = check_view(s, (24,))
    assert str(p1.outputs[0]) == "[3*x*4]" and not p1.needs_communication
    x = np.arange(24.0).reshape(3, 8).reshape(24)
    p2 = propagate("view", [p1.outputs[0]], shape=(4, 6))
    local_check(p2, x, lambda a: a.reshape(4, 6), reshape_local)


def test_dtensor_crash_nested_shard_view():
    s = Sharding.from_placements(M, (16, 4), ["S(0)", "S(0)"])
    p = check_view(s, (4, 4, 4))
    assert not p.needs_communication and str(p.outputs[0]) == "[dp*tp:(1)2, tp:(2)2*2, 4]"


def test_dtensor_keyerror_strided_flatten():
    s = Sharding.from_placements(Mesh.parse("x=2"), (4, 6), ["SS(1,2)"])
    p = check_view(s, (24,))
    assert not p.needs_communication


def test_dtensor_lost_sharding_split():
    s = Sharding.from_placements(Mesh.parse("x=2"), (2, 12), ["S(1)"])
    p = check_view(s, (4, 6))
    assert not p.needs_communication and p.outputs[0].to_placements() == ("SS(0,2)",)


def test_dtensor_error_where_exact_answer_exists():
    s = Sharding.from_placements(Mesh.parse("x=16"), (16, 16), ["S(1)"])
    p = check_view(s, (4, 64))
    assert not p.needs_communication and p.outputs[0].to_placements() == ("SS(1,4)",)


def test_shardy_sub_axes_512():
    s = Sharding.from_partition_spec(Mesh.parse("x=4"), (512,), ("x",))
    p = check_view(s, (4, 128))
    assert str(p.outputs[0]) == "[x, 128]"
    s = Sharding.from_partition_spec(Mesh.parse("x=8"), (512,), ("x",))
    p = check_view(s, (4, 128))
    assert str(p.outputs[0]) == "[x:(1)4, x:(4)2*64]" and not p.needs_communication


def test_uneven_flatten_stays_local():
    s = Sharding.from_placements(Mesh.parse("x=2"), (4, 5), ["S(1)"])
    p = propagate("flatten", [s])
    assert not p.needs_communication and str(p.outputs[0]) == "[4*x*3 of 20]"
    x = np.arange(20.0).reshape(4, 5)
    local_check(p, x, lambda a: a.reshape(20), reshape_local)


def test_uneven_dim_cut_by_a_view_gathers_it():
    s = Sharding.from_placements(Mesh.parse("x=2"), (5, 4), ["S(0)"])
    p = check_view(s, (20,))  # merging an uneven outer dim with an inner one: gather
    assert p.needs_communication
    p = check_view(s, (5, 2, 2))  # splitting a replicated dim next to it is free
    assert not p.needs_communication and str(p.outputs[0]) == "[x*3 of 5, 2, 2]"


def test_ops_by_aten_name_and_errors():
    s = Sharding.parse("[dp*4, tp*3]", M)
    assert str(propagate("aten.view.default", [s], shape=[16, 6]).outputs[0]).startswith("[dp*4*tp")
    assert str(propagate("aten::reshape", s, shape=(-1,)).outputs[0]) == "[dp*4*tp*3]"
    assert str(propagate("t", [s]).outputs[0]) == "[tp*3, dp*4]"
    assert str(propagate("permute", [s], dims=[1, 0]).outputs[0]) == "[tp*3, dp*4]"
    assert str(propagate("movedim", [s], source=0, destination=1).outputs[0]) == "[tp*3, dp*4]"
    assert str(propagate("unflatten", [s], dim=1, sizes=(4, 3)).outputs[0]) == "[dp*4, tp, 3]"
    assert str(propagate("expand", [Sharding.parse("[1, tp*3]", M)], size=(5, -1)).outputs[0]) == "[5, tp*3]"
    assert str(propagate("view_as_real", [s]).outputs[0]) == "[dp*4, tp*3, 2]"
    r = propagate("view_as_complex", [Sharding.parse("[dp*4, tp*3, 2]", M)])
    assert str(r.outputs[0]) == "[dp*4, tp*3]" and not r.needs_communication
    p = propagate("view", [Sharding.parse("[8, 12] +sum(tp)", M)], shape=(96,))
    assert p.outputs[0].partial == (("tp", "sum"),)
    with pytest.raises(UnsupportedOp, match="no sharding rule for op 'aten.frobnicate.default'"):
        propagate("aten.frobnicate.default", [s])
    with pytest.raises(ShardingError, match="keeps the number of elements"):
        propagate("view", [s], shape=(5, 5))
    with pytest.raises(ShardingError, match="only size-1 dims expand"):
        propagate("expand", [s], size=(8, 24))
