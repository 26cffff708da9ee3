"""Operations on nested tensors (nvFuser RFC #5550): partition, asNested / asFlattened, the merges
(case 2a: ragged x regular, case 2b: sources x ragged), split of the ragged dim, select, and the
op rules (pointwise, permute, squeeze / unsqueeze, reductions, grouped matmul).

Every function speaks *logical* dims. A :class:`~shardlayout.sharding.nested.Nested` whose data
has shape ``(A..., total, B...)`` with ``total`` at ``n.dim`` has the logical shape
``(A..., components, ragged, B...)``: logical dim ``n.dim`` is the component dim, ``n.dim + 1``
the ragged dim, and the dense dims after them are shifted by one. The component dim and the ragged
dim always stay adjacent and in that order (they are one dim of the storage).

Data may be numpy arrays or (CPU or GPU) torch tensors; every function takes its array module
from the data. Undefined operations raise :class:`RaggedError`.

    >>> import numpy as np
    >>> n = partition(np.arange(12.0).reshape(6, 2), 0, [0, 2, 2, 6])
    >>> n.extents.tolist(), [c.shape for c in n.to_list()]
    ([[2, 0, 4]], [(2, 2), (0, 2), (4, 2)])
    >>> reduce_ragged(pointwise(np.multiply, n, 2.0), "sum").tolist()
    [[4.0, 8.0], [0.0, 0.0], [56.0, 64.0]]
"""

from __future__ import annotations

from numbers import Integral

import numpy as np

from .nested import Nested, RaggedError, _is_torch, _take, from_blocks, same_extents

REDUCTIONS = ("sum", "mean", "max", "min")


# -- small helpers --------------------------------------------------------------------------------
def _show(values, limit: int = 12) -> str:
    """A short text of an int array for an error message (long ones elided)."""
    flat = np.asarray(values).tolist()
    text = str(flat)
    return text if len(text) <= 12 * limit else text[: 12 * limit] + " ...]"


def _int(value, what: str, op: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (Integral, np.integer)):
        raise RaggedError(f"{op}: {what} must be an int, got {value!r} ({type(value).__name__})")
    return int(value)


def _norm_dim(d, ndim: int, op: str, what: str = "dim") -> int:
    """``d`` as a dim in ``0 .. ndim-1`` (negative counts from the end)."""
    d = _int(d, what, op)
    if not -ndim <= d < ndim:
        raise RaggedError(f"{op}: {what} {d} is out of range for {ndim} logical dims; give a dim in "
                          f"[{-ndim}, {ndim - 1}]")
    return d % ndim


def _logical_ndim(n: Nested) -> int:
    return len(n.data.shape) + 1


def _data_axis(n: Nested, d: int) -> int:
    """The data axis of logical dim ``d`` (a dense dim; the component and ragged dims share n.dim)."""
    return d if d <= n.dim else d - 1


def _check_nested(n, op: str) -> Nested:
    if not isinstance(n, Nested):
        raise RaggedError(f"{op}: expected a Nested value, got {type(n).__name__}; build one with "
                          "partition(x, dim, offsets) or Nested.from_list(parts)")
    return n


def _transpose(x, axes: tuple):
    return x.permute(*axes) if _is_torch(x) else x.transpose(axes)


def _take_rows(x, axis: int, idx: np.ndarray):
    """Rows ``idx`` of ``x`` along ``axis`` (a gather: rows may repeat)."""
    if _is_torch(x):
        import torch

        return x.index_select(axis, torch.as_tensor(idx, dtype=torch.long, device=x.device))
    return np.take(x, idx, axis=axis)


def _stack(parts: list, axis: int, like):
    if _is_torch(like):
        import torch

        return torch.stack(parts, dim=axis)
    return np.stack(parts, axis=axis)


def _reduce_array(x, fn: str, axes: tuple):
    """``fn`` (sum/mean/max/min) of ``x`` over ``axes`` (none: ``x`` itself)."""
    if not axes:
        return x
    if _is_torch(x):
        import torch

        f = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}[fn]
        return f(x, dim=axes)
    return getattr(np, fn)(x, axis=axes)


