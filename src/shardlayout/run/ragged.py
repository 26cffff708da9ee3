"""Collectives on nested pieces on torch.distributed: uneven ``all_to_all_single`` from routing counts.

A planned collective of a ragged tensor (``sharding.ragged``) moves whole (component, source)
blocks whose row counts are known only at run time. On one rank it runs as two exchanges on
the collective's group: the members' extents (a few ints each, one ``all_gather``), then the
rows — every block a member needs, from the first member of the group that holds it, in one
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
from ..sharding.ragged import _dense_axes, _dense_slice, _storage, _where, held, ragged_of, source_factors, sources_of


def _holdings(s, r, rank: int, n_src: int) -> tuple:
    comps, src = held(s, r, rank)
    return comps, src if src is not None else tuple(range(n_src))


def _extents_of_group(ex, group, members, piece: Nested, sizes: list):
    """Every member's extents ``(sources, components)``, gathered on the group."""
    import torch
    import torch.distributed as dist

    width = max(max(sizes), 1)
    mine = torch.zeros(width, dtype=torch.int64)
    flat = torch.from_numpy(piece.extents.reshape(-1).copy())
    mine[: flat.numel()] = flat
    allx = torch.empty(width * len(members), dtype=torch.int64)
    ex.ran("all_gather")
    dist.all_gather_into_tensor(allx, mine, group=group)
    return allx.reshape(len(members), width).numpy()


def ragged_exchange(ex, c, piece: Nested) -> Nested:
    """This rank's nested piece after collective ``c`` (see the module docstring)."""
    import torch
    import torch.distributed as dist

    src, dst = c.src, c.dst
    r = ragged_of(src, piece)
    group, members = ex.group(c)
    members = tuple(members)
    rank = ex.rank
    if c.reduce_op is not None:
        if c.kind is not CollectiveKind.ALL_REDUCE or held(src, r, rank) != held(dst, r, rank):
            raise RunError(f"{c.kind.value} of a ragged tensor ({src} -> {dst}) is not supported on torch.distributed; "
                           "reduce partial nested values with an all_reduce")
        data = piece.data.detach().clone().contiguous()
        ex.ran("all_reduce")
        dist.all_reduce(data, op=dist.ReduceOp.SUM, group=group)
        return Nested(data / len(members) if c.reduce_op == "avg" else data, piece.extents, piece.dim)
    n_src = sources_of(src, r) if source_factors(src, r) else piece.sources
    if source_factors(dst, r) and sources_of(dst, r) != n_src:
        raise RunError(f"{c.kind.value} {src} -> {dst}: the target cuts the ragged dim into {sources_of(dst, r)} "
                       f"source blocks, the tensor has {n_src}")
    hold = {q: _holdings(src, r, q, n_src) for q in members}
    sizes = [len(hold[q][0]) * len(hold[q][1]) for q in members]
    ext = _extents_of_group(ex, group, members, piece, sizes)
    provider = {}  # (component, source) -> (member, its local component, its local source)
    for q in members:
        qc, qs = hold[q]
        for i, comp in enumerate(qc):
            for j, so in enumerate(qs):
                provider.setdefault((comp, so), (q, i, j))

    def rows(q, i, j):
        qc, qs = hold[q]
        return int(ext[members.index(q)][j * len(qc) + i])

    ndim = src.ndim
    dense = _dense_axes(r, ndim)
    my_idx = src.indices(rank)
    send = []
    for q in members:
        wc, ws = _holdings(dst, r, q, n_src)
        q_idx = dst.indices(q)
        parts = []
        for comp in wc:
            for so in ws:
                p = provider.get((comp, so))
                if p is None:
                    raise RunError(f"{c.kind.value}: rank {q} needs component {comp}, source {so} that its group "
                                   f"{list(members)} does not hold ({src} -> {dst})")
                if p[0] == rank:
                    picks = {d: _where(my_idx[d], q_idx[d]) for d in dense}
                    parts.append(_dense_slice(piece.block(p[1], p[2]), r, ndim, picks).reshape(-1))
        send.append(torch.cat(parts) if parts else piece.data.new_zeros(0))
    my_c, my_s = _holdings(dst, r, rank, n_src)
    storage = _storage(dst, r, rank)
    per_row = int(np.prod([n for k, n in enumerate(storage) if k != piece.dim]))
    expect = {q: [] for q in members}  # per member, the blocks it sends me, in my order
    for i, comp in enumerate(my_c):
        for j, so in enumerate(my_s):
            q, qi, qj = provider[(comp, so)]
            expect[q].append(((i, j), rows(q, qi, qj)))
    recv_sizes = [sum(n for _, n in expect[q]) * per_row for q in members]
    inp = torch.cat(send) if send else piece.data.new_zeros(0)
    got = piece.data.new_empty(sum(recv_sizes))
    ex.ran("all_to_all")
    dist.all_to_all_single(got, inp.contiguous(), output_split_sizes=recv_sizes,
                           input_split_sizes=[int(t.numel()) for t in send], group=group)
    blocks, off = {}, 0
    for q in members:
        for key, n in expect[q]:
            shape = tuple(storage[: piece.dim]) + (n,) + tuple(storage[piece.dim + 1:])
            blocks[key] = got[off: off + n * per_row].reshape(shape)
            off += n * per_row
    return from_blocks(blocks, len(my_c), len(my_s), piece.dim, piece.data, storage)


__all__ = ["ragged_exchange"]
