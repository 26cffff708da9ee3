"""Views against DTensor 2.13 (its pure propagation functions, one process).

Wherever DTensor is right without communication, we need none and keep at least as many
mesh axes sharded; where it raises, is wrong, or gathers, we are exact (checked on every rank).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from shardlayout import Mesh, Sharding, propagate  # noqa: E402

from .checks import local_check, reshape_local  # noqa: E402
from .dtensor_view import classify  # noqa: E402

REGRESSIONS = Path(__file__).with_name("dtensor_view_regressions.json")


def ours(mesh, shape, placements, out_shape):
    s = Sharding.from_placements(mesh, shape, placements)
    p = propagate("view", [s], shape=out_shape)
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    local_check(p, x, lambda a: a.reshape(out_shape), reshape_local)
    return p


@pytest.mark.parametrize(
    "mesh,shape,placements,out_shape,dtensor",
    [
        ("x=2", (24,), ["SS(0,3)"], (4, 6), "wrong"),  # silently wrong numbers
        ("a=2,b=4", (16, 4), ["S(0)", "S(0)"], (4, 4, 4), "wrong"),  # fails in the local op
        ("x=2", (4, 6), ["SS(1,2)"], (24,), "raises"),  # KeyError: 1
        ("x=2", (2, 12), ["S(1)"], (4, 6), "loses"),  # SS(0,2) is exact
        ("a=2,b=4", (8, 12), ["S(0)", "S(1)"], (16, 6), "loses"),  # sub-axes make it exact
        ("x=16", (16, 16), ["S(1)"], (4, 64), "loses"),  # (via dispatch: an error)
    ],
)
def test_quoted_dtensor_failures_are_exact_here(mesh, shape, placements, out_shape, dtensor):
    m = Mesh.parse(mesh)
    assert classify(m, shape, placements, out_shape) == dtensor
    p = ours(m, shape, placements, out_shape)
    if dtensor != "wrong" or shape != (24,):
        assert not p.needs_communication, p.outputs[0]


def random_cases(n, seed):
    rng = random.Random(seed)
    for _ in range(n):
        nd = rng.randint(1, 3)
        mesh = Mesh(tuple(rng.choice([2, 2, 3, 4]) for _ in range(nd)), ("a", "b", "c")[:nd])
        shape = tuple(rng.choice([1, 2, 3, 4, 6, 8, 12, 16]) for _ in range(rng.randint(1, 3)))
        pl = []
        for _ in range(nd):
            k = rng.random()
            if k < 0.25:
                pl.append("R")
            elif k < 0.85:
                pl.append(f"S({rng.randrange(len(shape))})")
            else:
                pl.append(f"SS({rng.randrange(len(shape))},{rng.choice([2, 3, 4])})")
        total = int(np.prod(shape))
        ps, p = [], 2
        while total > 1:
            while total % p == 0:
                ps.append(p)
                total //= p
            p += 1
        dims = [1] * rng.randint(1, 4)
        for f in ps:
            dims[rng.randrange(len(dims))] *= f
        yield mesh, shape, pl, tuple(dims)


def test_random_views_never_worse_than_dtensor():
    n = int(os.environ.get("SHARDLAYOUT_DTENSOR_CASES", "600"))
    counts = {"exact": 0, "loses": 0, "wrong": 0, "raises": 0, "empty_shards_gathered": 0}
    for mesh, shape, pl, out_shape in random_cases(n, 7):
        kind = classify(mesh, shape, pl, out_shape)
        counts[kind] += 1
        p = ours(mesh, shape, pl, out_shape)  # exact on every rank, always
        s = p.inputs[0]
        empty = any(0 in s.local_shape(r) for r in mesh.ranks())
        if kind == "exact" and empty and p.needs_communication:
            # some devices hold nothing along a dim (split factors larger than the dim):
            # we may gather where DTensor keeps such an all-or-nothing sharding
            counts["empty_shards_gathered"] += 1
            continue
        if kind == "exact":
            from .dtensor_view import dtensor_view

            _, out = dtensor_view(mesh, shape, pl, out_shape)
            dt_axes = sum(1 for q in out if type(q).__name__ != "Replicate")
            assert not p.needs_communication, (mesh, shape, pl, out_shape)
            assert len(p.outputs[0].axes_used()) >= dt_axes, (mesh, shape, pl, out_shape)
    print(counts)
    assert counts["empty_shards_gathered"] <= n // 100
    assert counts["exact"] > n // 4 and counts["loses"] > 0 and counts["wrong"] > 0


def test_recorded_regressions():
    cases = json.loads(REGRESSIONS.read_text())
    assert len(cases) >= 30
    for c in cases:
        m = Mesh.parse(c["mesh"])
        assert classify(m, c["shape"], c["placements"], c["out_shape"]) == c["dtensor"], c
        p = ours(m, tuple(c["shape"]), c["placements"], tuple(c["out_shape"]))
        if c["dtensor"] == "loses":
            assert not p.needs_communication, c
