"""View-like ops: a view moves no data, it regroups the input's factors into new dims.

The rule (``regroup``) walks the flat list of the input's factors, outer to inner, against
the output dims' boundaries (the common refinement). A local factor splits freely; a
factor on a mesh axis that a boundary cuts becomes two sub-axes (major piece outside,
minor inside). When no exact regrouping exists — a boundary that divides no factor, an
uneven dim that would have to merge with an inner one or be cut, sub-axes disabled —
the least data moves: only the piece of the factor in the way is gathered, and the
result says which.

Worked example (DESIGN.md): mesh dp=2, tp=4; (8,12) as ``[dp*4, tp*3]``::

    flat:   dp(2) 4 tp(4) 3                      = 96
    (16,6): [dp 4 tp:(1)2] [tp:(2)2 3]           tp cut 2|2 by the boundary at 16

    >>> from shardlayout import Mesh, Sharding
    >>> s = Sharding.parse("[dp*4, tp*3]", Mesh.parse("dp=2,tp=4"))
    >>> str(regroup(s, (16, 6))[1])
    '[dp*4*tp:(1)2, tp:(2)2*3]'
"""

from __future__ import annotations

from functools import partial
from math import prod

import numpy as _np

from ..config import settings
from ..errors import OpError
from ..sharding import Sharding
from ..sharding.core import ChunkProgram, _product
from ..sharding.cost import DEFAULT_COST_MODEL
from .registry import register_op
from .regroup import even_inferred, infer_view_shape, regroup, walk_inferred
from .result import Deferred, Propagation
from .strategy import input_moves

_infer_shape = infer_view_shape  # the rules below call it by this name
gathers = input_moves  # the collectives moving input 0 (one function, in ops.strategy)

# ------------------------------------------------------------------------------------------
# the rules (declared with register_op; numpy implementations reshape to the local shape)
# ------------------------------------------------------------------------------------------


def _view_result(name, s, out_shape, subaxes, tensor_dtype, cost_model):
    target, out = regroup(s, out_shape, subaxes)
    # regroup returns s when nothing moves; a move is planned when its collectives are first read
    moves = () if target is s else Deferred(partial(gathers, s, target, tensor_dtype, cost_model))
    return Propagation._trusted(name, (s,), (target,), (out,), moves, cost_model or DEFAULT_COST_MODEL)


def _np_reshape(x, out_shapes, **_):
    return _np.reshape(x, out_shapes[0])


def view_rule(name, inputs, shape=None, size=None, subaxes=None, tensor_dtype="float32", cost_model=None, **_):
    """view/reshape to ``shape`` (``size`` as torch names it); alias/clone keep the shape."""
    s = inputs[0]
    if shape is None:
        shape = size if size is not None else s.shape
    # regroup and _view_result inlined: the hot path of propagate("view"). The shape is bound (its
    # signature type): ints >= 1 but for one -1 at most, so without a -1 and of the input's count it
    # is the view's shape as it is; else infer_view_shape fills the -1 in (or raises, as the walk does)
    if -1 in shape or prod(shape) != prod(s.shape):
        shape = infer_view_shape(s.shape, shape)
    subaxes = settings.subaxes if subaxes is None else subaxes
    cm = cost_model or DEFAULT_COST_MODEL
    # even_inferred's evenness check inlined: an uneven input's walk then skips the dims it saw
    dims, in_shape = s.dims, s.shape
    known = 0  # the first dim that is uneven or a program (the count of dims: none)
    for fs in dims:
        if type(fs) is ChunkProgram:
            break
        p = 1
        for f in fs:
            p *= f[0]
        if p != in_shape[known]:
            break  # an uneven dim: a tail for the walk
        known += 1
    else:
        out = even_inferred(s, shape, subaxes, True)
        if out is not None:  # nothing in the way: nothing moves
            return Propagation._trusted(name, (s,), (s,), (out,), (), cm)
    target, out = walk_inferred(s, shape, subaxes, known)
    # walk_inferred returns s when nothing moves; a move is planned when its collectives are first read
    moves = () if target is s else Deferred(partial(gathers, s, target, tensor_dtype, cost_model))
    return Propagation._trusted(name, (s,), (target,), (out,), moves, cm)


