"""``Sharding``: one representation for every kind of shard, and its text form.

A Sharding is a tensor's global shape, per dim a tuple of factors (``factors.py``: local,
a mesh axis or a sub-axis, cut as ``torch.chunk`` cuts), and its partial axes. The class
checks its parts once, at the boundary, and puts them in canonical form; its conversions
(``placements.py``) and local pieces (``shards.py``) are functions of those parts.

Imports run one way (``A -> B``: A imports B):

    core.py        Sharding, its checks, its text form     -> placements.py, shards.py, factors.py
    placements.py  DTensor placements, JAX PartitionSpecs  -> factors.py
    shards.py      local pieces, shard / unshard, layout   -> factors.py
    factors.py     Factor, Step, ChunkProgram, one dim's canonical and text form

    >>> from shardlayout.mesh import Mesh
    >>> s = Sharding.parse("[dp*4, tp*3]", Mesh.parse("dp=2,tp=4")); s.shape, str(s)
    ((8, 12), '[dp*4, tp*3]')
"""

from __future__ import annotations

import numbers
import re
import reprlib

from ..errors import ShardingSpecError
from ..mesh import Mesh, as_mesh
from .factors import (
    REDUCE_OPS,
    ChunkProgram,
    Factor,
    Step,
    _canonical_dim,
    _fmt_factor,
    _merge_even,
    _product,
    chain_extent,
    parse_factor,
    stream_parts,
)
from .placements import (
    MAX_SPLIT_FACTOR,
    parts_from_partition_spec,
    parts_from_placements,
    to_dtensor,
    to_partition_spec,
    to_placements,
)
from .shards import local_indices, local_shape, shard, sharding_layout, unshard

# The factor vocabulary lives in factors.py; it is re-exported here, where it was first
# defined, so ``from shardlayout.sharding.core import ChunkProgram, _product`` keeps working.
__all__ = [
    "REDUCE_OPS",
    "ChunkProgram",
    "Factor",
    "Sharding",
    "Step",
    "_product",
    "chain_extent",
    "format_dim",
    "format_sharding",
    "parse_factor",
    "parse_sharding",
    "split_top_level",
]


