"""View propagation, first calls: shardlayout's public ``propagate("view", [s], shape=...)`` vs
DTensor 2.13's view rule, ``view_groups`` + ``propagate_shape_and_sharding``, on the same cases.

Two seeded sets of distinct (mesh, shape, placements, target shape), each mesh axis ``Replicate``
or ``Shard(d)``, the target a random regrouping of the element count's prime factors:

* **random** (``make_cases``): meshes 1-3-D of sizes 2/4/8, tensors 2-4-D of sizes 8..256
  (powers of 2), targets of 1-4 dims;
* **adversarial** (``make_adversarial``): meshes 1-3-D of sizes 2/3/4/8, tensors 2-6-D of sizes
  1/2/3/5/6/7/12/24/48/96/100/128 (size-1 dims, uneven shards, non-powers of 2), targets of 1-6
  dims; kept only where DTensor's rule accepts the case. No test or tuning reads this set.

Per case, in rotating order (the first side moves by one every case), each call timed once with
``perf_counter_ns``:

* **DTensor**: ``propagate_shape_and_sharding(placements, shape, view_groups(shape, out),
  mesh_shape)`` on placement objects built outside the timed region (that path has no cache).
  It returns the input's target placements and the output placements.
* **ours**: ``shardlayout.caches.clear_caches()`` (every memo of the package), then
  ``propagate("view", [s], shape=out)`` on a Sharding and Mesh built for this call outside the
  timed region and never used before (no cached hash). It validates the call, regroups, and
  returns a ``Propagation``: the input target and the output, as DTensor's rule does; the
  collectives of a move are planned when first read (``p.collectives``), as DTensor plans its
  redistribution when it runs. Timed three times: sub-axes on (the default); sub-axes on with
  ``p.collectives`` read inside the timed region (the move planned and priced: more work than
  DTensor's rule); inside ``shardlayout.config.options(subaxes=False)`` (outputs DTensor
  placements can say).

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
SIDES = ("dtensor", "ours", "ours_moves", "ours_nosub")


def prime_factors(n):
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def draw_cases(n, seed, mesh_sizes, dim_sizes, max_dims, max_out_dims, dtensor_accepts=False):
    """``n`` distinct ``(mesh_shape, shape, placements as text, out_shape)``: meshes of 1-3 axes of
    ``mesh_sizes``, tensors of 2-``max_dims`` dims of ``dim_sizes``, targets regrouping the prime
    factors into 1-``max_out_dims`` dims; with ``dtensor_accepts``, only cases DTensor's rule takes."""
    rng = random.Random(seed)
    cases, seen = [], set()
    while len(cases) < n:
        nd = rng.randint(1, 3)
        mesh = tuple(rng.choice(mesh_sizes) for _ in range(nd))
        shape = tuple(rng.choice(dim_sizes) for _ in range(rng.randint(2, max_dims)))
        pl = tuple(None if rng.random() < 0.25 else rng.randrange(len(shape)) for _ in range(nd))
        total = 1
        for x in shape:
            total *= x
        dims = [1] * rng.randint(1, max_out_dims)
        for p in prime_factors(total):
            dims[rng.randrange(len(dims))] *= p
        key = (mesh, shape, pl, tuple(dims))
        if key in seen:
            continue
        seen.add(key)
        if dtensor_accepts:
            try:
                propagate_shape_and_sharding(placements(pl), shape, view_groups(shape, tuple(dims)), mesh)
            except Exception:  # noqa: BLE001 - DTensor refuses the case: it is not compared
                continue
        cases.append(key)
    return cases


def make_cases(n, seed=0):
    """The random set: powers of 2 (module docstring)."""
    return draw_cases(n, seed, [2, 4, 8], [8, 16, 32, 64, 128, 256], 4, 4)


def make_adversarial(n, seed=7):
    """The adversarial set: size-1 dims, uneven shards, up to 6 dims (DTensor accepts each)."""
    return draw_cases(n, seed, [2, 3, 4, 8], [1, 2, 3, 5, 6, 7, 12, 24, 48, 96, 100, 128], 6, 6, True)


