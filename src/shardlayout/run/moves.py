"""A planned :class:`Collective` at one rank as a differentiable torch module on functional collectives.

``Move(c, rank, group)`` precomputes, once, the flat index maps that say where each element of this
rank's target piece comes from (``gather_map``, ``scatter_map``, ``all_to_all_map``, ``local_pick``:
sized by the group's pieces, never by the tensor's global extent), and its forward is one
``torch.distributed._functional_collectives`` call (``all_gather_single``, ``reduce_scatter_single``,
``all_reduce``, ``all_to_all_single`` with per-member split sizes) between index ops on constant
tensors — so ``torch.compile`` sees ordinary ``_c10d_functional`` collectives.

Its backward is the plan's, not the functional collectives' own (``plan.backward``: every rank holds
the *complete* gradient of what it holds): an all-gather's adjoint is this rank's own piece of the
gradient, an all-reduce's the gradient itself, a reduce-scatter's an all-gather, an all-to-all's the
reverse all-to-all, a local slice's the gradient put back and completed over the axes it cut on.
``GradSum`` is Megatron's "f": identity forward, one all-reduce of the consumers' partial gradients.

    >>> from shardlayout import Mesh, Sharding
    >>> from shardlayout.sharding.move import plan_move
    >>> m = Mesh.parse("tp=2")
    >>> c, = plan_move(Sharding.parse("[tp*2, 4]", m), Sharding.parse("[4, 4]", m))
    >>> index, width = gather_map(c, 1, (0, 1)); width, index.tolist()[:4]
    (8, [0, 1, 2, 3])
"""

from __future__ import annotations

import math

import numpy as np

from ..caches import memo
from ..errors import RunError
from ..execute.simulator import group_of
from ..sharding.collective import CollectiveKind


def _global_ids(s, rank: int) -> np.ndarray:
    """Row-major global offsets of the elements ``rank`` holds of ``s``, in local order."""
    idx = s.indices(rank)
    if not s.shape:
        return np.zeros(1, dtype=np.int64)
    return np.ravel_multi_index(np.ix_(*idx), s.shape).reshape(-1).astype(np.int64)


