"""The ID graph: ``mapped`` is sound (whenever it maps two IDs, brute force agrees on every
element both tensors hold), the op builders check their operands, and propagation carries
device splits forward.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlayout import Mesh
from shardlayout.domain import (
    IdGraph,
    Op,
    OpKind,
    ParallelType,
    TensorDomain,
    add_op,
    cat_op,
    is_resharding,
    matmul_op,
    pad_op,
    propagate,
    reshape_op,
    set_op,
    sharded_logical_axis,
    slice_op,
    sum_op,
)
from shardlayout.errors import DomainError

from .test_iterdomain import id_values, loop_size

X = ParallelType.device("x")


@st.composite
def splits(draw, td: TensorDomain, max_splits: int = 3) -> TensorDomain:
    for _ in range(draw(st.integers(0, max_splits))):
        pos = draw(st.integers(0, len(td.loop) - 1))
        td = td.split(pos, draw(st.integers(1, 4)), draw(st.booleans()))
    return td


def partition(draw, fs: list) -> tuple:
    cuts = sorted(draw(st.sets(st.integers(1, len(fs) - 1), max_size=len(fs) - 1))) if len(fs) > 1 else []
    bounds = [0, *cuts, len(fs)]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        p = 1
        for f in fs[a:b]:
            p *= f
        out.append(p)
    return tuple(out)


@st.composite
def reshapes(draw):
    fs = draw(st.lists(st.sampled_from([2, 2, 3, 4]), min_size=1, max_size=4))
    x = draw(splits(TensorDomain.create("x", partition(draw, fs))))
    op = reshape_op(x, partition(draw, fs), "y")
    return op.with_domains(draw(splits(op.output)))


def agree(x: TensorDomain, a, y: TensorDomain, b, shift=lambda k: k) -> bool:
    """Brute force: ID ``a`` of x and ID ``b`` of y give every common element the same value."""
    va, vb = id_values(x, a), id_values(y, b)
    common = [k for k in va if shift(k) in vb]
    return all(va[k] == vb[shift(k)] for k in common)


def check_sound(op: Op, pairs, shift=lambda k: k) -> int:
    g = IdGraph((op,))
    hits = 0
    for x, a, y, b in pairs:
        j = g.mapped(a, b)
        if j is not None:
            hits += 1
            assert a.extent == b.extent and j.holds is True
            assert agree(x, a, y, b, shift), (str(x), str(y), a.id, b.id, j)
    return hits


@settings(max_examples=120)
@given(reshapes())
def test_mapped_is_sound_through_reshapes(op):
    x, y = op.inputs[0], op.output
    if loop_size(x) > 3000 or loop_size(y) > 3000:
        return
    check_sound(op, [(x, a, y, b) for a in x.loop for b in y.loop])


@st.composite
def sliced(draw):
    n = draw(st.integers(2, 24))
    start = draw(st.integers(0, n - 1))
    end = draw(st.integers(start + 1, n))
    x = draw(splits(TensorDomain.create("x", (n,)), 2))
    op = slice_op(x, 0, start, end, "y")
    return op.with_domains(draw(splits(op.output, 2)))


@settings(max_examples=120)
@given(sliced())
def test_mapped_is_sound_through_slices(op):
    x, y = op.inputs[0], op.output
    check_sound(op, [(x, a, y, b) for a in x.loop for b in y.loop])


@st.composite
def cats(draw):
    ns = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    xs = [draw(splits(TensorDomain.create(f"x{k}", (n,)), 2)) for k, n in enumerate(ns)]
    op = cat_op(xs, 0, "y")
    return op.with_domains(draw(splits(op.output, 2)))


@settings(max_examples=120)
@given(cats())
def test_mapped_is_sound_through_cats(op):
    y = op.output
    off = 0
    for x in op.inputs:
        n = x.logical[0].extent
        check_sound(op, [(x, a, y, b) for a in x.loop for b in y.loop], shift=lambda k, o=off: (k[0] + o,))
        off += n


def test_mapped_finds_the_classic_patterns():
    x = TensorDomain.create("x", (8,)).inner_split(0, 2)
    op = slice_op(x, 0, 2, 8, "y")
    y = op.output.inner_split(0, 2)
    j = IdGraph.of([op], y).mapped(x.loop[1], y.loop[1])
    assert j is not None and j.theorem == "inner_split_slice" and "x.0 mod 2" in j.reason
    assert IdGraph.of([op], y).mapped(x.loop[0], y.loop[0]) is None  # [4] vs [3]: different extents
    same = set_op(x, "z")
    z = same.output.inner_split(0, 2)
    j = IdGraph.of([same], z).mapped(x.loop[1], z.loop[1])
    assert j.theorem == "same_transforms" and j.mapped == (("x.0.i", "z.0.i"),)
    assert IdGraph((same,)).mapped(x.logical[0], same.output.logical[0]).theorem == "exact"


def test_graph_checks_names_and_ids():
    x = TensorDomain.create("x", (4,))
    op = set_op(x, "x2")
    with pytest.raises(DomainError, match="two different tensors are named 'x'"):
        IdGraph((op, set_op(x.outer_split(0, 2), "x3")))
    with pytest.raises(DomainError, match="re-split of the same logical domain"):
        op.with_domains(TensorDomain.create("x2", (4, 1)))
    with pytest.raises(DomainError, match="no ID 'nope'"):
        IdGraph((op,)).mapped("nope", "x.0")
    with pytest.raises(DomainError, match="every step must be an Op"):
        IdGraph(("set",))


def test_op_builders_check_operands():
    a = TensorDomain.create("a", (4, 6))
    with pytest.raises(DomainError, match="changes the number of elements"):
        reshape_op(a, (5, 5), "b")
    with pytest.raises(DomainError, match="not a non-empty range"):
        slice_op(a, 1, 4, 4, "b")
    with pytest.raises(DomainError, match="ranks"):
        add_op([a, TensorDomain.create("c", (4,))], "b")
    with pytest.raises(DomainError, match="same rank >= 2"):
        matmul_op(a, TensorDomain.create("c", (6,)), "b")
    with pytest.raises(DomainError, match="off the cat dim"):
        cat_op([a, TensorDomain.create("c", (5, 2))], 1, "b")
    with pytest.raises(DomainError, match="does not match"):
        Op(OpKind.SET, (a,), TensorDomain.create("b", (4, 7)))
    assert [i.extent for i in pad_op(a, 1, 1, 2, "p").output.logical] == [4, 9]
    assert reshape_op(a, (2, 12), "r").output.shape == (2, 12)
    assert reshape_op(TensorDomain.create("s", (3, 1)), (3,), "r").output.shape == (3,)
    assert reshape_op(TensorDomain.create("s", (3,)), (1, 3, 1), "r").output.shape == (1, 3, 1)
    bc = TensorDomain.create("bc", (1, 6), broadcasts=[0])
    assert add_op([a, bc], "s").output.shape == (4, 6)


def test_propagate_through_sum_matmul_and_cat():
    m = Mesh.parse("x=2")
    a = TensorDomain.create("a", (4, 6), mesh=m).outer_split(1, 2).parallelize(1, X)
    (s,) = propagate([sum_op(a, [0], "s")])
    # nvFuser's tensor axis: s is [r{4}, 6], a 1-D tensor whose axis 0 is sharded
    assert sharded_logical_axis(s.output, X) == 0 and not is_resharding(s)
    w = TensorDomain.create("w", (6, 8), mesh=m).outer_split(0, 2).parallelize(0, X)
    (mm,) = propagate([matmul_op(TensorDomain.create("i", (4, 6), mesh=m), w, "z")])
    # the contracted K reaches r{K} on x: reduced by the op (an allreduce), so no axis of z is sharded
    assert [str(i) for i in mm.output.loop][-2:] == ["rz.2.o{2}@x", "rz.2.i{3}"]
    assert sharded_logical_axis(mm.output, X) is None and not mm.output.is_sharded()
    r = is_resharding(mm)
    assert r and "reduced by the op: an allreduce over x" in r.reasons[0]
    xs = [TensorDomain.create(f"c{k}", (2, n), mesh=m).inner_split(1, 2).parallelize(2, X)
          for k, n in enumerate([4, 6])]
    (c,) = propagate([cat_op(xs, 1, "cc")])
    assert [str(i) for i in c.output.loop] == ["cc.0{2}", "cc.1.o{5}", "cc.1.i{2}@x"]
    assert not is_resharding(c)


def test_propagate_does_not_touch_user_sharded_outputs():
    m = Mesh.parse("x=2")
    a = TensorDomain.create("a", (4,), mesh=m).outer_split(0, 2).parallelize(0, X)
    op = set_op(a, "b")
    (kept,) = propagate([op.with_domains(op.output.with_mesh(m))])
    assert not kept.output.device_ids()
    assert is_resharding(kept)
