"""DTensor's view propagation (torch 2.13, pure functions) and a classifier of its answers."""

from __future__ import annotations

import numpy as np
from torch.distributed.tensor._ops._view_ops import propagate_shape_and_sharding, view_groups
from torch.distributed.tensor.placement_types import Replicate, Shard, _StridedShard

from shardlayout import Mesh, Sharding


def placement(text: str):
    if text == "R":
        return Replicate()
    if text.startswith("SS("):
        d, sf = text[3:-1].split(",")
        return _StridedShard(int(d), split_factor=int(sf))
    return Shard(int(text[2:-1]))


def dtensor_view(mesh: Mesh, shape, placements, out_shape):
    """DTensor's (input target, output) placements, or the exception it raises."""
    pl = [placement(p) if isinstance(p, str) else p for p in placements]
    try:
        return propagate_shape_and_sharding(pl, tuple(shape), view_groups(tuple(shape), tuple(out_shape)),
                                            mesh.shape)
    except Exception as e:  # noqa: BLE001 - we classify whatever DTensor raises
        return e


def classify(mesh: Mesh, shape, placements, out_shape) -> str:
    """``raises``, ``wrong`` (its claimed output is not what the local view computes),
    ``loses`` (it redistributes the input first) or ``exact``."""
    res = dtensor_view(mesh, shape, placements, out_shape)
    if isinstance(res, Exception):
        return "raises"
    tgt, out = res
    try:
        a = Sharding.from_placements(mesh, shape, tgt)
        b = Sharding.from_placements(mesh, out_shape, out)
    except Exception:  # noqa: BLE001
        return "wrong"
    x = np.arange(int(np.prod(shape))).reshape(shape)
    pa, pb = a.shard(x), b.shard(x.reshape(out_shape))
    for r in mesh.ranks():
        piece = pa[r]
        if piece.size != int(np.prod(b.local_shape(r))) or not np.array_equal(
            piece.reshape(b.local_shape(r)), pb[r]
        ):
            return "wrong"
    pl = [placement(p) if isinstance(p, str) else p for p in placements]
    return "exact" if list(tgt) == pl else "loses"
