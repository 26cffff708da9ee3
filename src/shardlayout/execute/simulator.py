"""The numpy simulator of every rank: an executor whose local value is ``{rank: array}``.

A collective is run the way devices run it: each rank assembles its new piece from the
pieces of its own group only (the ranks that differ from it in the collective's mesh axes or
sub-axes), so a plan that asks a rank for data its group does not hold fails loudly.

    >>> import numpy as np
    >>> from shardlayout import Mesh, Sharding, plan_move
    >>> m = Mesh.parse("dp=2,tp=4")
    >>> a, b = Sharding.parse("[dp*4, tp*3]", m), Sharding.parse("[dp*4, 12]", m)
    >>> x = np.arange(96.0).reshape(8, 12)
    >>> got = run_moves(plan_move(a, b), a.shard(x))
    >>> all(np.array_equal(got[r], b.shard(x)[r]) for r in m.ranks())
    True
"""

from __future__ import annotations

import numpy as np

from ..errors import ShardMismatch
from ..mesh import Mesh

_REDUCE = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min}


def _piece_digit(mesh: Mesh, coord: tuple, axis: str, pre: int, size: int) -> int:
    n = mesh.axis_size(axis)
    return (coord[mesh.axis_index(axis)] // (n // (pre * size))) % size


def group_of(mesh: Mesh, rank: int, pieces: tuple) -> list:
    """Ranks in ``rank``'s group for a collective over ``pieces`` (AxisPiece values): those whose
    coordinates agree with it everywhere except in the digits of the pieces."""
    if not pieces:
        return [rank]
    c = mesh.coord(rank)
    touched = {p.axis for p in pieces}

    def outside(coord, axis):  # the coordinate of ``axis`` with the pieces' digits zeroed
        n, v = mesh.axis_size(axis), coord[mesh.axis_index(axis)]
        for p in pieces:
            if p.axis == axis:
                stride = n // (p.pre * p.size)
                v -= _piece_digit(mesh, coord, axis, p.pre, p.size) * stride
        return v

    out = []
    for q in mesh.ranks():
        d = mesh.coord(q)
        if all(d[i] == c[i] for i, a in enumerate(mesh.names) if a not in touched) and \
                all(outside(d, a) == outside(c, a) for a in touched):
            out.append(q)
    return out


def run_collective(c, pieces: dict) -> dict:
    """Run one :class:`Collective` on ``{rank: piece}``; returns the new pieces."""
    src, dst, mesh = c.src, c.dst, c.src.mesh
    src_partial = dict(src.partial)
    reduce_op = c.reduce_op if c.kind.communicates else None
    out = {}
    for r in mesh.ranks():
        group = group_of(mesh, r, c.axes)
        dtype = np.result_type(pieces[r].dtype, np.float64)
        have = np.zeros(src.shape, dtype=bool)
        if reduce_op:
            stacked = []
            for q in group:
                buf = np.zeros(src.shape, dtype=dtype)
                buf[np.ix_(*src.indices(q))] = pieces[q]
                stacked.append(buf)
                have[np.ix_(*src.indices(q))] = True
            full = _REDUCE[reduce_op](np.stack(stacked), axis=0)
        else:
            full = np.zeros(src.shape, dtype=dtype)
            for q in group:
                full[np.ix_(*src.indices(q))] = pieces[q]
                have[np.ix_(*src.indices(q))] = True
        idx = np.ix_(*dst.indices(r))
        if not have[idx].all():
            raise ShardMismatch(
                f"{c.kind.value} over {c.axes_text() or 'no axes'}: rank {r} needs elements its group "
                f"{group} does not hold ({src} -> {dst}); the plan is invalid"
            )
        piece = full[idx]
        for a, op in dst.partial:
            if a not in src_partial and op == "sum":
                piece = piece / mesh.axis_size(a)  # DTensor's Partial._partition_value
        out[r] = piece
    return out


def run_moves(moves, pieces: dict) -> dict:
    """Run collectives in order. ``run_moves((), pieces) is pieces``."""
    for c in moves:
        pieces = run_collective(c, pieces)
    return pieces


class NumpySimulator:
    """Every rank of ``mesh`` in one process, in numpy; a local value is ``{rank: array}``."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh

    def op(self, opdef, inputs: list, params: dict, outputs: tuple) -> list:
        """Run ``opdef``'s numpy implementation on every rank's pieces."""
        per_rank = {}
        for r in self.mesh.ranks():
            args = [x[r] if isinstance(x, dict) else x for x in inputs]
            per_rank[r] = opdef.run_numpy(args, params, [s.local_shape(r) for s in outputs])
        return [{r: per_rank[r][k] for r in self.mesh.ranks()} for k in range(len(outputs))]

    def collective(self, c, value: dict) -> dict:
        """Run one collective on every rank's piece."""
        return run_collective(c, value)

    def use(self, tensor: str, target, value: dict) -> dict:
        """A value before its consumers: nothing to do in a forward simulation."""
        return value


__all__ = ["NumpySimulator", "group_of", "run_collective", "run_moves"]
