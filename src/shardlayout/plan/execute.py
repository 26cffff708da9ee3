"""Numpy implementations of ops, for running a program globally and on every rank.

A view-like op on a rank reshapes to the rank's local output shape; every other op runs as
is on the local pieces (the plan made its dims whole where it needs them).

    >>> import numpy as np
    >>> float(run_op("mm", [np.ones((2, 3)), np.ones((3, 4))], {}, [(2, 4)])[0].sum())
    24.0
"""

from __future__ import annotations

import numpy as np

from ..errors import ShardingError
from ..ops.families import LETTERS  # noqa: F401  (shared alphabet of the rules)
from ..propagation import canonical_op_name


class SimulationUnsupported(ShardingError):
    """``Plan.verify`` met an op it cannot run in numpy."""


def _sdpa(q, k, v, is_causal=False, **_):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if is_causal:
        s = s + np.triu(np.full(s.shape[-2:], -np.inf), 1)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def _softmax(x, dim=-1, **_):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def _slice(x, dim=0, start=None, end=None, step=1, **_):
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(start, end, step)
    return x[tuple(idx)]


def _reduce(fn):
    def run(x, dim=None, keepdim=False, **_):
        axis = None if dim is None else tuple([dim] if isinstance(dim, int) else dim)
        return fn(x, axis=axis, keepdims=keepdim)

    return run




def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def _log_softmax(x, dim=-1, **_):
    m = x.max(axis=dim, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=dim, keepdims=True))


def _rms_norm(x, w=None, normalized_shape=None, eps=1e-6, **_):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + (eps if eps is not None else 1e-6))
    return y * (1 if w is None else w)


def _native_layer_norm(x, w=None, b=None, normalized_shape=None, eps=1e-5, **_):
    mu = x.mean(-1, keepdims=True)
    r = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
    return (x - mu) * r * (1 if w is None else w) + (0 if b is None else b), mu, r


def _layer_norm_backward(g, x, *rest, normalized_shape=None, eps=1e-5, **_):
    mu = x.mean(-1, keepdims=True)
    r = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
    xh = (x - mu) * r
    n = x.shape[-1]
    gi = r / n * (n * g - g.sum(-1, keepdims=True) - xh * (g * xh).sum(-1, keepdims=True))
    lead = tuple(range(x.ndim - 1))
    return gi, (g * xh).sum(axis=lead), g.sum(axis=lead)


