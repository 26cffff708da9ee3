"""ops/regroup.py's fast path, ``regroup_even``: the walk's answer, found in one pass.

Whenever it answers, it answers what ``regroup_walk`` (fit, gather, fit again) answers — the
same input target (the input itself), the same output, dims already canonical — and the
Sharding it builds without the constructor is complete and canonical. With sub-axes off it
answers only on whole-axis inputs, on the claim that an even sharding whose axis factors are
whole axes always has DTensor placements; that claim is checked here too.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardlayout import Mesh, Sharding, propagate
from shardlayout.config import options
from shardlayout.ops.regroup import has_placements, regroup, regroup_even, regroup_walk
from shardlayout.sharding import Factor

from ..sharding.strategies import meshes, shardings
from .test_view import view_shapes


def sh(text: str, mesh: str) -> Sharding:
    return Sharding.parse(text, Mesh.parse(mesh))


def agrees(s: Sharding, shape, subaxes: bool) -> bool:
    """regroup_even answers as the walk does (or leaves the case to it); True when it answered."""
    out = regroup_even(s, shape, subaxes)
    target, walked = regroup_walk(s, shape, subaxes)
    if out is None:
        return False
    assert target == s
    assert out == walked and out.dims == walked.dims and out.shape == walked.shape
    # canonical as built: the validating constructor and the trusted one give the same dims
    assert Sharding(out.mesh, out.shape, out.dims, out.partial).dims == out.dims
    assert Sharding._trusted(out.mesh, out.shape, out.dims, out.partial).dims == out.dims
    assert regroup(s, shape, subaxes) == (s, out)
    return True


def test_design_example():
    s = sh("[dp*4, tp*3]", "dp=2,tp=4")
    out = regroup_even(s, (16, 6), True)
    assert str(out) == "[dp*4*tp:(1)2, tp:(2)2*3]"
    assert regroup_even(s, (16, 6), False) is None  # tp would be cut: the walk gathers it
    assert str(regroup(s, (16, 6), False)[1]) == "[dp*8, 6]"


def test_every_slot_is_set():
    out = regroup_even(sh("[dp*4, tp*3]", "dp=2,tp=4"), (96,), True)
    for name in Sharding.__slots__:  # a slot added to Sharding must be set here too
        getattr(out, name)
    assert hash(out) == hash(Sharding.parse("[dp*4*tp*3]", out.mesh))


@pytest.mark.parametrize("text,mesh,shape", [
    ("[x*3 of 5, 4]", "x=2", (5, 2, 2)),  # uneven: a tail for the walk
    ("[dp*4, tp*3]", "dp=2,tp=4", (-1, 6)),  # a -1 to infer
    ("[dp*4, tp*3]", "dp=2,tp=4", [96]),  # not a tuple
    ("[dp*4, tp*3]", "dp=2,tp=4", (95,)),  # wrong element count: infer_view_shape raises
    ("[x*3]", "x=4", (6, 2)),  # a boundary cuts x(4) at 6: the walk keeps x:(1)2
    ("[3*x]", "x=2", (2, 3)),  # a boundary inside local 3, next to x: gather x
])
def test_leaves_the_unusual_to_the_walk(text, mesh, shape):
    assert regroup_even(sh(text, mesh), shape, True) is None


def test_sub_axis_input_with_sub_axes_off_goes_to_the_walk():
    s = sh("[a:(1)2*3, a:(2)2]", "a=4")
    assert regroup_even(s, (6, 2), False) is None
    assert regroup_even(s, (6, 2), True) is not None
    assert agrees(s, (6, 2), True)


def test_size_one_dims_and_merges():
    s = sh("[a:(1)2, a:(2)2*3]", "a=4")
    assert str(regroup_even(s, (1, 12, 1), True)) == "[1, a*3, 1]"  # the two pieces of a merge
    assert agrees(s, (1, 12, 1), True)
    assert agrees(sh("[2, 3, b*2]", "b=2"), (6, 4), True)  # locals merge across dims


@given(shardings(max_ndim=4), st.data(), st.booleans())
def test_fast_path_is_the_walk(s, data, subaxes):
    agrees(s, data.draw(view_shapes(int(np.prod(s.shape)))), subaxes)


def bench_cases():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_view import fresh_sharding, make_cases

    return [(fresh_sharding(m, shape, pl), out) for m, shape, pl, out in make_cases(200)]


def test_the_benchmark_cases():
    """Every case of benchmarks/bench_view.py, both settings: the fast path agrees with the
    walk, and answers most of them (else the benchmark times the walk)."""
    answered = {True: 0, False: 0}
    for s, out in bench_cases():
        for subaxes in (True, False):
            answered[subaxes] += agrees(s, out, subaxes)
            with options(subaxes=subaxes):
                p = propagate("view", [s], shape=out)
            assert (p.input_targets[0], p.outputs[0]) == regroup_walk(s, out, subaxes)
    assert answered[True] >= 180 and answered[False] >= 150, answered


@st.composite
def whole_axis_shardings(draw):
    """Even shardings whose axis factors are whole mesh axes, in any order between local factors."""
    mesh = draw(meshes())
    ndim = draw(st.integers(1, 4))
    dims = [[] for _ in range(ndim)]
    for name, n in zip(mesh.names, mesh.shape):
        if draw(st.integers(0, 4)) == 0:
            continue
        d = draw(st.integers(0, ndim - 1))
        dims[d].insert(draw(st.integers(0, len(dims[d]))), Factor(n, name))
    for d in range(ndim):
        for _ in range(draw(st.integers(0, 2))):
            dims[d].insert(draw(st.integers(0, len(dims[d]))), Factor(draw(st.sampled_from([2, 3, 5]))))
    shape = tuple(int(np.prod([f.size for f in fs])) if fs else 1 for fs in dims)
    free = [a for a in mesh.names if not any(f.axis == a for fs in dims for f in fs)]
    partial = [(free[0], "sum")] if free and draw(st.booleans()) else []
    return Sharding(mesh, shape, dims, partial)


@given(whole_axis_shardings())
def test_even_whole_axis_shardings_have_dtensor_placements(s):
    assert has_placements(s)


def test_even_whole_axis_shardings_have_dtensor_placements_many():
    rng = random.Random(1)
    for _ in range(3000):
        sizes = [rng.choice([2, 3, 4, 8]) for _ in range(rng.randint(1, 3))]
        mesh = Mesh(tuple(sizes), ("a", "b", "c")[: len(sizes)])
        dims = [[] for _ in range(rng.randint(1, 3))]
        for name, n in zip(mesh.names, sizes):
            if rng.random() < 0.8:
                d = rng.randrange(len(dims))
                dims[d].insert(rng.randint(0, len(dims[d])), Factor(n, name))
        for fs in dims:
            for _ in range(rng.randint(0, 2)):
                fs.insert(rng.randint(0, len(fs)), Factor(rng.choice([2, 3, 5])))
        shape = tuple(int(np.prod([f.size for f in fs])) if fs else 1 for fs in dims)
        assert has_placements(Sharding(mesh, shape, dims))