def _where(held: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Positions in ``held`` of each of ``want``'s global offsets (every one must be held)."""
    order = np.argsort(held, kind="stable")
    at = np.searchsorted(held[order], want)
    return order[at].astype(np.int64)


@memo(4096)
def local_pick(c, rank: int) -> np.ndarray:
    """Flat positions, in ``rank``'s source piece, of its target piece's elements (a local slice)."""
    return _where(_global_ids(c.src, rank), _global_ids(c.dst, rank))


@memo(4096)
def gather_map(c, rank: int, members: tuple) -> tuple:
    """Where each element of ``rank``'s target piece sits in the group's stacked source pieces
    (slot j of size ``width`` holds member j's piece, flattened): ``(index, width)``."""
    sizes = [math.prod(c.src.local_shape(q)) for q in members]
    width = max(sizes) if sizes else 0
    ids = np.concatenate([_global_ids(c.src, q) for q in members])
    pos = np.concatenate([j * width + np.arange(n, dtype=np.int64) for j, n in enumerate(sizes)])
    return pos[_where(ids, _global_ids(c.dst, rank))], width


@memo(4096)
def scatter_map(c, rank: int, members: tuple) -> tuple:
    """For a reduce-scatter: per member, the positions (in this rank's source piece) of the
    elements that member keeps, and the padded width: ``(positions per member, width)``."""
    mine = _global_ids(c.src, rank)
    per = tuple(_where(mine, _global_ids(c.dst, q)) for q in members)
    return per, max((len(p) for p in per), default=0)


@memo(4096)
def all_to_all_map(c, rank: int, members: tuple) -> tuple:
    """For an all-to-all: per member, the positions in this rank's source piece of what that
    member's target needs (in its order), and the positions in this rank's target piece of what
    that member's source sends (in this rank's order): ``(send, recv)``."""
    src_ids, dst_ids = _global_ids(c.src, rank), _global_ids(c.dst, rank)
    send, recv = [], []
    for q in members:
        want = _global_ids(c.dst, q)
        send.append(_where(src_ids, want[np.isin(want, src_ids)]))
        recv.append(np.nonzero(np.isin(dst_ids, _global_ids(c.src, q)))[0].astype(np.int64))
    return tuple(send), tuple(recv)


def splits(c) -> bool:
    """Whether collective ``c`` runs as two halves, issued then waited for (``Move.issue`` /
    ``Move.finish``): a gather or a reduction; a local step, an all-to-all or a ring step runs whole."""
    return c.kind not in (CollectiveKind.LOCAL, CollectiveKind.ALL_TO_ALL, CollectiveKind.PERMUTE)


def target_shape(c, rank: int) -> tuple:
    """The shape of ``rank``'s piece after collective ``c``: its target's local shape, or for a
    ring step (``PERMUTE``, ``sharding.move.ring_steps``) the shard it passes on, the source's."""
    return tuple((c.src if c.kind is CollectiveKind.PERMUTE else c.dst).local_shape(rank))


def ring_map(c, rank: int, members: tuple) -> tuple:
    """A ring step as an all-to-all's split sizes: ``rank`` sends its whole piece to the next member
    of its ring and gets the previous member's (``execute.simulator.ring_shift``): ``(send sizes,
    recv sizes)`` per member. ``ring_map(step, 0, (0, 1, 2)) -> ((0, n, 0), (0, 0, n))``"""
    n, at = math.prod(c.src.local_shape(rank)), members.index(rank)
    nxt, prev = (at + 1) % len(members), (at - 1) % len(members)
    return (tuple(n if j == nxt else 0 for j in range(len(members))),
            tuple(n if j == prev else 0 for j in range(len(members))))


def raw_shape(c, rank: int, members: tuple) -> tuple:
    """The shape of ``Move.issue``'s raw result at ``rank``: the stacked padded pieces of a
    gather, this rank's padded slot of a reduce-scatter, the reduced piece of an all-reduce."""
    if c.reduce_op is not None and c.kind is CollectiveKind.REDUCE_SCATTER:
        return (scatter_map(c, rank, members)[1],)
    if c.reduce_op is not None:
        return tuple(c.src.local_shape(rank))
    return (len(members) * max(math.prod(c.src.local_shape(q)) for q in members),)


def own_pick(c, rank: int) -> np.ndarray:
    """Flat positions, in ``rank``'s target piece, of its source piece's elements: a gather's
    adjoint under complete gradients. A target that does not hold the source has no such adjoint."""
    src, dst = _global_ids(c.src, rank), _global_ids(c.dst, rank)
    if not np.isin(src, dst).all():
        raise RunError(f"training through the move {c.src} -> {c.dst} of {c.tensor!r}: rank {rank}'s target "
                       "piece does not hold its source piece, so its gradient has no local adjoint")
    return _where(dst, src)


def _funcol():
    import torch.distributed._functional_collectives as funcol

    return funcol


def _autograd():
    import torch

    return torch.autograd.Function


def _t(a) -> "object":
    import torch

    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))


def _c10d():
    """The functional collectives' ops themselves: issued here, waited for (``wait_tensor``) where
    the result is first read — a graph holds the two as separate nodes a compiler can move apart."""
    import torch

    return torch.ops._c10d_functional


def _wait(raw):
    return _c10d().wait_tensor(raw)


def _padded(flat, width: int):
    """``flat`` zero-padded to ``width`` elements (gloo gathers equal sizes only)."""
    import torch

    if flat.numel() < width:
        flat = torch.nn.functional.pad(flat, (0, width - flat.numel()))
    return flat.contiguous()


def _wire_op(op: str) -> str:
    return "sum" if op == "avg" else op


# Each communicating move is two differentiable halves: ``issue`` starts the collective and gives
# its raw, not-yet-waited result; ``finish`` waits for it and picks this rank's target piece. Their
# backwards compose to the plan's adjoint of the whole move.


class _GatherIssue(_autograd()):
    """All-gather of this rank's padded flat piece; adjoint: its own slot of the stacked gradient."""

    @staticmethod
    def forward(ctx, x, width: int, n: int, slot: int, group: str):
        ctx.meta = (tuple(x.shape), x.numel(), slot * width)
        return _c10d().all_gather_into_tensor(_padded(x.reshape(-1), width), n, group)

    @staticmethod
    def backward(ctx, g):
        shape, numel, at = ctx.meta
        return g[at: at + numel].reshape(shape), None, None, None, None


