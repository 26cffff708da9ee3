"""Terminal pictures of who holds what: any tensor rank, any mesh, strided and sub-axis shards.

Runs of consecutive indices held by the same ranks are merged (``cells.py`` finds them from the
factors, per block), so a strided shard shows as alternating blocks and a large even one stays small.

    >>> from shardlayout import Mesh, Sharding
    >>> print(picture(Sharding.parse("[x*2]", Mesh.parse("x=2"))))
    dim 0 -> 0:2 2:4
              0   1
"""

from __future__ import annotations

import itertools

import numpy as np

from ..sharding import Sharding
from ..sharding.shards import _dim_digits, dim_ranges
from .cells import CellTable, cell_table


def holders(s: Sharding) -> np.ndarray:
    """For every element, the set of ranks holding it, as a bitmask (object ints). Builds the
    whole tensor: for small ones (tests); pictures use ``cells.cell_table``."""
    h = np.zeros(s.shape, dtype=object)
    for r in s.mesh.ranks():
        idx = np.ix_(*s.indices(r))
        h[idx] = h[idx] + (1 << r)
    return h


def _range(b) -> str:
    return f"{b.lo}:{b.hi}"


def _grid(t: CellTable, lead: tuple, max_rows: int = 32, max_cols: int = 24) -> list:
    """Rows: the blocks of the next-to-last dim; columns: those of the last dim."""
    rdim, cdim = t.dims[-2], t.dims[-1]
    rows, cols = rdim.blocks[:max_rows], cdim.blocks[:max_cols]
    col_heads = [_range(b) for b in cols]
    labels = t.labels(lead + (i, j) for i in range(len(rows)) for j in range(len(cols)))
    cells = [[labels[lead + (i, j)] for j in range(len(cols))] for i in range(len(rows))]
    more_cols = len(cdim.blocks) > max_cols or not cdim.complete
    if more_cols:
        col_heads.append("...")
        for row in cells:
            row.append("")
    width = max([len(x) for x in col_heads] + [len(c) for row in cells for c in row] + [1])
    row_heads = [_range(b) for b in rows]
    rw = max(len(x) for x in row_heads + ["..."])
    lines = [" " * (rw + 3) + " ".join(x.center(width) for x in col_heads)]
    for head, row in zip(row_heads, cells):
        lines.append(f"{head.rjust(rw)} | " + " ".join(c.center(width) for c in row))
    if len(rdim.blocks) > max_rows and rdim.complete:
        lines.append(f"{'...'.rjust(rw)}   ({len(rdim.blocks) - max_rows} more row blocks)")
    elif len(rdim.blocks) > max_rows or not rdim.complete:
        lines.append(f"{'...'.rjust(rw)}   (rows {rows[-1].hi}:{rdim.size} elided)")
    if more_cols:
        lines.append(f"{'...'.rjust(rw)}   (columns {cols[-1].hi}:{cdim.size} elided)")
    return lines


def picture(s: Sharding, max_slices: int = 8) -> str:
    """Text picture of the ranks holding each block of ``s`` (2-D slices of the last two dims),
    computed per block from the factors (``cells.py``): its cost does not grow with the tensor
    or the mesh. Holders are listed as ranks, or as mesh coordinates past 4096 of them."""
    t = cell_table(s)
    if s.ndim == 0:
        return t.label(())
    if s.ndim == 1:
        d = t.dims[0]
        heads = [_range(b) for b in d.blocks]
        labels = t.labels((i,) for i in range(len(d.blocks)))
        cells = [labels[(i,)] for i in range(len(d.blocks))]
        if not d.complete:
            heads.append(f"{d.shown}:{d.size} elided")
            cells.append("")
        w = max(len(x) for x in heads + cells)
        return (
            "dim 0 -> " + " ".join(x.center(w) for x in heads).rstrip() + "\n"
            + (" " * 9 + " ".join(c.center(w) for c in cells)).rstrip()
        )
    lines = [f"rows: dim {s.ndim - 2}, columns: dim {s.ndim - 1}; cells: ranks holding the block"]
    leads = list(itertools.islice(itertools.product(*(range(len(d.blocks)) for d in t.dims[:-2])), max_slices + 1))
    for n, lead in enumerate(leads):
        if n == max_slices:
            total = 1
            for d in t.dims[:-2]:
                total *= len(d.blocks)
            lines.append(f"... {total - max_slices}{'' if t.complete else '+'} more slices")
            break
        if lead:
            where = ", ".join(f"{b.lo}" if b.hi == b.lo + 1 else f"{b.lo}..{b.hi - 1}"
                              for b in (t.dims[d].blocks[i] for d, i in enumerate(lead)))
            lines.append(f"[{where}, :, :]")
        lines.extend(_grid(t, lead))
    elided = [f"dim {d} past {x.shown}" for d, x in enumerate(t.dims[:-2]) if not x.complete]
    if elided:
        lines.append(f"... ({', '.join(elided)} elided)")
    return "\n".join(line.rstrip() for line in lines)


def rank_table(s: Sharding, limit: int | None = None) -> list:
    """Per rank (the first ``limit`` ranks when given): coordinate, local shape and the global
    index ranges held per dim. ``rank_table(s, 2)[0]["rank"] -> 0``"""
    out = []
    ranks = s.mesh.ranks() if limit is None else range(min(limit, s.mesh.size))
    for r in ranks:
        coord = s.mesh.coord(r)
        ranges = []  # from the chunk tree (dim_ranges), never an array of the held indices
        for d in range(s.ndim):
            rs = []
            for lo, hi in dim_ranges(s.shape[d], s.dims[d], _dim_digits(s, d, coord)):
                if rs and rs[-1][1] == lo:
                    rs[-1][1] = hi
                else:
                    rs.append([lo, hi])
            ranges.append(rs)
        out.append({
            "rank": r,
            "coord": dict(zip(s.mesh.names, s.mesh.coord(r))),
            "local_shape": list(s.local_shape(r)),
            "ranges": ranges,
        })
    return out