def _check_reduction(fn, op: str) -> str:
    if fn not in REDUCTIONS:
        raise RaggedError(f"{op}: unknown reduction {fn!r}; give one of {list(REDUCTIONS)}")
    return fn


# -- creation and flattening ----------------------------------------------------------------------
def _check_offsets(offsets, size: int, dim: int) -> np.ndarray:
    """The RFC's offsets, validated: ``(components + 1,)`` or ``(sources, components + 1)`` ints,
    each row starting at 0 and non-decreasing; the rows' last entries sum to ``size``."""
    o = np.asarray(offsets)
    if o.ndim not in (1, 2):
        raise RaggedError(f"partition: offsets must be 1-D (components + 1) or 2-D (sources, components + 1), "
                          f"got shape {o.shape}; give one row of offsets per source")
    if o.shape[-1] < 2:
        raise RaggedError(f"partition: offsets of shape {o.shape} describe no component; give at least "
                          "[0, size] (components + 1 entries)")
    if o.dtype.kind not in "iu":
        raise RaggedError(f"partition: offsets must be integers, got dtype {o.dtype} ({_show(o)}); "
                          "give integer row positions")
    o = o.astype(np.int64)
    if (o < 0).any():
        raise RaggedError(f"partition: offsets {_show(o)} have a negative entry; offsets are row positions >= 0")
    rows = o.reshape(-1, o.shape[-1])
    if (rows[:, 0] != 0).any():
        raise RaggedError(f"partition: offsets {_show(o)} must start at 0 (each source's row); "
                          f"prepend 0: offsets are [0, end_0, end_1, ...]")
    if (np.diff(rows, axis=1) < 0).any():
        raise RaggedError(f"partition: offsets {_show(o)} decrease; offsets are cumulative row counts and "
                          "must be non-decreasing (a component's extent is offsets[c+1] - offsets[c] >= 0)")
    total = int(rows[:, -1].sum())
    if total != size:
        what = "the last offset" if o.ndim == 1 else f"the sources' last offsets {_show(rows[:, -1])} sum to"
        raise RaggedError(f"partition: {what} {total} but dim {dim} has size {size}; the last offset (the "
                          f"sum of each source's last offsets, for 2-D offsets) must equal the size of dim {dim}")
    return o


def partition(x, dim: int, offsets) -> Nested:
    """Split dim ``dim`` of the dense ``x`` into (component, ragged) at ``offsets`` (the RFC's
    ``partition``; offsets ``[0, end_0, ..., end_{C-1} = x.shape[dim]]``).

    2-D offsets ``(sources, components + 1)`` (the RFC's Example 2) read dim ``dim`` as source 0's
    rows, then source 1's, ..., each source partitioned by its own row of offsets (each row starts
    at 0 and ends at that source's row count). The result stores its rows component-major, then by
    source, so with several sources the rows are *reordered* (the expert-first shuffle happens
    here); with 1-D offsets the data is kept as is (no copy).

    >>> partition(np.zeros((5, 3)), 0, [0, 2, 2, 5]).extents.tolist()
    [[2, 0, 3]]
    """
    shape = tuple(x.shape)
    if not shape:
        raise RaggedError("partition: x is 0-d; give an array with the dim to partition")
    dim = _norm_dim(dim, len(shape), "partition")
    o = _check_offsets(offsets, shape[dim], dim)
    if o.ndim == 1:
        return Nested(x, np.diff(o)[None, :], dim)
    sources, components = o.shape[0], o.shape[1] - 1
    starts = np.concatenate([[0], np.cumsum(o[:, -1])])
    blocks = {(c, s): _take(x, dim, int(starts[s] + o[s, c]), int(starts[s] + o[s, c + 1]))
              for c in range(components) for s in range(sources)}
    return from_blocks(blocks, components, sources, dim, x)