_SUB = "subaxes: bool? = None"
def _check_view_shape(name, inputs, params):
    if (params["size"] is None) is (params["shape"] is None):  # bound params: both are there
        raise OpError(f"op {name}: give the new shape once, as size= (torch's name) or shape=")


register_op("view", f"x ; size: shape? = None, shape: shape? = None, dtype: dtype? = None, {_SUB}", view_rule,
            _np_reshape, shape_driven=True, aliases=("_unsafe_view", "view_copy"), check=_check_view_shape)
register_op("reshape", f"x ; shape: shape, {_SUB}", view_rule, _np_reshape, shape_driven=True)
register_op("_reshape_alias", f"x ; size: shape, stride: any = None, {_SUB}", view_rule, _np_reshape,
            shape_driven=True)
register_op("alias", f"x ; {_SUB}", view_rule, lambda x, **_: x)
register_op("clone", f"x ; memory_format: ignored = None, {_SUB}", view_rule, lambda x, **_: _np.array(x))
register_op("contiguous", f"x ; memory_format: ignored = None, {_SUB}", view_rule, lambda x, **_: x)


def flatten_rule(name, inputs, start_dim=0, end_dim=-1, subaxes=None, tensor_dtype="float32", cost_model=None, **_):
    s = inputs[0]
    a, b = (start_dim, end_dim) if s.ndim else (0, 0)
    if a > b:
        raise OpError(f"op flatten: start_dim {start_dim} is after end_dim {end_dim}; give start_dim <= end_dim")
    shape = s.shape[:a] + (_product(s.shape[a: b + 1]),) + s.shape[b + 1:]
    return _view_result(name, s, shape, subaxes, tensor_dtype, cost_model)


register_op("flatten", f"x ; start_dim: dim = 0, end_dim: dim = -1, {_SUB}", flatten_rule, _np_reshape,
            shape_driven=True)


def unflatten_rule(name, inputs, dim=0, sizes=None, subaxes=None, tensor_dtype="float32", cost_model=None, **_):
    s = inputs[0]
    shape = s.shape[:dim] + tuple(_infer_shape((s.shape[dim],), list(sizes))) + s.shape[dim + 1:]
    return _view_result(name, s, shape, subaxes, tensor_dtype, cost_model)


register_op("unflatten", f"x ; dim: dim, sizes: shape, {_SUB}", unflatten_rule, _np_reshape, shape_driven=True)


def squeeze_rule(name, inputs, dim=None, subaxes=None, tensor_dtype="float32", cost_model=None, **_):
    s = inputs[0]
    dims = [d for d in range(s.ndim) if s.shape[d] == 1] if dim is None else \
        ([dim] if isinstance(dim, int) else list(dim))
    shape = tuple(n for d, n in enumerate(s.shape) if not (d in dims and n == 1))
    return _view_result(name, s, shape, subaxes, tensor_dtype, cost_model)


register_op("squeeze", f"x ; dim: dims? = None, {_SUB}", squeeze_rule, _np_reshape, shape_driven=True)


def unsqueeze_rule(name, inputs, dim=0, subaxes=None, tensor_dtype="float32", cost_model=None, **_):
    s = inputs[0]
    return _view_result(name, s, s.shape[:dim] + (1,) + s.shape[dim:], subaxes, tensor_dtype, cost_model)


register_op("unsqueeze", f"x ; dim: dim+1, {_SUB}", unsqueeze_rule, _np_reshape, shape_driven=True)


def _permuted(name, s: Sharding, perm) -> Propagation:
    if sorted(perm) != list(range(s.ndim)):
        raise OpError(f"op {name}: {tuple(perm)} is not a permutation of {s.ndim} dims; name each dim once")
    out = Sharding(s.mesh, tuple(s.shape[p] for p in perm), [s.dims[p] for p in perm], s.partial)
    return Propagation(name, (s,), (s,), (out,))


def permute_rule(name, inputs, dims=(), **_):
    s = inputs[0]
    return _permuted(name, s, list(dims) if not isinstance(dims, int) else [dims])


def transpose_rule(name, inputs, dim0=0, dim1=1, **_):
    s = inputs[0]
    perm = list(range(s.ndim))
    if s.ndim:
        perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
    return _permuted(name, s, perm)


def t_rule(name, inputs, **_):
    s = inputs[0]
    return _permuted(name, s, list(range(s.ndim))[::-1])


