"""An independent alpha-beta pricer with DTensor's formulas (``_collective_utils.py``), written
from the formulas, not from our cost module: the oracle the search's prices are checked against."""

from __future__ import annotations

import itertools

from shardlayout import Sharding

BASE_US, HOP_US, BW_GIB = 6.6, 0.6, 87.7


def dtensor_seconds(kind: str, group: int, nbytes: int) -> float:
    """DTensor's price of one collective in seconds (all_to_all: all-gather formula + 1 µs)."""
    if kind == "local" or group <= 1:
        return 0.0
    hops = 2 * (group - 1) if kind == "all_reduce" else group - 1
    us = BASE_US + hops * HOP_US + (nbytes / 1024 / 1024 / 1024) * hops / group / BW_GIB * 1e6
    if kind == "all_to_all":
        us += 1.0
    return us * 1e-6


def price_collectives(collectives) -> float:
    """Sum of independent prices of our emitted Collective records (read via their JSON)."""
    total = 0.0
    for c in collectives:
        j = c.to_json()
        total += dtensor_seconds(j["kind"], j["group_size"], j["bytes"])
    return total


def placement_alternatives(mesh, letters_per_input: list, shapes: list, out_letters: str, linear: bool):
    """Every DTensor-style strategy of an einsum-like op: per mesh axis, replicate, shard one
    letter (each operand carrying it: Shard of that dim, mesh order), or (when ``linear``)
    keep one operand's partial. Yields the input placement lists."""
    letters = sorted({ch for lt in letters_per_input for ch in lt})
    per_axis = [("R",)] + [("S", L) for L in letters]
    for combo in itertools.product(per_axis, repeat=mesh.ndim):
        pls = []
        for lt, shape in zip(letters_per_input, shapes):
            pl = []
            for opt in combo:
                if opt[0] == "S" and opt[1] in lt and shape[lt.index(opt[1])] > 1:
                    pl.append(f"S({lt.index(opt[1])})")
                else:
                    pl.append("R")
            pls.append(pl)
        yield combo, [Sharding.from_placements(mesh, shape, pl) for shape, pl in zip(shapes, pls)]