def as_nested(data, offsets, ragged_dim: int) -> Nested:
    """The RFC's tensor-level ``asNested``: :func:`partition` of ``data``'s ``ragged_dim``.

    >>> as_nested(np.zeros((4, 2)), np.array([0, 1, 4]), 0).logical_shape
    (2, 'ragged[1, 3]', 2)
    """
    return partition(data, ragged_dim, offsets)


def as_flattened(n: Nested):
    """The RFC's ``asFlattened``: the component and ragged dims merged back into one dense dim (the
    RFC's merge case 1). The inverse of :func:`as_nested` with 1-D offsets; with several sources
    the rows come component-major, then by source (the storage order, not the input order of a
    2-D-offset partition).

    >>> as_flattened(partition(np.arange(3), 0, [0, 1, 3])).tolist()
    [0, 1, 2]
    """
    return _check_nested(n, "as_flattened").data


# -- merges and splits ----------------------------------------------------------------------------
def merge_regular(n: Nested, dense_dim: int | None = None) -> Nested:
    """The RFC's merge case 2a: the ragged dim merged with the dense dim right after it (logical
    ``n.dim + 2``, the default) -- each extent is multiplied by that dim's size. A reshape of the
    storage: the dense dim must follow the flat dim in the data, otherwise the rows of one
    component would interleave with other dims (permute it next to the ragged dim first).

    >>> merge_regular(Nested(np.zeros((3, 4)), [[1, 2]])).extents.tolist()
    [[4, 8]]
    """
    n = _check_nested(n, "merge_regular")
    L, dim = _logical_ndim(n), n.dim
    if dim + 2 >= L:
        raise RaggedError(f"merge_regular: logical shape {n.logical_shape} has no dense dim after the ragged dim "
                          f"{dim + 1}; there is nothing to merge (unsqueeze a dim there first)")
    d = dim + 2 if dense_dim is None else _norm_dim(dense_dim, L, "merge_regular", "dense_dim")
    if d == dim:
        raise RaggedError(f"merge_regular: logical dim {d} is the component dim; merging the component dim with "
                          f"the ragged dim is as_flattened(n), with any other dim it is undefined")
    if d == dim + 1:
        raise RaggedError(f"merge_regular: logical dim {d} is the ragged dim itself; give the dense dim "
                          f"{dim + 2} that follows it")
    if d != dim + 2:
        raise RaggedError(f"merge_regular: dense dim {d} (size {n.data.shape[_data_axis(n, d)]}) is not right "
                          f"after the ragged dim {dim + 1} of logical shape {n.logical_shape}, so its rows are not "
                          f"contiguous with the ragged rows in storage; permute it to dim {dim + 2} first")
    shape = tuple(n.data.shape)
    k = shape[dim + 1]
    data = n.data.reshape(shape[:dim] + (shape[dim] * k,) + shape[dim + 2:])
    return Nested(data, n.extents * k, dim)


def merge_sources(n: Nested) -> Nested:
    """The RFC's merge case 2b (sources x ragged): one source whose extents are the sum of the
    sources' (``extents.sum(axis=0)``). Built on :meth:`Nested.merged`: the storage is already
    component-major, so each component's rows keep their source order and no data moves (the
    shuffle the RFC's merge stands for happened when the rows were stored component-major).

    >>> merge_sources(Nested(np.zeros(5), [[1, 0], [2, 2]])).extents.tolist()
    [[3, 2]]
    """
    return _check_nested(n, "merge_sources").merged()


