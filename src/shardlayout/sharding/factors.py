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
        n = ceil_div(n, s)
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
    out: list = []
    for f in fs:
        if out:
            g = out[-1]
            if g.local and f.local:
                out[-1] = Factor(g.size * f.size)
                continue
            if g.axis is not None and g.axis == f.axis and g.pre * g.size == f.pre:
                out[-1] = Factor(g.size * f.size, g.axis, g.pre)
                continue
        out.append(f)
    return out


# ------------------------------------------------------------------------------------------
# text form of one factor
# ------------------------------------------------------------------------------------------


def _fmt_factor(f: Factor, mesh: Mesh) -> str:
    if f.axis is None:
        return str(f.size)
    if f.pre == 1 and f.size == mesh.axis_size(f.axis):
        return f.axis
    return f"{f.axis}:({f.pre}){f.size}"


_SUBAXIS = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):\((\d+)\)(\d+)$")


def parse_factor(text: str, mesh: Mesh) -> Factor:
    """``"4"`` local, ``"dp"`` an axis, ``"tp:(2)2"`` a sub-axis. ``parse_factor("dp", mesh)``."""
    t = text.strip().replace(" ", "")
    if t.isdigit():
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
