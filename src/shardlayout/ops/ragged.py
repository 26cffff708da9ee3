"""Ops with a ragged dim: token routing for mixture-of-experts, and how any op runs on nested values.

``route(x, index; experts)`` is token-choice dispatch: ``x`` is ``(T, *D)`` tokens,
``index`` ``(T, k)`` the experts each token chose; the result is the nested tensor
``(experts, ragged, *D)`` whose component ``e`` holds ``x[t]`` for every pair ``(t, j)``
with ``index[t, j] == e``, in ``(t, j)`` order (torch's stable argsort of the flattened
indices, as torchtitan and Megatron sort tokens by expert). Its shape holds the *expected*
rows per expert, ``ceil(T*k / experts)`` (``sharding.ragged``). ``unroute(y, index,
weights)`` is the combine: ``out[t] = sum_j weights[t, j] * y[index[t, j]][row of (t, j)]``
(``pairs=True``: ``out[t, j]``, each pair's row put back, none summed).

Sharding rules: routing is local to a token shard. Tokens cut by mesh axes give a nested
tensor whose ragged dim carries the same axes (each rank holds its own *source* block of
every expert); ``unroute`` takes it back to tokens on those axes. Between them an op that
needs experts on a mesh axis (the expert weights of a grouped matmul on ``ep``) gets the
nested tensor moved from sources to components — one ``all_to_all`` whose split sizes come
from the routing counts at run time (``sharding.ragged.ragged_collective_piece``), priced at
the expected size like any move.

    >>> import numpy as np
    >>> x = np.arange(8.0).reshape(4, 2); idx = np.array([[1, 0], [1, 2], [0, 1], [2, 1]])
    >>> n = route_values(x, idx, 3, np)
    >>> n.extents.tolist(), n.component(0)[:, 0].tolist(), n.component(1)[:, 0].tolist()
    ([[2, 4, 2]], [0.0, 4.0], [0.0, 2.0, 4.0, 6.0])
    >>> y = unroute_values(n, idx, np.ones((4, 2)), np)
    >>> np.array_equal(y, 2 * x)
    True
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import OpError
from ..sharding import Sharding
from ..sharding import ragged_ops as rops
from ..sharding.cost import DEFAULT_COST_MODEL
from ..sharding.factors import ChunkProgram, Factor
from ..sharding.nested import Nested, RaggedError, from_blocks
from ..sharding.ragged import _digits
from .registry import register_op
from .result import Propagation
from .strategy import move_collectives

RAGGED_OPS = ("route", "unroute")


# -- values ---------------------------------------------------------------------------------------
def _flat_ids(index, xp):
    flat = index.reshape(-1)
    return flat.long() if xp is not np else np.asarray(flat).astype(np.int64)


def _check_ids(ids, experts: int, xp) -> None:
    if ids.shape[0] and (int(ids.min()) < 0 or int(ids.max()) >= experts):
        raise RaggedError(f"route: expert index {int(ids.min()) if int(ids.min()) < 0 else int(ids.max())} is out "
                          f"of range for {experts} experts; the index must hold expert ids in [0, {experts})")


def _sorted_pairs(ids, experts: int, xp):
    """(order of the pairs sorted by expert, stably; rows per expert)."""
    if xp is np:
        return np.argsort(ids, kind="stable"), np.bincount(ids, minlength=experts)
    return xp.argsort(ids, stable=True), xp.bincount(ids, minlength=experts)


def _blocks_of(index, sources) -> tuple:
    t = index.shape[0]
    blocks = tuple(int(b) for b in sources) if sources else (t,)
    if sum(blocks) != t:
        raise RaggedError(f"route: source blocks {list(blocks)} cover {sum(blocks)} tokens, the index has {t}")
    return blocks


def route_values(x, index, experts: int, xp=np, sources=None, pairs: bool = False) -> Nested:
    """Token-choice dispatch on values (numpy or torch: ``xp`` is the module): the nested tensor
    of ``x``'s rows by expert (``pairs``: ``x`` is ``(T, k, *D)``, one row per (token, choice),
    e.g. the routing scores). ``sources``: token counts of consecutive source blocks (the token
    shards of a whole tensor, for a reference run); default one block."""
    t, k = index.shape[0], index.shape[1]
    if x.shape[0] != t or (pairs and (len(x.shape) < 2 or x.shape[1] != k)):
        raise RaggedError(f"route: x of shape {tuple(x.shape)} does not fit the index {tuple(index.shape)}; give "
                          "one row per token" + (" and choice (T, k, ...)" if pairs else ""))
    if pairs:
        x = x.reshape((t * k,) + tuple(x.shape[2:]))
    ids_all = _flat_ids(index, xp)
    _check_ids(ids_all, experts, xp)
    blocks, start = {}, 0
    for s, n in enumerate(_blocks_of(index, sources)):
        ids = ids_all[start * k:(start + n) * k]
        order, counts = _sorted_pairs(ids, experts, xp)
        at = order + start * k if pairs else order // k + start
        rows = x[at] if xp is np else x.index_select(0, at)
        off = 0
        for e in range(experts):
            c = int(counts[e])
            blocks[(e, s)] = rows[off:off + c]
            off += c
        start += n
    return from_blocks(blocks, experts, len(_blocks_of(index, sources)), 0, x)


def unroute_values(y: Nested, index, weights, xp=np, sources=None, pairs: bool = False):
    """Combine on values: each token's rows of ``y`` weighted and summed back into ``(T, *D)``
    (``pairs``: put back one row per (token, choice), ``(T, k, *D)``, none summed)."""
    if not isinstance(y, Nested):
        raise RaggedError("unroute: the first operand must be a nested tensor (the output of route and of ops on "
                          "it); it is dense")
    t, k = index.shape[0], index.shape[1]
    blocks = _blocks_of(index, sources)
    if sources is None and y.sources > 1:  # this rank's tokens are those sources' blocks, in order
        y = y.merged()
    if y.sources != len(blocks):
        raise RaggedError(f"unroute: the nested tensor holds {y.sources} source blocks per expert, the tokens "
                          f"here {len(blocks)}; combine where the tokens were routed (move it back to its sources)")
    ids_all = _flat_ids(index, xp)
    w_all = None if weights is None else weights.reshape(-1)
    dense = tuple(y.data.shape[1:])
    n_out = t * k if pairs else t
    out = xp.zeros((n_out,) + dense, dtype=y.data.dtype) if xp is not np else \
        np.zeros((n_out,) + dense, dtype=np.result_type(y.data, float))
    start = 0
    for s, n in enumerate(blocks):
        ids = ids_all[start * k:(start + n) * k]
        order, counts = _sorted_pairs(ids, y.components, xp)
        if [int(c) for c in counts] != [int(c) for c in y.extents[s]]:
            raise RaggedError(f"unroute: the routing gives {[int(c) for c in counts]} rows per expert for source "
                              f"{s}, the nested tensor holds {y.extents[s].tolist()}; route and unroute must use "
                              "the same indices")
        rows = xp.cat([y.block(e, s) for e in range(y.components)]) if xp is not np else \
            np.concatenate([y.block(e, s) for e in range(y.components)])
        tok = order + start * k if pairs else order // k + start
        if w_all is not None:
            w = w_all[start * k:(start + n) * k][order].reshape((-1,) + (1,) * len(dense))
            rows = rows * (w if xp is np else w.to(rows.dtype))
        if xp is np:
            np.add.at(out, tok, rows)
        else:
            out = out.index_add(0, tok, rows)
        start += n
    return out.reshape((t, k) + dense) if pairs else out


# -- any op on nested values ------------------------------------------------------------------------
def run_nested(opdef, args: list, params: dict, out_shapes: list, run, xp) -> list:
    """Run ``opdef`` where a value is nested (or the op makes one): route / unroute directly;
    einsum and bmm per component, squeeze / unsqueeze of dense dims and row-wise ops on the
    stored rows by the RFC's rules (``sharding.ragged_ops``); ``run(opdef, args, params,
    out_shapes)`` is the executor's dense run of the op itself on the rows."""
    name = opdef.name
    src = params.get("sources")
    if name.startswith("_assert"):  # a runtime check of dtype or device: nothing to compute
        return []
    if name == "route":
        return [route_values(args[0], args[1], params["experts"], xp, src, params.get("pairs", False))]
    if name == "unroute":
        return [unroute_values(args[0], args[1], args[2] if len(args) > 2 else None, xp, src,
                               params.get("pairs", False))]
    shape = out_shapes[0] if out_shapes else None
    if name in ("einsum", "bmm"):
        return [rops.einsum(params["equation"] if name == "einsum" else "erk,ekn->ern", *args, out_shape=shape)]
    if name == "unsqueeze":
        return [rops.unsqueeze(args[0], params["dim"])]
    if name == "squeeze":
        return [rops.squeeze(args[0], params["dim"])]
    if name in SPLITS:  # along a dense dim: each output keeps the rows where they are
        nested, d = args[0], params["dim"]
        dd = d - 1 if d >= 0 else d  # the component and ragged dims are one stored dim
        rows = tuple(nested.data.shape)
        shapes = [rows[:dd % len(rows)] + (s[d],) + rows[dd % len(rows) + 1:] for s in out_shapes]
        outs = run(opdef, [nested.data] + list(args[1:]), {**params, "dim": dd}, shapes)
        return [Nested(o, nested.extents, nested.dim) for o in outs]
    if name not in ROWWISE:
        raise RaggedError(f"op {name} on a ragged tensor is not defined here; ragged tensors go through route, "
                          f"einsum/bmm over their components, row-wise ops ({', '.join(sorted(ROWWISE))}) and "
                          "unroute")
    nested = next(a for a in args if isinstance(a, Nested))
    return [rops.pointwise(lambda *plain: run(opdef, list(plain), params, [tuple(nested.data.shape)])[0], *args)]