def split_ragged(n: Nested, factor: int) -> Nested:
    """The RFC's split of the ragged dim by ``factor``: each extent ``e`` becomes the outer
    (ragged) extent ``e // factor`` and a new dense dim of size ``factor`` follows the ragged dim.
    Defined only when every (source, component) extent divides by ``factor``: the RFC's
    ``ceilDiv`` would need padding, which is out of scope.

    >>> s = split_ragged(Nested(np.zeros((6, 3)), [[2, 4]]), 2)
    >>> s.extents.tolist(), s.logical_shape
    ([[1, 2]], (2, 'ragged[1, 2]', 2, 3))
    """
    n = _check_nested(n, "split_ragged")
    factor = _int(factor, "factor", "split_ragged")
    if factor < 1:
        raise RaggedError(f"split_ragged: factor {factor} must be >= 1")
    bad = n.extents % factor != 0
    if bad.any():
        hint = ""
        if n.sources > 1 and not (n.component_extents % factor).any():
            hint = "; the per-component sums divide, so merge_sources(n) first"
        raise RaggedError(f"split_ragged: extents {n.extents.tolist()} do not all divide by factor {factor} "
                          f"(the RFC's ceilDiv would need padding, which is out of scope); give a factor "
                          f"dividing every extent{hint}")
    shape = tuple(n.data.shape)
    dim = n.dim
    data = n.data.reshape(shape[:dim] + (shape[dim] // factor, factor) + shape[dim + 1:])
    return Nested(data, n.extents // factor, dim)


def merge(n: Nested, outer: int, inner: int):
    """The RFC's merge of adjacent logical dims ``outer`` and ``inner = outer + 1``: (component,
    ragged) -> :func:`as_flattened` (a dense array), (ragged, dense) -> :func:`merge_regular`,
    (dense, dense) -> a reshape of the data. A dense dim merged with the component dim is undefined.

    >>> merge(Nested(np.zeros((3, 2, 5)), [[1, 2]]), 2, 3).logical_shape
    (2, 'ragged[1, 2]', 10)
    """
    n = _check_nested(n, "merge")
    L, dim = _logical_ndim(n), n.dim
    outer, inner = _norm_dim(outer, L, "merge", "outer"), _norm_dim(inner, L, "merge", "inner")
    if inner != outer + 1:
        raise RaggedError(f"merge: dims {outer} and {inner} are not adjacent (outer, outer + 1) in logical shape "
                          f"{n.logical_shape}; permute them next to each other first")
    if (outer, inner) == (dim, dim + 1):
        return as_flattened(n)
    if outer == dim + 1:
        return merge_regular(n, inner)
    if inner == dim:
        raise RaggedError(f"merge: merging dense dim {outer} with the component dim {dim} of logical shape "
                          f"{n.logical_shape} is undefined (it would mix components of different extents); "
                          "only the ragged dim may merge with the component dim (as_flattened)")
    a = _data_axis(n, outer)
    shape = tuple(n.data.shape)
    data = n.data.reshape(shape[:a] + (shape[a] * shape[a + 1],) + shape[a + 2:])
    return Nested(data, n.extents, dim - 1 if outer < dim else dim)


def split(n: Nested, d: int, factor: int) -> Nested:
    """The RFC's split of logical dim ``d`` into (size / factor, factor): the ragged dim ->
    :func:`split_ragged`, a dense dim -> a reshape. Splitting the component dim is undefined here:
    its pieces would have extents of different components (the RFC's experts-across-GPUs split),
    which one Nested cannot hold; select the components each rank keeps instead.

    >>> split(Nested(np.zeros((3, 6)), [[1, 2]]), 2, 3).logical_shape
    (2, 'ragged[1, 2]', 2, 3)
    """
    n = _check_nested(n, "split")
    L, dim = _logical_ndim(n), n.dim
    d = _norm_dim(d, L, "split")
    if d == dim:
        raise RaggedError(f"split: dim {d} is the component dim of logical shape {n.logical_shape}; splitting it "
                          "is undefined for one Nested (its pieces hold different components); split the "
                          "ragged dim or a dense dim, or select components instead")
    if d == dim + 1:
        return split_ragged(n, factor)
    factor = _int(factor, "factor", "split")
    a = _data_axis(n, d)
    shape = tuple(n.data.shape)
    if factor < 1 or shape[a] % factor:
        raise RaggedError(f"split: dense dim {d} of size {shape[a]} does not divide by factor {factor}; "
                          "give a factor >= 1 dividing it")
    data = n.data.reshape(shape[:a] + (shape[a] // factor, factor) + shape[a + 1:])
    return Nested(data, n.extents, dim + 1 if d < dim else dim)


def select(n: Nested, component: int):
    """The RFC's (optional) ``select``: component ``component`` as a dense array, its ragged dim
    now a regular dim of that component's extent (all its sources' rows, in order; a view of the
    data for numpy).

    >>> select(Nested(np.arange(3), [[1, 2]]), 1).tolist()
    [1, 2]
    """
    n = _check_nested(n, "select")
    c = _int(component, "component", "select")
    if not -n.components <= c < n.components:
        raise RaggedError(f"select: component {c} is out of range for {n.components} components; give an index "
                          f"in [{-n.components}, {n.components - 1}]")
    return n.component(c % n.components)


# -- op rules -------------------------------------------------------------------------------------
def _dense_operand(y, n: Nested):
    """A dense operand of :func:`pointwise` in storage form: its logical shape right-aligned with
    ``n``'s, the ragged dim dropped, the component dim expanded to rows."""
    L, dim = _logical_ndim(n), n.dim
    shape = tuple(y.shape)
    if len(shape) > L:
        raise RaggedError(f"pointwise: dense operand of shape {shape} has more dims than the nested logical "
                          f"shape {n.logical_shape}; give at most {L} dims")
    padded = (1,) * (L - len(shape)) + shape
    comp, rag = padded[dim], padded[dim + 1]
    if rag != 1:
        raise RaggedError(f"pointwise: dense operand of shape {shape} has size {rag} in the ragged dim {dim + 1} of "
                          f"logical shape {n.logical_shape}; mixing ragged and dense rows is undefined (RFC #5550): "
                          "give size 1 there (broadcast) or make the operand Nested with the same extents")
    if comp not in (1, n.components):
        raise RaggedError(f"pointwise: dense operand of shape {shape} has size {comp} in the component dim {dim} "
                          f"of logical shape {n.logical_shape}; give 1 or the component count {n.components}")
    y = y.reshape(padded[: dim + 1] + padded[dim + 2:])
    if comp != 1:
        y = _take_rows(y, dim, np.repeat(np.arange(n.components), n.component_extents))
    return y


def pointwise(fn, *operands) -> Nested:
    """``fn`` applied elementwise to nested operands (same extents and dim) and dense ones (arrays
    broadcasting against the *logical* shape: size 1 or the component count in the component dim,
    size 1 in the ragged dim; scalars pass through). The rows stay where they are.

    >>> pointwise(np.add, Nested(np.ones((3, 2)), [[1, 2]]), np.array([[[10.0]], [[20.0]]])).data[:, 0].tolist()
    [11.0, 21.0, 21.0]
    """
    nested = [v for v in operands if isinstance(v, Nested)]
    if not nested:
        raise RaggedError("pointwise: no Nested operand; give at least one (for dense arrays call fn directly)")
    first = nested[0]
    for v in nested[1:]:
        if v.dim != first.dim or len(v.data.shape) != len(first.data.shape):
            raise RaggedError(f"pointwise: nested operands of logical shapes {first.logical_shape} (dim {first.dim}) "
                              f"and {v.logical_shape} (dim {v.dim}) place their ragged dims differently; give "
                              "operands with the same dim and rank (permute / unsqueeze first)")
    extents = same_extents(nested)
    args = []
    for v in operands:
        if isinstance(v, Nested):
            args.append(v.data)
        elif hasattr(v, "shape"):
            args.append(_dense_operand(v, first))
        else:
            args.append(v)
    shapes = [tuple(a.shape) for a in args if hasattr(a, "shape")]
    try:
        want = np.broadcast_shapes(*shapes)
    except ValueError:
        logical = [v.logical_shape if isinstance(v, Nested) else tuple(v.shape)
                   for v in operands if isinstance(v, Nested) or hasattr(v, "shape")]
        raise RaggedError(f"pointwise: operands of logical shapes {logical} do not broadcast in their dense dims; "
                          "give dense dims of equal size or 1") from None
    out = fn(*args)
    got = tuple(getattr(out, "shape", ()))
    if got != want:
        raise RaggedError(f"pointwise: fn returned shape {got} but the operands broadcast to {want}; pointwise "
                          "needs an elementwise fn (use reduce / reduce_ragged / matmul for the others)")
    return Nested(out, extents, first.dim)


def permute(n: Nested, perm) -> Nested:
    """Logical dims reordered by ``perm`` (``result dim i = n's dim perm[i]``); the component and
    ragged dims must stay adjacent and in that order.

    >>> permute(Nested(np.zeros((2, 3, 4)), [[1, 2]], dim=1), (3, 1, 2, 0)).logical_shape
    (4, 2, 'ragged[1, 2]', 2)
    """
    n = _check_nested(n, "permute")
    L, dim = _logical_ndim(n), n.dim
    perm = tuple(_norm_dim(p, L, "permute", "perm entry") for p in perm)
    if sorted(perm) != list(range(L)):
        raise RaggedError(f"permute: {list(perm)} is not a permutation of the {L} logical dims of "
                          f"{n.logical_shape}; give each of 0 .. {L - 1} once")
    i = perm.index(dim)
    if i + 1 >= L or perm[i + 1] != dim + 1:
        raise RaggedError(f"permute: {list(perm)} separates the component dim {dim} from the ragged dim {dim + 1} "
                          f"of logical shape {n.logical_shape}; they are one dim of the storage and must stay "
                          "adjacent, component first (move them together)")
    axes = tuple(_data_axis(n, p) for p in perm if p != dim + 1)
    return Nested(_transpose(n.data, axes), n.extents, i)


def squeeze(n: Nested, d: int) -> Nested:
    """Dense logical dim ``d`` (of size 1) removed.

    >>> squeeze(Nested(np.zeros((1, 3)), [[3]], dim=1), 0).logical_shape
    (1, 'ragged[3]')
    """
    n = _check_nested(n, "squeeze")
    L, dim = _logical_ndim(n), n.dim
    d = _norm_dim(d, L, "squeeze")
    if d in (dim, dim + 1):
        which = "component" if d == dim else "ragged"
        raise RaggedError(f"squeeze: dim {d} is the {which} dim of logical shape {n.logical_shape}; only dense "
                          "dims can be squeezed (select a component to drop the component and ragged dims)")
    a = _data_axis(n, d)
    if n.data.shape[a] != 1:
        raise RaggedError(f"squeeze: dense dim {d} of logical shape {n.logical_shape} has size "
                          f"{n.data.shape[a]}, not 1; only size-1 dims can be squeezed")
    shape = tuple(n.data.shape)
    return Nested(n.data.reshape(shape[:a] + shape[a + 1:]), n.extents, dim - 1 if d < dim else dim)


def unsqueeze(n: Nested, d: int) -> Nested:
    """A new dense logical dim of size 1 at position ``d`` of the result (as ``torch.unsqueeze``);
    not between the component and the ragged dim.

    >>> unsqueeze(Nested(np.zeros(3), [[3]]), 0).logical_shape
    (1, 1, 'ragged[3]')
    """
    n = _check_nested(n, "unsqueeze")
    L, dim = _logical_ndim(n), n.dim
    d = _norm_dim(d, L + 1, "unsqueeze")
    if d == dim + 1:
        raise RaggedError(f"unsqueeze: a new dim at {d} would sit between the component dim {dim} and the ragged "
                          f"dim {dim + 1} of logical shape {n.logical_shape}; insert it at {dim} or {dim + 2}")
    a = d if d <= dim else d - 1
    shape = tuple(n.data.shape)
    return Nested(n.data.reshape(shape[:a] + (1,) + shape[a:]), n.extents, dim + 1 if d <= dim else dim)


def reduce(n: Nested, fn: str, dims) -> Nested:
    """``fn`` (sum / mean / max / min) over dense logical ``dims`` (an int or a sequence), dropped
    from the result; the ragged dim reduces with :func:`reduce_ragged`.

    >>> reduce(Nested(np.ones((3, 4)), [[1, 2]]), "sum", 2).data.tolist()
    [4.0, 4.0, 4.0]
    """
    n = _check_nested(n, "reduce")
    fn = _check_reduction(fn, "reduce")
    L, dim = _logical_ndim(n), n.dim
    dims = (dims,) if isinstance(dims, (Integral, np.integer)) else tuple(dims)
    ds = [_norm_dim(d, L, "reduce") for d in dims]
    if len(set(ds)) != len(ds):
        raise RaggedError(f"reduce: dims {list(dims)} name a dim twice; give each dim once")
    if dim in ds:
        raise RaggedError(f"reduce: dim {dim} is the component dim of logical shape {n.logical_shape}; reducing "
                          "across components of different extents is undefined (reduce_ragged, then reduce the "
                          "dense result)")
    if dim + 1 in ds:
        raise RaggedError(f"reduce: dim {dim + 1} is the ragged dim of logical shape {n.logical_shape}; use "
                          f"reduce_ragged(n, {fn!r}) for it (it gives a dense array per component)")
    axes = tuple(sorted(_data_axis(n, d) for d in ds))
    if fn in ("max", "min") and any(n.data.shape[a] == 0 for a in axes):
        raise RaggedError(f"reduce: {fn} over dims {sorted(ds)} of logical shape {n.logical_shape} includes a "
                          "size-0 dim, which has no value; use sum or drop the empty dim")
    out = _reduce_array(n.data, fn, axes)
    return Nested(out, n.extents, dim - sum(1 for d in ds if d < dim))


def reduce_ragged(n: Nested, fn: str):
    """``fn`` (sum / mean / max / min) over the ragged dim of each component: a dense array of
    logical shape ``(A..., components, B...)``. An empty component sums to 0; its mean, max and
    min have no value (RaggedError, never NaN).

    >>> reduce_ragged(Nested(np.arange(3.0), [[1, 0, 2]]), "sum").tolist()
    [0.0, 0.0, 3.0]
    """
    n = _check_nested(n, "reduce_ragged")
    fn = _check_reduction(fn, "reduce_ragged")
    ext = n.component_extents
    if fn != "sum" and (ext == 0).any():
        empty = [int(c) for c in np.flatnonzero(ext == 0)]
        raise RaggedError(f"reduce_ragged: {fn} of empty components {empty} (extents {ext.tolist()}) has no value; "
                          "use sum, or drop the empty components first")
    parts = [_reduce_array(n.component(c), fn, (n.dim,)) for c in range(n.components)]
    return _stack(parts, n.dim, n.data)


def einsum(equation: str, *operands, out_shape=None) -> Nested:
    """An einsum over components: the nested operands share their component and ragged letters,
    which the output keeps adjacent and in that order; a dense operand with the component letter
    gives each component its slice, one without it is shared; the ragged letter is in no dense
    operand (contracting or moving apart a ragged dim is undefined). One einsum per component.
    ``out_shape``: the output's logical shape, for a piece with no component.

    >>> einsum("erd,edf->erf", Nested(np.ones((3, 2)), [[1, 2]]), np.stack([np.eye(2), 2 * np.eye(2)])).data.tolist()
    [[1.0, 1.0], [2.0, 2.0], [2.0, 2.0]]
    """
    eq = str(equation).replace(" ", "")
    if "->" not in eq or len(eq.split("->")[0].split(",")) != len(operands):
        raise RaggedError(f"einsum {equation!r}: give one term per operand ({len(operands)}) and an explicit output")
    terms, out = eq.split("->")[0].split(","), eq.split("->")[1]
    nested = [(a, t) for a, t in zip(operands, terms) if isinstance(a, Nested)]
    if not nested:
        raise RaggedError(f"einsum {equation!r}: no Nested operand; for dense arrays call einsum directly")
    first, term = nested[0]
    e, r = term[first.dim], term[first.dim + 1]
    for a, t in nested:
        if t[a.dim] != e or t[a.dim + 1] != r:
            raise RaggedError(f"einsum {equation}: nested operands must share their component and ragged letters "
                              f"({e}{r})")
    same_extents([a for a, _ in nested])
    if e + r not in out:
        raise RaggedError(f"einsum {equation}: the output must keep the component and ragged dims adjacent ({e}{r}); "
                          "contracting or moving apart a ragged dim is not defined")
    if any(r in t for a, t in zip(operands, terms) if not isinstance(a, Nested)):
        raise RaggedError(f"einsum {equation}: a dense operand spans the ragged dim {r!r}; ragged and dense rows "
                          "cannot mix in one dim")
    run = _torch_einsum if _is_torch(first.data) else _np_einsum
    local = ",".join(t.replace(e, "") for t in terms) + "->" + out.replace(e, "")
    pos = out.index(e)
    blocks = {}
    for c in range(first.components):
        ops = []
        for a, t in zip(operands, terms):
            if isinstance(a, Nested):
                ops.append(a.component(c))
            elif e in t:
                ops.append(a[(slice(None),) * t.index(e) + (c,)])
            else:
                ops.append(a)
        got, off = run(local, *ops), 0
        for s_ in range(first.sources):  # each component's rows back into their source blocks
            k = int(first.extents[s_, c])
            blocks[(c, s_)] = got[(slice(None),) * pos + (slice(off, off + k),)]
            off += k
    storage = None if out_shape is None else tuple(out_shape[:pos]) + (0,) + tuple(out_shape[pos + 2:])
    return from_blocks(blocks, first.components, first.sources, pos, first.data, storage)


def _np_einsum(eq, *ops):
    """``np.einsum`` contracting through BLAS (``optimize``: a per-expert ``rd,df->rf`` is a matmul,
    about 10x faster than numpy's plain einsum loop at MoE sizes)."""
    return np.einsum(eq, *ops, optimize=len(ops) > 1)


def _torch_einsum(eq, *ops):
    import torch

    return torch.einsum(eq, *ops)


def matmul(n: Nested, w) -> Nested:
    """Grouped matmul (``torch._grouped_mm``'s semantics): ``n`` of logical shape (components,
    ragged, K) times ``w`` of shape (components, K, N) -- component ``c``'s rows times ``w[c]`` --
    giving (components, ragged, N) with the same extents. A 2-D ``w`` (K, N) is shared by every
    component.

    >>> matmul(Nested(np.ones((3, 2)), [[1, 2]]), np.stack([np.eye(2), 2 * np.eye(2)])).data.tolist()
    [[1.0, 1.0], [2.0, 2.0], [2.0, 2.0]]
    """
    n = _check_nested(n, "matmul")
    if n.dim != 0 or len(n.data.shape) != 2:
        raise RaggedError(f"matmul: n has logical shape {n.logical_shape} (dim {n.dim}); grouped matmul needs "
                          "(components, ragged, K): permute / merge the dense dims into one K after the ragged dim")
    k = n.data.shape[1]
    wshape = tuple(w.shape)
    if len(wshape) == 2:
        if wshape[0] != k:
            raise RaggedError(f"matmul: w of shape {wshape} needs {k} rows to match K = {k} of {n.logical_shape}")
        return Nested(n.data @ w, n.extents, 0)
    if len(wshape) != 3 or wshape[0] != n.components or wshape[1] != k:
        raise RaggedError(f"matmul: w of shape {wshape} does not fit n of logical shape {n.logical_shape}; give "
                          f"w of shape ({n.components}, {k}, N) (one (K, N) matrix per component) or ({k}, N)")
    return einsum("erk,ekn->ern", n, w)


__all__ = [
    "REDUCTIONS",
    "RaggedError",
    "as_flattened",
    "as_nested",
    "einsum",
    "matmul",
    "merge",
    "merge_regular",
    "merge_sources",
    "partition",
    "permute",
    "pointwise",
    "reduce",
    "reduce_ragged",
    "select",
    "split",
    "split_ragged",
    "squeeze",
    "unsqueeze",
]