class Sharding:
    """How one tensor is laid out on a mesh: global shape, factors per dim, partial axes, and a
    stream, if any.

    Immutable and hashable; equal when they mean the same layout. Build it with
    ``Sharding(mesh, shape, dims, partial, stream)``, ``Sharding.parse``, ``Sharding.from_placements``
    or ``Sharding.from_partition_spec``.

    ``stream``: ``()`` or ``(dim, outer, k)`` — nvFuser's Stream parallel type, a factor ``~k`` of
    ``dim`` that adds no devices and moves no data: the dim's work runs in ``k`` chunks one after
    another, chunk ``j`` the ``j``-th part of each of the dim's ``outer`` outer blocks (``[tp*~8*64]``:
    every rank's 512 rows in 8 chunks of 64; ``[2*~8*64]``, the same rows gathered, chunk ``j``
    still the ``j``-th 64 of each half). Shards, moves and prices read the other fields only; a
    stream is what a move cut into chunks and the domain layer's Stream IDs are made of.
    """

    __slots__ = ("mesh", "shape", "dims", "partial", "stream", "_hash")

    def __init__(self, mesh: Mesh, shape, dims=None, partial=(), stream=()):
        if not isinstance(mesh, Mesh):
            mesh = as_mesh(mesh, "Sharding")
        shape = _check_shape(shape)
        if dims is None:
            dims = [() for _ in shape]
        dims = list(dims)
        if len(dims) != len(shape):
            raise ShardingSpecError(
                f"Sharding: shape {shape} has {len(shape)} dims but {len(dims)} factor lists were "
                "given; give one (possibly empty) factor list per dim"
            )
        canon = tuple(
            _check_program(mesh, d, f)
            if isinstance(f, ChunkProgram)
            else _canonical_dim(mesh, shape, d, _as_factors(mesh, f, d))
            for d, f in enumerate(dims)
        )
        partial = _check_partial(mesh, partial)
        _check_axis_use(mesh, canon, partial)
        stream = _check_stream(mesh, shape, canon, stream)
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dims", canon)
        object.__setattr__(self, "partial", partial)
        object.__setattr__(self, "stream", stream)
        object.__setattr__(self, "_hash", None)

    def __setattr__(self, name, value):
        raise AttributeError("Sharding is immutable")

    @classmethod
    def _trusted(cls, mesh: Mesh, shape: tuple, dims, partial: tuple) -> "Sharding":
        """Internal fast constructor for factors already known valid (op rules): only puts
        each dim in canonical form, no validation."""
        shape = tuple(shape)
        canon = tuple([_trusted_dim(mesh, shape, d, fs) for d, fs in zip(range(len(shape)), dims)])
        return _built(cls, mesh, shape, canon, partial)

    def _with_dim(self, d: int, fs) -> "Sharding":
        """This sharding with dim ``d``'s factors replaced by ``fs`` (known valid), that dim put in
        canonical form (the others already are). ``s._with_dim(0, (Factor(8),))``"""
        dims = self.dims[:d] + (_trusted_dim(self.mesh, self.shape, d, fs),) + self.dims[d + 1 :]
        return _built(Sharding, self.mesh, self.shape, dims, self.partial)

    def __reduce__(self):  # pickled by its fields (a hash is valid in one process only)
        return (_restore, (self.mesh, self.shape, self.dims, self.partial, self.stream))

    # -- identity -------------------------------------------------------------------------
    def _key(self):
        return (self.mesh, self.shape, self.dims, self.partial, self.stream)

    def __eq__(self, other) -> bool:
        if other is self:
            return True
        if not isinstance(other, Sharding):
            return NotImplemented
        return hash(self) == hash(other) and self._key() == other._key()

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = hash((self.mesh, self.shape, self.dims, self.partial, self.stream))  # self._key()
            _set_hash(self, h)
        return h

    def __repr__(self) -> str:
        return f"Sharding({self}, mesh={self.mesh})"

    def __str__(self) -> str:
        return format_sharding(self)

    # -- facts ----------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        """Number of tensor dims. ``Sharding(Mesh.parse("x=2"), (4, 4)).ndim -> 2``."""
        return len(self.shape)

    def is_even(self, dim: int | None = None) -> bool:
        """True when every chunk at every level has the same size (plain mixed radix)."""
        if dim is not None and (type(dim) is not int or not -len(self.shape) <= dim < len(self.shape)):
            dim = _check_dim_arg(self, dim, "is_even")
        dims = range(self.ndim) if dim is None else [dim]
        return all(
            not isinstance(self.dims[d], ChunkProgram)
            and _product(f.size for f in self.dims[d]) == self.shape[d]
            for d in dims
        )

    def axes_used(self) -> tuple:
        """Mesh axes some dim is sharded on, in mesh order."""
        used = {f.axis for fs in self.dims for f in fs if f.axis}
        return tuple(n for n in self.mesh.names if n in used)

    def replicated_axes(self) -> tuple:
        """Mesh axes that neither shard a dim nor hold partial values."""
        used = set(self.axes_used()) | {a for a, _ in self.partial}
        return tuple(n for n in self.mesh.names if n not in used)

    def axis_pieces(self, axis: str) -> list:
        """``[(dim, level, Factor)]`` of the pieces of ``axis`` used by the dims, major first."""
        if axis not in self.mesh.names:
            self.mesh.axis_index(axis)  # the MeshError naming the mesh's axes
        out = [
            (d, j, f)
            for d, fs in enumerate(self.dims)
            for j, f in enumerate(fs)
            if f.axis == axis
        ]
        return sorted(out, key=lambda t: t[2].pre)

    def with_partial(self, partial) -> "Sharding":
        """Same factors, other partial axes. ``s.with_partial({"tp": "sum"})``."""
        return Sharding(self.mesh, self.shape, self.dims, partial, self.stream)

    def with_stream(self, dim: int, k: int, outer: int | None = None) -> "Sharding":
        """This sharding with dim ``dim`` run in ``k`` stream chunks (``stream``): chunk ``j`` the
        ``j``-th part of each of the dim's ``outer`` outer blocks — by default the blocks of its
        mesh-axis factors (every rank's shard cut in ``k``: each chunk's collective spans every
        rank). Raises ShardingSpecError when a mesh axis factor lies inside the chunks or the sizes
        do not divide. ``Sharding.parse("[tp*512, 32]", m).with_stream(0, 8) -> [tp*~8*64, 32]``"""
        d = _check_dim_arg(self, dim, "with_stream")
        if outer is None:
            fs = self.dims[d] if not isinstance(self.dims[d], ChunkProgram) else ()
            last = max((i for i, f in enumerate(fs) if f.axis is not None), default=-1)
            outer = _product(f.size for f in fs[: last + 1])
        return Sharding(self.mesh, self.shape, self.dims, self.partial, (d, outer, k))

    @property
    def stream_axis(self):
        """The mesh-axis factor a **ring** stream runs over (its ``k`` chunks are that factor's
        blocks: chunk ``j`` is rank ``j``'s shard along it), or None (no stream, or chunks cut from
        local factors). ``Sharding.parse("[~tp*64]", "tp=8").stream_axis -> Factor(8, 'tp')``"""
        if not self.stream:
            return None
        d, outer, k = self.stream
        mid = stream_parts(self.dims[d], self.shape[d], outer, k)[1]
        return mid if mid.axis is not None else None

    def without_stream(self) -> "Sharding":
        """The same layout, no stream. ``Sharding.parse("[tp*~8*64]", m).without_stream() -> [tp*512]``"""
        if not self.stream:
            return self
        return _built(Sharding, self.mesh, self.shape, self.dims, self.partial)

    # -- conversions and shards (placements.py, shards.py) ----------------------------------
    @staticmethod
    def parse(text: str, mesh: Mesh) -> "Sharding":
        """Read the text form. ``Sharding.parse("[dp*4, tp*3] +sum(x)", mesh)``; ``mesh`` is a Mesh
        or its text (``Sharding.parse("[dp*4]", "dp=2")``)."""
        return parse_sharding(text, mesh)

    @staticmethod
    def replicated(mesh: Mesh, shape) -> "Sharding":
        """Every device holds the whole tensor. ``Sharding.replicated(mesh, (8, 12))``."""
        return Sharding(mesh, shape)

    @classmethod
    def from_placements(cls, mesh: Mesh, shape, placements) -> "Sharding":
        """From DTensor placements, one per mesh dim (DTensor semantics exactly).

        ``Sharding.from_placements(mesh, (8, 12), ["S(0)", "S(1)"])``
        """
        mesh = as_mesh(mesh, "Sharding.from_placements")
        return cls(mesh, *parts_from_placements(mesh, shape, placements))

    def to_placements(self) -> tuple:
        """DTensor placements as strings (``"R"``, ``"S(d)"``, ``"SS(d,sf)"``, ``"P(op)"``)."""
        return to_placements(self)

    def to_dtensor(self) -> list:
        """DTensor placement objects (needs torch). ``s.to_dtensor() -> [Shard(0), ...]``."""
        return to_dtensor(self)

    @classmethod
    def from_partition_spec(cls, mesh: Mesh, shape, spec) -> "Sharding":
        """From a JAX PartitionSpec (per dim: None, an axis, or a tuple of axes, major first)."""
        mesh = as_mesh(mesh, "Sharding.from_partition_spec")
        return cls(mesh, *parts_from_partition_spec(mesh, shape, spec))

    def to_partition_spec(self) -> tuple:
        """JAX PartitionSpec entries, sub-axes in Shardy's notation ``'x:(1)2'``."""
        return to_partition_spec(self)

    def local_shape(self, rank: int) -> tuple:
        """Shape of the piece ``rank`` holds. ``Sharding.parse("[x*4]", m).local_shape(0) -> (4,)``."""
        return local_shape(self, rank)

    def indices(self, rank: int) -> tuple:
        """Global indices (one int array per dim) of the piece ``rank`` holds, in local order."""
        return local_indices(self, rank)

    def layout(self):
        """CuTe layout ``((local dims), (mesh axes)) -> global row-major offset`` (even only)."""
        return sharding_layout(self)

    def shard(self, array) -> dict:
        """Split a global array into ``{rank: local piece}``."""
        return shard(self, array)

    def unshard(self, pieces, tolerance: float = 0.0):
        """Reassemble ``{rank: local piece}`` (reduces partial axes; replicas must agree)."""
        return unshard(self, pieces, tolerance)


