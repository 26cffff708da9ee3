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

from ..caches import memo
from ..errors import RunError
from ..execute.simulator import group_of
from ..ops.ragged import RAGGED_OPS, run_nested
from ..ops.result import at_rank
from ..sharding.collective import CollectiveKind
from ..sharding.nested import Nested
from .ragged import ragged_exchange
from .torch_ops import torch_op


def plan_groups(plan, extra=()) -> list:
    """Every distinct (axis pieces, rank group) the plan's collectives (and the ``extra`` piece
    tuples, e.g. gradient reductions) need, in one order that every rank computes alike
    (``dist.new_group`` must be called in the same order)."""
    pieces = sorted({c.axes for moves in plan.moves.values() for c in moves if c.axes} | set(extra), key=repr)
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


@memo(4096)
def local_pick(c, rank: int) -> tuple:
    """Index tensors picking ``rank``'s target piece out of its source piece (a local slice)."""
    import torch

    return _ix(torch, _positions(c.src.indices(rank), c.dst.indices(rank)))


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

    def __init__(self, mesh, rank: int, groups: dict, after_collective=None, reductions=None):
        self.mesh, self.rank, self.groups = mesh, rank, groups
        self.ranks = (rank,)  # the ranks whose pieces it holds: its own
        self.reductions = reductions or {}  # (tensor, target) -> axis pieces its gradient is reduced over
        self.counts: dict = {}
        self.primitives: dict = {}  # the torch.distributed calls that actually ran, by name
        self.after_collective = after_collective

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
            if self.after_collective is not None and c.kind.communicates:
                self.after_collective(c)
            return out
        if c.reduce_op is not None:
            out = _Reduce.apply(x, self, c)
        elif c.kind is CollectiveKind.LOCAL:
            out = _Local.apply(x, self, c)
        elif c.kind is CollectiveKind.ALL_TO_ALL:
            out = _AllToAll.apply(x, self, c)
        else:
            out = _Gather.apply(x, self, c)
        if self.after_collective is not None and c.kind.communicates:
            self.after_collective(c)
        return out.contiguous()

    def start(self, c, x):
        """Issue collective ``c`` on ``x`` without waiting (``async_op=True``) and return a function
        that waits and gives the result — so a stream's next chunk moves while this one computes.
        Outside autograd only, and for gathers and reductions; anything else runs now."""
        import torch

        if not c.kind.communicates or torch.is_grad_enabled() or isinstance(x, Nested) or (
                c.reduce_op is None and c.kind is not CollectiveKind.ALL_GATHER):
            out = self.collective(c, x)
            return lambda: out
        self.counts[c.kind.value] = self.counts.get(c.kind.value, 0) + 1
        finish = (_reduce_issue if c.reduce_op is not None else _gather_issue)(x, self, c, True)

        def done():
            out = finish()
            if self.after_collective is not None:
                self.after_collective(c)
            return out.contiguous()

        return done

    def use(self, tensor: str, target, value):
        """Before its consumers: where their gradients arrive partial (``backward``), sum them."""
        pieces = self.reductions.get((tensor, target))
        return _GradSum.apply(value, self, pieces) if pieces else value

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


def _autograd():
    import torch

    return torch.autograd.Function


def _global_ids(s, rank: int) -> np.ndarray:
    """Row-major global offsets of the elements ``rank`` holds of ``s``, in local order."""
    idx = s.indices(rank)
    if not s.shape:
        return np.zeros(1, dtype=np.int64)
    return np.ravel_multi_index(np.ix_(*idx), s.shape).reshape(-1).astype(np.int64)


@memo(4096)
def gather_map(c, rank: int, members: tuple) -> tuple:
    """Where each element of ``rank``'s target piece sits in the group's stacked source pieces
    (slot j of size ``width`` holds member j's piece, flattened): ``(index, width)``. Sized by
    the group's data, never by the tensor's global extent."""
    sizes = [int(np.prod(c.src.local_shape(q))) for q in members]
    width = max(sizes) if sizes else 0
    ids = np.concatenate([_global_ids(c.src, q) for q in members])
    pos = np.concatenate([j * width + np.arange(n, dtype=np.int64) for j, n in enumerate(sizes)])
    order = np.argsort(ids, kind="stable")
    want = _global_ids(c.dst, rank)
    at = np.searchsorted(ids[order], want)
    return pos[order[at]], width


@memo(4096)
def scatter_map(c, rank: int, members: tuple) -> tuple:
    """For a reduce-scatter: per member, the positions (in this rank's source piece) of the
    elements that member keeps, and the padded width: ``(positions per member, width)``."""
    mine = {int(g): k for k, g in enumerate(_global_ids(c.src, rank))}
    per = tuple(np.asarray([mine[int(g)] for g in _global_ids(c.dst, q)], dtype=np.int64) for q in members)
    return per, max((len(p) for p in per), default=0)