def _split(a, split_sizes=None, split_size=None, chunks=None, dim=0, **_):
    n = a.shape[dim]
    if split_sizes is not None:
        sizes = list(split_sizes)
    elif chunks is not None:
        c = -(-n // chunks)
        sizes = [min(c, n - i) for i in range(0, n, c)]
    else:
        step = split_size or n
        sizes = [min(step, n - i) for i in range(0, n, step)]
    return tuple(np.split(a, np.cumsum(sizes)[:-1], axis=dim))


def _scatter(a, i, src, dim=0, add=False):
    out = a.copy()
    where = tuple(i.astype(int) if k == dim else np.indices(i.shape)[k] for k in range(a.ndim))
    if add:
        np.add.at(out, where, src)
    else:
        out[where] = src
    return out


def _index_add(a, i, src, dim=0, **_):
    out = np.moveaxis(a.copy(), dim, 0)
    np.add.at(out, np.asarray(i).astype(int), np.moveaxis(src, dim, 0))
    return np.moveaxis(out, 0, dim)


def _index_put(a, i, v, **_):
    out = a.copy()
    out[np.asarray(i).astype(int)] = v
    return out


def _grouped_mm(a, b, offs=None, **_):
    out = np.zeros((a.shape[0], b.shape[2]))
    start = 0
    for g, end in enumerate(np.asarray(offs).astype(int)):
        out[start:end] = a[start:end] @ b[g]
        start = end
    return out


def _slice_backward(g, input_sizes=None, dim=0, start=None, end=None, step=1, **_):
    out = np.zeros(tuple(input_sizes))
    idx = [slice(None)] * out.ndim
    idx[dim] = slice(start, end, step)
    out[tuple(idx)] = g
    return out


def _softmax_backward(g, y, dim=-1, **_):
    return y * (g - (g * y).sum(axis=dim, keepdims=True))


def _log_softmax_backward(g, y, dim=-1, **_):
    return g - np.exp(y) * g.sum(axis=dim, keepdims=True)


def _topk(a, k, dim):
    idx = np.flip(np.argsort(a, axis=dim, kind="stable"), axis=dim)
    idx = np.take(idx, range(k), axis=dim)
    return np.take_along_axis(a, idx, dim), idx.astype(float)

OPS = {
    "mm": lambda a, b, **_: a @ b,
    "bmm": lambda a, b, **_: a @ b,
    "matmul": lambda a, b, **_: a @ b,
    "linear": lambda x, w, b=None, **_: x @ w.T + (0 if b is None else b),
    "t": lambda x, **_: x.T,
    "transpose": lambda x, dim0=0, dim1=1, **_: np.swapaxes(x, dim0, dim1),
    "permute": lambda x, dims=None, **_: np.transpose(x, dims),
    "add": lambda a, b, **_: a + b,
    "sub": lambda a, b, **_: a - b,
    "mul": lambda a, b, **_: a * b,
    "div": lambda a, b, **_: a / b,
    "neg": lambda a, **_: -a,
    "pow": lambda a, b=2, exponent=None, **_: a ** (b if exponent is None else exponent),
    "rsqrt": lambda a, **_: 1 / np.sqrt(a),
    "exp": lambda a, **_: np.exp(a),
    "sigmoid": lambda a, **_: 1 / (1 + np.exp(-a)),
    "silu": lambda a, **_: a / (1 + np.exp(-a)),
    "relu": lambda a, **_: np.maximum(a, 0),
    "where": lambda c, a, b, **_: np.where(c != 0, a, b),
    "clone": lambda a, **_: a.copy(),
    "alias": lambda a, **_: a,
    "sum": _reduce(np.sum),
    "mean": _reduce(np.mean),
    "amax": _reduce(np.max),
    "amin": _reduce(np.min),
    "_softmax": _softmax,
    "softmax": _softmax,
    "cat": lambda *xs, dim=0, **_: np.concatenate(xs, axis=dim),
    "slice": _slice,
    "scaled_dot_product_attention": _sdpa,
    "layer_norm": lambda x, w=None, b=None, normalized_shape=None, eps=1e-5, **_: _layer_norm(x, w, b, eps),
    "_scaled_dot_product_flash_attention_for_cpu": lambda q, k, v, is_causal=False, **_: (
        _sdpa(q, k, v, is_causal), np.zeros(q.shape[:-1])),
    "_to_copy": lambda a, **_: a.copy(),
    "detach": lambda a, **_: a,
    "eq": lambda a, b, **_: (a == b).astype(float),
    "ne": lambda a, b, **_: (a != b).astype(float),
    "le": lambda a, b, **_: (a <= b).astype(float),
    "lt": lambda a, b, **_: (a < b).astype(float),
    "ge": lambda a, b, **_: (a >= b).astype(float),
    "gt": lambda a, b, **_: (a > b).astype(float),
    "logical_and": lambda a, b, **_: ((a != 0) & (b != 0)).astype(float),
    "logical_not": lambda a, **_: (a == 0).astype(float),
    "any": lambda a, dim=None, keepdim=False, **_: (a != 0).any(
        axis=None if dim is None else tuple([dim] if isinstance(dim, int) else dim), keepdims=keepdim).astype(float),
    "full_like": lambda a, fill_value=0.0, **_: np.full(a.shape, float(fill_value)),
    "zeros_like": lambda a, **_: np.zeros(a.shape),
    "ones_like": lambda a, **_: np.ones(a.shape),
    "arange": lambda start=0, end=None, step=1, **_: np.arange(start, end, step, dtype=float),
    "full": lambda size=(), fill_value=0.0, **_: np.full(tuple(size), float(fill_value)),
    "zeros": lambda size=(), **_: np.zeros(tuple(size)),
    "ones": lambda size=(), **_: np.ones(tuple(size)),
    "scalar_tensor": lambda s=0.0, **_: np.asarray(float(s)),
    "einsum": lambda *ops, equation=None, **_: np.einsum(equation, *ops),
    "topk": lambda a, k=1, dim=-1, **_: _topk(a, k, dim),
    "_scaled_dot_product_flash_attention": lambda q, k, v, is_causal=False, **_: (
        _sdpa(q, k, v, is_causal), np.zeros(q.shape[:-1])),
    "_scaled_dot_product_efficient_attention": lambda q, k, v, is_causal=False, **_: (
        _sdpa(q, k, v, is_causal), np.zeros(q.shape[:-1])),
    "cumsum": lambda a, dim=0, **_: np.cumsum(a, axis=dim),
    "cumprod": lambda a, dim=0, **_: np.cumprod(a, axis=dim),
    "flip": lambda a, dims=(0,), **_: np.flip(a, axis=tuple(dims)),
    "roll": lambda a, shifts=0, dims=None, **_: np.roll(a, shifts, axis=dims),
    "argsort": lambda a, dim=-1, **_: np.argsort(a, axis=dim, kind="stable").astype(float),
    "select": lambda a, dim=0, index=0, **_: np.take(a, index, axis=dim),
    "narrow": lambda a, dim=0, start=0, length=1, **_: _slice(a, dim, start, start + length),
    "split": _split,
    "split_with_sizes": _split,
    "chunk": _split,
    "unbind": lambda a, dim=0, **_: tuple(np.moveaxis(a, dim, 0)),
    "concat": lambda *xs, dim=0, **_: np.concatenate(xs, axis=dim),
    "concatenate": lambda *xs, dim=0, **_: np.concatenate(xs, axis=dim),
    "gather": lambda a, i, dim=0, **_: np.take_along_axis(a, np.asarray(i).astype(int), dim),
    "scatter": lambda a, i, src, dim=0, **_: _scatter(a, i, src, dim),
    "scatter_add": lambda a, i, src, dim=0, **_: _scatter(a, i, src, dim, add=True),
    "index_add": _index_add,
    "index": lambda a, i, **_: a[np.asarray(i).astype(int)],
    "index_put": _index_put,
    "_index_put_impl": _index_put,
    "embedding": lambda w, i, **_: w[np.asarray(i).astype(int)],
    "one_hot": lambda a, num_classes=1, **_: np.eye(num_classes)[np.asarray(a).astype(int)],
    "histc": lambda a, bins=100, min=0, max=0, **_: np.histogram(
        a, bins=bins, range=(min, max) if max > min else (float(a.min()), float(a.max())))[0].astype(float),
    "log_softmax": _log_softmax,
    "_log_softmax": _log_softmax,
    "_softmax_backward_data": _softmax_backward,
    "_log_softmax_backward_data": _log_softmax_backward,
    "native_layer_norm": _native_layer_norm,
    "native_layer_norm_backward": _layer_norm_backward,
    "rms_norm": _rms_norm,
    "_fused_rms_norm": _rms_norm,
    "addmm": lambda c, a, b, **_: c + a @ b,
    "_grouped_mm": _grouped_mm,
    "slice_backward": _slice_backward,
    "all": _reduce(np.all),
    "abs": lambda a, **_: np.abs(a),
    "sqrt": lambda a, **_: np.sqrt(a),
    "log": lambda a, **_: np.log(a),
    "cos": lambda a, **_: np.cos(a),
    "sin": lambda a, **_: np.sin(a),
    "tanh": lambda a, **_: np.tanh(a),
    "erf": lambda a, **_: np.vectorize(__import__("math").erf)(a),
    "gelu": lambda a, **_: a * 0.5 * (1 + np.vectorize(__import__("math").erf)(a / np.sqrt(2))),
    "sign": lambda a, **_: np.sign(a),
    "floor": lambda a, **_: np.floor(a),
    "ceil": lambda a, **_: np.ceil(a),
    "round": lambda a, **_: np.round(a),
    "reciprocal": lambda a, **_: 1 / a,
    "maximum": lambda a, b, **_: np.maximum(a, b),
    "minimum": lambda a, b, **_: np.minimum(a, b),
    "clamp": lambda a, min=None, max=None, **_: np.clip(a, min, max),
    "logical_or": lambda a, b, **_: ((a != 0) | (b != 0)).astype(float),
    "bitwise_not": lambda a, **_: (a == 0).astype(float),
    "masked_fill": lambda a, m, value=0.0, **_: np.where(m != 0, value, a),
    "empty_like": lambda a, **_: np.zeros(a.shape),
    "fill": lambda a, value=0.0, **_: np.full(a.shape, float(value)),
    "new_zeros": lambda a, size=(), **_: np.zeros(tuple(size)),
    "new_ones": lambda a, size=(), **_: np.ones(tuple(size)),
    "new_full": lambda a, size=(), fill_value=0.0, **_: np.full(tuple(size), float(fill_value)),
    "contiguous": lambda a, **_: a,
    "movedim": lambda a, source=0, destination=0, **_: np.moveaxis(a, source, destination),
    "view_as_real": lambda a, **_: np.stack([np.real(a), np.imag(a)], -1),
    "view_as_complex": lambda a, **_: a[..., 0] + 1j * a[..., 1],
    "index_select": lambda a, i, dim=0, **_: np.take(a, np.asarray(i).astype(int), axis=dim),
    "sort": lambda a, dim=-1, **_: (np.sort(a, axis=dim), np.argsort(a, axis=dim, kind="stable").astype(float)),
}

VIEWS = {"view", "_unsafe_view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "_reshape_alias",
         "view_copy"}

# ops Plan.verify cannot run in numpy: their values are random or undefined (empty, rand), their
# output size depends on the data (nonzero, unique), or they are fused attention backward
# kernels (the decomposed graph torch.export produces runs instead)
NOT_SIMULATED = {"empty", "new_empty", "rand", "randn", "nonzero", "unique", "_unique2", "masked_select",
                 "argwhere", "bincount", "_scaled_dot_product_flash_attention_for_cpu_backward",
                 "_scaled_dot_product_flash_attention_backward",
                 "_scaled_dot_product_efficient_attention_backward"}
NO_OUTPUT = {"_assert_async", "_assert_scalar", "_assert_tensor_metadata", "sym_constrain_range_for_size"}


def run_op(target: str, args: list, params: dict, out_shapes: list) -> list:
    """Run one op on numpy arrays; view-like ops reshape to ``out_shapes`` (local or global)."""
    name = canonical_op_name(target)
    if name in VIEWS:
        return [np.reshape(args[0], out_shapes[0])]
    if name == "expand":
        return [np.broadcast_to(args[0], out_shapes[0]).copy()]
    if name in NO_OUTPUT:
        return []
    fn = OPS.get(name)
    if fn is None:
        raise SimulationUnsupported(
            f"Plan.verify cannot simulate {target!r}: "
            + ("its values are random, undefined or data-dependent" if name in NOT_SIMULATED
               else "it has no numpy implementation in shardlayout/plan/execute.py")
            + "; the plan itself is still valid (every rule is checked by simulation in tests/ops)"
        )
    out = fn(*args, **params)
    return list(out) if isinstance(out, tuple) else [np.asarray(out)]
