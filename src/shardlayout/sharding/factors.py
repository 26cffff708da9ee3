"""Factors: the mixed-radix digits a sharded dim is written in, and their text form.

A dim of global size N is written outer to inner as factors, each *local* or bound to
a mesh axis or a piece of one (a sub-axis, Shardy's ``"x":(m)k``). Its meaning is a
chunk tree: the outermost factor cuts ``[0, N)`` into ``size`` chunks the way
``torch.chunk`` does (ceil-sized, trailing chunks short or empty); a factor on an axis
keeps the chunk of the device's coordinate, a local factor keeps them all, in order;
the next factor cuts each kept chunk again. When N is the product of the sizes (an
*even* dim) this is plain mixed radix, i.e. a CuTe layout.

This is the lowest module of ``sharding/``: it knows one dim's factors, never the
``Sharding`` class that holds them (``core.py``). ``placements.py`` and ``shards.py``
build on it and read a Sharding through ``ShardingLike``; ``core.py`` builds on them.

    >>> from shardlayout.mesh import Mesh
    >>> m = Mesh.parse("dp=2,tp=4")
    >>> _canonical_dim(m, (8,), 0, [parse_factor("dp", m), Factor(2), Factor(2)])
    (Factor(size=2, axis='dp', pre=1), Factor(size=4, axis=None, pre=1))
"""

from __future__ import annotations

import re
from typing import NamedTuple, Protocol

from ..errors import ShardingSpecError
from ..layout.inttuple import ceil_div
from ..mesh import Mesh

REDUCE_OPS = ("sum", "avg", "max", "min")


class Factor(NamedTuple):
    """One mixed-radix digit of a dim: ``Factor(4)`` is local; ``Factor(2, "dp")`` is bound to
    axis dp; ``Factor(2, "tp", pre=2)`` to the sub-axis ``tp:(2)2`` (size 2 after pre-size 2)."""

    size: int
    axis: str | None = None
    pre: int = 1

    @property
    def local(self) -> bool:
        """True for a local factor. ``Factor(4).local -> True``."""
        return self.axis is None


class Step(NamedTuple):
    """One DTensor cut of a ``ChunkProgram`` dim: ``sf`` groups, each cut ``size`` ways by ``axis``."""

    size: int
    axis: str
    pre: int = 1
    sf: int = 1

    @property
    def local(self) -> bool:
        """Always False: a step cuts by a mesh axis. ``Step(2, "x").local -> False``."""
        return False


