"""Terminal pictures of who holds what: any tensor rank, any mesh, strided and sub-axis shards.

Runs of consecutive indices held by the same ranks are merged, so a strided shard shows as
alternating blocks and a large even one stays small.

    >>> from shardlayout import Mesh, Sharding
    >>> print(picture(Sharding.parse("[x*2]", Mesh.parse("x=2"))))
    dim 0 -> 0:2 2:4
              0   1
"""

from __future__ import annotations

import numpy as np

from ..sharding import Sharding


def holders(s: Sharding) -> np.ndarray:
    """For every element, the set of ranks holding it, as a bitmask (object ints)."""
    h = np.zeros(s.shape, dtype=object)
    for r in s.mesh.ranks():
        idx = np.ix_(*s.indices(r))
        h[idx] = h[idx] + (1 << r)
    return h


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


def _runs(keys: list) -> list:
    out = []
    for i, k in enumerate(keys):
        if out and out[-1][2] == k:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1, k])
    return out


def _grid(h2: np.ndarray, max_rows: int = 32) -> list:
    rows = _runs([tuple(r) for r in h2])
    hidden = max(0, len(rows) - max_rows)
    rows = rows[:max_rows]
    cols = _runs([tuple(c) for c in h2.T])
    lines = []
    col_heads = [f"{a}:{b}" for a, b, _ in cols]
    cells = [[ranks_text(h2[a, c0]) for c0, _, _ in cols] for a, _, _ in rows]
    width = max([len(x) for x in col_heads] + [len(c) for row in cells for c in row] + [1])
    row_heads = [f"{a}:{b}" for a, b, _ in rows]
    rw = max(len(x) for x in row_heads)
    lines.append(" " * (rw + 3) + " ".join(x.center(width) for x in col_heads))
    for head, row in zip(row_heads, cells):
        lines.append(f"{head.rjust(rw)} | " + " ".join(c.center(width) for c in row))
    if hidden:
        lines.append(f"{'...'.rjust(rw)}   ({hidden} more row blocks)")
    return lines


def picture(s: Sharding, max_slices: int = 8) -> str:
    """Text picture of the ranks holding each block of ``s`` (2-D slices of the last two dims)."""
    h = holders(s)
    if s.ndim == 0:
        return ranks_text(h.item())
    if s.ndim == 1:
        runs = _runs(list(h))
        heads = [f"{a}:{b}" for a, b, _ in runs]
        cells = [ranks_text(k) for _, _, k in runs]
        w = max(len(x) for x in heads + cells)
        return (
            "dim 0 -> " + " ".join(x.center(w) for x in heads).rstrip() + "\n"
            + (" " * 9 + " ".join(c.center(w) for c in cells)).rstrip()
        )
    lead = s.shape[:-2]
    h3 = h.reshape((-1,) + s.shape[-2:])
    lines = [f"rows: dim {s.ndim - 2}, columns: dim {s.ndim - 1}; cells: ranks holding the block"]
    slices = _runs([tuple(map(tuple, h3[i])) for i in range(h3.shape[0])])
    for n, (a, b, _) in enumerate(slices):
        if n == max_slices:
            lines.append(f"... {len(slices) - max_slices} more slices")
            break
        if lead:
            lo = np.unravel_index(a, lead)
            hi = np.unravel_index(b - 1, lead)
            where = ", ".join(f"{x}" if x == y else f"{x}..{y}" for x, y in zip(lo, hi))
            lines.append(f"[{where}, :, :]")
        lines.extend(_grid(h3[a]))
    return "\n".join(line.rstrip() for line in lines)


def rank_table(s: Sharding, limit: int | None = None) -> list:
    """Per rank (the first ``limit`` ranks when given): coordinate, local shape and the global
    index ranges held per dim. ``rank_table(s, 2)[0]["rank"] -> 0``"""
    out = []
    ranks = s.mesh.ranks() if limit is None else range(min(limit, s.mesh.size))
    for r in ranks:
        idx = s.indices(r)
        ranges = []
        for ix in idx:
            rs = []
            for v in ix.tolist():
                if rs and rs[-1][1] == v:
                    rs[-1][1] = v + 1
                else:
                    rs.append([v, v + 1])
            ranges.append(rs)
        out.append({
            "rank": r,
            "coord": dict(zip(s.mesh.names, s.mesh.coord(r))),
            "local_shape": list(s.local_shape(r)),
            "ranges": ranges,
        })
    return out
