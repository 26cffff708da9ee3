"""Streams on torch.distributed: a collective cut into ``k`` chunks issued asynchronously, so
that each chunk's collective runs while the matmul works on another chunk (``plan.stream``).

Chunk ``j`` is the ``j``-th part of every rank's rows (the ``~k`` factor after the mesh axis,
``plan.stream.chunk_layout``): its all_gather brings every rank's part ``j`` together, its
reduce_scatter sends each rank its part ``j``. Both functions compute exactly what the serial
collective + matmul compute (rows are independent through a matmul's pass-through dim); only
the order of the work changes:

    issue gather 0;  for j: wait gather j, issue gather j+1, compute j, issue reduce_scatter j
    wait every reduce_scatter

``gather_compute`` is the first half (Megatron-SP's all_gather before the column-parallel
projections), ``compute_reduce_scatter`` the second (after the row-parallel one);
``gather_compute_reduce_scatter`` chains both for a whole Megatron-SP MLP block, one pipeline.

    >>> # on each rank of a gloo/NCCL group of R ranks, x the rank's (L, H) rows:
    >>> # y = gather_compute_reduce_scatter(x, lambda g: (g @ w1).relu() @ w2, group, k=4)
"""

from __future__ import annotations

from ..errors import RunError


def _chunks(x, k: int):
    n = x.shape[0]
    if k < 1 or n % k:
        raise RunError(f"streams: {n} local rows do not cut into {k} equal chunks; give k dividing {n}")
    return x.reshape(k, n // k, *x.shape[1:]).unbind(0)


def _gather(part, world: int, group, async_op: bool):
    import torch
    import torch.distributed as dist

    out = torch.empty((world * part.shape[0],) + tuple(part.shape[1:]), dtype=part.dtype, device=part.device)
    gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)  # the newer name where it exists
    work = gather(out, part.contiguous(), group=group, async_op=async_op)
    return out, work


def _reduce_scatter(full, world: int, group, async_op: bool):
    import torch
    import torch.distributed as dist

    out = torch.empty((full.shape[0] // world,) + tuple(full.shape[1:]), dtype=full.dtype, device=full.device)
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    work = scatter(out, full.contiguous(), group=group, async_op=async_op)
    return out, work


def _interleave(parts, world: int):
    """Rows of ``k`` gathered chunks ``(world * c, ...)`` back in global order ``(rank, j, i)``."""
    import torch

    k = len(parts)
    stacked = torch.stack(parts)  # (k, world*c, ...)
    c = stacked.shape[1] // world
    return stacked.reshape(k, world, c, *stacked.shape[2:]).transpose(0, 1).reshape(world * k * c, *stacked.shape[2:])


def _gathered(x, world: int, group, k: int):
    """The all_gathered chunks of ``x``'s rows, in order: chunk ``j+1``'s gather is issued
    (asynchronously) before chunk ``j`` is handed out, so it runs while the caller computes."""
    parts = _chunks(x, k)
    pending = _gather(parts[0], world, group, True)
    for j in range(k):
        got, work = pending
        work.wait()
        if j + 1 < k:
            pending = _gather(parts[j + 1], world, group, True)
        yield got


def gather_compute(x, fn, group, k: int = 1):
    """``fn`` of the all_gather of every rank's rows ``x`` (row-wise: ``fn`` must treat rows
    independently), the gather cut into ``k`` chunks overlapped with ``fn`` on the previous one.
    ``gather_compute(x, lambda g: g @ w, group, k=4)`` equals ``all_gather(x) @ w``."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    if k == 1:
        full, _ = _gather(x, world, group, False)
        return fn(full)
    return _interleave([fn(got) for got in _gathered(x, world, group, k)], world)


def gather_compute_reduce_scatter(x, fn, group, k: int = 1):
    """Each rank's rows of ``reduce_scatter(fn(all_gather(x)))`` (``fn`` row-wise and linear in
    the reduced sum, e.g. a Megatron-SP MLP block with its row-parallel output partial), as one
    pipeline of ``k`` chunks: gather ``j+1`` and reduce-scatter ``j-1`` run while ``fn`` works on
    chunk ``j``. ``gather_compute_reduce_scatter(x, mlp, group, k=4)`` equals the serial block."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    if k == 1:
        full, _ = _gather(x, world, group, False)
        out, _ = _reduce_scatter(fn(full), world, group, False)
        return out
    sent = [_reduce_scatter(fn(got), world, group, True) for got in _gathered(x, world, group, k)]
    for _, work in sent:
        work.wait()
    return torch.cat([out for out, _ in sent])


def compute_reduce_scatter(h, fn, group, k: int = 1):
    """Each rank's rows of ``reduce_scatter(fn(h))`` where ``h`` holds every rank's rows in global
    order ``(rank, row)`` (a partial sum after ``fn``), the reduce-scatter cut into ``k`` chunks
    overlapped with ``fn`` on the next one. ``compute_reduce_scatter(h, lambda a: a @ w2, group, 4)``"""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    if k == 1:
        out, _ = _reduce_scatter(fn(h), world, group, False)
        return out
    rows = h.shape[0] // world
    if k < 1 or rows % k:
        raise RunError(f"streams: {rows} rows per rank do not cut into {k} equal chunks; give k dividing {rows}")
    per = h.reshape(world, rows, *h.shape[1:])
    sent = []
    for idx in torch.arange(rows).reshape(k, rows // k) if rows % k == 0 else ():
        chunk = per[:, idx].reshape(world * len(idx), *h.shape[1:])
        sent.append(_reduce_scatter(fn(chunk), world, group, True))
    if not sent:
        raise RunError(f"streams: {rows} rows per rank do not cut into {k} equal chunks; give k dividing {rows}")
    for _, work in sent:
        work.wait()
    return torch.cat([out for out, _ in sent])


__all__ = ["compute_reduce_scatter", "gather_compute", "gather_compute_reduce_scatter"]
