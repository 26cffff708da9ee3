"""IterDomains and their transforms: nvFuser's view of a tensor's index space.

An ``IterDomain`` is one index range (an extent) with a parallel type. A ``TensorDomain``
keeps three lists of them and the transforms between the lists:

    root     the dims before a reshape or slice (the same as logical for most tensors)
    logical  the tensor's dims (the global shape, plus reduction IDs of a reduction output)
    loop     how the dims are iterated and parallelized: logical IDs split and merged

Transforms follow nvFuser (``doc/reading/iterdomain.md``): ``split(I, f, inner)`` pads with
ceil-div, ``[f, ceilDiv(n, f)]`` for an outer split and ``[ceilDiv(n, f), f]`` for an inner
one, and the index of ``I`` is ``outer * inner.extent + inner`` (out of bounds past ``n``);
``merge(O, I)`` has extent ``O * I`` and index ``o * I.extent + i``; ``resize(I, l, r)`` has
extent ``n + l + r`` and shifts the index by ``l`` (a slice has negative ``l, r``, a pad
positive ones). A cat is recorded as one ``Resize`` per input, *from* the cat's output ID
*to* that input's ID: input k is the slice ``[off_k, off_k + n_k)`` of the output, the
inverse of nvFuser's pad, so every ID keeps one definition per tensor.

A Sharding is a loop domain (``loop_domain_of``): each dim outer-split into its factors,
each factor's ID parallelized on its mesh axis or sub-axis. ``sharding_of`` reads it back.

Every extent computation and precondition goes through ``_mul``, ``_add``, ``_ceil_div``,
``_div_exact``, ``divides`` and ``equal`` so that symbolic extents can replace the ints:
with a ``facts`` object (``divides(m, e)``, ``equal(a, b)`` -> True/False/None) the checks
delegate to it.

    >>> td = TensorDomain.create("t", (10,)).outer_split(0, 4)
    >>> [i.extent for i in td.loop], index_map(td)((3, 0)), index_map(td)((3, 1))
    ([4, 3], (9,), None)

(loop index ``(3, 1)`` reads ``3 * 3 + 1 = 10``, past the 10 elements: a padded hole.)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from enum import Enum
from functools import cache

from ..errors import DomainError
from ..mesh import Mesh
from ..sharding.core import Sharding
from ..sharding.factors import ChunkProgram, Factor, chunk_counts, stream_parts

# ------------------------------------------------------------------------------------------
# extent arithmetic: the one place that knows what an extent is
# ------------------------------------------------------------------------------------------


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@cache
def _symbolic_ceil_div():
    try:
        from ..symbolic import ceil_div  # optional: another package; plain operators work without it
    except Exception:  # the symbolic package is optional: plain operators still work
        return None
    return ceil_div


def _mul(a, b):
    """Product of two extents. ``_mul(2, 3) -> 6``."""
    return a * b


def _add(a, b):
    """Sum of two extents (or an extent and an offset). ``_add(6, -2) -> 4``."""
    return a + b


def _ceil_div(a, b):
    """``ceilDiv(a, b)`` of extents. ``_ceil_div(7, 2) -> 4``."""
    if _is_int(a) and _is_int(b):
        return -(-a // b)
    cd = _symbolic_ceil_div()
    return cd(a, b) if cd is not None else (a + b - 1) // b


def _div_exact(a, b):
    """``a / b`` when ``b`` divides ``a`` (checked when known). ``_div_exact(12, 4) -> 3``."""
    if divides(b, a) is False:
        raise DomainError(f"extent {a} is not divisible by {b}; divide only by a divisor")
    return a // b


def _const(x):
    """The int value of an int or of a constant symbolic extent, else None."""
    if _is_int(x):
        return x
    v = getattr(x, "constant_value", None)
    return v if _is_int(v) else None


def divides(m, e, facts=None):
    """True / False when ``m`` divides ``e`` is known, None when not. ``divides(2, 6) -> True``.

    With ``facts`` (a ``shardlayout.symbolic.FactBase``) the question goes to ``facts.divides``;
    without, a symbolic ``e`` is decided only when ``e % m`` is a constant."""
    mc, ec = _const(m), _const(e)
    if mc is not None and ec is not None:
        return mc != 0 and ec % mc == 0
    if facts is not None and mc is not None and mc > 0:
        return facts.divides(mc, e)
    r = _const(e % m) if mc != 0 else None
    return None if r is None else r == 0


def equal(a, b, facts=None):
    """True / False when ``a == b`` is known, None when not. ``equal(3, 3) -> True``.

    Symbolic extents are equal when their difference is a constant 0 (the same polynomial);
    beyond that ``facts.equal`` decides."""
    ac, bc = _const(a), _const(b)
    if ac is not None and bc is not None:
        return ac == bc
    d = _const(a - b)
    if d is not None:
        return d == 0
    return facts.equal(a, b) if facts is not None else None


def _le(a, b, facts=None):
    """``a <= b`` when known (constants, or ``facts.le``), None otherwise."""
    ac, bc = _const(a), _const(b)
    if ac is not None and bc is not None:
        return ac <= bc
    d = _const(b - a)
    if d is not None:
        return d >= 0
    le = getattr(facts, "le", None)
    return le(a, b) if le is not None else None


def _as_int(x, what: str) -> int:
    v = _const(x)
    if v is not None:
        return v
    raise DomainError(f"{what} has the symbolic extent {x}; enumeration needs concrete ints: bind the symbols first")


def _check_extent(x, what: str):
    if isinstance(x, bool) or (_const(x) is not None and _const(x) < 1):
        raise DomainError(f"{what}: extent {x!r} must be a positive int (or a symbolic extent)")
    if not _is_int(x) and not hasattr(x, "__floordiv__"):
        raise DomainError(f"{what}: extent {x!r} is neither an int nor a symbolic extent")
    return x


# ------------------------------------------------------------------------------------------
# parallel types and IterDomains
# ------------------------------------------------------------------------------------------


class Kind(Enum):
    """What runs an ID's iterations: a loop, devices along a mesh axis, or streams.
    ``ParallelType.device("tp").kind -> Kind.DEVICE``"""

    SERIAL = "serial"
    DEVICE = "device"
    STREAM = "stream"


@dataclass(frozen=True)
class ParallelType:
    """``ParallelType.device("tp")`` (a whole mesh axis, nvFuser's DIDx-like),
    ``ParallelType.device("tp", pre=2, size=2)`` (the sub-axis ``tp:(2)2``), ``SERIAL``, ``STREAM``."""

    kind: Kind = Kind.SERIAL
    axis: str | None = None
    pre: int = 1
    size: int | None = None

    def __post_init__(self):
        if (self.kind is Kind.DEVICE) != (self.axis is not None):
            raise DomainError(f"ParallelType: kind {self.kind.value} with axis {self.axis!r}; only a device "
                              "type names a mesh axis (use ParallelType.device(axis))")
        if not _is_int(self.pre) or self.pre < 1 or (self.size is not None and (not _is_int(self.size)
                                                                               or self.size < 1)):
            raise DomainError(f"ParallelType: sub-axis pre={self.pre!r} size={self.size!r} must be positive ints")

    @staticmethod
    def device(axis: str, pre: int = 1, size: int | None = None) -> "ParallelType":
        """Devices along ``axis`` (or its piece of ``size`` after ``pre``). ``ParallelType.device("tp")``."""
        return ParallelType(Kind.DEVICE, axis, pre, size)

    @property
    def is_device(self) -> bool:
        """True for a mesh axis or sub-axis. ``ParallelType.device("x").is_device -> True``."""
        return self.kind is Kind.DEVICE

    def axis_size(self, mesh: Mesh) -> int:
        """Devices this type spans on ``mesh``. ``ParallelType.device("tp").axis_size(Mesh.parse("tp=4")) -> 4``."""
        n = mesh.axis_size(self.axis)
        size = n // self.pre if self.size is None else self.size
        if n % (self.pre * size):
            raise DomainError(f"{self}: sub-axis (pre {self.pre}, size {size}) does not fit axis {self.axis!r} "
                              f"of size {n}; pre*size must divide it")
        return size

    def __str__(self) -> str:
        if self.kind is not Kind.DEVICE:
            return self.kind.value
        if self.pre == 1 and self.size is None:
            return self.axis
        return f"{self.axis}:({self.pre}){'*' if self.size is None else self.size}"


SERIAL = ParallelType()
STREAM = ParallelType(Kind.STREAM)


@dataclass(frozen=True)
class IterDomain:
    """One index range: ``IterDomain("t.0", 8)``; ``id`` is unique in a program (tensor name
    first), ``ptype`` says what runs it; reduction, broadcast and partial IDs are marked.

    A reduction ID on a device axis (nvFuser's ``r{DIDx}``) is reduced: the op that makes it
    sums across the devices (an allreduce or reduce-scatter), so the tensor is replicated
    there. A *partial* ID (``p``) is the other state, the per-device partial sums that a later
    reduction adds up (nvFuser's rfactor product on a device axis; DTensor's ``Partial``)."""

    id: str
    extent: object
    ptype: ParallelType = SERIAL
    is_reduction: bool = False
    is_broadcast: bool = False
    is_partial: bool = False

    def __post_init__(self):
        if not isinstance(self.id, str) or not self.id:
            raise DomainError(f"IterDomain: id {self.id!r} must be a non-empty string such as 't.0'")
        _check_extent(self.extent, f"IterDomain {self.id}")
        if not isinstance(self.ptype, ParallelType):
            raise DomainError(f"IterDomain {self.id}: ptype {self.ptype!r} is not a ParallelType")
        if self.is_broadcast and equal(self.extent, 1) is False:
            raise DomainError(f"IterDomain {self.id}: a broadcast ID has extent 1, not {self.extent}")
        if self.is_partial and (self.is_reduction or self.is_broadcast):
            raise DomainError(f"IterDomain {self.id}: a partial ID holds pending partial sums; it is neither a "
                              "reduction (already summed) nor a broadcast ID: mark one of them")

    def parallelize(self, ptype: ParallelType) -> "IterDomain":
        """The same ID run by ``ptype``. ``IterDomain("t.0", 2).parallelize(ParallelType.device("x"))``."""
        return replace(self, ptype=ptype)

    def __str__(self) -> str:
        tag = "r" if self.is_reduction else "b" if self.is_broadcast else "p" if self.is_partial else ""
        par = "" if self.ptype == SERIAL else f"@{self.ptype}"
        return f"{tag}{self.id}{{{self.extent}}}{par}"


# ------------------------------------------------------------------------------------------
# transforms: frozen records of their inputs and outputs
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    """``input`` split by ``factor``: inner split ``[ceilDiv(n, f), f]``, outer ``[f, ceilDiv(n, f)]``."""

    input: IterDomain
    outer: IterDomain
    inner: IterDomain
    factor: object
    inner_split: bool

    @property
    def inputs(self) -> tuple:
        """``(input,)``."""
        return (self.input,)

    @property
    def outputs(self) -> tuple:
        """``(outer, inner)``."""
        return (self.outer, self.inner)


@dataclass(frozen=True)
class Merge:
    """``outer`` and ``inner`` merged into ``output`` of extent ``outer * inner``."""

    outer: IterDomain
    inner: IterDomain
    output: IterDomain

    @property
    def inputs(self) -> tuple:
        """``(outer, inner)``."""
        return (self.outer, self.inner)

    @property
    def outputs(self) -> tuple:
        """``(output,)``."""
        return (self.output,)


@dataclass(frozen=True)
class Resize:
    """``output`` index ``j`` is ``input`` index ``j - left``; extent ``n + left + right``.
    ``kind`` says where it comes from: ``"slice"``, ``"pad"`` or ``"cat"`` (output -> input)."""

    input: IterDomain
    output: IterDomain
    left: object
    right: object
    kind: str = "pad"

    @property
    def inputs(self) -> tuple:
        """``(input,)``."""
        return (self.input,)

    @property
    def outputs(self) -> tuple:
        """``(output,)``."""
        return (self.output,)


def split(iid: IterDomain, factor, inner: bool) -> Split:
    """Split ``iid`` by ``factor`` (ceil-div, padded). ``split(IterDomain("t.0", 10), 4, False).inner.extent -> 3``."""
    _check_extent(factor, f"split of {iid.id}")
    rest = _ceil_div(iid.extent, factor)
    o_ext, i_ext = (rest, factor) if inner else (factor, rest)
    mark = dict(is_reduction=iid.is_reduction, is_partial=iid.is_partial)
    return Split(iid, IterDomain(iid.id + ".o", o_ext, **mark), IterDomain(iid.id + ".i", i_ext, **mark), factor, inner)


def merge(outer: IterDomain, inner: IterDomain) -> Merge:
    """Merge two IDs. ``merge(IterDomain("t.0", 3), IterDomain("t.1", 10)).output.extent -> 30``."""
    if outer.is_reduction != inner.is_reduction or outer.is_partial != inner.is_partial:
        kind = "reduction" if outer.is_reduction or inner.is_reduction else "partial"
        raise DomainError(f"merge({outer}, {inner}): a {kind} ID merges only with a {kind} ID")
    out = IterDomain(f"({outer.id}*{inner.id})", _mul(outer.extent, inner.extent), is_reduction=outer.is_reduction,
                     is_partial=outer.is_partial)
    return Merge(outer, inner, out)


def resize(iid: IterDomain, left, right, kind: str = "pad", out_id: str | None = None) -> Resize:
    """Expand ``iid`` by ``left`` / ``right`` (negative: a slice).
    ``resize(IterDomain("t.0", 8), -2, -1).output.extent -> 5``"""
    ext = _add(_add(iid.extent, left), right)
    if _is_int(ext) and ext < 1:
        raise DomainError(f"resize of {iid} by ({left}, {right}) leaves extent {ext}; keep at least one element")
    return Resize(iid, IterDomain(out_id or iid.id + "~", ext), left, right, kind)


def cat(ids, out: IterDomain) -> tuple:
    """A cat of ``ids`` (one dim) into ``out``: one ``Resize`` per input, from ``out`` to the input
    (input k is the slice ``[off_k, off_k + n_k)`` of ``out``). ``cat([a, b], o)`` -> 2 Resizes."""
    ids = tuple(ids)
    total = ids[0].extent
    for i in ids[1:]:
        total = _add(total, i.extent)
    if equal(total, out.extent) is False:
        raise DomainError(f"cat into {out}: the inputs add up to {total}, not {out.extent}")
    records, off = [], 0
    for i in ids:
        end = _add(off, i.extent)
        records.append(Resize(out, i, _mul(-1, off), _add(end, _mul(-1, out.extent)), "cat"))
        off = end
    return tuple(records)


# ------------------------------------------------------------------------------------------
# TensorDomain
# ------------------------------------------------------------------------------------------


def _check_pos(pos: int, n: int, what: str) -> int:
    if isinstance(pos, bool) or not isinstance(pos, int) or not -n <= pos < n:
        raise DomainError(f"{what}: position {pos!r} is outside the loop domain of {n} IDs (0..{n - 1})")
    return pos % n


@dataclass(frozen=True)
class TensorDomain:
    """A tensor's root, logical and loop domains with the transforms between them (immutable).
    ``TensorDomain.create("t", (8, 12)).outer_split(0, 2).parallelize(0, ParallelType.device("dp"))``."""

    name: str
    root: tuple
    logical: tuple
    loop: tuple
    logical_exprs: tuple = ()
    loop_exprs: tuple = ()
    mesh: Mesh | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or " " in self.name:
            raise DomainError(f"TensorDomain: name {self.name!r} must be a non-empty word such as 'tv0'")
        for field_name in ("root", "logical", "loop"):
            ids = tuple(getattr(self, field_name))
            object.__setattr__(self, field_name, ids)
            bad = [i for i in ids if not isinstance(i, IterDomain)]
            if bad:
                raise DomainError(f"TensorDomain {self.name}: {field_name} holds {bad[0]!r}, not an IterDomain")
            if len({i.id for i in ids}) != len(ids):
                raise DomainError(f"TensorDomain {self.name}: {field_name} repeats an ID ({[i.id for i in ids]})")
        object.__setattr__(self, "logical_exprs", tuple(self.logical_exprs))
        object.__setattr__(self, "loop_exprs", tuple(self.loop_exprs))

    @staticmethod
    def create(name: str, shape, mesh: Mesh | None = None, reductions=(), broadcasts=(),
               partials=()) -> "TensorDomain":
        """Logical = root = loop = one serial ID per dim, ids ``name.k``; the positions in
        ``reductions`` / ``broadcasts`` / ``partials`` are marked so. ``TensorDomain.create("t", (8, 12))``."""
        if _is_int(shape) or not hasattr(shape, "__iter__"):
            shape = (shape,)
        red, bc, part = set(reductions), set(broadcasts), set(partials)
        ids = tuple(IterDomain(f"{name}.{k}", e, is_reduction=k in red, is_broadcast=k in bc, is_partial=k in part)
                    for k, e in enumerate(shape))
        return TensorDomain(name, ids, ids, ids, mesh=mesh)

    # -- facts --------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        """Extents of the tensor's dims: the logical IDs that are neither reduction nor partial.
        ``TensorDomain.create("t", (8, 12)).shape -> (8, 12)``."""
        return tuple(i.extent for i in self.logical if not (i.is_reduction or i.is_partial))

    def current(self, iid) -> IterDomain:
        """The ID with this id as the domain holds it now (loop first, with its parallel type)."""
        key = iid.id if isinstance(iid, IterDomain) else iid
        for ids in (self.loop, self.logical, self.root):
            for i in ids:
                if i.id == key:
                    return i
        for e in self.logical_exprs + self.loop_exprs:
            for i in e.inputs + e.outputs:
                if i.id == key:
                    return i
        raise DomainError(f"TensorDomain {self.name} has no ID {key!r}; its loop is {[i.id for i in self.loop]}")

    def position(self, iid) -> int:
        """Loop position of an ID. ``TensorDomain.create("t", (8,)).position("t.0") -> 0``."""
        key = iid.id if isinstance(iid, IterDomain) else iid
        for k, i in enumerate(self.loop):
            if i.id == key:
                return k
        raise DomainError(f"{key!r} is not in the loop domain of {self.name} ({[i.id for i in self.loop]}); "
                          "it was split or merged already")

    def device_ids(self) -> tuple:
        """Loop IDs on a mesh axis, loop order. ``loop_domain_of(s).device_ids()``."""
        return tuple(i for i in self.loop if i.ptype.is_device)

    def is_sharded(self) -> bool:
        """nvFuser's ``isSharded``: some loop ID that is not a reduction runs on a mesh axis (``r{DIDx}``
        is reduced, hence replicated); two such IDs on one parallel type is an error.
        ``loop_domain_of(Sharding.parse("[x*2]", Mesh.parse("x=2"))).is_sharded() -> True``"""
        seen: dict = {}
        for i in self.loop:
            if i.ptype.is_device and not i.is_reduction:
                if i.ptype in seen:
                    raise DomainError(f"{self.name}: loop IDs {seen[i.ptype]} and {i} both run on {i.ptype}; a "
                                      "parallel type runs one loop ID of a tensor (split the axis into sub-axes)")
                seen[i.ptype] = i
        return bool(seen)

    # -- loop transforms ----------------------------------------------------------------------
    def split(self, pos: int, factor, inner: bool) -> "TensorDomain":
        """Split loop ID ``pos`` by ``factor``. ``TensorDomain.create("t", (8,)).split(0, 2, True)``."""
        pos = _check_pos(pos, len(self.loop), f"split of {self.name}")
        s = split(self.loop[pos], factor, inner)
        loop = self.loop[:pos] + (s.outer, s.inner) + self.loop[pos + 1 :]
        return replace(self, loop=loop, loop_exprs=self.loop_exprs + (s,))

    def outer_split(self, pos: int, factor) -> "TensorDomain":
        """``[n] -> [factor, ceilDiv(n, factor)]`` at ``pos``. ``TensorDomain.create("t", (8,)).outer_split(0, 2)``."""
        return self.split(pos, factor, inner=False)

    def inner_split(self, pos: int, factor) -> "TensorDomain":
        """``[n] -> [ceilDiv(n, factor), factor]`` at ``pos``. ``TensorDomain.create("t", (8,)).inner_split(0, 2)``."""
        return self.split(pos, factor, inner=True)

    def merge(self, pos: int) -> "TensorDomain":
        """Merge loop IDs ``pos`` and ``pos + 1``. ``TensorDomain.create("t", (2, 3)).merge(0)``."""
        pos = _check_pos(pos, len(self.loop), f"merge of {self.name}")
        if pos + 1 >= len(self.loop):
            raise DomainError(f"merge of {self.name} at {pos}: there is no loop ID after it to merge with")
        m = merge(self.loop[pos], self.loop[pos + 1])
        loop = self.loop[:pos] + (m.output,) + self.loop[pos + 2 :]
        return replace(self, loop=loop, loop_exprs=self.loop_exprs + (m,))

    def parallelize(self, pos: int, ptype: ParallelType) -> "TensorDomain":
        """Run loop ID ``pos`` by ``ptype``. ``td.parallelize(0, ParallelType.device("tp"))``."""
        pos = _check_pos(pos, len(self.loop), f"parallelize of {self.name}")
        if not isinstance(ptype, ParallelType):
            raise DomainError(f"parallelize of {self.name}: {ptype!r} is not a ParallelType "
                              "(use ParallelType.device('tp'), SERIAL or STREAM)")
        old = self.loop[pos]
        if ptype.is_device and self.mesh is not None:
            n = ptype.axis_size(self.mesh)
            if equal(old.extent, n) is False:
                raise DomainError(f"{self.name}: loop ID {old} has extent {old.extent} but {ptype} spans {n} devices; "
                                  f"split it by {n} first (outer_split({pos}, {n}))")
        new = old.parallelize(ptype)

        def swap(ids):
            return tuple(new if i.id == old.id else i for i in ids)

        return replace(self, root=swap(self.root), logical=swap(self.logical), loop=swap(self.loop))

    def with_mesh(self, mesh: Mesh | None) -> "TensorDomain":
        """The same domain placed on ``mesh``. ``td.with_mesh(Mesh.parse("x=2"))``."""
        return replace(self, mesh=mesh)

    def __str__(self) -> str:
        def show(ids):
            return "[" + ", ".join(map(str, ids)) + "]"

        root = "" if tuple(i.id for i in self.root) == tuple(i.id for i in self.logical) else f"root={show(self.root)} "
        return f"{self.name}: {root}logical={show(self.logical)} loop={show(self.loop)}"


# ------------------------------------------------------------------------------------------
# index maps (brute force)
# ------------------------------------------------------------------------------------------


def _walk_back(exprs, known: dict) -> dict | None:
    """From indices of the exprs' outputs to indices of their inputs (None: a padded hole)."""
    for e in reversed(exprs):
        if isinstance(e, Split):
            if e.outer.id not in known:
                continue
            x = known.pop(e.outer.id) * _as_int(e.inner.extent, str(e.inner)) + known.pop(e.inner.id)
            if x >= _as_int(e.input.extent, str(e.input)):
                return None
            known[e.input.id] = x
        elif isinstance(e, Merge):
            if e.output.id not in known:
                continue
            x, ie = known.pop(e.output.id), _as_int(e.inner.extent, str(e.inner))
            known[e.outer.id], known[e.inner.id] = divmod(x, ie)
        else:
            if e.output.id not in known:
                continue
            x = known.pop(e.output.id) - e.left
            if not 0 <= x < _as_int(e.input.extent, str(e.input)):
                return None
            known[e.input.id] = x
    return known


def index_map(domain: TensorDomain):
    """A function from a loop index tuple to the logical index tuple, or ``None`` for a
    padded hole of a ceil-div split. ``index_map(TensorDomain.create("t", (6,)).outer_split(0, 2))((1, 0)) -> (3,)``."""
    exts = [_as_int(i.extent, str(i)) for i in domain.loop]

    def f(loop_index) -> tuple | None:
        loop_index = tuple(loop_index)
        if len(loop_index) != len(exts) or not all(0 <= x < e for x, e in zip(loop_index, exts)):
            raise DomainError(f"loop index {loop_index} is outside the loop extents {exts} of {domain.name}")
        known = _walk_back(domain.loop_exprs, {i.id: x for i, x in zip(domain.loop, loop_index)})
        if known is None:
            return None
        return tuple(known[i.id] for i in domain.logical)

    return f


def root_index(domain: TensorDomain, logical_index) -> tuple | None:
    """The root index of a logical index (None: a pad's new element). ``root_index(td, (0, 3))``."""
    known = _walk_back(domain.logical_exprs, {i.id: x for i, x in zip(domain.logical, logical_index)})
    if known is None:
        return None
    return tuple(known[i.id] for i in domain.root)


def loop_indices(domain: TensorDomain):
    """Every loop index tuple, row-major. ``len(list(loop_indices(TensorDomain.create("t", (2, 3))))) -> 6``."""
    return itertools.product(*(range(_as_int(i.extent, str(i))) for i in domain.loop))


# ------------------------------------------------------------------------------------------
# Sharding <-> loop domain
# ------------------------------------------------------------------------------------------


def _chunked_like_padded(n: int, cuts) -> str | None:
    """None when the padded splits ``cuts`` (per level: (pieces k, padded piece size I)) cut
    ``[0, n)`` exactly as torch.chunk cuts each actual chunk; else the first difference."""
    lengths = {n}
    for k, size in cuts:
        for L in sorted(lengths):
            if L > 1 and k != 1 and -(-L // k) != size:
                return (f"a chunk of {L} elements is cut into {k} pieces of {-(-L // k)} by torch.chunk "
                        f"but of {size} by the padded ceil-div split")
        nxt = set()
        for L in lengths:
            c, q, r = chunk_counts(L, k)
            nxt.update(x for x in (c if q else 0, r) if x)
        lengths = nxt
    return None


def _ptype_of(f: Factor, mesh: Mesh) -> ParallelType:
    if f.axis is None:
        return SERIAL
    if f.pre == 1 and f.size == mesh.axis_size(f.axis):
        return ParallelType.device(f.axis)
    return ParallelType.device(f.axis, f.pre, f.size)


def loop_domain_of(sharding: Sharding, name: str = "t") -> TensorDomain:
    """The loop domain of a Sharding: dim ``d`` (id ``name.d``) outer-split into its factors,
    outer to inner, each on its axis or sub-axis (Serial if local; the stream factor ``~k`` on
    Stream, nvFuser's Stream ID: ``[tp*~8*64]`` is ``[o{2}@tp, o{8}@stream, i{64}]``; a ring's
    ``~tp`` is the producer's device ID — its Stream ID is on the consumer, ``ring_domains``); a
    pending partial sum over an axis becomes a partial ID on it (``p``: the per-device partials a
    later sum reduces, nvFuser's rfactor product; not ``r{DIDx}``, which is already reduced).
    ``loop_domain_of(Sharding.parse("[dp*4]", m))``."""
    mesh = sharding.mesh
    for axis, op in sharding.partial:
        if op != "sum":
            raise DomainError(f"{sharding}: partial {op}({axis}) has no loop-domain form; only a pending sum is a "
                              "partial ID (reduce it first)")
    shape = sharding.shape
    reds = [mesh.axis_size(a) for a, _ in sharding.partial]
    td = TensorDomain.create(name, tuple(shape) + tuple(reds), mesh=mesh,
                             partials=range(len(shape), len(shape) + len(reds)))
    for k, (axis, _) in enumerate(sharding.partial):
        td = td.parallelize(td.position(f"{name}.{len(shape) + k}"), ParallelType.device(axis))
    for d, fs in enumerate(sharding.dims):
        if isinstance(fs, ChunkProgram):
            raise DomainError(f"{sharding}: dim {d} is cut by DTensor's strided uneven chunks ({fs!r}), which no "
                              "chain of ceil-div splits reproduces; make the dim even")
        n = shape[d]
        even = _prod(f.size for f in fs) == n
        if not even:
            why = _chunked_like_padded(n, _outer_cuts(n, [f.size for f in fs[:-1]] if fs[-1].local else
                                                      [f.size for f in fs]))
            if why:
                raise DomainError(f"{sharding}: dim {d} (size {n}) is uneven and {why}; torch.chunk (DTensor) and "
                                  "nvFuser's padded split differ here (DESIGN.md 'Uneven shards'): make it even")
        cur = f"{name}.{d}"
        parts = [(f.size, _ptype_of(f, mesh), f.local) for f in fs]
        if sharding.stream and sharding.stream[0] == d:  # the stream factor ~k: a Stream ID between its blocks
            pre, mid, post = stream_parts(fs, n, sharding.stream[1], sharding.stream[2])
            run = (mid.size, _ptype_of(mid, mesh), False) if mid.axis else (mid.size, STREAM, True)  # a ring: DIDx
            parts = ([(f.size, _ptype_of(f, mesh), f.local) for f in pre] + [run]
                     + [(f.size, _ptype_of(f, mesh), f.local) for f in post])
        for j, (size, ptype, local) in enumerate(parts):
            pos = td.position(cur)
            last = j == len(parts) - 1
            if last and (even or local or equal(td.loop[pos].extent, size)):
                td = td.parallelize(pos, ptype)
                break
            td = td.outer_split(pos, size).parallelize(pos, ptype)
            cur = td.loop[pos + 1].id
    return td


def ring_domains(sharding: Sharding, name: str = "t") -> tuple:
    """``(producer, consumer)``: a ring stream (``Sharding.stream_axis``, ``[~tp*512]``) as nvFuser
    writes its collective-based pipeline — the sharded producer with the ring's outer split by the
    device count on its device axis (``[o{8}@tp, i{512}]``), and the gathered consumer with the same
    split on Stream (``[o{8}@stream, i{512}]``: chunk ``j`` = device ``j``'s shard). ``ring_of``
    reads them back. ``ring_domains(Sharding.parse("[~tp*512]", "tp=8"))[1]``"""
    if sharding.stream_axis is None:
        raise DomainError(f"{sharding}: no ring stream (a stream over a mesh axis, e.g. '[~tp*512]'); its loop "
                          "domain is loop_domain_of(sharding)")
    d, outer, k = sharding.stream
    fs = stream_parts(sharding.dims[d], sharding.shape[d], outer, k)
    dims = list(sharding.dims)
    dims[d] = fs[0] + (Factor(k),) + fs[2]
    gathered = Sharding(sharding.mesh, sharding.shape, dims, sharding.partial, sharding.stream)
    return loop_domain_of(sharding, name), loop_domain_of(gathered, f"{name}_gathered")


def ring_of(producer: TensorDomain, consumer: TensorDomain, mesh: Mesh) -> Sharding:
    """The ring stream of a producer whose device ID and its consumer's Stream ID are the same outer
    split (the inverse of ``ring_domains``); raises DomainError when they are not a ring.
    ``ring_of(*ring_domains(s), s.mesh) == s``"""
    p, c = sharding_of(producer, mesh), sharding_of(consumer, mesh)
    if not c.stream or p.shape != c.shape:
        raise DomainError(f"{consumer.name}: no Stream ID over a dim of {producer.name} ({c} from {p}); a ring's "
                          "consumer runs the producer's device-split dim on Stream")
    try:
        ring = Sharding(mesh, p.shape, p.dims, p.partial, c.stream)
    except Exception as e:  # ShardingSpecError: the Stream split is not the producer's device split
        raise DomainError(f"{producer.name} -> {consumer.name}: the Stream ID is not the producer's device ID's split "
                          f"({p} -> {c}): {e}") from e
    if ring.stream_axis is None:
        raise DomainError(f"{producer.name} -> {consumer.name}: the Stream ID cuts local factors of {p}, not a device "
                          "axis: not a ring (loop_domain_of/sharding_of read that stream)")
    return ring


def _prod(xs):
    p = 1
    for x in xs:
        p = _mul(p, x)
    return p


def _outer_cuts(n: int, sizes) -> list:
    """(pieces, padded piece size) of a chain of outer splits of ``n`` by ``sizes``."""
    out, p = [], n
    for k in sizes:
        p = -(-p // k)
        out.append((k, p))
    return out


def _children(domain: TensorDomain) -> dict:
    """id -> the loop expr that consumes it."""
    out = {}
    for e in domain.loop_exprs:
        for i in e.inputs:
            out[i.id] = e
    return out


def _leaves(domain: TensorDomain, iid: str, kids: dict, path: list) -> list:
    """Loop leaves under ``iid`` in order, with the splits on the way (``path``)."""
    e = kids.get(iid)
    if e is None:
        return [domain.current(iid)]
    if isinstance(e, Split):
        path.append(e)
        return _leaves(domain, e.outer.id, kids, path) + _leaves(domain, e.inner.id, kids, path)
    if isinstance(e, Merge):
        under = _leaves(domain, e.output.id, kids, [])
        dev = [str(i) for i in under if i.ptype.is_device]
        if dev:
            raise DomainError(f"{domain.name}: device ID {dev[0]} lies under merge({e.outer}, {e.inner}); a Sharding "
                              "binds each device ID to one dim: split the dims before merging them")
        return [domain.current(iid)]
    raise DomainError(f"{domain.name}: loop ID under {iid} comes through a resize ({e.kind}); a loop domain "
                      "made of splits (and merges of serial IDs) is what a Sharding expresses")


def sharding_of(domain: TensorDomain, mesh: Mesh) -> Sharding:
    """The Sharding a loop domain expresses (the inverse of ``loop_domain_of``); raises
    DomainError when there is none. A reduction ID is reduced whatever runs it: ``r{DIDx}`` (the
    output of an allreduce or a reduce-scatter) is replicated on its axis, as nvFuser's
    ``isSharded`` reads it; a partial ID is a pending sum; a Stream ID is the Sharding's stream
    (one per tensor, on an even dim). ``sharding_of(loop_domain_of(s), s.mesh) == s``."""
    kids = _children(domain)
    dims, shape, partial, seen = [], [], [], {}
    stream, stream_id = (), None
    for lid in domain.logical:
        if lid.is_reduction:
            continue
        path: list = []
        leaves = _leaves(domain, lid.id, kids, path)
        for leaf in leaves:
            if leaf.ptype.is_device:
                size = leaf.ptype.axis_size(mesh)
                if equal(leaf.extent, size) is not True:
                    raise DomainError(f"{domain.name}: {leaf} has extent {leaf.extent} but {leaf.ptype} spans {size} "
                                      "devices; a device ID's extent is its axis size")
                whole = leaf.ptype.size is None or (leaf.ptype.pre == 1 and size == mesh.axis_size(leaf.ptype.axis))
                key = leaf.ptype.axis
                if whole and key in seen:
                    raise DomainError(f"{domain.name}: {seen[key]} and {leaf} are both on mesh axis {key!r}; an axis "
                                      "shards one place (split it into sub-axes to use it twice)")
                seen.setdefault(key, leaf)
        if lid.is_partial:
            dev = [x for x in leaves if x.ptype.is_device]
            if len(leaves) != len(dev) or any(x.ptype.pre != 1 or x.ptype.axis_size(mesh) !=
                                              mesh.axis_size(x.ptype.axis) for x in dev):
                raise DomainError(f"{domain.name}: partial ID {lid} is not held one partial sum per device of whole "
                                  "mesh axes; parallelize it (or each of its outer splits) on a whole mesh axis")
            partial.extend((x.ptype.axis, "sum") for x in dev)
            continue
        n = _as_int(lid.extent, str(lid))
        factors = [Factor(_as_int(x.extent, str(x)), x.ptype.axis, x.ptype.pre) if x.ptype.is_device
                   else Factor(_as_int(x.extent, str(x))) for x in leaves]
        for j, x in enumerate(leaves):  # a Stream ID: the Sharding's stream factor ~k (a local factor run in turn)
            if x.ptype.kind is Kind.STREAM and factors[j].size > 1:  # (a Stream of one chunk is none)
                if stream:
                    raise DomainError(f"{domain.name}: Stream IDs {stream_id} and {x}; a Sharding holds one stream: "
                                      "parallelize one ID on Stream")
                stream, stream_id = (len(dims), _prod(f.size for f in factors[:j]), factors[j].size), x
        if _prod(f.size for f in factors) != n:
            if stream and stream[0] == len(dims):
                raise DomainError(f"{domain.name}: Stream ID {stream_id} splits {lid} (size {n}) unevenly; a "
                                  "Sharding's stream cuts an even dim: split by a divisor")
            _check_uneven_chain(domain, lid, path, n)
            if factors[-1].local:
                factors = factors[:-1]  # the innermost local factor is the torch.chunk extent: canonical form fills it
        dims.append(factors)
        shape.append(n)
    try:
        return Sharding(mesh, tuple(shape), dims, partial, stream)
    except DomainError:
        raise
    except Exception as e:  # ShardingSpecError (overlapping sub-axes, ...): same cause, our vocabulary
        raise DomainError(f"{domain.name}: its loop domain is no valid Sharding on {mesh}: {e}") from e


def _check_uneven_chain(domain: TensorDomain, lid: IterDomain, path: list, n: int) -> None:
    cur, cuts = lid.id, []
    for s in path:
        if s.input.id != cur:
            raise DomainError(f"{domain.name}: {lid} is split unevenly along a tree, not a chain (split of {s.input}); "
                              "only a chain of splits, each of the previous inner part, reads as torch.chunk")
        cuts.append((_as_int(s.outer.extent, str(s.outer)), _as_int(s.inner.extent, str(s.inner))))
        cur = s.inner.id
    why = _chunked_like_padded(n, cuts)
    if why:
        raise DomainError(f"{domain.name}: {lid} (size {n}) is split unevenly and {why}; no Sharding (torch.chunk "
                          "semantics) holds the same elements: make the splits divisible")
