"""shardlayout.layout vs pycute on the same inputs, in the same run.

For each operation and layout family, times every call on distinct inputs (first calls:
caches cleared, nothing repeated) and then the same calls again (warm), and prints the
median per call and the ratio pycute / ours. Run: ``python benchmarks/bench_layout.py``.
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time

import pycute

from shardlayout.errors import LayoutError
from shardlayout.layout import Layout
from shardlayout.layout import algebra as ours

N_CASES = 400
WARM_REPEATS = 5


def rand_shape(rng, depth, max_rank=3):
    if depth == 0 or rng.random() < 0.35:
        return rng.choice([2, 2, 3, 4, 4, 8, 16])
    return tuple(rand_shape(rng, depth - 1, max_rank) for _ in range(rng.randint(2, max_rank)))


def compact(shape, rng):
    from shardlayout.layout.inttuple import flatten, unflatten

    flat = list(flatten(shape))
    order = list(range(len(flat)))
    rng.shuffle(order)
    strides = [0] * len(flat)
    p = 1
    for i in order:
        strides[i] = p
        p *= flat[i]
    return Layout(shape, unflatten(strides, shape))


def tiler_for(A, rng):
    from shardlayout.layout.inttuple import flatten

    fs = [s for s in flatten(A.shape) if s > 1] or [1]
    pre = [1]
    for s in fs:
        pre.append(pre[-1] * s)
    shape, stride = [], []
    for _ in range(rng.randint(1, 3)):
        d = rng.choice(pre[:-1])
        rest = A.size() // d
        shape.append(rng.choice([x for x in (1, 2, 3, 4, 8, 16, 32) if rest % x == 0]))
        stride.append(d)
    return Layout(tuple(shape), tuple(stride)) if len(shape) > 1 else Layout(shape[0], stride[0])


FAMILIES = {"small": 1, "nested": 2, "deep": 3}


def make_cases(op, family, rng):
    depth = FAMILIES[family]
    cases, seen = [], set()
    tries = 0
    while len(cases) < N_CASES and tries < N_CASES * 200:
        tries += 1
        A = compact(rand_shape(rng, depth, 3), rng)
        if A.size() > 4096 or A.depth != depth:
            continue
        if op in ("composition", "logical_divide"):
            B = tiler_for(A, rng)
            args = (A, B)
        elif op == "complement":
            args = (A, A.size() * rng.choice([1, 2, 4]))
        else:
            args = (A,)
        key = tuple(map(str, args))
        if key in seen:
            continue
        try:
            getattr(ours, op)(*args)
            getattr(pycute, op)(*[to_py(a) for a in args])
        except (LayoutError, AssertionError):
            continue
        seen.add(key)
        cases.append(args)
    ours.clear_caches()
    return cases


def to_py(x):
    return pycute.Layout(x.shape, x.stride) if isinstance(x, Layout) else x


def time_calls(f, arg_list, repeats=1):
    out = []
    for args in arg_list:
        best = None
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            f(*args)
            dt = time.perf_counter_ns() - t0
            best = dt if best is None else min(best, dt)
        out.append(best)
    return statistics.median(out) / 1000.0


def time_pairs(fo, ours_args, fp, py_args, repeats):
    """Time ours and pycute case by case, interleaved, so drift hits both alike."""
    to, tp = [], []
    clock = time.perf_counter_ns
    for a, b in zip(ours_args, py_args):
        bo = bp = None
        for _ in range(repeats):
            t0 = clock()
            fo(*a)
            t1 = clock()
            fp(*b)
            t2 = clock()
            bo = t1 - t0 if bo is None else min(bo, t1 - t0)
            bp = t2 - t1 if bp is None else min(bp, t2 - t1)
        to.append(bo)
        tp.append(bp)
    return statistics.median(to) / 1000.0, statistics.median(tp) / 1000.0


def main() -> int:
    rng = random.Random(20261122)
    rows = []
    for op in ("composition", "logical_divide", "complement", "coalesce"):
        for family in FAMILIES:
            cases = make_cases(op, family, rng)
            py_cases = [tuple(to_py(a) for a in args) for args in cases]
            fo, fp = getattr(ours, op), getattr(pycute, op)
            gc.disable()
            ours.clear_caches()
            first_ours, first_py = time_pairs(fo, cases, fp, py_cases, 1)
            warm_ours, warm_py = time_pairs(fo, cases, fp, py_cases, WARM_REPEATS)
            gc.enable()
            rows.append((op, family, len(cases), first_py, first_ours, warm_py, warm_ours))
    print(f"{'op':16}{'family':8}{'n':>5} {'pycute first':>13}{'ours first':>11}{'ratio':>7}"
          f" {'pycute warm':>12}{'ours warm':>10}{'ratio':>7}   (µs, medians)")
    firsts, warms = [], []
    for op, fam, n, fp, fo, wp, wo in rows:
        firsts.append(fp / fo)
        warms.append(wp / wo)
        print(f"{op:16}{fam:8}{n:5d} {fp:13.2f}{fo:11.2f}{fp / fo:7.1f}x {wp:12.2f}{wo:10.2f}"
              f"{wp / wo:7.1f}x")
    print(f"\nfirst calls: ours is {min(firsts):.1f}x-{max(firsts):.1f}x pycute's speed "
          f"(median {statistics.median(firsts):.1f}x); warm: {min(warms):.1f}x-{max(warms):.1f}x "
          f"(median {statistics.median(warms):.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
