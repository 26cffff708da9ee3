"""shardlayout.layout vs pycute: the same operation on the same inputs, truly cold, in one run.

Method (also printed in the header of the output):

- Inputs are generated from ``--seed`` (default 20261122; pass any other to get inputs nobody has
  seen): per operation and family (small = depth 1, nested = depth 2, deep = depth 3), ``--cases``
  distinct layouts (compact, modes in a random order) and, for composition and logical_divide,
  tilers that are admissible for both libraries. Cases either library refuses are skipped.
- Cases are kept as plain nested tuples. For every timed call, both sides get FRESH objects built
  from those tuples just before the call (``shardlayout.layout.Layout(shape, stride)`` and
  ``pycute.Layout(shape, stride)``; construction is not timed), so no hash, flattened form or
  other state computed earlier is reused, and ``shardlayout.caches.clear_caches()`` empties every
  memo of the package before each case: every timed call of ours is a memo miss.
- The interpreter itself is warm (both libraries are imported and exercised while the cases are
  generated); "cold" means no state of ours from an earlier call survives: no memo entry, no
  cached hash or flattened form on the operands (their tuples carry no cached state in CPython).
- Timed: one call of the public function (``composition(A, B)``, ``logical_divide(A, B)``,
  ``complement(A, cotarget)``, ``coalesce(A)``) with ``time.perf_counter_ns``, garbage collector
  off. Ours and pycute alternate case by case, and which side goes first alternates too.
- Reported per row: median µs per call with the p25–p75 spread, the ratio of the medians
  (pycute / ours: above 1 means ours is faster) and the median of the per-case ratios.
- ``--memo-hit`` adds a column with ours called again on the same objects (a memo hit). pycute has
  no memo, so that column is not comparable with anything and has no ratio.

Run: ``python benchmarks/bench_layout.py [--seed N] [--cases N] [--memo-hit]``; writes
``benchmarks/results/layout.md`` through ``report.emit``.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from pathlib import Path

import pycute

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import emit, spread  # noqa: E402

from shardlayout.caches import clear_caches  # noqa: E402
from shardlayout.errors import LayoutError  # noqa: E402
from shardlayout.layout import Layout  # noqa: E402
from shardlayout.layout import algebra as ours  # noqa: E402

DEFAULT_SEED = 20261122
OPS = ("composition", "logical_divide", "complement", "coalesce")
FAMILIES = {"small": 1, "nested": 2, "deep": 3}


# ------------------------------------------------------------------------------------------
# cases: plain nested tuples, never Layout objects
# ------------------------------------------------------------------------------------------


def rand_shape(rng, depth, max_rank=3):
    """A random nested shape of at most ``depth`` levels."""
    if depth == 0 or rng.random() < 0.35:
        return rng.choice([2, 2, 3, 4, 4, 8, 16])
    return tuple(rand_shape(rng, depth - 1, max_rank) for _ in range(rng.randint(2, max_rank)))


def flat(t):
    """Leaves of a nested tuple."""
    return [t] if type(t) is int else [y for x in t for y in flat(x)]


def refold(leaves, profile):
    """``leaves`` in the nesting of ``profile``."""
    it = iter(leaves)

    def rec(p):
        return next(it) if type(p) is int else tuple(rec(x) for x in p)

    return rec(profile)


def depth(t):
    return 0 if type(t) is int else 1 + max(depth(x) for x in t)


def compact(shape, rng):
    """A compact layout of ``shape`` whose modes are ordered at random: ``(shape, stride)``."""
    fs = flat(shape)
    order = list(range(len(fs)))
    rng.shuffle(order)
    strides = [0] * len(fs)
    p = 1
    for i in order:
        strides[i] = p
        p *= fs[i]
    return shape, refold(strides, shape)


def tiler_for(A, rng):
    """A tiler whose strides follow A's mode boundaries: ``(shape, stride)``."""
    fs = [s for s in flat(A[0]) if s > 1] or [1]
    pre = [1]
    for s in fs:
        pre.append(pre[-1] * s)
    size = pre[-1]
    shape, stride = [], []
    for _ in range(rng.randint(1, 3)):
        d = rng.choice(pre[:-1])
        rest = size // d
        shape.append(rng.choice([x for x in (1, 2, 3, 4, 8, 16, 32) if rest % x == 0]))
        stride.append(d)
    return (tuple(shape), tuple(stride)) if len(shape) > 1 else (shape[0], stride[0])


def size_of(A):
    p = 1
    for s in flat(A[0]):
        p *= s
    return p


