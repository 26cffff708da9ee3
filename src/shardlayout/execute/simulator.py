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
from ..ops.ragged import RAGGED_OPS, run_nested
from ..ops.result import at_rank
from ..sharding.collective import CollectiveKind
from ..sharding.nested import Nested
from ..sharding.ragged import ragged_collective_piece
from .classes import group_ranks

_REDUCE = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min}



def grid(lists) -> tuple:
    """``np.ix_(*lists)`` for 1-D integer index arrays, without its per-call dtype checks (the
    simulator and verify index pieces thousands of times). ``grid([[0, 1], [2]])[0].shape -> (2, 1)``"""
    n = len(lists)
    out = []
    for k, x in enumerate(lists):
        a = np.asarray(x)
        if a.dtype.kind not in "iu":
            a = a.astype(np.intp)
        out.append(a.reshape((1,) * k + (-1,) + (1,) * (n - k - 1)))
    return tuple(out)

def group_of(mesh: Mesh, rank: int, pieces: tuple) -> list:
    """Ranks in ``rank``'s group for a collective over ``pieces`` (AxisPiece values): those whose
    coordinates agree with it everywhere except in the digits of the pieces (ascending;
    enumerated from the pieces, never by scanning the mesh)."""
    return list(group_ranks(mesh, rank, tuple(pieces)))


def _where(want: np.ndarray, n: int) -> np.ndarray:
    """Per global index of a dim of size ``n``, its position in ``want`` (-1: not wanted)."""
    where = np.full(n, -1, dtype=np.int64)
    where[want] = np.arange(len(want))
    return where


def _positions(held: np.ndarray, where: np.ndarray) -> tuple:
    """``(k, j)``: the positions ``k`` in ``held`` whose global index is ``want[j]`` (``where``:
    ``_where(want, n)``, made once per dim for every member of a group)."""
    j = where[held] if len(held) else np.zeros(0, dtype=np.int64)
    k = np.nonzero(j >= 0)[0]
    return k, j[k]


def collective_piece(c, rank: int, pieces: dict, want=None, held=None):
    """``rank``'s piece after collective ``c``, from the pieces of its group (``pieces`` maps
    every member of ``group_of(mesh, rank, c.axes)`` to its source piece). Each member's
    elements are placed by their global indices into ``rank``'s target piece only (memory: the
    target piece, never the global tensor). A gather takes each element from any member that
    holds it; a reduction needs it from every member. ``want`` (per dim, global indices; default
    ``dst.indices(rank)``) asks for a sub-box of the target piece, ``held`` ({member: per-dim
    indices}; default ``src.indices(member)``) says what each given piece covers. Raises
    ``ShardMismatch`` when the group does not hold what the target names."""
    src, dst, mesh = c.src, c.dst, c.src.mesh
    group = group_of(mesh, rank, c.axes)
    reduce_op = c.reduce_op if c.kind.communicates else None
    want = dst.indices(rank) if want is None else want
    shape = tuple(len(w) for w in want)
    dtype = np.result_type(*[np.asarray(pieces[q]).dtype for q in group], np.float64)
    have = np.zeros(shape, dtype=bool)
    out = np.zeros(shape, dtype=dtype)
    stacked = np.zeros((len(group),) + shape, dtype=dtype) if reduce_op else None  # every member's, in group order
    wheres = [_where(w, n) for w, n in zip(want, src.shape)]
    placed: dict = {}  # a member's index arrays (by identity, kept alive here) -> where to read and write
    for m, q in enumerate(group):
        mine = src.indices(q) if held is None else held[q]
        if not reduce_op and any(len(h) == 0 for h in mine):
            continue  # an empty piece gives nothing
        got = placed.get(tuple(map(id, mine)))
        if got is None:
            pos = [_positions(h, wh) for h, wh in zip(mine, wheres)]
            got = placed[tuple(map(id, mine))] = (mine, pos, grid([k for k, _ in pos]) if pos else (),
                                                 grid([j for _, j in pos]) if pos else (),
                                                 all(len(j) == len(w) for (_, j), w in zip(pos, want)))
        _, pos, take, at, covers = got
        block = np.asarray(pieces[q])[take] if pos else np.asarray(pieces[q])
        if reduce_op:
            if not covers:
                raise ShardMismatch(
                    f"{c.kind.value} over {c.axes_text()}: rank {q} of rank {rank}'s group {group} does not hold "
                    f"every element rank {rank} needs ({src} -> {dst}); a reduction needs them from every member")
            if at:
                stacked[m][at] = block
            else:  # a 0-d piece (a whole tensor's mean, all-reduced): stacked[m] is a number, not a view
                stacked[m] = block
        else:
            out[at] = block
        have[at] = True
    if not have.all():
        raise ShardMismatch(
            f"{c.kind.value} over {c.axes_text() or 'no axes'}: rank {rank} needs elements its group "
            f"{group} does not hold ({src} -> {dst}); the plan is invalid"
        )
    if reduce_op:
        out = _REDUCE[reduce_op](stacked, axis=0)
    src_partial = dict(src.partial)
    for a, op in dst.partial:
        if a not in src_partial and op == "sum":
            out = out / mesh.axis_size(a)  # DTensor's Partial._partition_value
    return out