# ------------------------------------------------------------------------------------------
# validation and canonical form
# ------------------------------------------------------------------------------------------


MAX_DIM = (1 << 63) - 1  # torch's int64 sizes: beyond it a shape is absurd


_set_hash = Sharding.__dict__["_hash"].__set__  # the slot's own setter: half of object.__setattr__'s cost


class _Fields:
    """Sharding's slots without its guard against assignment: ``_built`` fills one with plain
    attribute stores and then makes it a Sharding (``__class__`` assignment; the layouts are the
    same), a third of the cost of ``object.__setattr__`` per field. Never seen outside ``_built``."""

    __slots__ = Sharding.__slots__


def _built(cls, mesh: Mesh, shape: tuple, dims: tuple, partial: tuple, stream: tuple = ()) -> Sharding:
    """A Sharding of canonical fields, set without checks (``Sharding._trusted`` and friends)."""
    if cls is not Sharding:  # a subclass may have slots of its own: field by field
        obj = object.__new__(cls)
        for name, value in zip(Sharding.__slots__, (mesh, shape, dims, partial, stream, None)):
            object.__setattr__(obj, name, value)
        return obj
    obj = _Fields()
    obj.mesh = mesh
    obj.shape = shape
    obj.dims = dims
    obj.partial = partial
    obj.stream = stream
    obj._hash = None
    obj.__class__ = Sharding
    return obj


