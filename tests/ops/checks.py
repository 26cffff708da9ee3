"""The local check: run a view-like op on every rank's input-target piece and compare with
the output sharding's piece of the global result."""

from __future__ import annotations

import numpy as np

from shardlayout import Propagation


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
