"""Strategy selection: shardlayout vs DTensor's ``propagate_op_sharding_non_cached``.

mm and einsum on 1-D to 4-D meshes, the same inputs on both sides, a fresh ``OpSchema``
(DTensor) and fresh Shardings (ours) for every call; also our own brute-force enumeration of
the full N-D expansion. Prints medians, ratios and candidate counts.
Run: ``python benchmarks/bench_strategy.py``.
"""

from __future__ import annotations

import random
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from shardlayout import Mesh, Sharding, propagate
from shardlayout.ops.strategy import FactorMap, brute_force, search

MESHES = {1: (8,), 2: (2, 4), 3: (2, 2, 4), 4: (2, 2, 2, 2)}
REPS = 15


def dtensor_setup():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=16)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

    meshes = {}
    for k, v in MESHES.items():
        meshes[k] = DeviceMesh("cpu", torch.arange(int(torch.tensor(v).prod())).reshape(v))
    return meshes, DTensor._op_dispatcher.sharding_propagator


def main() -> int:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._op_schema import OpSchema

    dmeshes, prop = dtensor_setup()
    aten = torch.ops.aten
    rng = random.Random(0)
    print(f"{'op':8}{'mesh':>12}{'DTensor ms':>12}{'ours ms':>10}{'ratio':>8}{'brute ms':>10}"
          f"{'ours cand':>10}{'N-D cand':>10}")
    for nd, shape in MESHES.items():
        names = tuple(f"m{i}" for i in range(nd))
        mesh = Mesh(shape, names)
        for op in ("mm", "einsum"):
            t_dt, t_ours, t_bf, cands = [], [], [], (0, 0)
            cases = []
            for rep in range(REPS):
                m, k, n = 64 + 8 * rep, 128, 32 + 8 * rep  # distinct shapes: no cache can help
                pa = [rng.choice([Replicate(), Shard(0), Shard(1)]) for _ in range(nd)]
                pb = [rng.choice([Replicate(), Shard(0), Shard(1)]) for _ in range(nd)]
                cases.append((m, k, n, pa, pb))

            def spec(sz, pl, dm=dmeshes[nd]):
                t = torch.empty(sz)
                return DTensorSpec(dm, tuple(pl), tensor_meta=TensorMeta(t.shape, t.stride(), t.dtype))

            if op == "mm":  # DTensor has no einsum strategy (it decomposes einsum first)
                for m, k, n, pa, pb in cases:
                    schema = OpSchema(aten.mm.default, (spec((m, k), pa), spec((k, n), pb)), {})
                    t0 = time.perf_counter()
                    prop.propagate_op_sharding_non_cached(schema)
                    t_dt.append(time.perf_counter() - t0)
            fm = FactorMap(("mk", "kn"), "mn", linear="multi")
            ins = [(Sharding.from_placements(mesh, (m, k), pa), Sharding.from_placements(mesh, (k, n), pb))
                   for m, k, n, pa, pb in cases]
            for a, b in ins:
                t0 = time.perf_counter()
                if op == "mm":
                    propagate("mm", [a, b])
                else:
                    propagate("einsum", [a, b], equation="mk,kn->mn")
                t_ours.append(time.perf_counter() - t0)
            for a, b in ins:
                t0 = time.perf_counter()
                _, count = brute_force(fm, [a, b])
                t_bf.append(time.perf_counter() - t0)
                _, considered = search(fm, [a, b])
                cands = (len(considered), count)
            mo, mb = (statistics.median(x) * 1e3 for x in (t_ours, t_bf))
            if t_dt:
                md = statistics.median(t_dt) * 1e3
                dt, ratio = f"{md:12.2f}", f"{md / mo:7.0f}x"
            else:
                dt, ratio = f"{'n/a':>12}", f"{'-':>8}"
            print(f"{op:8}{'x'.join(map(str, shape)):>12}{dt}{mo:10.3f}{ratio}{mb:10.2f}"
                  f"{cands[0]:10d}{cands[1]:10d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