def _check_stream(mesh: Mesh, shape: tuple, dims: tuple, stream) -> tuple:
    """``stream`` as ``()`` or ``(dim, outer, k)``, checked: an even dim whose ``outer`` outer
    blocks are each cut in ``k`` chunks of local factors only, or of exactly one mesh-axis factor
    of size ``k`` (a ring; ``factors.stream_parts``)."""
    if stream is None or stream == ():
        return ()
    if not (isinstance(stream, tuple) and len(stream) == 3 and all(type(x) is int for x in stream)):
        raise ShardingSpecError(f"Sharding: stream {reprlib.repr(stream)} is not (dim, outer, k); e.g. (0, 2, 8) for "
                                "'[tp*~8*64]', or () for none")
    d, outer, k = stream
    if not 0 <= d < len(shape):
        raise ShardingSpecError(f"Sharding: stream dim {d} is out of range for a tensor of {len(shape)} dims")
    if k < 2:
        raise ShardingSpecError(f"Sharding: a stream of {k} chunk(s) is no stream; give k >= 2, or no stream")
    fs = dims[d]
    if isinstance(fs, ChunkProgram) or _product(f.size for f in fs) != shape[d]:
        raise ShardingSpecError(f"Sharding: stream ~{k} on dim {d} (size {shape[d]}), which is cut unevenly; stream "
                                "chunks cut an even dim")
    if stream_parts(fs, shape[d], outer, k) is None:
        shown = "*".join(_fmt_factor(f, mesh) for f in fs) or "1"
        raise ShardingSpecError(
            f"Sharding: dim {d} ({shown}, size {shape[d]}) cannot run in {k} stream chunks of each of its {outer} "
            f"outer block(s): the chunks must cut local factors only, right after the outer blocks, and divide "
            f"them (e.g. write ~{k} right after the dim's mesh axes: 'tp*~{k}*...'), or be exactly the blocks of "
            f"one mesh axis of size {k} there (a ring: '~tp*...')")
    return (d, outer, k)