def run_collective(c, pieces: dict) -> dict:
    """Run one :class:`Collective` on ``{rank: piece}``; returns the new pieces."""
    if c.kind is CollectiveKind.PERMUTE:
        return ring_shift(c, pieces)
    return {r: collective_piece(c, r, pieces) for r in c.src.mesh.ranks()}


def ring_previous(mesh: Mesh, rank: int, pieces: tuple) -> int:
    """The rank before ``rank`` in its ring over the axis ``pieces`` (its group, in coordinate
    order, wrapping around). ``ring_previous(Mesh.parse("tp=4"), 0, (AxisPiece("tp", 4),)) -> 3``"""
    group = group_of(mesh, rank, pieces)
    return group[(group.index(rank) - 1) % len(group)]


def ring_shift(c, pieces: dict) -> dict:
    """One ring step (a ``PERMUTE``, ``sharding.move.ring_steps``): every rank's piece goes to the
    next rank of its ring, so each rank gets its previous rank's. ``ring_shift(step, {0: a, 1: b})
    -> {0: b, 1: a}``"""
    mesh = c.src.mesh
    return {r: pieces[ring_previous(mesh, r, c.axes)] for r in mesh.ranks()}


def run_moves(moves, pieces: dict) -> dict:
    """Run collectives in order. ``run_moves((), pieces) is pieces``."""
    for c in moves:
        pieces = run_collective(c, pieces)
    return pieces


def _run_dense(opdef, args, params, shapes):
    return opdef.run_numpy(args, params, shapes)


class NumpySimulator:
    """Every rank of ``mesh`` in one process, in numpy; a local value is ``{rank: array}``."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh
        self.ranks = tuple(mesh.ranks())  # the ranks whose pieces it holds: all

    def op(self, opdef, inputs: list, params: dict, outputs: tuple) -> list:
        """Run ``opdef``'s numpy implementation on every rank's pieces."""
        per_rank = {}
        for r in self.mesh.ranks():
            args = [x[r] if isinstance(x, dict) else x for x in inputs]
            shapes = [s.local_shape(r) for s in outputs]
            if opdef.name in RAGGED_OPS or any(isinstance(a, Nested) for a in args):
                per_rank[r] = run_nested(opdef, args, at_rank(params, self.mesh, r), shapes, _run_dense, np)
                continue
            per_rank[r] = opdef.run_numpy(args, at_rank(params, self.mesh, r), shapes)
        return [{r: per_rank[r][k] for r in self.mesh.ranks()} for k in range(len(outputs))]

    def collective(self, c, value: dict) -> dict:
        """Run one collective on every rank's piece (nested pieces: ``ragged_collective_piece``)."""
        if c.kind is CollectiveKind.PERMUTE:
            return ring_shift(c, value)
        if isinstance(next(iter(value.values())), Nested):
            return {r: ragged_collective_piece(c, r, value, group_of(self.mesh, r, c.axes)) for r in self.mesh.ranks()}
        return run_collective(c, value)

    def use(self, reduction: tuple, value: dict) -> dict:
        """A value before its consumers' gradient sum: nothing to do in a forward simulation."""
        return value

    def chunk(self, value: dict, dim: int, positions: dict) -> dict:
        """Every rank's part of a stream chunk: its piece at ``positions[rank]`` along ``dim``."""
        return {r: np.take(value[r], positions[r], axis=dim) for r in self.mesh.ranks()}

    def join(self, parts: list, dim: int, positions: list, shapes: dict) -> dict:
        """Every rank's piece put together from its stream chunks (``parts[j]`` at ``positions[j]``)."""
        out = {}
        for r in self.mesh.ranks():
            piece = np.zeros(shapes[r], dtype=np.result_type(*[p[r] for p in parts]))
            for part, pos in zip(parts, positions):
                idx = [slice(None)] * piece.ndim
                idx[dim] = pos[r]
                piece[tuple(idx)] = part[r]
            out[r] = piece
        return out


__all__ = ["NumpySimulator", "collective_piece", "grid", "group_of", "run_collective", "run_moves"]