def make_cases(op, family, rng, n):
    """``n`` distinct admissible cases of ``op`` as tuples of ``(shape, stride)`` pairs / ints."""
    want = FAMILIES[family]
    cases, seen = [], set()
    for _ in range(n * 200):
        if len(cases) == n:
            break
        A = compact(rand_shape(rng, want, 3), rng)
        if size_of(A) > 4096 or depth(A[0]) != want:
            continue
        if op in ("composition", "logical_divide"):
            args = (A, tiler_for(A, rng))
        elif op == "complement":
            args = (A, size_of(A) * rng.choice([1, 2, 4]))
        else:
            args = (A,)
        if args in seen or not admissible(op, args):
            continue
        seen.add(args)
        cases.append(args)
    clear_caches()
    return cases


def fresh(args, make):
    """New layout objects (built by ``make``) from the plain tuples of a case."""
    return tuple(make(*a) if type(a) is tuple else a for a in args)


def admissible(op, args) -> bool:
    try:
        getattr(ours, op)(*fresh(args, Layout))
        getattr(pycute, op)(*fresh(args, pycute.Layout))
    except (LayoutError, AssertionError, ArithmeticError, IndexError, TypeError):
        return False
    return True


# ------------------------------------------------------------------------------------------
# timing
# ------------------------------------------------------------------------------------------


def time_cold(op, cases, memo_hit):
    """Per case, interleaved and alternating who goes first: (ours ns, pycute ns, ours-hit ns)."""
    fo, fp = getattr(ours, op), getattr(pycute, op)
    clock = time.perf_counter_ns
    to, tp, th = [], [], []
    gc.collect()
    gc.disable()
    try:
        for i, args in enumerate(cases):
            clear_caches()
            a = fresh(args, Layout)
            b = fresh(args, pycute.Layout)
            if i % 2:
                t0 = clock()
                fp(*b)
                t1 = clock()
                fo(*a)
                t2 = clock()
                tp.append(t1 - t0)
                to.append(t2 - t1)
            else:
                t0 = clock()
                fo(*a)
                t1 = clock()
                fp(*b)
                t2 = clock()
                to.append(t1 - t0)
                tp.append(t2 - t1)
            if memo_hit:
                t0 = clock()
                fo(*a)
                th.append(clock() - t0)
    finally:
        gc.enable()
    return to, tp, th


def method_text(seed, n, memo_hit) -> str:
    hit = (
        " The last column is ours called again on the same objects, a memo hit; pycute has no "
        "memo, so it is not comparable and has no ratio."
        if memo_hit
        else ""
    )
    return (
        "## Layout algebra: shardlayout.layout vs pycute (nvidia-cutlass), truly cold first calls\n\n"
        f"Inputs generated from seed {seed} ({n} distinct admissible cases per row; small / nested "
        "/ deep = nesting depth 1 / 2 / 3). Timed: one call of the public function on each side "
        "(`composition(A, B)`, `logical_divide(A, B)`, `complement(A, cotarget)`, `coalesce(A)`), "
        "on FRESH layout objects built from plain tuples just before the call (construction not "
        "timed on either side; ours validates its operands there, pycute does not), with "
        "`shardlayout.caches.clear_caches()` (every memo of the package) called before each "
        "case, so every call of ours is a memo miss and finds no cached hash or flattened form "
        "(the interpreter itself is warm: same process). Ours and pycute alternate case "
        "by case, and which side goes first alternates; garbage collector off. Cells: median µs "
        "per call (p25–p75). `ratio` = pycute median / ours median (above 1: ours faster); "
        "`per-case ratio` = median (p25–p75) of pycute / ours per case." + hit
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the generated inputs")
    ap.add_argument("--cases", type=int, default=400, help="cases per op and family")
    ap.add_argument("--memo-hit", action="store_true", help="add ours' memo-hit column")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    header = ["op", "family", "n", "pycute µs", "ours µs", "ratio", "per-case ratio"]
    if args.memo_hit:
        header.append("ours memo hit µs (not comparable)")
    rows, ratios = [], []
    for op in OPS:
        for family in FAMILIES:
            cases = make_cases(op, family, rng, args.cases)
            to, tp, th = time_cold(op, cases, args.memo_hit)
            ratio = statistics.median(tp) / statistics.median(to)
            ratios.append(ratio)
            row = [op, family, len(cases), spread(tp, 1e-3), spread(to, 1e-3), f"{ratio:.2f}x",
                   spread([p / o for p, o in zip(tp, to)], 1.0)]
            if args.memo_hit:
                row.append(spread(th, 1e-3))
            rows.append(row)
    notes = (
        f"Truly cold first calls: ours is {min(ratios):.2f}x-{max(ratios):.2f}x pycute's speed "
        f"(median of rows {statistics.median(ratios):.2f}x). Seed {args.seed}."
    )
    emit("layout", method_text(args.seed, args.cases, args.memo_hit), header, rows, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
