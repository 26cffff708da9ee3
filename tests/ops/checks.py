"""The local check: run a view-like op on every rank's input-target piece and compare with
the output sharding's piece of the global result."""

from __future__ import annotations

import itertools

import numpy as np

from shardlayout import Propagation, Sharding


def local_check(p: Propagation, x: np.ndarray, global_fn, local_fn) -> None:
    """``global_fn(x)`` is the op on the global array, ``local_fn(piece, out_local_shape)`` on a
    rank's piece. Raises AssertionError naming the rank on the first mismatch."""
    (target,), (out,) = p.input_targets, p.outputs
    y = global_fn(x)
    assert y.shape == out.shape, (y.shape, out.shape)
    pieces = target.shard(x)
    want = out.shard(y)
    for r in target.mesh.ranks():
        got = local_fn(pieces[r], out.local_shape(r))
        assert got.shape == want[r].shape and np.array_equal(got, want[r]), (
            f"rank {r}: {p.op} {p.inputs[0]} -> {out} (target {target})"
        )


def reshape_local(piece, shape):
    return piece.reshape(shape)


def random_pieces(s: Sharding, value, rng) -> dict:
    """``{rank: piece}`` of ``value`` under ``s``, each partial sum split at random over its group
    (``Sharding.shard`` splits it evenly, which would let A/2 * B/2 summed over two axes pass as A @ B)."""
    mesh = s.mesh
    plain = Sharding(mesh, s.shape, list(s.dims), ())
    axes = [a for a, _ in s.partial]
    coords = list(itertools.product(*(range(mesh.axis_size(a)) for a in axes)))
    parts = [rng.standard_normal(value.shape) for _ in coords[1:]]
    parts = [value - sum(parts, np.zeros_like(value))] + parts
    by = {c: plain.shard(v) for c, v in zip(coords, parts)}
    return {r: by[tuple(mesh.coord(r)[mesh.axis_index(a)] for a in axes)][r] for r in mesh.ranks()}
