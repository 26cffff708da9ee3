"""View propagation, first calls: shardlayout's public ``propagate("view", [s], shape=...)`` vs
DTensor 2.13's view rule, ``view_groups`` + ``propagate_shape_and_sharding``, on the same cases.

Cases (``make_cases``, fixed seed): distinct (mesh, shape, placements, target shape); meshes 1-3-D
of sizes 2/4/8, tensors 2-4-D of sizes 8..256, each mesh axis ``Replicate`` or ``Shard(d)``, the
target a random regrouping of the element count's prime factors into 1-4 dims.

Per case, in rotating order (DTensor, ours sub-axes on, ours sub-axes off; the first side moves
by one every case), each call timed once with ``perf_counter_ns``:

* **DTensor**: ``propagate_shape_and_sharding(placements, shape, view_groups(shape, out),
  mesh_shape)`` on placement objects built outside the timed region (that path has no cache).
  It returns the input's target placements and the output placements.
* **ours**: ``shardlayout.caches.clear_caches()`` (every memo of the package), then
  ``propagate("view", [s], shape=out)`` on a Sharding and Mesh built for this call outside the
  timed region and never used before (no cached hash). It validates the call, regroups, and
  returns a ``Propagation``: the input target, the output, the collectives of any move (planned
  and priced). Timed twice: sub-axes on (the default) and inside
  ``shardlayout.config.options(subaxes=False)`` (outputs DTensor placements can say).

``gc`` is collected before and disabled during the case loop. The loop runs here and, unchanged,
in ``PROCS`` fresh processes (``--worker``); the table gives this process's medians (p25-p75,
all cases) and the median over the fresh processes of their per-process medians (min-max over
processes). Ratio: DTensor median / ours median (> 1: ours is faster).
Run: ``python benchmarks/bench_view.py [N_CASES] [PROCS]``.
"""

from __future__ import annotations

import gc
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from torch.distributed.tensor._ops._view_ops import propagate_shape_and_sharding, view_groups
from torch.distributed.tensor.placement_types import Replicate, Shard

from shardlayout import Mesh, Sharding, propagate
from shardlayout.caches import clear_caches
from shardlayout.config import options

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import emit, spread  # noqa: E402

N_CASES = 200
PROCS = 5
SIDES = ("dtensor", "ours", "ours_nosub")


def prime_factors(n):
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def make_cases(n, seed=0):
    """``n`` distinct ``(mesh_shape, shape, placements as text, out_shape)``."""
    rng = random.Random(seed)
    cases, seen = [], set()
    while len(cases) < n:
        nd = rng.randint(1, 3)
        mesh = tuple(rng.choice([2, 4, 8]) for _ in range(nd))
        shape = tuple(rng.choice([8, 16, 32, 64, 128, 256]) for _ in range(rng.randint(2, 4)))
        pl = tuple(None if rng.random() < 0.25 else rng.randrange(len(shape)) for _ in range(nd))
        total = 1
        for x in shape:
            total *= x
        dims = [1] * rng.randint(1, 4)
        for p in prime_factors(total):
            dims[rng.randrange(len(dims))] *= p
        key = (mesh, shape, pl, tuple(dims))
        if key in seen:
            continue
        seen.add(key)
        cases.append(key)
    return cases


def placements(pl):
    return [Replicate() if d is None else Shard(d) for d in pl]


def fresh_sharding(mesh_shape, shape, pl):
    mesh = Mesh(mesh_shape, ("a", "b", "c")[: len(mesh_shape)])
    return Sharding.from_placements(mesh, shape, placements(pl))


def run_cases(cases) -> dict:
    """``{side: [ns per call]}`` and the count of cases that move data, timed as the module says."""
    clock = time.perf_counter_ns
    times = {k: [] for k in SIDES}
    moves = {"ours": 0, "ours_nosub": 0, "dtensor": 0}
    gc.collect()
    gc.disable()
    try:
        for i, (mesh_shape, shape, pl, out) in enumerate(cases):
            order = SIDES[i % 3:] + SIDES[: i % 3]
            for side in order:
                if side == "dtensor":
                    src = placements(pl)
                    t0 = clock()
                    tgt, _ = propagate_shape_and_sharding(src, shape, view_groups(shape, out), mesh_shape)
                    t1 = clock()
                    moves["dtensor"] += list(tgt) != src
                else:
                    s = fresh_sharding(mesh_shape, shape, pl)
                    clear_caches()
                    if side == "ours":
                        t0 = clock()
                        p = propagate("view", [s], shape=out)
                        t1 = clock()
                    else:
                        with options(subaxes=False):
                            t0 = clock()
                            p = propagate("view", [s], shape=out)
                            t1 = clock()
                    moves[side] += p.needs_communication
                times[side].append(t1 - t0)
    finally:
        gc.enable()
    return {"times": times, "moves": moves}


def worker(n: int) -> int:
    res = run_cases(make_cases(n))
    json.dump({k: statistics.median(v) for k, v in res["times"].items()}, sys.stdout)
    return 0


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else N_CASES
    if "--worker" in sys.argv:
        return worker(n)
    procs = int(args[1]) if len(args) > 1 else PROCS
    cases = make_cases(n)
    run_cases(cases[:10])  # one-time set-up on both sides (lazy imports, first-use paths)
    here = run_cases(cases)
    fresh = []
    for _ in range(procs):
        out = subprocess.run([sys.executable, __file__, str(n), "--worker"], capture_output=True, text=True,
                             check=True).stdout
        fresh.append(json.loads(out))
    t, mv = here["times"], here["moves"]
    md = statistics.median(t["dtensor"])
    fd = statistics.median(f["dtensor"] for f in fresh) if fresh else None
    names = {
        "dtensor": "DTensor `view_groups` + `propagate_shape_and_sharding`",
        "ours": "shardlayout `propagate(\"view\")`, sub-axes on (default)",
        "ours_nosub": "shardlayout `propagate(\"view\")`, sub-axes off",
    }
    rows = []
    for side in SIDES:
        m = statistics.median(t[side])
        per = sorted(f[side] for f in fresh)
        fm = statistics.median(per) if per else None
        rows.append([
            names[side],
            spread(t[side], 1e-3),
            f"{fm / 1e3:.3g} ({per[0] / 1e3:.3g}–{per[-1] / 1e3:.3g})" if per else "—",
            "—" if side == "dtensor" else f"{md / m:.2f}x",
            "—" if side == "dtensor" or not per else f"{fd / fm:.2f}x",
            mv[side],
        ])
    method = (
        f"## View propagation, first calls ({n} distinct cases)\n\n"
        + __doc__.split("Run:")[0].strip()
    )
    header = ["side", "µs per call, this process: median (p25–p75)",
              f"µs, {procs} fresh processes: median of medians (min–max)", "ratio DTensor/ours",
              "ratio, fresh processes", f"cases that move data (of {n})"]
    notes = (
        "Ours does more per call than DTensor's rule: it validates the params against the op's signature and "
        "plans and prices the collectives of any move (DTensor's rule only names the target placements). "
        "Cases that move data differ between the sides: with sub-axes on, ours keeps shardings DTensor "
        "gathers; with them off, ours gathers only the factor in the way (DTensor may replicate a whole "
        "mesh dim)."
    )
    emit("view", method, header, rows, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