class ChunkProgram(tuple):
    """A dim cut exactly as a sequence of DTensor placements cuts it (``Shard`` /
    ``_StridedShard``, mesh dims left to right), kept where no factor layout reproduces
    DTensor's uneven chunks. Text: ``chunks(a/3, c) of 16`` (``a/3``: SS with split factor 3).
    Such a dim is never even: views and ops treat it as needing a gather."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"ChunkProgram({tuple(self)!r})"


class ShardingLike(Protocol):
    """What ``placements.py`` and ``shards.py`` read of a ``Sharding`` (``core.py``, which
    is built on them and so cannot be imported by them): its fields and three facts."""

    mesh: Mesh
    shape: tuple
    dims: tuple
    partial: tuple

    @property
    def ndim(self) -> int: ...

    def is_even(self, dim: int | None = None) -> bool: ...

    def axis_pieces(self, axis: str) -> list: ...


def chain_extent(n: int, sizes) -> int:
    """Length of the largest chunk after cutting ``n`` by each size in turn (torch.chunk).

    ``chain_extent(9, [2, 2]) -> 3``
    """
    for s in sizes:
        n = -(-n // s)  # ceil_div(n, s)
    return n


def chunk_length(n: int, k: int, i: int) -> int:
    """Length of piece ``i`` when ``torch.chunk`` cuts ``n`` elements into ``k`` (0 past the end).

    ``chunk_length(10, 4, 3) -> 1``
    """
    if n <= 0:
        return 0
    c = ceil_div(n, k)
    return max(0, min(c, n - i * c))


def chunk_counts(n: int, k: int) -> tuple:
    """``(c, q, r)``: ``torch.chunk`` cuts ``n`` into ``q`` chunks of ``c``, then one of ``r``
    (``0 <= r < c``), then empty ones. ``chunk_counts(10, 4) -> (3, 3, 1)``
    """
    if n <= 0:
        return (0, 0, 0)
    c = -(-n // k)  # ceil_div(n, k), inlined: the walk of uneven views calls this often
    q = n // c
    return (c, q, n - q * c)


def _is_leaf(factors, j: int) -> bool:
    """True when level ``j`` cuts nothing: past the end, or the innermost local factor."""
    return j >= len(factors) or (j == len(factors) - 1 and factors[j].axis is None)


def _cut_lengths(lengths, k: int) -> frozenset:
    """The non-empty chunk lengths of cutting each of ``lengths`` into ``k``: two per length."""
    return frozenset(x for L in lengths for x in chunk_counts(L, k)[::2] if x)


def level_lengths(n: int, factors) -> list:
    """Per level of the chunk tree, the set of chunk lengths some device meets there (every
    digit of every axis factor; the empty chunk left out).
    ``level_lengths(10, [Factor(4), Factor(3)])[1] -> frozenset({1, 3})``

    Few, whatever ``n``: a cut turns each length into at most two.
    """
    out = [frozenset({n})]
    for j, f in enumerate(factors):
        if _is_leaf(factors, j):
            break
        out.append(_cut_lengths(out[-1], f.size))
    return out


def digit_classes(n: int, factors):
    """Representative digits of the axis factors of a dim of size ``n``: yields lists
    ``digits`` (None at local factors) such that every device meets, level by level, the
    same chunk lengths as one of them (so holds as many elements, cut the same way).

    A digit g of a factor cutting chunks of lengths L matters only through which chunk of
    each L it keeps: a full one (g < q), the short last one (g == q) or none (g > q); so
    the digits 0, q, q + 1 of each L stand for all of them, whatever the axis size.
    ``list(digit_classes(10, (Factor(4, "x"),))) -> [[0], [3]]`` (x=0..2 hold 3, x=3 holds 1)
    """
    factors = tuple(factors)

    def go(j: int, lengths: frozenset, digits: list):
        if _is_leaf(factors, j) or not lengths:  # nothing left to tell devices apart
            yield digits + [None if f.axis is None else 0 for f in factors[len(digits) :]]
            return
        f = factors[j]
        if f.axis is None:
            yield from go(j + 1, _cut_lengths(lengths, f.size), digits + [None])
            return
        reps = {0}
        for L in lengths:
            q = chunk_counts(L, f.size)[1]
            reps.update(g for g in (q, q + 1) if g < f.size)
        for g in sorted(reps):
            kept = frozenset(x for x in (chunk_length(L, f.size, g) for L in lengths) if x)
            yield from go(j + 1, kept, digits + [g])

    yield from go(0, frozenset({n}), [])


def held_length(n: int, factors, digits) -> int:
    """How many of a dim's ``n`` elements a device with these ``digits`` holds (``digits[j]``
    for axis factor ``j``), counted per chunk length, never per element or per chunk.

    ``held_length(9, (Factor(2, "x"), Factor(5)), [1, None]) -> 4``
    """
    counts = {n: 1} if n else {}
    for j, f in enumerate(factors):
        if _is_leaf(factors, j):
            break
        nxt: dict = {}
        for L, m in counts.items():
            if f.axis is None:
                c, q, r = chunk_counts(L, f.size)
                parts = ((c, q), (r, 1))
            else:
                parts = ((chunk_length(L, f.size, digits[j]), 1),)
            for x, k in parts:
                if x and k:
                    nxt[x] = nxt.get(x, 0) + m * k
        counts = nxt
    return sum(L * m for L, m in counts.items())


def program_length(n: int, steps, digits) -> int:
    """``held_length`` for a ``ChunkProgram``: DTensor's cuts on the held list, by lengths.

    ``program_length(10, [Step(3, "x", 1, 2)], [2]) -> 2``
    """
    for st, g in zip(steps, digits):
        c, q, r = chunk_counts(n, st.sf)
        n = q * chunk_length(c, st.size, g) + chunk_length(r, st.size, g)
    return n


def _product(xs) -> int:
    p = 1
    for x in xs:
        p *= x
    return p


def factor_digit(mesh: Mesh, f: Factor, coord: tuple) -> int:
    """The digit of an axis factor at a mesh coordinate (sub-axes read their piece).

    ``factor_digit(Mesh.parse("tp=4"), Factor(2, "tp", 2), (3,)) -> 1``
    """
    n = mesh.shape[mesh.axis_index(f.axis)]
    c = coord[mesh.axis_index(f.axis)]
    return (c // (n // (f.pre * f.size))) % f.size


# ------------------------------------------------------------------------------------------
# canonical form of one dim
# ------------------------------------------------------------------------------------------


def _canonical_dim(mesh: Mesh, shape: tuple, d: int, fs: list) -> tuple:
    """Drop size-1 factors, fill in (or check) the innermost local factor, merge when even."""
    n = shape[d]
    fs = [f for f in fs if f.size != 1]
    trailing = bool(fs) and fs[-1].local
    body = fs[:-1] if trailing else fs
    ext = chain_extent(n, [f.size for f in body])
    if trailing and fs[-1].size != ext:
        shown = "*".join(_fmt_factor(f, mesh) for f in fs)
        raise ShardingSpecError(
            f"dim {d} (size {n}): factors {shown} do not cover it exactly: cut as torch.chunk "
            f"does, the innermost local factor must be {ext}, not {fs[-1].size} "
            f"(write '{'*'.join([_fmt_factor(f, mesh) for f in body] + [str(ext)])}')"
        )
    if not trailing and ext > 1:
        fs = body + [Factor(ext)]
    if _product(f.size for f in fs) == n:
        fs = _merge_even(fs, mesh)
    return tuple(fs)


def _merge_even(fs: list, mesh: Mesh) -> list:
    """An even dim's factors with adjacent local factors merged, and adjacent pieces of one axis
    in order. ``_merge_even([Factor(2), Factor(3)], m) -> [Factor(6)]``"""
    out: list = []
    new = tuple.__new__  # Factor(...) without the Python-level NamedTuple __new__
    for f in fs:
        if out:
            g = out[-1]
            axis = g[1]  # g.axis; g[0] g.size, g[2] g.pre
            if axis is None:
                if f[1] is None:
                    out[-1] = new(Factor, (g[0] * f[0], None, 1))
                    continue
            elif axis == f[1] and g[2] * g[0] == f[2]:
                out[-1] = new(Factor, (g[0] * f[0], axis, g[2]))
                continue
        out.append(f)
    return out


def stream_cut(fs, n: int, outer: int, k: int) -> tuple | None:
    """``(pre, post)``: an even dim's factors ``fs`` (of ``n``) read as ``pre + [~k] + post``, where
    ``pre`` covers the outer ``outer`` of the dim's index range and the stream's ``k`` chunks cut
    only local factors (a local factor is split where the cut falls inside it); None when a mesh
    axis factor lies in the way or the sizes do not divide (``stream_parts`` also reads a ring).
    Chunk ``j`` of the stream is the ``j``-th part of each of the ``outer`` blocks.
    ``stream_cut((Factor(2, "tp"), Factor(512)), 1024, 2, 8) -> ((Factor(2, 'tp'),), (Factor(64),))``"""
    parts = stream_parts(fs, n, outer, k)
    if parts is None or parts[1].axis is not None:
        return None
    return parts[0], parts[2]


def stream_parts(fs, n: int, outer: int, k: int) -> tuple | None:
    """``(pre, mid, post)``: an even dim's factors ``fs`` (of ``n``) read as ``pre + [mid] + post``
    with the stream's ``k`` chunks on ``mid`` right after the ``outer`` outer blocks ``pre``:
    ``mid`` is ``Factor(k)`` cut from local factors (``stream_cut``), or — a **ring** — exactly one
    mesh-axis factor of size ``k``, whose blocks are the chunks (chunk ``j`` is the block of the
    axis coordinate ``j``: rank ``j``'s shard). None when neither reads.
    ``stream_parts((Factor(8, "tp"), Factor(64)), 512, 1, 8) -> ((), Factor(8, 'tp'), (Factor(64),))``"""
    if outer < 1 or k < 2 or n % (outer * k) or _product(f.size for f in fs) != n:
        return None
    pre, rest, c = [], list(fs), 1
    while rest and c < outer:  # the factors of the outer blocks
        f = rest.pop(0)
        if c * f.size <= outer:
            pre.append(f)
            c *= f.size
        elif f.axis is None and outer % c == 0 and f.size % (outer // c) == 0:
            pre.append(Factor(outer // c))
            rest.insert(0, Factor(f.size // (outer // c)))
            c = outer
        else:
            return None
    if c != outer:
        return None
    if rest and rest[0].axis is not None:  # a ring: the chunks are one mesh-axis factor's blocks
        return (tuple(pre), rest[0], tuple(rest[1:])) if rest[0].size == k else None
    need = k  # the stream's extent, from local factors only
    while need > 1:
        if not rest or rest[0].axis is not None:
            return None
        f = rest.pop(0)
        if f.size <= need:
            if need % f.size:
                return None
            need //= f.size
        elif f.size % need == 0:
            rest.insert(0, Factor(f.size // need))
            need = 1
        else:
            return None
    return tuple(pre), Factor(k), tuple(rest)


# ------------------------------------------------------------------------------------------
# text form of one factor
# ------------------------------------------------------------------------------------------


def _fmt_factor(f: Factor, mesh: Mesh) -> str:
    if f.axis is None:
        return str(f.size)
    if f.pre == 1 and f.size == mesh.axis_size(f.axis):
        return f.axis
    return f"{f.axis}:({f.pre}){f.size}"


_SUBAXIS = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):\((\d{1,18})\)(\d{1,18})$", re.ASCII)


def parse_factor(text: str, mesh: Mesh) -> Factor:
    """``"4"`` local, ``"dp"`` an axis, ``"tp:(2)2"`` a sub-axis. ``parse_factor("dp", mesh)``."""
    if not isinstance(text, str):
        raise ShardingSpecError(f"factor {text!r} is not text: write a size, an axis name or 'axis:(m)k'")
    t = text.strip().replace(" ", "")
    if t.isascii() and t.isdigit():
        if len(t) > 18:
            raise ShardingSpecError(f"factor {t[:24]}...: a size of {len(t)} digits is absurd (int64 holds 18)")
        return Factor(int(t))
    if t in mesh.names:
        return Factor(mesh.axis_size(t), t)
    m = _SUBAXIS.match(t)
    if m:
        name, pre, size = m.group(1), int(m.group(2)), int(m.group(3))
        n = mesh.axis_size(name)
        if pre < 1 or size < 1 or n % (pre * size):
            raise ShardingSpecError(
                f"sub-axis {t!r}: '{name}:(m)k' needs m*k to divide the size {n} of axis {name!r}"
            )
        return Factor(size, name, pre)
    if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", t):
        mesh.axis_index(t)  # raises a MeshError naming the axes
    raise ShardingSpecError(
        f"factor {text!r} is not an int, a mesh axis ({', '.join(mesh.names)}) or a sub-axis like 'tp:(2)2'"
    )
