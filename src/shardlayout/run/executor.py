"""The torch.distributed executor: one rank runs the plan on its own local shards only.

It implements the executor seam (``shardlayout.execute.walk``): ``op`` runs the op's aten
implementation on local tensors, ``collective`` runs one planned :class:`Collective` as a
``run.moves.Move`` — the module the generated per-rank program (``run.program``) holds for it, so
the interpreter and ``parallelize`` share one implementation of every move and its adjoint — on
the process group of the ranks that share every mesh coordinate but the collective's axis pieces
(a sub-axis such as ``tp:(2)2`` gets its own groups). Ragged (nested) pieces move by
``run.ragged``. Collectives that reach the dispatcher are tallied by ``count_calls``.
"""

from __future__ import annotations

import numpy as np

from ..ops.ragged import RAGGED_OPS, run_nested
from ..ops.result import at_rank
from ..sharding.nested import Nested
from .backward import reduction_at
from .moves import plan_groups
from .ragged import ragged_exchange
from .torch_ops import torch_op

# the torch.distributed primitive each dispatcher-level collective is (functional and c10d forms)
PRIMITIVES = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
              "all_reduce": "all_reduce", "all_to_all_single": "all_to_all"}


def count_calls(counts: dict):
    """A dispatch mode that adds each functional collective reaching the dispatcher to ``counts``
    by primitive (``all_gather``, ``reduce_scatter``, ``all_reduce``, ``all_to_all``): what really
    ran, not our bookkeeping. ``with count_calls(d): ...``"""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ns, _, rest = str(func).partition(".")
            prim = PRIMITIVES.get(rest.split(".")[0]) if ns == "_c10d_functional" else None
            if prim is not None:
                counts[prim] = counts.get(prim, 0) + 1
            return func(*args, **(kwargs or {}))

    return Count()


class TorchRankExecutor:
    """Executes a plan on one rank of a torch.distributed job; ``counts`` tallies the
    collectives it ran, by kind."""

    def __init__(self, mesh, rank: int, groups: dict, after_collective=None, reductions=None):
        self.mesh, self.rank, self.groups = mesh, rank, groups
        self.ranks = (rank,)  # the ranks whose pieces it holds: its own
        self.reductions = reductions or {}  # plan.backward.gradient_reductions: (tensor, target, pieces) -> readers
        self.readers = reduction_at(self.reductions)  # (op index, input position) -> its reduction (walk)
        self.counts: dict = {}
        self.primitives: dict = {}  # the torch.distributed calls that actually ran, by name
        self.after_collective = after_collective
        self._moves: dict = {}
        self._sums: dict = {}

    def op(self, opdef, inputs: list, params: dict, outputs: tuple) -> list:
        """Run the op's aten implementation on this rank's local tensors."""
        shapes = [s.local_shape(self.rank) for s in outputs]
        if opdef.name in RAGGED_OPS or any(isinstance(a, Nested) for a in inputs):
            import torch

            return run_nested(opdef, inputs, at_rank(params, self.mesh, self.rank), shapes, torch_op, torch)
        return torch_op(opdef, inputs, at_rank(params, self.mesh, self.rank), shapes)

    def collective(self, c, x):
        """Run one planned collective on this rank's piece ``x`` (differentiable: its backward is
        the exact adjoint for complete gradients, see ``run.backward``)."""

        if c.kind.communicates:
            self.counts[c.kind.value] = self.counts.get(c.kind.value, 0) + 1
        if isinstance(x, Nested):  # a ragged tensor: blocks sized by the routing counts
            out = ragged_exchange(self, c, x)
        else:
            out = self.move(c)(x).contiguous()
        if self.after_collective is not None and c.kind.communicates:
            self.after_collective(c)
        return out

    def move(self, c):
        """The ``run.moves.Move`` of collective ``c`` at this rank (made once)."""
        from .moves import Move

        got = self._moves.get(c)
        if got is None:
            got = self._moves[c] = Move(c, self.rank, self.groups)
        return got

    def start(self, c, x):
        """Issue collective ``c`` on ``x`` without waiting (``Move.issue``) and return a function
        that waits and gives the result (``Move.finish``) — so a stream's next chunk moves while
        this one computes; differentiable like ``collective``. A ragged piece or a move with
        nothing in flight (a local step, an all-to-all) runs now."""
        move = self.move(c)
        if not c.kind.communicates or isinstance(x, Nested) or not move.split:
            out = self.collective(c, x)
            return lambda: out
        self.counts[c.kind.value] = self.counts.get(c.kind.value, 0) + 1
        raw = move.issue(x)

        def done():
            out = move.finish(raw)
            if self.after_collective is not None:
                self.after_collective(c)
            return out.contiguous()

        return done

    def use(self, reduction: tuple, value):
        """Before the consumers that read it through ``reduction`` (``backward``): sum their
        partial gradients over its axis pieces."""
        from .moves import GradSum

        pieces = reduction[2]
        if pieces not in self._sums:
            self._sums[pieces] = GradSum(pieces, self.groups)
        if isinstance(value, Nested):  # routed rows: the same sum over their stored blocks
            return Nested(self._sums[pieces](value.data), value.extents, value.dim)
        return self._sums[pieces](value)

    def chunk(self, value, dim: int, positions: dict):
        """This rank's part of a stream chunk: its piece at ``positions[rank]`` along ``dim``."""
        import torch

        return value.index_select(dim, torch.from_numpy(np.ascontiguousarray(positions[self.rank])))

    def join(self, parts: list, dim: int, positions: list, shapes: dict):
        """This rank's piece put together from its stream chunks (differentiable)."""
        import torch

        out = parts[0].new_zeros(shapes[self.rank])
        for part, pos in zip(parts, positions):
            out = out.index_copy(dim, torch.from_numpy(np.ascontiguousarray(pos[self.rank])), part)
        return out

    def group(self, c):
        """``(process group, members)`` of this rank for collective ``c``."""
        return self.groups.get(c.axes, (None, (self.rank,)))

    def group_of_pieces(self, pieces):
        """``(process group, members)`` of this rank over the given axis pieces."""
        return self.groups.get(tuple(pieces), (None, (self.rank,)))

    def ran(self, primitive: str) -> None:
        """Tally one torch.distributed call."""
        self.primitives[primitive] = self.primitives.get(primitive, 0) + 1



__all__ = ["PRIMITIVES", "TorchRankExecutor", "count_calls", "plan_groups"]
