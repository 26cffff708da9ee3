"""Hypothesis strategies for random layouts."""

from __future__ import annotations

from hypothesis import strategies as st

from shardlayout.layout import Layout

SIZES = st.sampled_from([1, 2, 2, 3, 4, 4, 6, 8])


@st.composite
def int_tuples(draw, leaf, max_rank=3, max_depth=2):
    """A nested tuple profile with leaves drawn from ``leaf``."""
    if max_depth == 0 or draw(st.integers(0, 2)) == 0:
        return draw(leaf)
    n = draw(st.integers(1, max_rank))
    return tuple(draw(int_tuples(leaf, max_rank, max_depth - 1)) for _ in range(n))


def _strides_like(draw, shape, stride_leaf):
    if type(shape) is tuple:
        return tuple(_strides_like(draw, s, stride_leaf) for s in shape)
    return draw(stride_leaf)


@st.composite
def layouts(draw, max_rank=3, max_depth=2, strides=None):
    """Random layouts: nested shapes, strides from ``strides`` (default 0..64)."""
    shape = draw(int_tuples(SIZES, max_rank, max_depth))
    if strides is None:
        strides = st.one_of(st.integers(0, 64), st.sampled_from([1, 2, 4, 8, 16, 32]))
    stride = _strides_like(draw, shape, strides)
    return Layout(shape, stride)


@st.composite
def compact_layouts(draw, max_rank=3, max_depth=2):
    """Injective, compact layouts: a permutation of the column-major strides."""
    shape = draw(int_tuples(SIZES, max_rank, max_depth))
    from shardlayout.layout import flatten
    from shardlayout.layout.inttuple import unflatten

    flat = list(flatten(shape))
    order = draw(st.permutations(range(len(flat))))
    strides = [0] * len(flat)
    p = 1
    for i in order:
        strides[i] = p
        p *= flat[i]
    return Layout(shape, unflatten(strides, shape))


@st.composite
def tilers_for(draw, A: Layout):
    """A layout B whose strides and sizes follow A's mode boundaries (often admissible)."""
    from shardlayout.layout import flatten

    fs = [s for s in flatten(A.shape) if s > 1] or [1]
    pre = [1]
    for s in fs:
        pre.append(pre[-1] * s)
    n = draw(st.integers(1, 3))
    shape = []
    stride = []
    for _ in range(n):
        k = draw(st.integers(0, len(pre) - 1))
        d = pre[k]
        rest = A.size() // d if A.size() >= d else 1
        divisors = [x for x in range(1, max(rest, 1) + 1) if rest % x == 0] or [1]
        shape.append(draw(st.sampled_from(divisors)))
        stride.append(d)
    if n == 1:
        return Layout(shape[0], stride[0])
    return Layout(tuple(shape), tuple(stride))
