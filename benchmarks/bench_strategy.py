"""Strategy selection, cold: shardlayout's ``propagate`` vs DTensor 2.13's
``propagate_op_sharding_non_cached``, in the same run, on the same inputs.

For each row (an op on a mesh) ``REPS`` cases are drawn: random ``Replicate`` / ``Shard(0)`` /
``Shard(1)`` placements per mesh axis for both operands of ``[m, k] @ [k, n]`` (distinct shapes per
case), converted for us with ``Sharding.from_placements``. Per case, in random order:

* **DTensor**: a fresh ``OpSchema`` of fresh ``DTensorSpec``s, DTensor's module-level caches
  cleared, then ``propagate_op_sharding_non_cached`` timed with its fake-tensor shape inference
  (``_propagate_tensor_meta_non_cached``) answered by the output ``TensorMeta`` computed
  beforehand: we time its sharding propagation (strategy expansion, redistribute costs, choice),
  not FakeTensorMode running the op. That shape inference is timed separately and shown, but
  excluded from the ratio (our search does not run the op either).
* **ours, cold**: ``shardlayout.caches.clear_caches()`` (every memo of the package: the
  per-call memo, the search's, ``plan_move``'s, the Sharding and layout-algebra ones), fresh
  ``Mesh`` and ``Sharding`` objects (no cached hashes), then ``propagate`` timed.
* **ours, warm**: the same call again right after (median of ``WARM_CALLS`` back-to-back calls):
  a memo hit (validation, key hashing, lookup), shown only as such; not compared.

``gc.collect()`` runs before every cold call on both sides (gc stays enabled while timing; the
collection itself evicts the CPU caches, which costs either side ~0.1 ms on the next call). One untimed case per
row first pays one-time set-up (imports, FakeTensorMode) on both sides. Prints a Markdown table:
medians with the interquartile range, and the ratio DTensor median / ours cold median from this run
(> 1: ours is faster; < 1: ours is slower). The table and this method go through
``benchmarks/report.py`` (``results/strategy.md``). Run: ``python benchmarks/bench_strategy.py``.
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

import shardlayout
from shardlayout import Mesh, Sharding, propagate
from shardlayout.caches import clear_caches

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import emit  # noqa: E402

ROWS = [("mm", (8,)), ("mm", (2, 4)), ("mm", (2, 2, 4)), ("mm", (2, 2, 2, 2)), ("einsum", (2, 2, 2, 2))]
REPS = 21
WARM_CALLS = 5
SEED = 0


# ------------------------------------------------------------------------------------------
# caches
# ------------------------------------------------------------------------------------------


def _caches_in(package: str) -> list:
    """Every functools cache at module level (or on a class) in the loaded modules of
    ``package`` (DTensor's: it has no registry of its caches)."""
    found, seen = [], set()

    def add(v):
        v = getattr(v, "__func__", v)  # staticmethod / classmethod
        if (not isinstance(v, type) and callable(getattr(v, "cache_clear", None))
                and callable(getattr(v, "cache_info", None)) and id(v) not in seen):
            seen.add(id(v))
            found.append(v)

    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == package or name.startswith(package + ".")):
            continue
        for v in list(vars(mod).values()):
            add(v)
            if isinstance(v, type) and v.__module__ == name:
                for w in list(vars(v).values()):
                    add(w)
    return found


def clear_ours() -> None:
    """Forget everything shardlayout memoised: ``shardlayout.caches.clear_caches()``."""
    clear_caches()


def clear_dtensor() -> None:
    """Forget DTensor's module-level caches (redistribute transform infos, mesh topology)."""
    for c in _caches_in("torch.distributed.tensor"):
        c.cache_clear()


# ------------------------------------------------------------------------------------------
# timing
# ------------------------------------------------------------------------------------------


def timed(fn):
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def q(xs, p):
    """The p-quantile (inclusive method) of xs."""
    return statistics.quantiles(xs, n=4, method="inclusive")[p] if len(xs) > 1 else xs[0]