class _GatherFinish(_autograd()):
    """This rank's target picked from the stacked pieces; adjoint (complete gradients): the
    gradient of its own source elements, put in its own slot."""

    @staticmethod
    def forward(ctx, raw, index, own, at: int, n_src: int, shape: tuple):
        ctx.save_for_backward(own)
        ctx.meta = (raw.numel(), at, n_src)
        return _wait(raw)[index].reshape(shape)

    @staticmethod
    def backward(ctx, g):
        (own,) = ctx.saved_tensors
        numel, at, n_src = ctx.meta
        if own.numel() != n_src:
            raise RunError("training through an all-gather whose target piece does not hold its source piece: "
                           "its gradient has no local adjoint (please report the plan)")
        grad = g.new_zeros(numel)
        grad[at: at + n_src] = g.reshape(-1)[own]
        return grad, None, None, None, None, None


class _ScatterIssue(_autograd()):
    """Each member's part of this rank's partial piece stacked (padded to one width) and
    reduce-scattered; adjoint of a sum: the gradient all-gathered, put back at each part's positions."""

    @staticmethod
    def forward(ctx, x, slots, positions, width: int, n: int, op: str, group: str):
        ctx.save_for_backward(slots, positions)
        ctx.meta = (tuple(x.shape), x.numel(), group)
        flat = x.reshape(-1)
        stacked = flat.new_zeros(width * n).index_copy(0, slots, flat[positions])
        return _c10d().reduce_scatter_tensor(stacked, _wire_op(op), n, group)

    @staticmethod
    def backward(ctx, g):
        slots, positions = ctx.saved_tensors
        shape, numel, group = ctx.meta
        stacked = _funcol().all_gather_single(g.contiguous(), 0, group)
        return (g.new_zeros(numel).index_add(0, positions, stacked[slots]).reshape(shape),
                None, None, None, None, None, None)


class _ScatterFinish(_autograd()):
    """This rank's kept part of its reduced slot (an average divided); adjoint: padded back."""

    @staticmethod
    def forward(ctx, raw, keep: int, n: int, op: str, shape: tuple):
        ctx.meta = (raw.numel(), n, op)
        out = _wait(raw)[:keep].reshape(shape)
        return out / n if op == "avg" else out

    @staticmethod
    def backward(ctx, g):
        width, n, op = ctx.meta
        _differentiable(op)
        grad = _padded(g.reshape(-1), width)
        return (grad / n if op == "avg" else grad), None, None, None, None


class _ReduceIssue(_autograd()):
    """All-reduce of the partial piece; adjoint (complete gradients): the gradient itself."""

    @staticmethod
    def forward(ctx, x, op: str, group: str):
        return _c10d().all_reduce(x.contiguous(), _wire_op(op), group)

    @staticmethod
    def backward(ctx, g):
        return g, None, None


class _ReduceFinish(_autograd()):
    """This rank's target picked from the reduced piece; adjoint: the gradient put back."""

    @staticmethod
    def forward(ctx, raw, pick, n: int, op: str, shape: tuple):
        ctx.save_for_backward(pick)
        ctx.meta = (tuple(raw.shape), raw.numel(), op, n)
        out = _wait(raw).reshape(-1)[pick].reshape(shape)
        return out / n if op == "avg" else out

    @staticmethod
    def backward(ctx, g):
        (pick,) = ctx.saved_tensors
        shape, numel, op, n = ctx.meta
        _differentiable(op)
        grad = g.new_zeros(numel).index_add(0, pick, g.reshape(-1)).reshape(shape)
        return (grad / n if op == "avg" else grad), None, None, None, None