def _trusted_dim(mesh: Mesh, shape: tuple, d: int, fs):
    """Dim ``d``'s factors ``fs`` (known valid) in canonical form: size-1 factors dropped, even
    dims merged, an uneven dim's trailing local factors re-derived."""
    if type(fs) is ChunkProgram:
        return fs
    kept, p = [], 1  # size-1 factors dropped (a loop: a comprehension is a call of its own)
    for f in fs:
        if f[0] != 1:  # f.size
            kept.append(f)
            p *= f[0]
    fs = kept
    n = shape[d]
    if p == n:
        return tuple(_merge_even(fs, mesh))
    # uneven: local factors after the last axis factor only enumerate their range;
    # _canonical_dim then, without its checks (the factors are valid): the innermost local
    # factor is the extent the axis factors leave (chain_extent), the dim merged if that is even
    while fs and fs[-1][1] is None:
        fs.pop()
    ext, p = n, 1
    for f in fs:
        ext = -(-ext // f[0])
        p *= f[0]
    if ext > 1:
        fs.append(tuple.__new__(Factor, (ext, None, 1)))
        p *= ext
    return tuple(_merge_even(fs, mesh)) if p == n else tuple(fs)


def _check_dim_arg(s: Sharding, dim, where: str) -> int:
    """``dim`` as a dim of ``s`` (``-ndim <= dim < ndim``), or a ShardingSpecError naming it."""
    n = len(s.shape)
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or not -n <= dim < n:
        raise ShardingSpecError(f"{where}: dim {reprlib.repr(dim)} is not a dim of {s} ({n} dims); give an int "
                                f"from {-n} to {n - 1}, or None for every dim")
    return int(dim)


def _check_shape(shape) -> tuple:
    if isinstance(shape, int):
        shape = (shape,)
    try:
        shape = tuple(shape)
    except TypeError:
        raise ShardingSpecError(f"Sharding: shape {shape!r} is not a sequence of ints") from None
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1 or s > MAX_DIM:
            raise ShardingSpecError(
                f"Sharding: shape {shape} has size {s!r}; every dim must be a positive int (at most 2**63-1)"
            )
    return tuple(int(s) for s in shape)


def _as_factors(mesh: Mesh, factors, d: int) -> list:
    out = []
    for f in factors:
        if type(f) is not Factor and isinstance(f, int) and not isinstance(f, bool):
            f = Factor(f)
        elif type(f) is not Factor and isinstance(f, str):
            f = Factor(mesh.axis_size(f), f) if f in mesh.names else parse_factor(f, mesh)
        elif type(f) is not Factor and isinstance(f, tuple) and len(f) in (2, 3):
            f = Factor(*f)
        elif type(f) is not Factor:
            raise ShardingSpecError(f"dim {d}: {f!r} is not a factor (an int, an axis name or a Factor)")
        if isinstance(f.size, bool) or not isinstance(f.size, int) or f.size < 1:
            raise ShardingSpecError(f"dim {d}: factor size {f.size!r} is not a positive int")
        if isinstance(f.pre, bool) or not isinstance(f.pre, int):
            raise ShardingSpecError(f"dim {d}: factor {tuple(f)!r} has pre {f.pre!r}, not an int; pre is the "
                                    "positive int size of the sub-axes before this piece (1 for a whole axis)")
        if f.axis is not None:
            n = mesh.axis_size(f.axis)
            if f.pre < 1 or n % (f.pre * f.size):
                raise ShardingSpecError(
                    f"dim {d}: factor {_fmt_factor(f, mesh)} does not fit axis {f.axis!r} of size "
                    f"{n}: a sub-axis '{f.axis}:(m)k' needs m*k to divide {n}"
                )
        out.append(f)
    return out


def _check_program(mesh: Mesh, d: int, prog: ChunkProgram) -> ChunkProgram:
    for st in prog:
        if type(st) is not Step or st.axis is None or st.size != mesh.axis_size(st.axis):
            raise ShardingSpecError(f"dim {d}: {st!r} is not a step on a whole mesh axis")
        if isinstance(st.sf, bool) or not isinstance(st.sf, int) or not 1 <= st.sf <= MAX_SPLIT_FACTOR:
            raise ShardingSpecError(f"dim {d}: split factor {reprlib.repr(st.sf)} of {st.axis} must be an int in "
                                    f"[1, {MAX_SPLIT_FACTOR}], as SS(d,sf) takes")
    return prog


def _check_partial(mesh: Mesh, partial) -> tuple:
    if isinstance(partial, dict):
        items = list(partial.items())
    elif isinstance(partial, str):
        items = [(partial, "sum")]
    else:
        items = [(p, "sum") if isinstance(p, str) else tuple(p) for p in partial]
    seen = {}
    for axis, op in items:
        mesh.axis_index(axis)
        if op not in REDUCE_OPS:
            raise ShardingSpecError(
                f"partial axis {axis!r}: reduce op {op!r} is not one of {', '.join(REDUCE_OPS)}"
            )
        if axis in seen:
            raise ShardingSpecError(f"partial axis {axis!r} given twice")
        seen[axis] = op
    return tuple((n, seen[n]) for n in mesh.names if n in seen)


def _check_axis_use(mesh: Mesh, dims: tuple, partial: tuple) -> None:
    pieces: dict = {}
    for d, fs in enumerate(dims):
        for f in fs:
            if f.axis is not None:
                pieces.setdefault(f.axis, []).append((f.pre, f.size, d))
    for axis, ps in pieces.items():
        ps.sort()
        for (p1, s1, d1), (p2, s2, d2) in zip(ps, ps[1:]):
            if p2 < p1 * s1 or p2 % (p1 * s1):
                what = (
                    f"axis {axis!r} is used twice (dims {d1} and {d2})"
                    if (p1, s1) == (p2, s2) == (1, mesh.axis_size(axis))
                    else f"sub-axes {axis}:({p1}){s1} (dim {d1}) and {axis}:({p2}){s2} (dim {d2}) overlap"
                )
                raise ShardingSpecError(
                    f"{what}; a mesh axis, or each piece of it, can shard only one place — "
                    "use another axis or split it into disjoint sub-axes"
                )
    for axis, _ in partial:
        if axis in pieces:
            raise ShardingSpecError(
                f"axis {axis!r} both shards a dim and holds partial values; an axis is one or the other"
            )


# ------------------------------------------------------------------------------------------
# text form
# ------------------------------------------------------------------------------------------


def format_dim(s: Sharding, d: int) -> str:
    """Text of one dim: ``dp*4``, ``2*tp*2``, ``dp*tp*3 of 9`` (uneven), ``tp*~8*64`` (a stream).
    ``format_dim(s, 0)``."""
    fs = s.dims[d]
    if s.stream and s.stream[0] == d:
        pre, mid, post = stream_parts(fs, s.shape[d], s.stream[1], s.stream[2])
        return "*".join([_fmt_factor(f, s.mesh) for f in pre] + ["~" + (_fmt_factor(mid, s.mesh) if mid.axis else
                                                                        str(s.stream[2]))]
                        + [_fmt_factor(f, s.mesh) for f in post])
    if isinstance(fs, ChunkProgram):
        steps = ", ".join(st.axis + (f"/{st.sf}" if st.sf != 1 else "") for st in fs)
        return f"chunks({steps}) of {s.shape[d]}"
    body = "*".join(_fmt_factor(f, s.mesh) for f in fs) or "1"
    if _product(f.size for f in fs) != s.shape[d]:
        body += f" of {s.shape[d]}"
    return body


def format_sharding(s: Sharding) -> str:
    """``[dp*4, tp*3] +sum(x)``: the round-trippable text form."""
    text = "[" + ", ".join(format_dim(s, d) for d in range(s.ndim)) + "]"
    ops: dict = {}
    for axis, op in s.partial:
        ops.setdefault(op, []).append(axis)
    for op in REDUCE_OPS:
        if op in ops:
            text += f" +{op}({','.join(ops[op])})"
    return text


def split_top_level(inner: str) -> list:
    """Split at commas outside brackets. ``split_top_level("a,(b,c)") -> ['a', '(b,c)']``."""
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        depth += ch in "(["
        depth -= ch in ")]"
        cur += ch
    if cur.strip() or parts:
        parts.append(cur.strip())
    return parts


def parse_sharding(text: str, mesh: Mesh) -> Sharding:
    """Read ``[dp*4, tp*3] +sum(x)``; uneven dims carry their size: ``[dp*tp*3 of 9]``."""
    if not isinstance(mesh, Mesh):
        mesh = as_mesh(mesh, "Sharding.parse")
    if not isinstance(text, str):
        raise ShardingSpecError(f"Sharding.parse: got {type(text).__name__} {reprlib.repr(text)}, not text; write e.g. "
                                "'[dp*4, tp*3]' (a Sharding is used as it is, not parsed)")
    src = text
    text = text.strip()
    if not text.isascii():  # Python's int() would read '٨' or '８' as 8
        raise ShardingSpecError(f"Sharding.parse: {src!r} has a non-ASCII character; write sizes with 0-9")
    if not text.startswith("[") or "]" not in text:
        raise ShardingSpecError(
            f"Sharding.parse: {src!r} is not '[dim, dim, ...]', e.g. '[dp*4, tp*3]' or '[8, 12] +sum(tp)'"
        )
    close = text.index("]")
    inner, rest = text[1:close], text[close + 1 :].strip()
    dims, shape, stream = [], [], ()
    parts = split_top_level(inner)
    for d, part in enumerate(parts):
        if not part:
            raise ShardingSpecError(f"Sharding.parse: dim {d} of {src!r} is empty")
        size = None
        if " of " in part:
            part, size_text = part.rsplit(" of ", 1)
            if not size_text.strip().isdigit():
                raise ShardingSpecError(f"Sharding.parse: dim {d} size {size_text!r} is not an int")
            if len(size_text.strip()) > 19:  # past int64 (and past int()'s 4300 digits): refused unread
                raise ShardingSpecError(f"Sharding.parse: dim {d} size {size_text.strip()[:20]}... "
                                        f"({len(size_text.strip())} digits) is more than 2**63-1; give a real size")
            size = int(size_text)
        if part.startswith("chunks("):
            if size is None or not part.endswith(")"):
                raise ShardingSpecError(
                    f"Sharding.parse: dim {d} {part!r} reads 'chunks(a/2, b) of N' (N required)"
                )
            steps = []
            for x in part[len("chunks(") : -1].split(","):
                name, _, sf = x.strip().partition("/")
                if sf and not sf.strip().isdigit():
                    raise ShardingSpecError(f"Sharding.parse: split factor {sf!r} is not an int")
                if len(sf.strip()) > 19:  # past int64 (and past int()'s 4300 digits): refused unread
                    digits = sf.strip()
                    shown = digits if len(digits) <= 40 else f"{digits[:20]}... ({len(digits)} digits)"
                    raise ShardingSpecError(f"Sharding.parse: split factor {shown} of {name.strip()} must be an int "
                                            f"in [1, {MAX_SPLIT_FACTOR}], as SS(d,sf) takes")
                steps.append(Step(mesh.axis_size(name.strip()), name.strip(), 1, int(sf or 1)))
            dims.append(ChunkProgram(steps))
            shape.append(size)
            continue
        tokens = part.split("*")
        marks = [i for i, x in enumerate(tokens) if x.strip().startswith("~")]
        if marks:  # a stream factor ~k: the dim's index range in k chunks (Sharding.stream)
            if len(marks) > 1 or stream or size is not None:
                raise ShardingSpecError(f"Sharding.parse: {src!r} has more than one stream factor ~k, or one in an "
                                        "uneven dim; give one ~k, in an even dim, e.g. '[tp*~4*16, 32]'")
            k_text = tokens[marks[0]].strip()[1:].strip()
            ring = k_text.split(":")[0] in mesh.names  # ~tp: a ring, the chunks are the axis's blocks
            if not ring and (not k_text.isdigit() or len(k_text) > 18):
                raise ShardingSpecError(f"Sharding.parse: stream factor {tokens[marks[0]].strip()!r} in {src!r} is "
                                        f"not ~k with k an int, e.g. ~4, nor ~axis (a ring) with an axis of {mesh}")
            mid = parse_factor(k_text, mesh) if ring else Factor(int(k_text))
            before = [parse_factor(x, mesh) for x in tokens[: marks[0]]]
            stream = (d, _product(f.size for f in before), mid.size)
            fs = before + [mid] + [parse_factor(x, mesh) for x in tokens[marks[0] + 1:]]
        else:
            fs = [parse_factor(x, mesh) for x in tokens]
        dims.append(fs)
        shape.append(size if size is not None else _product(f.size for f in fs))
    partial = []
    for m in re.finditer(r"\+\s*([a-z]+)\s*\(([^)]*)\)", rest):
        op = m.group(1)
        if not m.group(2).strip():
            raise ShardingSpecError(f"Sharding.parse: {m.group(0)!r} in {src!r} names no mesh axis; write the partial "
                                    f"axes inside, e.g. '+{op}(tp)', or drop it")
        for a in m.group(2).split(","):
            if a.strip():
                partial.append((a.strip(), op))
    leftover = re.sub(r"\+\s*([a-z]+)\s*\(([^)]*)\)", "", rest).strip()
    if leftover:
        raise ShardingSpecError(
            f"Sharding.parse: unexpected {leftover!r} after the dims in {src!r}; partial axes read '+sum(tp)'"
        )
    return Sharding(mesh, tuple(shape), dims, partial, stream)


def _restore(mesh, shape, dims, partial, stream=()) -> Sharding:
    """A pickled Sharding (its fields were canonical when it was pickled)."""
    return _built(Sharding, mesh, shape, dims, partial, stream)
