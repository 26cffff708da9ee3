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

from math import gcd

from ..config import settings
from ..errors import ShardingSpecError
from ..sharding import Factor, Sharding
from ..sharding.core import ChunkProgram, _product


class _Tok:
    """A piece of the flat factor list: kind "f" (one even factor), "u" (the uneven tail of a
    dim) or "p" (a ChunkProgram dim); ``dim``/``index`` locate it in the input (-1: merged)."""

    __slots__ = ("kind", "factors", "size", "dim", "index")

    def __init__(self, kind, factors, size, dim, index):
        self.kind, self.factors, self.size, self.dim, self.index = kind, factors, size, dim, index


def _tokens(s: Sharding) -> list:
    toks: list = []
    for d, fs in enumerate(s.dims):
        n = s.shape[d]
        if type(fs) is ChunkProgram:
            toks.append(_Tok("p", (fs,), n, d, 0))
            continue
        p = 1
        for f in fs:
            p *= f.size
        if p == n:
            for j, f in enumerate(fs):
                if merged_local(toks, f):
                    size = toks[-1].size * f.size
                    toks[-1] = _Tok("f", (Factor(size),), size, -1, -1)
                else:
                    toks.append(_Tok("f", (f,), f.size, d, j))
            continue
        j, p = 0, 1
        while j < len(fs) - 1 and n % (p * fs[j].size) == 0:
            p *= fs[j].size
            j += 1
        for i, f in enumerate(fs[:j]):
            if merged_local(toks, f):
                size = toks[-1].size * f.size
                toks[-1] = _Tok("f", (Factor(size),), size, -1, -1)
            else:
                toks.append(_Tok("f", (f,), f.size, d, i))
        toks.append(_Tok("u", tuple(fs[j:]), n // p, d, j))
    return toks


def merged_local(toks: list, f: Factor) -> bool:
    """Does local factor ``f`` merge into the last token (also local)?"""
    if f.axis is not None or not toks:
        return False
    t = toks[-1]
    return t.kind == "f" and t.factors[0].axis is None


def _split(f: Factor, outer: int) -> tuple:
    if f.local:
        return Factor(outer), Factor(f.size // outer)
    return Factor(outer, f.axis, f.pre), Factor(f.size // outer, f.axis, f.pre * outer)


class _Gather(Exception):
    """Refinement failed: gather (the inner part of) token ``tok``, keeping ``keep`` outer."""

    def __init__(self, tok, keep: int, why: str):
        super().__init__(why)
        self.tok, self.keep, self.why = tok, keep, why


def _blame(toks: list, i: int, need: int, subaxes: bool) -> _Gather:
    t = toks[i]
    if t.kind == "f" and not t.factors[0].local:
        keep = gcd(t.size, need) if subaxes else 1
        return _Gather(t, keep, f"a boundary cuts {t.size} at {need}")
    for j in (i + 1, i - 1):
        if 0 <= j < len(toks) and not (toks[j].kind == "f" and toks[j].factors[0].local):
            return _Gather(toks[j], 1, f"a boundary falls between factors {i} and {j}")
    raise AssertionError("two adjacent local factors are always merged")  # pragma: no cover


def _unit_body(t: _Tok) -> list:
    fs = list(t.factors)
    return fs[:-1] if fs and fs[-1].local else fs


def _same_chunks(body: list, n_in: int, n_out: int, q_in: int, q_out: int) -> bool:
    """Do ``body`` cutting ``n_in`` (each element a block of ``q_in``) and ``body`` cutting
    ``n_out`` (blocks of ``q_out``) hold the same elements on every device?"""
    from itertools import product as cartesian

    from ..sharding.shards import dim_ranges

    axes = [j for j, f in enumerate(body) if not f.local]
    for combo in cartesian(*(range(body[j].size) for j in axes)):
        digits = [None] * len(body)
        for j, g in zip(axes, combo):
            digits[j] = g
        a = [(lo * q_in, hi * q_in) for lo, hi in dim_ranges(n_in, tuple(body), digits)]
        b = [(lo * q_out, hi * q_out) for lo, hi in dim_ranges(n_out, tuple(body), digits)]
        if _merge_ranges(a) != _merge_ranges(b):
            return False
    return True


def _merge_ranges(rs: list) -> list:
    out: list = []
    for lo, hi in rs:
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        elif hi > lo:
            out.append((lo, hi))
    return out


def _take_inner(toks: list, i: int, q: int):
    """Local factors right after token ``i`` whose outer digits make up exactly ``q``:
    ``[(token index, size taken)]``, or None."""
    taken, got = [], 1
    for j in range(i + 1, len(toks)):
        if got == q:
            break
        u = toks[j]
        if u.kind != "f" or not u.factors[0].local:
            return None
        want = q // got
        if q % got:
            return None
        if u.size % want == 0:
            taken.append((j, want))
            got *= want
        elif want % u.size == 0:
            taken.append((j, u.size))
            got *= u.size
        else:
            return None
    return taken if got == q else None


def _consume(toks: list, taken: list) -> None:
    for j, used in taken:
        u = toks[j]
        rest = u.size // used
        toks[j] = _Tok("f", (Factor(rest),), rest, u.dim, u.index)


def _same_program_chunks(prog, n: int, q: int) -> bool:
    """Does DTensor's chunk program on ``n * q`` hold the blocks of ``q`` it holds on ``n``?"""
    from itertools import product as cartesian

    from ..sharding.shards import _program_ranges

    for digits in cartesian(*(range(st.size) for st in prog)):
        a = [(lo * q, hi * q) for lo, hi in _program_ranges(n, prog, digits)]
        b = _program_ranges(n * q, prog, digits)
        if _merge_ranges(a) != _merge_ranges(b):
            return False
    return True


def _refine(toks: list, out_shape: tuple, subaxes: bool) -> list:
    # tails of extent 1 (all-or-nothing shards) sit anywhere: take them out, so that the local
    # factors around them merge, and place them at the end
    floating = [t for t in toks if t.size == 1 and t.kind != "f"]
    rest: list = [] if floating else list(toks)
    for t in toks if floating else ():
        if t.kind in ("u", "p") and t.size == 1:
            continue
        if rest and t.kind == "f" and rest[-1].kind == "f" and t.factors[0].axis is None \
                and rest[-1].factors[0].axis is None:
            size = rest[-1].size * t.size
            rest[-1] = _Tok("f", (Factor(size),), size, -1, -1)
        else:
            rest.append(t)
    toks = rest
    out: list = [[] for _ in out_shape]
    k, acc = 0, 1
    nout = len(out_shape)

    def skip():
        nonlocal k, acc
        while k < nout and acc == out_shape[k]:
            k += 1
            acc = 1

    for i, t in enumerate(toks):
        skip()
        if t.kind in ("u", "p"):
            if k == nout:
                raise _Gather(toks[i], 1, "an uneven dim of extent 1 has no output dim to live in")
            need = out_shape[k] // acc
            if t.kind == "p":
                prog = t.factors[0]
                q = need // t.size if need % t.size == 0 else 0
                if acc == 1 and need < t.size and t.size % need == 0:
                    inner = t.size // need
                    if _same_program_chunks(prog, need, inner):
                        # cut where DTensor's chunks line up: the program keeps the outer part
                        out[k] = prog
                        acc = out_shape[k]
                        toks.insert(i + 1, _Tok("f", (Factor(inner),), inner, -1, -1))
                        continue
                if acc != 1 or not q:
                    raise _Gather(toks[i], 1, "a DTensor chunk program must stay a whole dim")
                taken = _take_inner(toks, i, q) if q > 1 else []
                if taken is None or (q > 1 and not _same_program_chunks(prog, t.size, q)):
                    raise _Gather(toks[i], 1, "a DTensor chunk program must stay a whole dim")
                _consume(toks, taken)
                out[k] = prog
                acc = out_shape[k]
                continue
            if need == t.size:
                out[k].extend(t.factors)
                acc = out_shape[k]
                continue
            body = _unit_body(t)
            if need < t.size and t.size % need == 0 and _same_chunks(body, t.size, need, 1, t.size // need):
                # the boundary cuts the uneven tail where its chunks line up: split it
                out[k].extend(body)
                acc = out_shape[k]
                skip()
                rest = t.size // need
                out_k_need = out_shape[k] // acc if k < nout else 0
                if out_k_need % rest:
                    raise _Gather(toks[i], 1, "the inner part of an uneven dim straddles a boundary")
                out[k].append(Factor(rest))
                acc *= rest
                continue
            q = need // t.size if need % t.size == 0 else 0
            taken = _take_inner(toks, i, q) if q > 1 else None
            if taken is not None and _same_chunks(body, t.size, t.size * q, q, 1):
                # inner local factors merge into the uneven tail where chunks line up
                out[k].extend(body)
                acc = out_shape[k]
                _consume(toks, taken)
                continue
            # general case: the tail and the local factors after it form a region of R
            # elements; the output dim takes ``need`` blocks of it where the chunks line up
            follow, q = [], 1
            for j in range(i + 1, len(toks)):
                u = toks[j]
                if u.kind != "f" or not u.factors[0].local:
                    break
                follow.append(j)
                q *= u.size
            region = t.size * q
            if region % need == 0 and _same_chunks(body, t.size, need, q, region // need):
                out[k].extend(body)
                acc = out_shape[k]
                for j in follow:
                    u = toks[j]
                    toks[j] = _Tok("f", (Factor(1),), 1, u.dim, u.index)
                rest = region // need
                if rest > 1:
                    toks.insert(i + 1, _Tok("f", (Factor(rest),), rest, -1, -1))
                continue
            raise _Gather(toks[i], 1, "an uneven dim must end an output dim and stay whole")
        piece, psize = t.factors[0], t.size
        while True:
            while k < nout and acc == out_shape[k]:
                k += 1
                acc = 1
            if psize == 1:
                break
            need = out_shape[k] // acc
            if psize <= need:
                if need % psize:
                    raise _blame(toks, i, need, subaxes)
                out[k].append(piece)
                acc *= psize
                break
            if psize % need:
                raise _blame(toks, i, need, subaxes)
            if piece.axis is not None and not subaxes:
                raise _Gather(toks[i], 1, "sub-axes are disabled")
            outer, piece = _split(piece, need)
            out[k].append(outer)
            acc *= need
            psize //= need
    skip()
    for t in floating:
        free = [j for j in range(nout) if out_shape[j] == 1 and not out[j]]
        if free:
            out[free[0]] = t.factors[0] if t.kind == "p" else list(t.factors)
        elif t.kind == "u" and nout and type(out[-1]) is not ChunkProgram:
            out[-1] = list(out[-1]) + list(t.factors)  # innermost: extent 1 changes no chunk
        else:
            raise _Gather(t, 1, "a shard of extent 1 needs an output dim to live in")
    return out


def _gather_token(s: Sharding, t: _Tok, keep: int) -> Sharding:
    dims = [fs if isinstance(fs, ChunkProgram) else list(fs) for fs in s.dims]
    d = t.dim
    if t.kind == "p":
        dims[d] = []
    elif t.kind == "u":
        dims[d] = dims[d][: t.index] + [Factor(t.size)]
    else:
        f = t.factors[0]
        if keep > 1:
            outer, inner = _split(f, keep)
            dims[d][t.index : t.index + 1] = [outer, Factor(inner.size)]
        else:
            dims[d][t.index] = Factor(f.size)
    return Sharding._trusted(s.mesh, s.shape, dims, s.partial)


def regroup(s: Sharding, out_shape, subaxes: bool | None = None) -> tuple:
    """``(input_target, output)`` for viewing ``s`` as ``out_shape`` (row-major reshape).

    ``input_target == s`` when the view needs no communication.
    """
    out_shape = _infer_shape(s.shape, out_shape)
    subaxes = settings.subaxes if subaxes is None else subaxes
    target = s
    while True:
        toks = _tokens(target)
        try:
            dims = _refine(toks, out_shape, subaxes)
        except _Gather as g:
            target = _gather_token(target, g.tok, g.keep)
            continue
        out = Sharding._trusted(s.mesh, out_shape, dims, s.partial)
        if not subaxes:
            fixed = _dtensor_expressible(target, out, out_shape)
            if fixed is not None:
                target = fixed
                continue
        return target, out


def _dtensor_expressible(target: Sharding, out: Sharding, out_shape) -> Sharding | None:
    """With sub-axes off, the output must have DTensor placements; else gather one more axis."""
    from ..errors import NotRepresentable

    try:
        out.to_placements()
    except NotRepresentable:
        toks = _tokens(target)
        sharded = [i for i, t in enumerate(toks) if not (t.kind == "f" and t.factors[0].local)]
        return _gather_token(target, toks[sharded[-1]], 1)
    return None


def _infer_shape(shape: tuple, out_shape) -> tuple:
    if type(out_shape) is tuple and -1 not in out_shape and _product(out_shape) == _product(shape):
        if all(type(x) is int and x > 0 for x in out_shape):
            return out_shape
    if isinstance(out_shape, int):
        out_shape = (out_shape,)
    out_shape = [int(x) for x in out_shape]
    total = _product(shape)
    if out_shape.count(-1) > 1:
        raise ShardingSpecError(f"view: shape {tuple(out_shape)} has more than one -1")
    if -1 in out_shape:
        rest = _product(x for x in out_shape if x != -1)
        if rest == 0 or total % rest:
            raise ShardingSpecError(f"view: cannot view {shape} ({total} elements) as {tuple(out_shape)}")
        out_shape[out_shape.index(-1)] = total // rest
    if any(x < 1 for x in out_shape) or _product(out_shape) != total:
        raise ShardingSpecError(
            f"view: shape {tuple(out_shape)} has {_product(out_shape)} elements, the input {shape} has "
            f"{total}; a view keeps the number of elements"
        )
    return tuple(out_shape)


# ------------------------------------------------------------------------------------------
# the rules (declared with register_op; numpy implementations reshape to the local shape)
# ------------------------------------------------------------------------------------------

import numpy as _np  # noqa: E402

from ..errors import OpError  # noqa: E402
from ..sharding.move import communicating, plan_move  # noqa: E402
from .registry import register_op  # noqa: E402
from .result import Propagation  # noqa: E402


def gathers(src: Sharding, dst: Sharding, tensor_dtype: str = "float32") -> tuple:
    """The collectives moving input 0 from ``src`` to ``dst`` (``plan_move``, local steps dropped)."""
    return tuple(c.attributed("input 0") for c in communicating(plan_move(src, dst, tensor_dtype)))


def _view_result(name, s, out_shape, subaxes, tensor_dtype, cost_model, notes=()):
    target, out = regroup(s, out_shape, subaxes)
    return Propagation(name, (s,), (target,), (out,), gathers(s, target, tensor_dtype), tuple(notes))


def _np_reshape(x, out_shapes, **_):
    return _np.reshape(x, out_shapes[0])


def view_rule(name, inputs, shape=None, size=None, subaxes=None, tensor_dtype="float32", cost_model=None, **_):
    """view/reshape to ``shape`` (``size`` as torch names it); alias/clone keep the shape."""
    s = inputs[0]
    if shape is None:
        shape = size if size is not None else s.shape
    return _view_result(name, s, shape, subaxes, tensor_dtype, cost_model)


_SUB = "subaxes: bool? = None"
def _check_view_shape(name, inputs, params):
    if (params.get("size") is None) == (params.get("shape") is None):
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
    return Propagation(name, (s,), (target,), (out,), gathers(s, target, tensor_dtype))


register_op("expand", f"x ; size: ints, implicit: bool = False, {_SUB}", expand_rule,
            lambda x, out_shapes, **_: _np.broadcast_to(x, out_shapes[0]).copy(), shape_driven=True)


def view_as_real_rule(name, inputs, **_):
    s = inputs[0]
    return Propagation(name, (s,), (s,), (Sharding(s.mesh, s.shape + (2,), list(s.dims) + [[]], s.partial),))


def view_as_complex_rule(name, inputs, tensor_dtype="float32", **_):
    s = inputs[0]
    if not s.ndim or s.shape[-1] != 2:
        raise OpError(f"op view_as_complex: the last dim must have size 2, got shape {s.shape}")
    target = s
    if any(not f.local for f in s.dims[-1]):
        target = Sharding(s.mesh, s.shape, list(s.dims[:-1]) + [[]], s.partial)
    out = Sharding(s.mesh, s.shape[:-1], list(target.dims[:-1]), s.partial)
    return Propagation(name, (s,), (target,), (out,), gathers(s, target, tensor_dtype))


register_op("view_as_real", f"x ; {_SUB}", view_as_real_rule, lambda a: _np.stack([_np.real(a), _np.imag(a)], -1))
register_op("view_as_complex", f"x ; {_SUB}", view_as_complex_rule, lambda a: a[..., 0] + 1j * a[..., 1])