class _AllToAll(_autograd()):
    """Pieces that only move: one ``all_to_all_single`` with per-member split sizes; adjoint: the
    same exchange backwards."""

    @staticmethod
    def forward(ctx, x, send, recv, send_sizes: tuple, recv_sizes: tuple, group: str, shape: tuple):
        got = _funcol().all_to_all_single(x.reshape(-1)[send].contiguous(), list(recv_sizes), list(send_sizes), group)
        n_out = math.prod(shape)
        ctx.save_for_backward(send, recv)
        ctx.meta = (tuple(x.shape), x.numel(), send_sizes, recv_sizes, group)
        return got.new_zeros(n_out).index_copy(0, recv, got).reshape(shape)

    @staticmethod
    def backward(ctx, g):
        send, recv = ctx.saved_tensors
        src_shape, numel, send_sizes, recv_sizes, group = ctx.meta
        got = _funcol().all_to_all_single(g.reshape(-1)[recv].contiguous(), list(send_sizes), list(recv_sizes), group)
        return g.new_zeros(numel).index_copy(0, send, got).reshape(src_shape), None, None, None, None, None, None


class _Local(_autograd()):
    """A local slice (a sum partitioned onto new partial axes is divided among their ranks);
    adjoint: the gradient put back in place, completed over the axes the slice cut on."""

    @staticmethod
    def forward(ctx, x, pick, scale: float, group, shape: tuple):
        ctx.save_for_backward(pick)
        ctx.meta = (tuple(x.shape), x.numel(), group)
        out = x.reshape(-1)[pick].reshape(shape)
        return out / scale if scale != 1 else out

    @staticmethod
    def backward(ctx, g):
        (pick,) = ctx.saved_tensors
        src_shape, numel, group = ctx.meta
        grad = g.new_zeros(numel).index_add(0, pick, g.reshape(-1))
        if group is not None:
            grad = _funcol().all_reduce(grad, "sum", group)
        return grad.reshape(src_shape), None, None, None, None


class _GradSum(_autograd()):
    """Identity forward; backward sums the consumers' partial gradients over a group."""

    @staticmethod
    def forward(ctx, x, group: str):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _funcol().all_reduce(g.contiguous(), "sum", ctx.group), None


def _differentiable(op: str) -> None:
    if op not in ("sum", "avg"):
        raise RunError(f"training through a partial {op} is not supported (it has no unique gradient); "
                       "reduce it before a loss, or pin the tensor replicated")


def _module():
    import torch

    return torch.nn.Module


