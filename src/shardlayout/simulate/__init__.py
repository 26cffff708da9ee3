"""SPMD simulation on numpy: every rank runs a function on its local pieces.

    >>> import numpy as np
    >>> from shardlayout import Mesh, Sharding
    >>> m = Mesh.parse("x=2")
    >>> s = Sharding.parse("[x*2, 3]", m)
    >>> y = simulate(lambda rank, a: a * 2, [(s, np.ones((4, 3)))], s)
    >>> float(y.sum())
    24.0
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..errors import ShardMismatch
from ..mesh import Mesh
from ..sharding import Sharding


def spmd(fn: Callable, mesh: Mesh, per_rank_inputs: Sequence[dict]) -> list:
    """Run ``fn(rank, *pieces)`` on every rank; returns ``[{rank: output_k}]`` per output.

    ``per_rank_inputs`` is one ``{rank: piece}`` per input. ``fn`` may return one array or a
    tuple of arrays. ``spmd(lambda r, a: a + r, mesh, [pieces])``
    """
    results: dict = {}
    n_out = None
    for r in mesh.ranks():
        out = fn(r, *(pieces[r] for pieces in per_rank_inputs))
        outs = out if isinstance(out, tuple) else (out,)
        if n_out is None:
            n_out = len(outs)
        elif len(outs) != n_out:
            raise ShardMismatch(f"spmd: rank {r} returned {len(outs)} outputs, rank 0 returned {n_out}")
        results[r] = outs
    return [{r: results[r][k] for r in mesh.ranks()} for k in range(n_out or 0)]


def simulate(
    fn: Callable,
    inputs: Sequence[tuple],
    outputs: Sharding | Sequence[Sharding],
    tolerance: float = 0.0,
):
    """Shard each ``(Sharding, global array)`` input, run ``fn(rank, *pieces)`` on every rank,
    and reassemble the outputs with their shardings (partial axes reduced, replicas checked).

    Returns one global array, or a list when ``outputs`` is a sequence.
    """
    single = isinstance(outputs, Sharding)
    outs = [outputs] if single else list(outputs)
    if not inputs and not outs:
        return [] if not single else None
    mesh = (inputs[0][0] if inputs else outs[0]).mesh
    for s, _ in inputs:
        if s.mesh != mesh:
            raise ShardMismatch(f"simulate: input sharding {s} is on mesh {s.mesh}, not {mesh}")
    pieces = [s.shard(a) for s, a in inputs]
    per_out = spmd(fn, mesh, pieces)
    if len(per_out) != len(outs):
        raise ShardMismatch(f"simulate: fn returned {len(per_out)} outputs for {len(outs)} shardings")
    arrays = [s.unshard(p, tolerance) for s, p in zip(outs, per_out)]
    return arrays[0] if single else arrays


__all__ = ["simulate", "spmd"]
