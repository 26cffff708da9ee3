"""Collectives on nested pieces on torch.distributed: uneven ``all_to_all_single`` from routing counts.

A planned collective of a ragged tensor (``sharding.ragged``) moves whole (component, source)
blocks whose row counts are known only at run time. On one rank it runs as two exchanges on
the collective's group: the members' extents (a few ints each, one ``all_gather`` on
torch.distributed directly: metadata, not a planned collective), then the rows — every block a
member needs, from the first member of the group that holds it, in one functional
``all_to_all_single`` whose split sizes are those counts (the token dispatch and combine of
expert parallelism: torchtitan's and Megatron's convention). A reduction of partial nested
values with equal extents is one ``all_reduce``. The result is this rank's piece under the
collective's target, component-major then source, exactly as the numpy simulator assembles it
(``sharding.ragged.ragged_collective_piece``).
"""

from __future__ import annotations

import numpy as np

from ..errors import RunError
from ..sharding.collective import CollectiveKind
from ..sharding.nested import Nested, from_blocks
from ..sharding.ragged import (
    _box,
    _dense_axes,
    _dense_slice,
    _storage,
    block_holders,
    dense_cover,
    held,
    ragged_of,
    routed_sources,
    target_blocks,
)


def _holdings(s, r, rank: int, n_src: int, fs: tuple = ()) -> tuple:
    comps, src = held(s, r, rank, fs)
    return comps, src if src is not None else tuple(range(n_src))


def _extents_of_group(ex, group, members, piece: Nested, sizes: list):
    """Every member's extents ``(sources, components)``, gathered on the group."""
    import torch
    import torch.distributed as dist

    width = max(max(sizes), 1)
    mine = torch.zeros(width, dtype=torch.int64)
    flat = torch.from_numpy(piece.extents.reshape(-1).copy())
    mine[: flat.numel()] = flat
    if len(members) == 1:  # a local move (a slice of this rank's own blocks): nothing to exchange
        return mine.reshape(1, width).numpy()
    allx = torch.empty(width * len(members), dtype=torch.int64)
    ex.ran("all_gather")
    dist.all_gather_into_tensor(allx, mine, group=group)
    return allx.reshape(len(members), width).numpy()


def ragged_exchange(ex, c, piece: Nested) -> Nested:
    """This rank's nested piece after collective ``c`` (see the module docstring)."""
    import torch

    src, dst = c.src, c.dst
    r = ragged_of(src, piece)
    group, members = ex.group(c)
    members = tuple(members)
    rank = ex.rank
    if c.reduce_op is not None:
        if c.kind is not CollectiveKind.ALL_REDUCE or held(src, r, rank, c.ragged[1] if c.ragged else ()) != \
                held(dst, r, rank, c.ragged[1] if c.ragged else ()):
            raise RunError(f"{c.kind.value} of a ragged tensor ({src} -> {dst}) is not supported on torch.distributed; "
                           "reduce partial nested values with an all_reduce")
        data = _functions()[1].apply(piece.data, ex, group)
        return Nested(data / len(members) if c.reduce_op == "avg" else data, piece.extents, piece.dim)
    fs, n_src = routed_sources(c, src, dst, r, piece.sources)
    if torch.is_grad_enabled() and piece.data.requires_grad:
        for side, s in (("source", src), ("target", dst)):
            if _replicated(s, r, members, fs, n_src):
                raise RunError(f"training through {c.kind.value} {src} -> {dst} of a ragged tensor: its {side} holds "
                               "some routed rows on more than one rank of the group, so the reverse exchange is not "
                               "its gradient; train with the routed rows cut on every axis of the exchange (e.g. "
                               "tokens and experts both on ep), or run the forward pass (drop --train)")
    hold = {q: _holdings(src, r, q, n_src, fs) for q in members}
    sizes = [len(hold[q][0]) * len(hold[q][1]) for q in members]
    ext = _extents_of_group(ex, group, members, piece, sizes)
    holders = block_holders(src, r, fs, n_src, members)

    def rows(q, i, j):
        return int(ext[members.index(q)][j * len(hold[q][0]) + i])

    def plan_for(t):  # per block of member t's target piece: its cover (dense parts by member)
        want = dst.indices(t)
        return [(key, dense_cover(src, r, want, hs) or [(hs[0][0], hs[0][1], hs[0][2],
                                                         {d: np.zeros(0, dtype=np.int64) for d in dense}, {})])
                for key, _, _, hs in target_blocks(c, dst, r, fs, n_src, t, holders, members)]

    ndim = src.ndim
    dense = _dense_axes(r, ndim)
    send = []
    for t in members:
        parts = []
        for _, cover in plan_for(t):
            for q, qi, qj, qpos, _ in cover:
                if q == rank:
                    parts.append(_dense_slice(piece.block(qi, qj), r, ndim, qpos).reshape(-1))
        send.append(torch.cat(parts) if parts else piece.data.new_zeros(0))
    storage = _storage(dst, r, rank)
    mine = plan_for(rank)
    recv = {q: [] for q in members}  # per member, (block, its part's positions, rows, elements) in my order
    for key, cover in mine:
        for q, qi, qj, _, tpos in cover:
            n = rows(q, qi, qj)
            per_row = int(np.prod([len(tpos.get(d, ())) if d in tpos else 0 for d in dense])) if dense else 1
            recv[q].append((key, tpos, n, n * per_row))
    recv_sizes = [sum(x[3] for x in recv[q]) for q in members]
    inp = torch.cat(send) if send else piece.data.new_zeros(0)
    got = _functions()[0].apply(inp, ex, group, [int(t.numel()) for t in send], recv_sizes)
    blocks, off = {}, 0
    for q in members:
        for key, tpos, n, count in recv[q]:
            shape = list(storage)
            shape[piece.dim] = n
            for d in dense:
                shape[d if d < r.dim - 1 else d - 1] = len(tpos.get(d, ()))
            part = got[off: off + count].reshape(shape)
            off += count
            if key not in blocks:
                full = list(storage)
                full[piece.dim] = n
                blocks[key] = part if shape == full else piece.data.new_zeros(full)
            if blocks[key] is not part:
                at = _box(full_shape(storage, piece.dim, n), r, tpos)
                blocks[key][tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in at)] = part
    my_c, my_s = _holdings(dst, r, rank, n_src, fs)
    return from_blocks(blocks, len(my_c), len(my_s), piece.dim, piece.data, storage)