@memo(4096)
def all_to_all_map(c, rank: int, members: tuple) -> tuple:
    """For an all-to-all: per member, the positions in this rank's source piece of what that
    member's target needs (in its order), and the positions in this rank's target piece of what
    that member's source sends (in this rank's order): ``(send, recv)``."""
    src_ids = {int(g): k for k, g in enumerate(_global_ids(c.src, rank))}
    dst_ids = _global_ids(c.dst, rank)
    send, recv = [], []
    for q in members:
        theirs = set(int(g) for g in _global_ids(c.src, q))
        send.append(np.asarray([src_ids[int(g)] for g in _global_ids(c.dst, q) if int(g) in src_ids], dtype=np.int64))
        recv.append(np.asarray([k for k, g in enumerate(dst_ids) if int(g) in theirs], dtype=np.int64))
    return tuple(send), tuple(recv)


class _GradSum(_autograd()):
    """Identity forward; backward sums the consumers' partial gradients over the axis pieces
    (Megatron's "f"; a data-parallel gradient sync)."""

    @staticmethod
    def forward(ctx, x, ex, pieces):
        ctx.ex, ctx.pieces = ex, pieces
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        import torch.distributed as dist

        ex = ctx.ex
        group, _ = ex.group_of_pieces(ctx.pieces)
        g = g.contiguous().clone()
        ex.counts["backward_all_reduce"] = ex.counts.get("backward_all_reduce", 0) + 1
        ex.ran("all_reduce")
        dist.all_reduce(g, op=dist.ReduceOp.SUM, group=group)
        return g, None, None


class _Local(_autograd()):
    """A local slice (and partition onto new partial axes: a sum is divided among the ranks).
    Adjoint with complete gradients: the slice's gradient put back in place and completed over
    the axes the slice cut on (one all-reduce), no division (every share's gradient is the sum's)."""

    @staticmethod
    def forward(ctx, x, ex, c):
        from .backward import slice_completions

        ctx.ex, ctx.c, ctx.new = ex, c, slice_completions(c)
        out = x[local_pick(c, ex.rank)]
        for a, op in c.dst.partial:
            if a not in dict(c.src.partial) and op == "sum":
                out = out / ex.mesh.axis_size(a)  # DTensor's Partial._partition_value
        return out

    @staticmethod
    def backward(ctx, g):
        import torch
        import torch.distributed as dist

        ex, c, r = ctx.ex, ctx.c, ctx.ex.rank
        grad = torch.zeros(c.src.local_shape(r), dtype=g.dtype)
        grad[local_pick(c, r)] = g
        if ctx.new:
            group, _ = ex.group_of_pieces(ctx.new)
            ex.counts["backward_all_reduce"] = ex.counts.get("backward_all_reduce", 0) + 1
            ex.ran("all_reduce")
            dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=group)
        return grad, None, None


class _AllToAll(_autograd()):
    """A piece that only moves: one ``all_to_all_single`` with per-member split sizes (uneven and
    empty splits included). Adjoint: the same exchange backwards."""

    @staticmethod
    def forward(ctx, x, ex, c):

        group, members = ex.group(c)
        send, recv = all_to_all_map(c, ex.rank, tuple(members))
        ctx.ex, ctx.c, ctx.send, ctx.recv = ex, c, send, recv
        ex.ran("all_to_all")
        out = _exchange(x.detach().reshape(-1), send, recv, int(np.prod(c.dst.local_shape(ex.rank))), group)
        return out.reshape(c.dst.local_shape(ex.rank))

    @staticmethod
    def backward(ctx, g):
        ex, c = ctx.ex, ctx.c
        group, _ = ex.group(c)
        ex.counts["backward_all_to_all"] = ex.counts.get("backward_all_to_all", 0) + 1
        ex.ran("all_to_all")
        grad = _exchange(g.reshape(-1), ctx.recv, ctx.send, int(np.prod(c.src.local_shape(ex.rank))), group)
        return grad.reshape(c.src.local_shape(ex.rank)), None, None


def _exchange(flat, send, recv, n_out: int, group):
    """Send ``flat[send[j]]`` to member j, receive into ``out[recv[j]]`` from member j."""
    import torch
    import torch.distributed as dist

    parts = [flat[torch.from_numpy(p)] for p in send]
    inp = torch.cat(parts) if parts else flat.new_zeros(0)
    got = flat.new_empty(sum(len(p) for p in recv))
    dist.all_to_all_single(got, inp, output_split_sizes=[len(p) for p in recv],
                           input_split_sizes=[len(p) for p in send], group=group)
    out = flat.new_zeros(n_out)
    out[torch.from_numpy(np.concatenate(recv) if recv else np.zeros(0, dtype=np.int64))] = got
    return out


