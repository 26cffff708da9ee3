"""Numpy implementations of ops, for running a program globally and on every rank.

A view-like op on a rank reshapes to the rank's local output shape; every other op runs as
is on the local pieces (the plan made its dims whole where it needs them).

    >>> import numpy as np
    >>> float(run_op("mm", [np.ones((2, 3)), np.ones((3, 4))], {}, [(2, 4)])[0].sum())
    24.0
"""

from __future__ import annotations

import numpy as np

from ..ops.families import LETTERS  # noqa: F401  (shared alphabet of the rules)
from ..propagation import canonical_op_name


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
    "cumsum": lambda a, dim=0, **_: np.cumsum(a, axis=dim),
    "index_select": lambda a, i, dim=0, **_: np.take(a, np.asarray(i).astype(int), axis=dim),
    "sort": lambda a, dim=-1, **_: (np.sort(a, axis=dim), np.argsort(a, axis=dim, kind="stable").astype(float)),
}


def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def _topk(a, k, dim):
    idx = np.flip(np.argsort(a, axis=dim, kind="stable"), axis=dim)
    idx = np.take(idx, range(k), axis=dim)
    return np.take_along_axis(a, idx, dim), idx.astype(float)

VIEWS = {"view", "_unsafe_view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze"}


def run_op(target: str, args: list, params: dict, out_shapes: list) -> list:
    """Run one op on numpy arrays; view-like ops reshape to ``out_shapes`` (local or global)."""
    name = canonical_op_name(target)
    if name in VIEWS:
        return [np.reshape(args[0], out_shapes[0])]
    if name == "expand":
        return [np.broadcast_to(args[0], out_shapes[0]).copy()]
    fn = OPS.get(name)
    if fn is None:
        raise NotImplementedError(f"no numpy implementation of {target!r} for simulation")
    out = fn(*args, **params)
    return list(out) if isinstance(out, tuple) else [np.asarray(out)]