def fmt_ms(xs) -> str:
    """``median (p25–p75)`` in ms, with a precision that fits."""
    med = statistics.median(xs) * 1e3
    lo, hi = q(xs, 0) * 1e3, q(xs, 2) * 1e3
    d = 3 if med < 1 else 2 if med < 10 else 1 if med < 100 else 0
    return f"{med:.{d}f} ({lo:.{d}f}–{hi:.{d}f})"


def fmt_us(xs) -> str:
    med, lo, hi = statistics.median(xs) * 1e6, q(xs, 0) * 1e6, q(xs, 2) * 1e6
    return f"{med:.1f} µs ({lo:.1f}–{hi:.1f})"


# ------------------------------------------------------------------------------------------
# the two sides
# ------------------------------------------------------------------------------------------


class DTensorSide:
    def __init__(self):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=16)
        from torch.distributed.tensor import DTensor

        self.prop = DTensor._op_dispatcher.sharding_propagator

    def device_mesh(self, shape):
        from torch.distributed.device_mesh import DeviceMesh

        return DeviceMesh("cpu", torch.arange(int(torch.tensor(shape).prod())).reshape(shape))

    def schema(self, dm, m, k, n, pa, pb):
        """A fresh OpSchema of fresh specs."""
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
        from torch.distributed.tensor._op_schema import OpSchema

        def spec(sz, pl):
            t = torch.empty(sz)
            return DTensorSpec(dm, tuple(pl), tensor_meta=TensorMeta(t.shape, t.stride(), t.dtype))

        return OpSchema(torch.ops.aten.mm.default, (spec((m, k), pa), spec((k, n), pb)), {})

    def run(self, dm, case):
        """(propagation seconds, fake shape-inference seconds) of one cold call."""
        prop = self.prop
        t_meta, meta = timed(lambda: prop._propagate_tensor_meta_non_cached(self.schema(dm, *case)))
        clear_dtensor()
        schema = self.schema(dm, *case)
        prop._propagate_tensor_meta_non_cached = lambda s: meta  # shape inference answered, not run
        try:
            t, out = timed(lambda: prop.propagate_op_sharding_non_cached(schema))
        finally:
            del prop._propagate_tensor_meta_non_cached
        assert out.output_spec is not None
        return t, t_meta


def ours_inputs(shape, case):
    """Fresh Mesh and Shardings (equal to earlier ones, but with no cached hash)."""
    m, k, n, pa, pb = case
    mesh = Mesh(shape, tuple(f"m{i}" for i in range(len(shape))))
    return Sharding.from_placements(mesh, (m, k), pa), Sharding.from_placements(mesh, (k, n), pb)


def ours_call(op, a, b):
    if op == "mm":
        return propagate("mm", [a, b])
    return propagate("einsum", [a, b], equation="mk,kn->mn")


def ours_run(op, shape, case):
    """(cold seconds, warm seconds, (candidates priced, candidates in the set))."""
    clear_ours()
    a, b = ours_inputs(shape, case)
    t_cold, p = timed(lambda: ours_call(op, a, b))
    warm = []
    for _ in range(WARM_CALLS):  # back to back, no gc.collect (it evicts the CPU caches: ~0.1 ms)
        t0 = time.perf_counter()
        p2 = ours_call(op, a, b)
        warm.append(time.perf_counter() - t0)
        assert p2 is p, "the warm call should be a memo hit"
    return t_cold, statistics.median(warm), (_priced(op, shape, case), len(p.candidates))


def _priced(op, shape, case) -> int:
    """How many candidates the search prices (untimed: the call again, cold, with ``price`` counted)."""
    from shardlayout.ops import strategy

    clear_ours()
    a, b = ours_inputs(shape, case)
    real, n = strategy.price, [0]

    def counted(*args, **kw):
        n[0] += 1
        return real(*args, **kw)

    strategy.price = counted
    try:
        ours_call(op, a, b)
    finally:
        strategy.price = real
    return n[0]


