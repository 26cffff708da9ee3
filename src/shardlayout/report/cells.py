"""Who holds what, block by block, computed from the factors: never the whole tensor, never every rank.

Along one dim, the devices holding index ``i`` are those whose digits on the dim's axis factors
equal the digits ``i`` is written with. A *block* is a maximal run of indices with the same such
digits; a *cell* is one block per dim, and the devices holding it are those whose mesh coordinates
match every digit its blocks name: a constraint on (sub-)axes, known without enumerating devices.
Blocks are found by walking the chunk tree of each dim in index order (``torch.chunk`` cuts, so
uneven dims too) and stop after ``max_blocks`` (the rest is *elided*); a dim cut as DTensor's
uneven ``_StridedShard`` (a ``ChunkProgram``) is cut per digit combination.

The text picture (``picture.py``) and the matplotlib figure (``figure.py``) both draw this table.

    >>> from shardlayout import Mesh, Sharding
    >>> t = cell_table(Sharding.from_placements(Mesh.parse("dp=2,tp=2"), (8, 4), ["SS(0,2)", "S(0)"]))
    >>> [(b.lo, b.hi) for b in t.dims[0].blocks], t.holder_ranks((1, 0))
    ([(0, 2), (2, 4), (4, 6), (6, 8)], [2])
    >>> t.label((0, 0)), t.device_cells(1)
    ('0', [(2, 0)])
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..errors import ShardingError
from ..layout.inttuple import ceil_div
from ..sharding import Sharding
from ..sharding.factors import ChunkProgram, Factor, factor_digit
from ..sharding.shards import dim_ranges

MAX_BLOCKS = 64  # blocks per dim in a table; the rest of the dim is elided
MAX_LEAVES = 1 << 16  # chunk-tree leaves visited per dim (merged into blocks)
MAX_PROGRAM_KEYS = 4096  # digit combinations of a ChunkProgram dim cut one by one
LIST_LIMIT = 4096  # holders enumerated up to this many; beyond, named by coordinates
LABEL_WIDTH = 32  # a holder list longer than this is named by coordinates instead


class PictureTooLarge(ShardingError):
    """A sharding whose blocks cannot be found within the bounds of a picture."""


@dataclass(frozen=True)
class Block:
    """Indices ``lo:hi`` of one dim, held by the devices whose digit on each piece
    ``(axis, pre, size)`` of ``digits`` is the given one: ``((axis, pre, size, digit), ...)``."""

    lo: int
    hi: int
    digits: tuple


@dataclass(frozen=True)
class DimBlocks:
    """The blocks of one dim in index order; ``complete`` is False when the dim goes on past the
    last block (elided)."""

    size: int
    blocks: tuple
    complete: bool

    @property
    def shown(self) -> int:
        """Indices covered by the blocks (``size`` when complete)."""
        return self.blocks[-1].hi if self.blocks else 0


def _chunk(lo: int, hi: int, k: int, i: int) -> tuple:
    c = ceil_div(hi - lo, k) if hi > lo else 0
    s = lo + i * c
    return (hi, hi) if s >= hi else (s, min(s + c, hi))


def _leaves(n: int, factors: tuple):
    """``(lo, hi, digits)`` of the chunk tree's non-empty leaves, in index order (lazily)."""
    def go(lo, hi, j, digits):
        if j >= len(factors) or (j == len(factors) - 1 and factors[j].axis is None):
            yield lo, hi, digits
            return
        f = factors[j]
        for i in range(f.size):
            a, b = _chunk(lo, hi, f.size, i)
            if b <= a:
                break  # torch.chunk: every later chunk is empty too
            yield from go(a, b, j + 1, digits if f.axis is None else digits + ((f.axis, f.pre, f.size, i),))

    if n:
        yield from go(0, n, 0, ())


def _program_leaves(n: int, prog: ChunkProgram):
    keys = 1
    for st in prog:
        keys *= st.size
    if keys > MAX_PROGRAM_KEYS:
        raise PictureTooLarge(f"picture: a dim cut by {keys} DTensor chunk combinations; at most "
                              f"{MAX_PROGRAM_KEYS} are drawn")
    out = []
    for digits in itertools.product(*(range(st.size) for st in prog)):
        key = tuple((st.axis, st.pre, st.size, g) for st, g in zip(prog, digits))
        out.extend((lo, hi, key) for lo, hi in dim_ranges(n, prog, list(digits)))
    out.sort()
    return iter(out)


def dim_blocks(n: int, factors, max_blocks: int = MAX_BLOCKS) -> DimBlocks:
    """The blocks of a dim of size ``n`` cut by ``factors`` (the first ``max_blocks``).

    ``[(b.lo, b.hi) for b in dim_blocks(10, (Factor(4, "x"),)).blocks] -> [(0, 3), (3, 6), (6, 9), (9, 10)]``
    """
    leaves = _program_leaves(n, factors) if isinstance(factors, ChunkProgram) else _leaves(n, tuple(factors))
    blocks: list = []
    for visited, (lo, hi, key) in enumerate(leaves):
        if visited >= MAX_LEAVES:
            return DimBlocks(n, tuple(Block(*b) for b in blocks), False)
        if blocks and blocks[-1][2] == key and blocks[-1][1] == lo:
            blocks[-1][1] = hi
            continue
        if len(blocks) == max_blocks:
            return DimBlocks(n, tuple(Block(*b) for b in blocks), False)
        blocks.append([lo, hi, key])
    return DimBlocks(n, tuple(Block(*b) for b in blocks), True)