def untrainable(plan) -> str | None:
    """Why training cannot run through a ragged collective of ``plan``, or None: a ragged move
    of a tensor with a gradient whose source or target holds some routed rows on two ranks of its
    group (its reverse exchange would not be its gradient)."""
    from ..mesh import group_ranks
    from ..plan.backward import grad_tensors

    prog = plan.program
    needs = grad_tensors(prog)
    for (name, _), chain in sorted(plan.moves.items(), key=lambda kv: kv[0][0]):
        r = prog.tensors[name].ragged
        if r is None or name not in needs:
            continue
        for c in chain:
            if not c.kind.communicates or c.reduce_op is not None:
                continue
            for side, s in (("source", c.src), ("target", c.dst)):
                idle = [q for q in range(plan.mesh.size) if not held(s, r, q)[0]]
                if idle:  # its backward exchange would not run there: the others would wait for it
                    return (f"{c.kind.value} of {name} ({c.src} -> {c.dst}): rank {idle[0]} holds none of the "
                            f"{r.components} experts on the {side} side, so it has no gradient to send back; give a "
                            "number of experts the expert axis divides, or run the forward pass (drop --train)")
            whole = int(np.prod([f.size for f in c.ragged[1]], dtype=np.int64)) if c.ragged else 1
            fs, n_src = routed_sources(c, c.src, c.dst, r, whole)  # a piece holding every source holds them all
            for members in sorted({group_ranks(plan.mesh, q, c.axes) for q in range(plan.mesh.size)}):
                for side, s in (("source", c.src), ("target", c.dst)):
                    if _replicated(s, r, members, fs, n_src):
                        return (f"{c.kind.value} of {name} ({c.src} -> {c.dst}): its {side} holds some routed rows on "
                                f"more than one rank of the group {list(members)}, so the reverse exchange is not its "
                                "gradient; train with the routed rows cut on every axis of the exchange (e.g. tokens "
                                "and experts both on ep), or run the forward pass (drop --train)")
    return None


def _replicated(s, r, members: tuple, fs: tuple, n_src: int) -> bool:
    """Do two members of the group hold a common element of the ragged tensor under ``s`` (a
    block of the same component and source, with common dense positions)?"""
    dense = _dense_axes(r, s.ndim)
    seen = []
    for q in members:
        comps, srcs = _holdings(s, r, q, n_src, fs)
        idx = s.indices(q)
        pos = {d: {int(i) for i in idx[d]} for d in dense}
        for c2, s2, p2 in seen:
            if set(comps) & c2 and set(srcs) & s2 and all(pos[d] & p2[d] for d in dense):
                return True
        seen.append((set(comps), set(srcs), pos))
    return False


_FUNCTIONS: list = []


def _functions() -> tuple:
    """``(rows exchange, nested sum)``: the autograd Functions of the two torch.distributed calls
    on nested data (made on first use: torch is imported lazily). The rows exchange is one
    ``all_to_all_single`` with the counts' split sizes; its adjoint is the same exchange
    backwards (exact: the routed rows are cut on every axis of the group, checked before). The
    nested sum is an ``all_reduce``; with complete gradients its adjoint is the identity."""
    if not _FUNCTIONS:
        import torch
        import torch.distributed._functional_collectives as funcol

        class RowsExchange(torch.autograd.Function):
            @staticmethod
            def forward(ctx, inp, ex, group, send_sizes, recv_sizes):
                ctx.ex, ctx.group, ctx.send, ctx.recv = ex, group, send_sizes, recv_sizes
                if len(send_sizes) == 1:  # a local move: this rank's own blocks, nothing sent
                    return inp.detach().clone()
                return funcol.wait_tensor(funcol.all_to_all_single(inp.detach().contiguous(), list(recv_sizes),
                                                                   list(send_sizes), group))

            @staticmethod
            def backward(ctx, g):
                if len(ctx.send) == 1:
                    return g, None, None, None, None
                out = funcol.wait_tensor(funcol.all_to_all_single(g.contiguous(), list(ctx.send), list(ctx.recv),
                                                                  ctx.group))
                return out, None, None, None, None

        class NestedSum(torch.autograd.Function):
            @staticmethod
            def forward(ctx, data, ex, group):
                return funcol.wait_tensor(funcol.all_reduce(data.detach().contiguous(), "sum", group))

            @staticmethod
            def backward(ctx, g):
                return g, None, None

        _FUNCTIONS.extend((RowsExchange, NestedSum))
    return tuple(_FUNCTIONS)


def full_shape(storage: tuple, dim: int, n: int) -> list:
    """The storage shape of a block of ``n`` rows."""
    out = list(storage)
    out[dim] = n
    return out


__all__ = ["ragged_exchange", "untrainable"]