SETS = {"random": make_cases, "adversarial": make_adversarial}


def placements(pl):
    return [Replicate() if d is None else Shard(d) for d in pl]


def fresh_sharding(mesh_shape, shape, pl):
    mesh = Mesh(mesh_shape, ("a", "b", "c")[: len(mesh_shape)])
    return Sharding.from_placements(mesh, shape, placements(pl))


def run_cases(cases) -> dict:
    """``{side: [ns per call]}`` and the count of cases that move data, timed as the module says."""
    clock = time.perf_counter_ns
    times = {k: [] for k in SIDES}
    moves = {k: 0 for k in SIDES}
    gc.collect()
    gc.disable()
    try:
        for i, (mesh_shape, shape, pl, out) in enumerate(cases):
            order = SIDES[i % len(SIDES):] + SIDES[: i % len(SIDES)]
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
                    elif side == "ours_moves":
                        t0 = clock()
                        p = propagate("view", [s], shape=out)
                        p.collectives[:]
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


def worker(n: int, which: str) -> int:
    res = run_cases(SETS[which](n))
    json.dump({k: statistics.median(v) for k, v in res["times"].items()}, sys.stdout)
    return 0


NAMES = {
    "dtensor": "DTensor `view_groups` + `propagate_shape_and_sharding`",
    "ours": "shardlayout `propagate(\"view\")`, sub-axes on (default)",
    "ours_moves": "the same, `p.collectives` read (move planned and priced)",
    "ours_nosub": "shardlayout `propagate(\"view\")`, sub-axes off",
}


def set_rows(which: str, n: int, procs: int) -> list:
    """The table rows of one case set: this process's run, then ``procs`` fresh processes."""
    cases = SETS[which](n)
    run_cases(cases[:10])  # one-time set-up on both sides (lazy imports, first-use paths)
    here = run_cases(cases)
    fresh = []
    for _ in range(procs):
        out = subprocess.run([sys.executable, __file__, str(n), which, "--worker"], capture_output=True,
                             text=True, check=True).stdout
        fresh.append(json.loads(out))
    t, mv = here["times"], here["moves"]
    md = statistics.median(t["dtensor"])
    fd = statistics.median(f["dtensor"] for f in fresh) if fresh else None
    rows = []
    for side in SIDES:
        m = statistics.median(t[side])
        per = sorted(f[side] for f in fresh)
        fm = statistics.median(per) if per else None
        rows.append([
            which,
            NAMES[side],
            spread(t[side], 1e-3),
            f"{fm / 1e3:.3g} ({per[0] / 1e3:.3g}–{per[-1] / 1e3:.3g})" if per else "—",
            "—" if side == "dtensor" else f"{md / m:.2f}x",
            "—" if side == "dtensor" or not per else f"{fd / fm:.2f}x",
            mv[side],
        ])
    return rows


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else N_CASES
    if "--worker" in sys.argv:
        return worker(n, args[1])
    procs = int(args[1]) if len(args) > 1 else PROCS
    rows = [r for which in SETS for r in set_rows(which, n, procs)]
    method = (
        f"## View propagation, first calls ({n} distinct cases per set)\n\n"
        + __doc__.split("Run:")[0].strip()
    )
    header = ["set", "side", "µs per call, this process: median (p25–p75)",
              f"µs, {procs} fresh processes: median of medians (min–max)", "ratio DTensor/ours",
              "ratio, fresh processes", f"cases that move data (of {n})"]
    notes = (
        "Ours validates the params against the op's signature (DTensor's rule does not). Cases that move "
        "data differ between the sides: with sub-axes on, ours keeps shardings DTensor gathers; with them "
        "off, ours gathers only the factor in the way (DTensor may replicate a whole mesh dim). On the "
        "adversarial set most cases have an uneven dim: ours then walks the factor list "
        "(`ops.regroup.regroup_walk`) instead of its one-pass even path, and most of them move data."
    )
    emit("view", method, header, rows, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
