"""The torch.distributed executor: one rank runs the plan on its own local shards only.

It implements the executor seam (``shardlayout.execute.walk``): ``op`` runs the op's aten
implementation on local tensors, ``collective`` runs one planned :class:`Collective` on the
process group of the ranks that share every mesh coordinate but the collective's axis pieces
(a sub-axis such as ``tp:(2)2`` gets its own groups). Partial values are reduced with
``all_reduce`` on that group; pieces that move are exchanged with one ``all_gather`` of the
group's pieces (padded to equal size: gloo refuses uneven gathers) and the rank keeps what its
target sharding names — exact for strided, sub-axis and uneven shardings alike, at the memory
of the tensor's global extent on the group.
"""

from __future__ import annotations

import numpy as np

from ..errors import RunError
from ..execute.simulator import group_of
from ..sharding.collective import CollectiveKind
from .torch_ops import torch_op


def plan_groups(plan) -> list:
    """Every distinct (axis pieces, rank group) the plan's collectives need, in one order that
    every rank computes alike (``dist.new_group`` must be called in the same order)."""
    pieces = sorted({c.axes for moves in plan.moves.values() for c in moves if c.axes}, key=repr)
    out = []
    for ps in pieces:
        seen = []
        for r in plan.mesh.ranks():
            g = tuple(group_of(plan.mesh, r, ps))
            if g not in seen:
                seen.append(g)
        out.extend((ps, g) for g in seen)
    return out


def _ix(torch, idx):
    return tuple(torch.from_numpy(np.asarray(i, dtype=np.int64)) for i in np.ix_(*idx))


def _positions(src_idx, dst_idx):
    """Per dim, where each of ``dst_idx``'s global indices sits in ``src_idx``."""
    out = []
    for s, d in zip(src_idx, dst_idx):
        where = {int(v): k for k, v in enumerate(s)}
        out.append(np.asarray([where[int(v)] for v in d], dtype=np.int64))
    return out


class TorchRankExecutor:
    """Executes a plan on one rank of a torch.distributed job; ``counts`` tallies the
    collectives it ran, by kind."""

    def __init__(self, mesh, rank: int, groups: dict, after_collective=None):
        self.mesh, self.rank, self.groups = mesh, rank, groups
        self.counts: dict = {}
        self.primitives: dict = {}  # the torch.distributed calls that actually ran, by name
        self.after_collective = after_collective

    def op(self, opdef, inputs: list, params: dict, outputs: tuple) -> list:
        """Run the op's aten implementation on this rank's local tensors."""
        return torch_op(opdef, inputs, params, [s.local_shape(self.rank) for s in outputs])

    def collective(self, c, x):
        """Run one planned collective on this rank's piece ``x`` (differentiable: its backward
        is the exact adjoint, one ``all_reduce`` on the same group)."""
        import torch

        if c.kind.communicates:
            self.counts[c.kind.value] = self.counts.get(c.kind.value, 0) + 1
        src, dst, r = c.src, c.dst, self.rank
        if c.reduce_op is not None:
            out = _Reduce.apply(x, self, c)
        elif c.kind is CollectiveKind.LOCAL:
            out = x[_ix(torch, _positions(src.indices(r), dst.indices(r)))]
        else:
            out = _Gather.apply(x, self, c)
        for a, op in dst.partial:
            if a not in dict(src.partial) and op == "sum":
                out = out / self.mesh.axis_size(a)  # DTensor's Partial._partition_value
        if self.after_collective is not None and c.kind.communicates:
            self.after_collective(c)
        return out.contiguous()

    def group(self, c):
        """``(process group, members)`` of this rank for collective ``c``."""
        return self.groups.get(c.axes, (None, (self.rank,)))

    def backward_all_reduce(self, buf, c):
        """The adjoint's one all_reduce (sum) on ``c``'s group; counted under ``backward``."""
        import torch.distributed as dist

        group, members = self.group(c)
        self.counts["backward_all_reduce"] = self.counts.get("backward_all_reduce", 0) + 1
        self.ran("all_reduce")
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
        return buf

    def ran(self, primitive: str) -> None:
        """Tally one torch.distributed call."""
        self.primitives[primitive] = self.primitives.get(primitive, 0) + 1


def _autograd():
    import torch

    return torch.autograd.Function


class _Gather(_autograd()):
    """Pieces that move: one all_gather of the group's pieces (padded: gloo refuses uneven
    sizes), then this rank keeps what its target names. Adjoint: scatter the gradient into the
    tensor's extent, sum it over the group, keep this rank's source piece."""

    @staticmethod
    def forward(ctx, x, ex, c):
        import torch
        import torch.distributed as dist

        ctx.ex, ctx.c = ex, c
        group, members = ex.group(c)
        src, r = c.src, ex.rank
        sizes = [int(np.prod(src.local_shape(q))) for q in members]
        flat = x.detach().reshape(-1)
        pad = torch.zeros(max(sizes), dtype=x.dtype)
        pad[: flat.numel()] = flat
        got = [torch.empty_like(pad) for _ in members]
        ex.ran("all_gather")
        dist.all_gather(got, pad, group=group)
        buf = torch.zeros(src.shape, dtype=x.dtype)
        for q, n, piece in zip(members, sizes, got):
            buf[_ix(torch, src.indices(q))] = piece[:n].reshape(src.local_shape(q))
        return buf[_ix(torch, c.dst.indices(r))]

    @staticmethod
    def backward(ctx, g):
        import torch

        ex, c, r = ctx.ex, ctx.c, ctx.ex.rank
        buf = torch.zeros(c.src.shape, dtype=g.dtype)
        buf[_ix(torch, c.dst.indices(r))] = g
        buf = ex.backward_all_reduce(buf, c)
        return buf[_ix(torch, c.src.indices(r))], None, None


class _Reduce(_autograd()):
    """Partial values reduced on the group (all_reduce), then this rank keeps what its target
    names (a reduce-scatter keeps a slice). Adjoint of a sum: scatter the gradient into the
    source piece and sum it over the group (an average divides by the group size)."""

    @staticmethod
    def forward(ctx, x, ex, c):
        import torch
        import torch.distributed as dist

        ctx.ex, ctx.c = ex, c
        group, members = ex.group(c)
        y = x.detach().clone().contiguous()
        op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
              "min": dist.ReduceOp.MIN}[c.reduce_op]
        ex.ran("all_reduce")
        dist.all_reduce(y, op=op, group=group)
        if c.reduce_op == "avg":
            y = y / len(members)
        ctx.n = len(members)
        return y[_ix(torch, _positions(c.src.indices(ex.rank), c.dst.indices(ex.rank)))]

    @staticmethod
    def backward(ctx, g):
        import torch

        ex, c, r = ctx.ex, ctx.c, ctx.ex.rank
        if c.reduce_op not in ("sum", "avg"):
            raise RunError(f"training through a partial {c.reduce_op} is not supported (it has no unique gradient)")
        buf = torch.zeros(c.src.local_shape(r), dtype=g.dtype)
        buf[_ix(torch, _positions(c.src.indices(r), c.dst.indices(r)))] = g
        buf = ex.backward_all_reduce(buf, c)
        return (buf / ctx.n if c.reduce_op == "avg" else buf), None, None


__all__ = ["TorchRankExecutor", "plan_groups"]