def movedim_rule(name, inputs, source=0, destination=0, **_):
    s = inputs[0]
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    if len(src) != len(dst):
        raise OpError(f"op movedim: source {src} and destination {dst} must name as many dims")
    perm = [None] * s.ndim
    for a, b in zip(src, dst):
        perm[b] = a
    rest = iter(d for d in range(s.ndim) if d not in src)
    return _permuted(name, s, [p if p is not None else next(rest) for p in perm])


register_op("permute", f"x ; dims: dims, {_SUB}", permute_rule, lambda x, dims: _np.transpose(x, dims))
register_op("transpose", f"x ; dim0: dim, dim1: dim, {_SUB}", transpose_rule,
            lambda x, dim0, dim1: _np.swapaxes(x, dim0, dim1))
def _check_t(name, inputs, params):
    if inputs[0].ndim > 2:
        raise OpError(f"op t: expects a tensor of at most 2 dims, got {inputs[0].ndim} (use transpose)")


register_op("t", f"x ; {_SUB}", t_rule, lambda x: _np.asarray(x).T, check=_check_t)
register_op("movedim", f"x ; source: dims, destination: dims, {_SUB}", movedim_rule,
            lambda x, source, destination: _np.moveaxis(x, source, destination))


def expand_rule(name, inputs, size=None, tensor_dtype="float32", cost_model=None, **_):
    """Broadcast size-1 dims (and new leading dims): every rank holds the whole new extent."""
    s = inputs[0]
    size = list(size)
    lead = len(size) - s.ndim
    if lead < 0:
        raise OpError(f"op expand: size {tuple(size)} has fewer dims than the input {s.shape}")
    dims, shape_out = [], []
    for i, n in enumerate(size):
        if i < lead:
            if n < 1:
                raise OpError(f"op expand: new dim {i} must have a positive size, got {n}")
            dims.append([])
            shape_out.append(n)
            continue
        d = i - lead
        if n == -1 or n == s.shape[d]:
            dims.append(s.dims[d])
            shape_out.append(s.shape[d])
        elif s.shape[d] == 1:
            dims.append([])
            shape_out.append(n)
        else:
            raise OpError(f"op expand: dim {d} has size {s.shape[d]}; only size-1 dims expand (to {n})")
    # an expanded size-1 dim that carries a shard (all on some devices, nothing on others) is
    # gathered first: every device must hold the broadcast values
    busy = [d for d in range(s.ndim) if s.shape[d] == 1 and size[d + lead] not in (-1, 1) and s.dims[d]]
    target = s if not busy else Sharding(s.mesh, s.shape, [[] if d in busy else s.dims[d] for d in range(s.ndim)],
                                         s.partial)
    out = Sharding(s.mesh, tuple(shape_out), dims, s.partial)
    return Propagation(name, (s,), (target,), (out,), gathers(s, target, tensor_dtype, cost_model))


register_op("expand", f"x ; size: ints, implicit: bool = False, {_SUB}", expand_rule,
            lambda x, out_shapes, **_: _np.broadcast_to(x, out_shapes[0]).copy(), shape_driven=True)


def view_as_real_rule(name, inputs, **_):
    s = inputs[0]
    return Propagation(name, (s,), (s,), (Sharding(s.mesh, s.shape + (2,), list(s.dims) + [[]], s.partial),))


def view_as_complex_rule(name, inputs, tensor_dtype="float32", cost_model=None, **_):
    s = inputs[0]
    if not s.ndim or s.shape[-1] != 2:
        raise OpError(f"op view_as_complex: the last dim must have size 2, got shape {s.shape}")
    target = s
    if any(not f.local for f in s.dims[-1]):
        target = Sharding(s.mesh, s.shape, list(s.dims[:-1]) + [[]], s.partial)
    out = Sharding(s.mesh, s.shape[:-1], list(target.dims[:-1]), s.partial)
    return Propagation(name, (s,), (target,), (out,), gathers(s, target, tensor_dtype, cost_model))


register_op("view_as_real", f"x ; {_SUB}", view_as_real_rule, lambda a: _np.stack([_np.real(a), _np.imag(a)], -1))
register_op("view_as_complex", f"x ; {_SUB}", view_as_complex_rule, lambda a: a[..., 0] + 1j * a[..., 1])