class _Gather(_autograd()):
    """Pieces that move: one all_gather of the group's pieces (padded to one width: gloo refuses
    uneven sizes), then this rank picks its target's elements through ``gather_map``. Adjoint
    with complete gradients: this rank's own piece of the gradient, no communication."""

    @staticmethod
    def forward(ctx, x, ex, c):
        group, members = ex.group(c)
        ctx.ex, ctx.c, ctx.members = ex, c, tuple(members)
        return _gather_issue(x, ex, c, False)()

    @staticmethod
    def backward(ctx, g):
        import torch

        c, r = ctx.c, ctx.ex.rank
        # complete gradients: this rank's source piece is part of what it gathered
        pick = _ix(torch, _positions(c.dst.indices(r), c.src.indices(r)))
        return g[pick].contiguous(), None, None


def _gather_issue(x, ex, c, async_op: bool):
    """Issue the all_gather of ``c`` on this rank's piece ``x``; returns a function that waits
    for it and gives this rank's target piece (``gather_map``)."""
    import torch
    import torch.distributed as dist

    group, members = ex.group(c)
    index, width = gather_map(c, ex.rank, tuple(members))
    flat = x.detach().reshape(-1)
    pad = torch.zeros(width, dtype=x.dtype)
    pad[: flat.numel()] = flat
    stacked = torch.empty(width * len(members), dtype=x.dtype)
    ex.ran("all_gather")
    work = dist.all_gather_into_tensor(stacked, pad, group=group, async_op=async_op)

    def finish():
        if work is not None:
            work.wait()
        return stacked[torch.from_numpy(index)].reshape(c.dst.local_shape(ex.rank))

    return finish


def _reduce_issue(x, ex, c, async_op: bool):
    """Issue the reduction of ``c`` (a reduce-scatter, or an all-reduce) on this rank's partial
    piece ``x``; returns a function that waits for it and gives this rank's target piece."""
    import torch
    import torch.distributed as dist

    group, members = ex.group(c)
    members = tuple(members)
    op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
          "min": dist.ReduceOp.MIN}[c.reduce_op]
    r = ex.rank
    if c.kind is CollectiveKind.REDUCE_SCATTER:
        per, width = scatter_map(c, r, members)
        flat = x.detach().reshape(-1)
        stacked = torch.zeros(width * len(members), dtype=x.dtype)
        for j, p in enumerate(per):
            stacked[j * width: j * width + len(p)] = flat[torch.from_numpy(p)]
        mine = torch.empty(width, dtype=x.dtype)
        ex.ran("reduce_scatter")
        work = dist.reduce_scatter_tensor(mine, stacked, op=op, group=group, async_op=async_op)

        def done():
            return mine[: len(per[members.index(r)])].reshape(c.dst.local_shape(r))
    else:
        y = x.detach().clone().contiguous()
        ex.ran("all_reduce")
        work = dist.all_reduce(y, op=op, group=group, async_op=async_op)

        def done():
            return y[local_pick(c, r)]

    def finish():
        if work is not None:
            work.wait()
        out = done()
        return out / len(members) if c.reduce_op == "avg" else out

    return finish


class _Reduce(_autograd()):
    """Partial values reduced on the group: a planned reduce-scatter runs as one
    ``reduce_scatter_tensor`` (each member's part of this rank's piece, padded to one width), an
    all-reduce as one ``all_reduce``; then this rank keeps what its target names. Adjoint of a
    sum with complete gradients: a reduce-scatter's is an all-gather (each contributor needs every
    member's part), an all-reduce's is the gradient itself; an average divides by the group size."""

    @staticmethod
    def forward(ctx, x, ex, c):
        group, members = ex.group(c)
        ctx.ex, ctx.c, ctx.members, ctx.n = ex, c, tuple(members), len(members)
        return _reduce_issue(x, ex, c, False)()

    @staticmethod
    def backward(ctx, g):
        import torch
        import torch.distributed as dist

        ex, c, r = ctx.ex, ctx.c, ctx.ex.rank
        if c.reduce_op not in ("sum", "avg"):
            raise RunError(f"training through a partial {c.reduce_op} is not supported (it has no unique gradient)")
        group, _ = ex.group(c)
        if c.kind is CollectiveKind.REDUCE_SCATTER:
            per, width = scatter_map(c, r, ctx.members)
            pad = torch.zeros(width, dtype=g.dtype)
            pad[: g.numel()] = g.reshape(-1)
            stacked = torch.empty(width * len(ctx.members), dtype=g.dtype)
            ex.counts["backward_all_gather"] = ex.counts.get("backward_all_gather", 0) + 1
            ex.ran("all_gather")
            dist.all_gather_into_tensor(stacked, pad, group=group)
            grad = torch.zeros(int(np.prod(c.src.local_shape(r))), dtype=g.dtype)
            for j, p in enumerate(per):
                grad[torch.from_numpy(p)] += stacked[j * width: j * width + len(p)]
            grad = grad.reshape(c.src.local_shape(r))
        else:  # an all-reduce: every partial contributor's gradient is the sum's, complete already
            grad = torch.zeros(c.src.local_shape(r), dtype=g.dtype)
            grad[local_pick(c, r)] = g
        return (grad / ctx.n if c.reduce_op == "avg" else grad), None, None


__all__ = ["TorchRankExecutor", "plan_groups"]