class CellTable:
    """The blocks of every dim of a Sharding, and the devices holding each cell (a tuple of one
    block index per dim)."""

    def __init__(self, s: Sharding, max_blocks: int = MAX_BLOCKS):
        self.sharding = s
        self.mesh = s.mesh
        self.dims = tuple(dim_blocks(n, fs, max_blocks) for n, fs in zip(s.shape, s.dims))

    @property
    def complete(self) -> bool:
        """True when no dim is elided."""
        return all(d.complete for d in self.dims)

    def constraint(self, cell) -> tuple:
        """``((axis, pre, size, digit), ...)`` every holder of ``cell`` satisfies."""
        return tuple(p for d, b in zip(self.dims, cell) for p in d.blocks[b].digits)

    def holder_count(self, cell) -> int:
        """How many devices hold ``cell``."""
        n = self.mesh.size
        for _, _, size, _ in self.constraint(cell):
            n //= size
        return n

    def _axis_values(self, cell) -> list:
        allowed = []
        pins = self.constraint(cell)
        for name, n in zip(self.mesh.names, self.mesh.shape):
            mine = [(pre, size, g) for a, pre, size, g in pins if a == name]
            allowed.append([c for c in range(n) if all((c // (n // (pre * size))) % size == g
                                                       for pre, size, g in mine)] if mine else range(n))
        return allowed

    def holder_ranks(self, cell, limit: int = LIST_LIMIT):
        """The ranks holding ``cell``, ascending (None when more than ``limit``)."""
        if self.holder_count(cell) > limit:
            return None
        mesh = self.mesh
        return sorted(mesh.rank_of(c) for c in itertools.product(*self._axis_values(cell)))

    def ranks_label(self, cell) -> str | None:
        """The holders as ranks, ``0-3,8`` (None past ``LIST_LIMIT`` of them)."""

        ranks = self.holder_ranks(cell, LIST_LIMIT)
        return None if ranks is None else ranks_text(sum(1 << r for r in ranks))

    def coord_label(self, cell) -> str:
        """The holders as mesh coordinates: ``dp=1,tp:(2)2=0``; ``all`` when every device holds it."""
        parts = []
        for axis, pre, size, g in sorted(self.constraint(cell), key=lambda p: (self.mesh.axis_index(p[0]), p[1])):
            whole = pre == 1 and size == self.mesh.axis_size(axis)
            parts.append(f"{axis}={g}" if whole else f"{axis}:({pre}){size}={g}")
        return ",".join(parts) or "all"

    def labels(self, cells, width: int = LABEL_WIDTH) -> dict:
        """``{cell: label}``: all as ranks when each list fits in ``width`` characters, else all as
        coordinates (one style per picture)."""
        cells = list(cells)
        out = {}
        for c in cells:
            text = self.ranks_label(c)
            if text is None or len(text) > width:
                return {c: self.coord_label(c) for c in cells}
            out[c] = text
        return out

    def label(self, cell, width: int = LABEL_WIDTH) -> str:
        """One cell's label (``labels`` of that cell alone)."""
        return self.labels([cell], width)[cell]

    def cells(self):
        """Every cell, row-major."""
        return itertools.product(*(range(len(d.blocks)) for d in self.dims))

    def device_cells(self, rank: int) -> list:
        """The cells ``rank`` holds (among the blocks shown), row-major."""
        coord = self.mesh.coord(rank)

        def mine(b: Block) -> bool:
            return all(factor_digit(self.mesh, Factor(size, axis, pre), coord) == g for axis, pre, size, g in b.digits)

        per_dim = [[i for i, b in enumerate(d.blocks) if mine(b)] for d in self.dims]
        return list(itertools.product(*per_dim))


def cell_table(s: Sharding, max_blocks: int = MAX_BLOCKS) -> CellTable:
    """The :class:`CellTable` of ``s`` (at most ``max_blocks`` blocks per dim)."""
    return CellTable(s, max_blocks)


def ranks_text(mask: int) -> str:
    """``ranks_text(0b1111) -> '0-3'``; ``ranks_text(0b101) -> '0,2'``."""
    rs = [i for i in range(mask.bit_length()) if mask >> i & 1]
    if not rs:
        return "-"
    parts, start = [], rs[0]
    for a, b in zip(rs, rs[1:] + [None]):
        if b != a + 1:
            parts.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ",".join(parts)


__all__ = ["Block", "CellTable", "DimBlocks", "PictureTooLarge", "cell_table", "dim_blocks", "ranks_text"]
