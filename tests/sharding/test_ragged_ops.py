"""Ops on nested tensors (nvFuser RFC #5550) against an independent reference: a nested tensor as
plain Python lists of numpy blocks, ``blocks[c][s]`` the rows of component ``c`` from source
``s`` (the ragged dim at ``dim`` of each block). Logical ops run on a block with a size-1
component axis inserted (its *logical block*), so numpy's own transpose / broadcast / reduce
rules are the reference; ragged reductions and grouped matmul use a padded dense reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardlayout import ShardingError
from shardlayout.sharding.nested import Nested, RaggedError
from shardlayout.sharding.ragged_ops import (
    REDUCTIONS,
    as_flattened,
    as_nested,
    matmul,
    merge,
    merge_regular,
    merge_sources,
    partition,
    permute,
    pointwise,
    reduce,
    reduce_ragged,
    select,
    split,
    split_ragged,
    squeeze,
    unsqueeze,
)


# -- the reference --------------------------------------------------------------------------------
def ref_extents(blocks, dim):
    sources = len(blocks[0])
    return np.array([[comp[s].shape[dim] for comp in blocks] for s in range(sources)])


def ref_storage(blocks, dim):
    return np.concatenate([b for comp in blocks for b in comp], axis=dim)


def assert_matches(n, blocks, dim):
    """``n`` holds exactly ``blocks`` (component-major, then source) with the ragged dim at ``dim``."""
    assert isinstance(n, Nested)
    assert n.dim == dim
    assert n.extents.tolist() == ref_extents(blocks, dim).tolist()
    want = ref_storage(blocks, dim)
    assert tuple(n.data.shape) == want.shape
    assert np.allclose(np.asarray(n.data), want, rtol=1e-12, atol=1e-12)


def nested_of(blocks, dim):
    return Nested(ref_storage(blocks, dim), ref_extents(blocks, dim), dim)


def logical_map(blocks, dim, op, new_dim):
    """Apply ``op`` to each block's logical form (component axis of size 1 at ``dim``); the result's
    component axis sits at ``new_dim`` and is dropped again."""
    return [[np.squeeze(op(np.expand_dims(b, dim)), axis=new_dim) for b in comp] for comp in blocks]


def padded(blocks, dim, fill):
    """The dense logical array (A..., C, max extent, B...) with ``fill`` beyond each component."""
    comps = [np.concatenate(comp, axis=dim) for comp in blocks]
    shape = comps[0].shape
    rmax = max(c.shape[dim] for c in comps)
    out = np.full(shape[:dim] + (len(comps), rmax) + shape[dim + 1:], fill, dtype=float)
    for c, rows in enumerate(comps):
        out[(slice(None),) * dim + (c, slice(0, rows.shape[dim]))] = rows
    return out, [c.shape[dim] for c in comps]


# -- strategies -----------------------------------------------------------------------------------
@st.composite
def nested_blocks(draw, min_after=0, max_after=2, max_before=2, max_sources=2, factor=1, before=None):
    """(blocks, dim): 1..6 components (zero-size ones included), 1..max_sources sources, random
    dense dims before and after the ragged one."""
    if before is None:
        before = tuple(draw(st.lists(st.integers(1, 3), max_size=max_before)))
    after = tuple(draw(st.lists(st.integers(1, 3), min_size=min_after, max_size=max_after)))
    components = draw(st.integers(1, 6))
    sources = draw(st.integers(1, max_sources))
    ext = [[factor * draw(st.integers(0, 3)) for _ in range(sources)] for _ in range(components)]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    blocks = [[rng.integers(-9, 10, size=before + (e,) + after).astype(float) for e in row] for row in ext]
    return blocks, len(before)


@st.composite
def permutations_keeping_pair(draw, L, dim):
    units = [(d,) for d in range(L) if d not in (dim, dim + 1)] + [(dim, dim + 1)]
    return tuple(d for u in draw(st.permutations(units)) for d in u)


# -- partition, as_nested, as_flattened -----------------------------------------------------------
@given(nested_blocks(max_sources=1))
def test_partition_1d_matches_np_split(bd):
    blocks, dim = bd
    x = ref_storage(blocks, dim)
    ext = ref_extents(blocks, dim)[0]
    offsets = np.concatenate([[0], np.cumsum(ext)])
    want = [[p] for p in np.split(x, offsets[1:-1], axis=dim)]
    n = partition(x, dim, offsets)
    assert_matches(n, want, dim)
    assert_matches(as_nested(x, offsets.tolist(), dim - x.ndim), want, dim)
    assert as_flattened(n) is x  # 1-D offsets keep the data as is; asFlattened inverts asNested
    assert merge(n, dim, dim + 1) is x


@given(nested_blocks())
def test_partition_2d_reads_sources_one_after_another(bd):
    blocks, dim = bd
    ext = ref_extents(blocks, dim)  # (sources, components)
    sources = ext.shape[0]
    # the dense input: source 0's rows (its components in order), then source 1's
    x = np.concatenate([blocks[c][s] for s in range(sources) for c in range(len(blocks))], axis=dim)
    offsets = np.concatenate([np.zeros((sources, 1), int), np.cumsum(ext, axis=1)], axis=1)
    segments = np.split(x, np.cumsum(offsets[:, -1])[:-1], axis=dim)
    per_source = [np.split(seg, offsets[s, 1:-1], axis=dim) for s, seg in enumerate(segments)]
    want = [[per_source[s][c] for s in range(sources)] for c in range(len(blocks))]
    n = partition(x, dim, offsets)
    assert_matches(n, want, dim)
    assert np.array_equal(as_flattened(n), ref_storage(want, dim))  # component-major, then source


# -- merges and splits ----------------------------------------------------------------------------
@given(nested_blocks(min_after=1))
def test_merge_regular_multiplies_extents(bd):
    blocks, dim = bd
    n = nested_of(blocks, dim)
    want = [[b.reshape(b.shape[:dim] + (b.shape[dim] * b.shape[dim + 1],) + b.shape[dim + 2:]) for b in comp]
            for comp in blocks]
    got = merge_regular(n, dim + 2)
    assert_matches(got, want, dim)
    assert got.extents.tolist() == (n.extents * n.data.shape[dim + 1]).tolist()
    assert_matches(merge(n, dim + 1, dim + 2), want, dim)
    assert_matches(merge_regular(n), want, dim)


@given(nested_blocks())
def test_merge_sources_sums_extents(bd):
    blocks, dim = bd
    n = nested_of(blocks, dim)
    want = [[np.concatenate(comp, axis=dim)] for comp in blocks]
    got = merge_sources(n)
    assert_matches(got, want, dim)
    assert got.extents.tolist() == [n.extents.sum(axis=0).tolist()]


@given(st.integers(1, 3).flatmap(lambda f: st.tuples(st.just(f), nested_blocks(factor=f))))
def test_split_ragged_divides_extents(fbd):
    f, (blocks, dim) = fbd
    n = nested_of(blocks, dim)
    want = [[b.reshape(b.shape[:dim] + (b.shape[dim] // f, f) + b.shape[dim + 1:]) for b in comp] for comp in blocks]
    got = split_ragged(n, f)
    assert_matches(got, want, dim)
    assert got.extents.tolist() == (n.extents // f).tolist()
    assert_matches(split(n, dim + 1, f), want, dim)


@given(nested_blocks(min_after=0), st.data())
def test_merge_and_split_of_dense_dims(bd, data):
    blocks, dim = bd
    n = nested_of(blocks, dim)
    L = n.data.ndim + 1
    pairs = [(d, d + 1) for d in range(L - 1) if d + 1 < dim or d > dim + 1]
    if pairs:
        outer, inner = data.draw(st.sampled_from(pairs))

        def merged(lb):
            return lb.reshape(lb.shape[:outer] + (lb.shape[outer] * lb.shape[inner],) + lb.shape[inner + 1:])

        new_dim = dim - 1 if outer < dim else dim
        got = merge(n, outer, inner)
        assert_matches(got, logical_map(blocks, dim, merged, new_dim), new_dim)
        # splitting the merged dim by the inner size gives n back
        assert_matches(split(got, outer, n.data.shape[inner if inner < dim else inner - 1]), blocks, dim)
    dense = [d for d in range(L) if d not in (dim, dim + 1)]
    if dense:
        d = data.draw(st.sampled_from(dense))
        size = n.data.shape[d if d < dim else d - 1]
        f = data.draw(st.sampled_from([k for k in range(1, size + 1) if size % k == 0]))

        def splitted(lb):
            return lb.reshape(lb.shape[:d] + (size // f, f) + lb.shape[d + 1:])

        new_dim = dim + 1 if d < dim else dim
        assert_matches(split(n, d, f), logical_map(blocks, dim, splitted, new_dim), new_dim)


@given(nested_blocks())
def test_select_gives_the_component_rows(bd):
    blocks, dim = bd
    n = nested_of(blocks, dim)
    for c, comp in enumerate(blocks):
        want = np.concatenate(comp, axis=dim)
        assert np.array_equal(select(n, c), want)
        assert np.array_equal(select(n, c - len(blocks)), want)


# -- op rules -------------------------------------------------------------------------------------
@given(nested_blocks(), st.data())
def test_pointwise_broadcasts_over_the_logical_shape(bd, data):
    blocks, dim = bd
    n = nested_of(blocks, dim)
    C = len(blocks)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    other = [[rng.integers(-9, 10, size=b.shape).astype(float) for b in comp] for comp in blocks]
    # a dense operand: each logical dim full or 1 (component: C or 1; ragged: 1), leading dims dropped
    logical = list(n.data.shape[:dim]) + [C, 1] + list(n.data.shape[dim + 1:])
    full = tuple(s if data.draw(st.booleans()) else 1 for s in logical)
    lead = data.draw(st.integers(0, len(full)))
    full = (1,) * lead + full[lead:]  # the dropped leading dims broadcast as 1
    y = rng.integers(1, 5, size=full[lead:]).astype(float)
    y_full = y.reshape(full)

    def fn(a, b, z, k):
        return a * b - z + k

    got = pointwise(fn, n, y, nested_of(other, dim), 0.5)
    want = [[np.squeeze(fn(np.expand_dims(b, dim),
                           y_full[(slice(None),) * dim + (slice(c, c + 1) if full[dim] == C else slice(None),)],
                           np.expand_dims(z, dim), 0.5), axis=dim)
             for b, z in zip(comp, ocomp)] for c, (comp, ocomp) in enumerate(zip(blocks, other))]
    assert_matches(got, want, dim)


@given(nested_blocks(), st.data())
def test_permute_matches_np_transpose(bd, data):
    blocks, dim = bd
    n = nested_of(blocks, dim)
    L = n.data.ndim + 1
    perm = data.draw(permutations_keeping_pair(L, dim))
    new_dim = perm.index(dim)
    assert_matches(permute(n, perm), logical_map(blocks, dim, lambda lb: np.transpose(lb, perm), new_dim), new_dim)


@given(nested_blocks(), st.data())
def test_unsqueeze_then_squeeze(bd, data):
    blocks, dim = bd
    n = nested_of(blocks, dim)
    L = n.data.ndim + 1
    d = data.draw(st.sampled_from([k for k in range(L + 1) if k != dim + 1]))
    new_dim = dim + 1 if d <= dim else dim
    up = unsqueeze(n, d)
    assert_matches(up, logical_map(blocks, dim, lambda lb: np.expand_dims(lb, d), new_dim), new_dim)
    assert_matches(squeeze(up, d), blocks, dim)
    ones = [k for k in range(L) if k not in (dim, dim + 1) and n.data.shape[k if k < dim else k - 1] == 1]
    if ones:
        k = data.draw(st.sampled_from(ones))
        k_dim = dim - 1 if k < dim else dim
        assert_matches(squeeze(n, k), logical_map(blocks, dim, lambda lb: np.squeeze(lb, axis=k), k_dim), k_dim)


@given(nested_blocks(), st.sampled_from(REDUCTIONS), st.data())
def test_reduce_over_dense_dims(bd, fn, data):
    blocks, dim = bd
    n = nested_of(blocks, dim)
    L = n.data.ndim + 1
    dense = [d for d in range(L) if d not in (dim, dim + 1)]
    ds = data.draw(st.lists(st.sampled_from(dense), unique=True)) if dense else []
    new_dim = dim - sum(1 for d in ds if d < dim)
    want = logical_map(blocks, dim, lambda lb: getattr(np, fn)(lb, axis=tuple(ds)), new_dim)
    assert_matches(reduce(n, fn, ds), want, new_dim)


@given(nested_blocks(), st.sampled_from(REDUCTIONS))
def test_reduce_ragged_matches_a_padded_reference(bd, fn):
    blocks, dim = bd
    n = nested_of(blocks, dim)
    fill = {"sum": 0.0, "mean": 0.0, "max": -np.inf, "min": np.inf}[fn]
    P, counts = padded(blocks, dim, fill)
    if fn != "sum" and 0 in counts:
        with pytest.raises(RaggedError, match=fn):
            reduce_ragged(n, fn)
        return
    if fn == "sum":
        want = P.sum(axis=dim + 1)
    elif fn == "mean":
        shape = [1] * P.ndim
        shape[dim] = len(counts)
        want = P.sum(axis=dim + 1) / np.array(counts, float).reshape(shape[: dim + 1] + shape[dim + 2:])
    else:
        want = getattr(np, fn)(P, axis=dim + 1)
    got = reduce_ragged(n, fn)
    assert got.shape == want.shape
    assert np.allclose(got, want, rtol=1e-12, atol=1e-12) and not np.isnan(got).any()


@given(nested_blocks(before=(), min_after=1, max_after=1), st.integers(1, 3), st.integers(0, 2**32 - 1))
def test_matmul_is_grouped_mm(bd, N, seed):
    blocks, dim = bd
    n = nested_of(blocks, dim)
    C, K = len(blocks), n.data.shape[1]
    w = np.random.default_rng(seed).integers(-3, 4, size=(C, K, N)).astype(float)
    P, counts = padded(blocks, 0, 0.0)
    out = P @ w  # (C, max extent, N)
    rows = [out[c, : counts[c]] for c in range(C)]
    want = [np.split(r, np.cumsum([b.shape[0] for b in comp])[:-1]) for r, comp in zip(rows, blocks)]
    assert_matches(matmul(n, w), want, 0)
    shared = [[b @ w[0] for b in comp] for comp in blocks]
    assert_matches(matmul(n, w[0]), shared, 0)


def test_torch_tensors_follow_numpy():
    torch = pytest.importorskip("torch")
    x = np.arange(40.0).reshape(10, 4)
    offsets = np.array([[0, 2, 2, 5], [0, 0, 4, 5]])
    n, t = partition(x, 0, offsets), partition(torch.tensor(x), 0, torch.tensor(offsets))
    assert isinstance(t.data, torch.Tensor) and t.extents.tolist() == n.extents.tolist()
    assert np.array_equal(t.data.numpy(), n.data)
    y = np.array([1.0, 2.0, 3.0]).reshape(3, 1, 1)
    steps = [
        lambda v, yy: pointwise(lambda a, b: a * b, v, yy),
        lambda v, yy: permute(unsqueeze(v, 2), (2, 0, 1, 3)),
        lambda v, yy: split_ragged(merge_regular(v), 2),
        lambda v, yy: reduce(v, "max", 2),
        lambda v, yy: matmul(v, yy * np.ones((3, 4, 2)) if isinstance(yy, np.ndarray) else yy * torch.ones(3, 4, 2)),
    ]
    for step in steps:
        a, b = step(n, y), step(t, torch.tensor(y))
        assert a.extents.tolist() == b.extents.tolist() and a.dim == b.dim
        assert np.allclose(b.data.numpy(), a.data)
    for fn in REDUCTIONS:
        assert np.allclose(reduce_ragged(t, fn).numpy(), reduce_ragged(n, fn))


# -- errors ---------------------------------------------------------------------------------------
def raises(fn, *words):
    with pytest.raises(RaggedError) as info:
        fn()
    msg = str(info.value)
    for w in words:
        assert w in msg, (w, msg)
    assert isinstance(info.value, ShardingError)


def test_partition_errors_name_the_offsets_and_sizes():
    x = np.zeros((5, 2))
    raises(lambda: partition(x, 0, [1, 2, 5]), "start at 0", "[1, 2, 5]")
    raises(lambda: partition(x, 0, [0, 3, 2, 5]), "decrease", "[0, 3, 2, 5]")
    raises(lambda: partition(x, 0, [0, 2, 4]), "4", "dim 0 has size 5")
    raises(lambda: partition(x, 0, np.zeros((1, 1, 3), int)), "(1, 1, 3)", "1-D")
    raises(lambda: partition(x, 0, [0, -1, 5]), "negative", "[0, -1, 5]")
    raises(lambda: partition(x, 0, [0, 1.5, 5]), "integers", "float64")
    raises(lambda: partition(x, 0, [0]), "no component")
    raises(lambda: partition(x, 2, [0, 5]), "dim 2", "out of range")
    raises(lambda: partition(x, 0, [[0, 1, 3], [0, 0, 1]]), "[3, 1]", "4", "size 5")


def test_op_errors_name_what_is_wrong():
    n = Nested(np.zeros((3, 4)), [[1, 2]])  # logical (2, ragged[1, 2], 4)
    m = Nested(np.zeros((3, 4)), [[2, 1]])
    raises(lambda: pointwise(np.add, n, m), "[[1, 2]]", "[[2, 1]]")
    raises(lambda: pointwise(np.add, n, np.zeros((2, 3, 4))), "size 3 in the ragged dim 1", "mixing ragged and dense")
    raises(lambda: pointwise(np.add, n, np.zeros((3, 1, 4))), "size 3 in the component dim 0", "2")
    raises(lambda: pointwise(np.add, n, np.zeros(5)), "broadcast", "(5,)")
    raises(lambda: pointwise(np.add, np.zeros(3), np.zeros(3)), "no Nested operand")
    raises(lambda: pointwise(np.add, n, Nested(np.zeros((4, 3)), [[1, 2]], dim=1)), "dim 0", "dim 1")
    raises(lambda: pointwise(lambda a: a.sum(axis=1), n), "shape (3,)", "(3, 4)", "elementwise")
    raises(lambda: permute(n, (0, 2, 1)), "separates", "component dim 0", "ragged dim 1")
    raises(lambda: permute(n, (1, 0, 2)), "separates")
    raises(lambda: permute(n, (0, 1, 1)), "not a permutation")
    raises(lambda: squeeze(n, 0), "component dim")
    raises(lambda: squeeze(n, 1), "ragged dim")
    raises(lambda: squeeze(n, 2), "size 4, not 1")
    raises(lambda: unsqueeze(n, 1), "between the component dim 0 and the ragged dim 1")
    raises(lambda: reduce(n, "sum", 0), "component dim")
    raises(lambda: reduce(n, "sum", [1]), "ragged dim", "reduce_ragged")
    raises(lambda: reduce(n, "prod", 2), "'prod'", "sum")
    raises(lambda: reduce(n, "sum", [2, -1]), "twice")
    raises(lambda: reduce_ragged(Nested(np.zeros(3), [[1, 0, 2]]), "max"), "empty components [1]", "[1, 0, 2]")
    raises(lambda: reduce_ragged(Nested(np.zeros(3), [[1, 0, 2]]), "mean"), "mean", "[1, 0, 2]")
    raises(lambda: matmul(n, np.zeros((3, 4, 5))), "(3, 4, 5)", "(2, 4, N)")
    raises(lambda: matmul(n, np.zeros((5, 2))), "(5, 2)", "K = 4")
    raises(lambda: matmul(Nested(np.zeros((2, 3, 4)), [[1, 1]], dim=0), np.zeros((2, 3, 4))), "(components, ragged, K)")
    raises(lambda: select(n, 2), "component 2", "2 components")
    raises(lambda: select(n, 1.0), "must be an int")


def test_merge_and_split_errors_name_the_dims():
    n = Nested(np.zeros((3, 4, 5)), [[1, 2]])  # logical (2, ragged[1, 2], 4, 5)
    raises(lambda: merge_regular(n, 0), "component dim", "as_flattened")
    raises(lambda: merge_regular(n, 1), "ragged dim itself")
    raises(lambda: merge_regular(n, 3), "dense dim 3 (size 5)", "not right after", "permute")
    raises(lambda: merge_regular(Nested(np.zeros(3), [[1, 2]])), "no dense dim")
    raises(lambda: merge(n, 0, 2), "not adjacent")
    raises(lambda: merge(Nested(np.zeros((2, 3)), [[1, 2]], dim=1), 0, 1), "dense dim 0", "component dim 1")
    raises(lambda: split(n, 0, 2), "component dim", "undefined")
    raises(lambda: split(n, 2, 3), "size 4", "factor 3")
    raises(lambda: split_ragged(n, 2), "[[1, 2]]", "factor 2", "ceilDiv")
    raises(lambda: split_ragged(Nested(np.zeros((4, 5)), [[1, 1], [1, 1]]), 2), "merge_sources")
    raises(lambda: split_ragged(n, 0), "factor 0")
    raises(lambda: Nested(np.zeros(3), [[1, -1, 3]]), "negative")
