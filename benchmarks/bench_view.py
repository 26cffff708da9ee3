"""View propagation: shardlayout vs DTensor's ``view_groups`` + ``propagate_shape_and_sharding``.

Same run, the same distinct cases on both sides (no cache hits: each case is a new input),
median per call and the ratio. Run: ``python benchmarks/bench_view.py [N_CASES]``.
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time

import numpy as np
from torch.distributed.tensor._ops._view_ops import propagate_shape_and_sharding, view_groups
from torch.distributed.tensor.placement_types import Replicate, Shard

from shardlayout import Mesh, Sharding
from shardlayout.ops.view import regroup


def prime_factors(n):
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def make_cases(n, seed=0):
    rng = random.Random(seed)
    cases, seen = [], set()
    while len(cases) < n:
        nd = rng.randint(1, 3)
        mesh = Mesh(tuple(rng.choice([2, 4, 8]) for _ in range(nd)), ("a", "b", "c")[:nd])
        shape = tuple(rng.choice([8, 16, 32, 64, 128, 256]) for _ in range(rng.randint(2, 4)))
        pl = [Replicate() if rng.random() < 0.25 else Shard(rng.randrange(len(shape))) for _ in range(nd)]
        ps = prime_factors(int(np.prod(shape)))
        dims = [1] * rng.randint(1, 4)
        for p in ps:
            dims[rng.randrange(len(dims))] *= p
        out = tuple(dims)
        key = (mesh.shape, shape, tuple(map(str, pl)), out)
        if key in seen:
            continue
        seen.add(key)
        cases.append((mesh, shape, pl, out))
    return cases


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    cases = make_cases(n)
    # inputs built outside the timed region on both sides
    ours_in = [(Sharding.from_placements(m, s, pl), out) for m, s, pl, out in cases]
    clock = time.perf_counter_ns
    t_ours, t_dt = [], []
    gc.disable()
    for (m, shape, pl, out), (s, out2) in zip(cases, ours_in):
        t0 = clock()
        propagate_shape_and_sharding(pl, shape, view_groups(shape, out), m.shape)
        t1 = clock()
        regroup(s, out2)
        t2 = clock()
        t_dt.append(t1 - t0)
        t_ours.append(t2 - t1)
    gc.enable()
    mo, md = statistics.median(t_ours) / 1e3, statistics.median(t_dt) / 1e3
    print(f"{n} distinct view cases (meshes 1-3-D, tensors 2-4-D, Shard/Replicate, random targets)")
    print(f"DTensor view_groups + propagate_shape_and_sharding: median {md:.1f} µs per call")
    print(f"shardlayout regroup:                                median {mo:.1f} µs per call")
    print(f"ratio: shardlayout is {md / mo:.1f}x DTensor's speed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