class Move(_module()):
    """One planned collective at one rank: ``Move(c, rank, groups)(x)`` is this rank's target piece.
    ``groups`` maps axis-piece tuples to ``(group name, members)`` (``process_groups``)."""

    def __init__(self, c, rank: int, groups: dict):
        super().__init__()
        from .backward import slice_completions

        self.kind, self.shape = c.kind, target_shape(c, rank)
        self.split = splits(c)  # issue and finish are two steps; else issue is the whole move
        self.label = f"{c.kind.value} {c.tensor or ''} {c.src} -> {c.dst}".strip()
        buf = lambda name, a: self.register_buffer(name, _t(a), persistent=False)  # noqa: E731
        if c.kind is CollectiveKind.LOCAL:
            new = slice_completions(c)
            self.group = _group(groups, new)[0] if new else None
            self.scale = float(math.prod(c.src.mesh.axis_size(a) for a, op in c.dst.partial
                                         if a not in dict(c.src.partial) and op == "sum"))
            buf("pick", local_pick(c, rank))
            return
        self.group, members = _group(groups, c.axes)
        self.op, self.n = c.reduce_op, len(members)
        if c.reduce_op is not None and c.kind is CollectiveKind.REDUCE_SCATTER:
            per, self.width = scatter_map(c, rank, members)
            self.keep = len(per[members.index(rank)])
            buf("slots", np.concatenate([j * self.width + np.arange(len(p)) for j, p in enumerate(per)]))
            buf("positions", np.concatenate(per))
        elif c.reduce_op is not None:
            buf("pick", local_pick(c, rank))
        elif c.kind is CollectiveKind.PERMUTE:  # one ring step: the whole piece to the next member
            self.send_sizes, self.recv_sizes = ring_map(c, rank, members)
            whole = np.arange(max(self.send_sizes), dtype=np.int64)
            buf("send", whole)
            buf("recv", whole)
        elif c.kind is CollectiveKind.ALL_TO_ALL:
            send, recv = all_to_all_map(c, rank, members)
            self.send_sizes, self.recv_sizes = tuple(len(p) for p in send), tuple(len(p) for p in recv)
            buf("send", np.concatenate(send))
            buf("recv", np.concatenate(recv))
        else:
            index, self.width = gather_map(c, rank, members)
            self.slot, self.n_src = members.index(rank), math.prod(c.src.local_shape(rank))
            buf("index", index)
            buf("own", own_pick(c, rank) if _holds(c, rank) else np.zeros(0))  # none: not trainable

    def forward(self, x, part: str = "whole"):
        """``part``: ``"whole"`` (this rank's target piece), ``"issue"`` (the collective started:
        its raw result, of ``raw_shape``) or ``"finish"`` (a raw result waited for and picked) — a
        generated program places the two halves apart so a stream's next chunk moves while this
        one computes."""
        if part == "issue":
            return self.issue(x)
        if part == "finish":
            return self.finish(x)
        return self.finish(self.issue(x))

    def issue(self, x):
        """Start the collective on ``x``: its raw, not yet waited result (``finish`` gives the target)."""
        if self.kind is CollectiveKind.LOCAL:
            return _Local.apply(x, self.pick, self.scale, self.group, self.shape)
        if self.kind in (CollectiveKind.ALL_TO_ALL, CollectiveKind.PERMUTE):
            return _AllToAll.apply(x, self.send, self.recv, self.send_sizes, self.recv_sizes, self.group, self.shape)
        if self.op is not None and self.kind is CollectiveKind.REDUCE_SCATTER:
            return _ScatterIssue.apply(x, self.slots, self.positions, self.width, self.n, self.op, self.group)
        if self.op is not None:
            return _ReduceIssue.apply(x, self.op, self.group)
        return _GatherIssue.apply(x, self.width, self.n, self.slot, self.group)

    def finish(self, raw):
        """Wait for an issued collective and give this rank's target piece."""
        if not self.split:
            return raw
        if self.op is not None and self.kind is CollectiveKind.REDUCE_SCATTER:
            return _ScatterFinish.apply(raw, self.keep, self.n, self.op, self.shape)
        if self.op is not None:
            return _ReduceFinish.apply(raw, self.pick, self.n, self.op, self.shape)
        return _GatherFinish.apply(raw, self.index, self.own, self.slot * self.width, self.n_src, self.shape)

    def start(self, x):
        """``issue`` now; a function that gives ``finish`` of it later (eager pipelining)."""
        raw = self.issue(x)
        return lambda: self.finish(raw)

    def extra_repr(self) -> str:
        return self.label


def _holds(c, rank: int) -> bool:
    return bool(np.isin(_global_ids(c.src, rank), _global_ids(c.dst, rank)).all())


class GradSum(_module()):
    """Megatron's "f" over the given axis pieces: identity forward, all-reduce of the gradient."""

    def __init__(self, pieces: tuple, groups: dict):
        super().__init__()
        self.group = _group(groups, pieces)[0]
        self.label = ",".join(p.axis if p.pre == 1 else f"{p.axis}:({p.pre}){p.size}" for p in pieces)

    def forward(self, x):
        return _GradSum.apply(x, self.group)

    def extra_repr(self) -> str:
        return f"backward all_reduce over {self.label}"


def _group(groups: dict, pieces) -> tuple:
    """``(group name, members)`` of this rank over ``pieces`` (``groups`` holds names or process groups)."""
    got = groups.get(tuple(pieces))
    if got is None or got[0] is None:
        raise RunError(f"no process group for the axis pieces {tuple(pieces)} (an internal error: the plan's "
                       "groups are made from its collectives; please report it)")
    g, members = got
    return (g if isinstance(g, str) else g.group_name), tuple(members)


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


def process_groups(plan, rank: int, extra=()) -> dict:
    """Make (collectively: every rank calls this in the same order) the process groups of the
    plan's collectives and the ``extra`` axis-piece tuples; ``{pieces: (process group, members)}``
    of this rank's groups."""
    import torch.distributed as dist

    out = {}
    for pieces, members in plan_groups(plan, extra):
        g = dist.new_group(list(members))
        if rank in members:
            out[pieces] = (g, tuple(members))
    return out


__all__ = ["GradSum", "Move", "all_to_all_map", "gather_map", "local_pick", "plan_groups", "process_groups",
           "raw_shape", "ring_map", "scatter_map", "splits", "target_shape"]