SPLITS = frozenset({"split_with_sizes", "split", "chunk", "slice", "narrow"})
"""Ops that cut a dense dim of routed rows (transformers' fused gate|up split): defined on ragged rows
when the cut dim comes after the ragged one."""

ROWWISE = frozenset({
    "rsqrt", "sqrt", "exp", "log", "abs", "sigmoid", "silu", "relu", "tanh", "cos", "sin", "erf", "reciprocal",
    "sign", "floor", "ceil", "neg", "detach", "_to_copy", "gelu", "round", "add", "sub", "mul", "div", "pow",
    "maximum", "minimum", "clamp", "where", "clone", "log1p", "expm1", "log2", "exp2", "log10", "trunc", "tan",
    "atan", "asin", "acos", "sinh", "cosh", "asinh", "acosh", "atanh",
})


# -- sharding rules --------------------------------------------------------------------------------
def _plain_tokens(fs) -> tuple | None:
    """The mesh factors of a token dim cut by mesh factors outermost (then local), or None."""
    if type(fs) is ChunkProgram:
        return None
    fs = tuple(fs)
    mesh_fs = tuple(f for f in fs if f.axis is not None)
    if fs[: len(mesh_fs)] != mesh_fs:
        return None
    return mesh_fs


def _ragged_factors(mesh_fs: tuple, expected: int) -> tuple:
    n = math.prod(f.size for f in mesh_fs)
    rest = (Factor(expected // n),) if mesh_fs and expected % n == 0 else ()
    return tuple(mesh_fs) + rest if mesh_fs else ()


def _token_factors(mesh_fs: tuple, tokens: int) -> tuple:
    n = math.prod(f.size for f in mesh_fs)
    return tuple(mesh_fs) + ((Factor(tokens // n),) if mesh_fs and tokens % n == 0 else ())


def _candidates(shardings, token_dims) -> list:
    """Distinct plain token cuts (their mesh factors) offered by the operands, then none."""
    out = []
    for s, d in zip(shardings, token_dims):
        fs = _plain_tokens(s.dims[d]) if s is not None else None
        if fs is not None and fs not in out:
            out.append(fs)
    if () not in out:
        out.append(())
    return out


def _best(name, inputs, options, cm, tensor_dtype, out_pins, note) -> Propagation:
    best = None
    for targets, outputs in options:
        moves = move_collectives(inputs, targets, outputs, tuple(out_pins or ()) + (None,) * len(outputs),
                                 tensor_dtype, cm)
        said = note + ("; nothing moves" if not moves else "; its operands move first (below)")
        p = Propagation(name, tuple(inputs), tuple(targets), tuple(outputs), moves, (said,), (), cm)
        if best is None or p.cost < best.cost:
            best = p
    return best


def expected_rows(tokens: int, k: int, experts: int) -> int:
    """Expected rows per expert of ``tokens`` routed to ``k`` experts each: ``ceil(T*k / E)``."""
    return -(-tokens * k // experts)


def _route_rule(name, inputs, experts=1, pairs=False, cost_model=None, tensor_dtype="float32", out_pins=(), **_):
    """Routing is local to a token shard: x and index share a plain token cut (mesh factors
    outermost); the nested output carries those factors on its ragged dim (its sources), the
    expert dim whole, x's other dims as they are (``pairs``: x's choice dim whole too)."""
    x, idx = inputs[0], inputs[1]
    mesh = x.mesh
    t, k = idx.shape
    rows = expected_rows(t, k, experts)
    rest = 2 if pairs else 1
    options = []
    for mesh_fs in _candidates([x, idx], [0, 0]):
        tf = _token_factors(mesh_fs, t)
        try:
            xt = Sharding(mesh, x.shape, [tf] + [()] * (rest - 1) + list(x.dims[rest:]))
            it = Sharding(mesh, idx.shape, [tf, ()])
            out = Sharding(mesh, (experts, rows) + x.shape[rest:],
                           [(), _ragged_factors(mesh_fs, rows)] + list(x.dims[rest:]))
        except Exception:  # noqa: BLE001 - a cut whose axes x's other dims already use
            continue
        options.append(((xt, it), (out,)))
    return _best(name, inputs, options, cost_model or DEFAULT_COST_MODEL, tensor_dtype, out_pins,
                 "route: each rank sorts its own tokens by expert (its source block of every expert)")


def _unroute_rule(name, inputs, routed=None, pairs=False, cost_model=None, tensor_dtype="float32", out_pins=(),
                  **_):
    """The combine: the nested input's sources on the same mesh factors as the tokens (its
    expert dim whole), so each rank sums its own tokens' rows; partial values stay partial. The
    tokens are cut as the rows' sources are (or not at all): the index and weights follow.
    ``routed``: the mesh factors the rows were routed from (a planning param, ``plan``);
    ``pairs``: the output is ``(T, k, *D)``, its choice dim whole."""
    y, idx = inputs[0], inputs[1]
    w = inputs[2] if len(inputs) > 2 and isinstance(inputs[2], Sharding) else None
    mesh = y.mesh
    t = idx.shape[0]
    options = []
    # rows are combined where they came from (the routing's token cut, ``routed``: the planner
    # gives it), where they are, or gathered whole: a token cut on another axis would cut the
    # ragged dim by rows it was not routed from. Without ``routed``: the index's and weights' cuts.
    ragged_fs = _plain_tokens(y.dims[1])
    offered = [tuple(routed)] if routed is not None else _candidates([idx, w], [0, 0])
    for fs in (ragged_fs, ()):
        if fs is not None and fs not in offered:
            offered.append(fs)
    for mesh_fs in offered:
        tf = _token_factors(mesh_fs, t)
        try:
            yt = Sharding(mesh, y.shape, [(), _ragged_factors(mesh_fs, y.shape[1])] + list(y.dims[2:]), y.partial)
            it = Sharding(mesh, idx.shape, [tf, ()])
            wt = None if w is None else Sharding(mesh, w.shape, [tf, ()])
            out = Sharding(mesh, (t,) + ((idx.shape[1],) if pairs else ()) + y.shape[2:],
                           [tf] + ([()] if pairs else []) + list(y.dims[2:]), y.partial)
        except Exception:  # noqa: BLE001 - a cut whose axes y's other dims already use
            continue
        options.append(((yt, it) + ((wt,) if w is not None else ()), (out,)))
    return _best(name, inputs, options, cost_model or DEFAULT_COST_MODEL, tensor_dtype, out_pins,
                 "unroute: each rank sums its own tokens' rows of every expert")


def _check_route(name, inputs, params):
    x, idx = inputs[0], inputs[1]
    if idx.ndim != 2 or idx.shape[0] != x.shape[0]:
        raise OpError(f"op route: index of shape {idx.shape} must be (tokens, k) with x's {x.shape[0]} tokens")
    if params.get("pairs") and (x.ndim < 2 or x.shape[1] != idx.shape[1]):
        raise OpError(f"op route: with pairs=True x of shape {x.shape} must be (tokens, k, ...) like the index "
                      f"{idx.shape}")


def _check_unroute(name, inputs, params):
    routed = params.get("routed")
    if routed is not None and (not isinstance(routed, tuple) or not all(isinstance(f, Factor) for f in routed)):
        raise OpError(f"op unroute: routed = {routed!r} is set by the planner (the mesh factors the rows were routed "
                      "from); do not give it")
    y, idx = inputs[0], inputs[1]
    w = inputs[2] if len(inputs) > 2 and isinstance(inputs[2], Sharding) else None
    if idx.ndim != 2 or (w is not None and w.shape != idx.shape):
        raise OpError(f"op unroute: index {idx.shape} and weights {None if w is None else w.shape} must both be "
                      "(tokens, k)")
    if y.ndim < 2:
        raise OpError(f"op unroute: y of shape {y.shape} must be (experts, ragged, ...)")


def _no_numpy(*_a, **_k):
    raise RaggedError("route / unroute run through ops.ragged.run_nested (their values are nested tensors)")


register_op("route", "x, index ; experts: int[1..], pairs: bool = False", _route_rule, _no_numpy,
            check=_check_route)
register_op("unroute", "y, index, weights? ; routed: any = None, pairs: bool = False", _unroute_rule, _no_numpy,
            check=_check_unroute)


def reference_params(po) -> dict:
    """Params of a whole-tensor (reference) run of planned ``route`` ``po`` that reproduce the
    sources the plan routes from: the token blocks of its input as the plan cuts them (its
    ``unroute`` takes the same blocks: ``execute.verify.reference_run``). Other ops: their params."""
    if po.target != "route":
        return po.params
    tokens = po.input_targets[0]
    fs = _plain_tokens(tokens.dims[0]) or ()
    if not fs:
        return po.params
    blocks = {}
    for rank in tokens.mesh.ranks():  # source order: by the ranks' coordinates on the token cut
        blocks.setdefault(_digits(tokens, rank, fs), len(tokens.indices(rank)[0]))
    return {**po.params, "sources": tuple(blocks[k] for k in sorted(blocks))}


__all__ = ["RAGGED_OPS", "ROWWISE", "SPLITS", "expected_rows", "reference_params", "route_values", "run_nested",
           "unroute_values"]