# ------------------------------------------------------------------------------------------


def draw_cases(rng, nd):
    from torch.distributed.tensor import Replicate, Shard

    cases = []
    for rep in range(REPS + 1):  # the first is the untimed set-up case
        m, k, n = 64 + 8 * rep, 128, 32 + 8 * rep  # distinct shapes per case
        pa = [rng.choice([Replicate(), Shard(0), Shard(1)]) for _ in range(nd)]
        pb = [rng.choice([Replicate(), Shard(0), Shard(1)]) for _ in range(nd)]
        cases.append((m, k, n, pa, pb))
    return cases


def main() -> int:
    rng = random.Random(SEED)
    dt = DTensorSide()
    t_start = time.perf_counter()
    rows = []
    for op, shape in ROWS:
        cases = draw_cases(rng, len(shape))
        dm = dt.device_mesh(shape)
        t_dt, t_meta, t_cold, t_warm, cands, first = [], [], [], [], [], {"ours": 0, "DTensor": 0}
        for i, case in enumerate(cases):
            sides = ["ours", "DTensor"] if op == "mm" else ["ours"]  # DTensor has no einsum strategy
            rng.shuffle(sides)
            for side in sides:
                if side == "ours":
                    got = ours_run(op, shape, case)
                    if i:
                        t_cold.append(got[0])
                        t_warm.append(got[1])
                        cands.append(got[2])
                else:
                    got = dt.run(dm, case)
                    if i:
                        t_dt.append(got[0])
                        t_meta.append(got[1])
            if i and len(sides) == 2:
                first[sides[0]] += 1
        rows.append((op, shape, t_dt, t_meta, t_cold, t_warm, cands, first))
    elapsed = time.perf_counter() - t_start

    header = ["op", "mesh", "DTensor propagation, ms", "ours cold, ms", "DTensor ÷ ours cold", "ours warm (memo hit)",
              "candidates we price / in the set", "DTensor fake shape inference (excluded), ms"]
    table = []
    for op, shape, t_dt, t_meta, t_cold, t_warm, cands, _ in rows:
        mesh = "x".join(map(str, shape))
        priced, whole = [c[0] for c in cands], [c[1] for c in cands]
        cand = (f"{statistics.median(priced):.0f} ({min(priced)}–{max(priced)}) / "
                f"{statistics.median(whole):.0f} ({min(whole)}–{max(whole)})")
        if t_dt:
            r = statistics.median(t_dt) / statistics.median(t_cold)
            paired = [d / c for d, c in zip(t_dt, t_cold)]
            ratio = (f"{r:.2f}x ({q(paired, 0):.2f}–{q(paired, 2):.2f})"
                     + (" **ours slower**" if r < 1 else ""))
            dcol, mcol = fmt_ms(t_dt), fmt_ms(t_meta)
        else:
            ratio, dcol, mcol = "n/a", "n/a: no strategy for aten.einsum", "n/a"
        table.append([op, mesh, dcol, fmt_ms(t_cold), ratio, fmt_us(t_warm), cand, mcol])
    method = (f"## Strategy selection, cold ({REPS} cases per row, seed {SEED}; torch {torch.__version__}, "
              f"shardlayout {getattr(shardlayout, '__version__', '?')}; {elapsed:.0f} s in all)\n\n"
              + __doc__.split("The table and this method")[0].strip())
    notes = ("Medians over the cases, (p25–p75) in brackets; the ratio is DTensor's median over our cold median"
             " (> 1: ours faster), its brackets the p25–p75 of the per-case paired ratios. Which side ran first"
             " was random per case: " + ", ".join(
                 f"{'x'.join(map(str, s))} ours first {f['ours']}/{REPS}" for o, s, *_, f in rows if o == "mm") + ".")
    emit("strategy", method, header, table, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
