"""The exact solver: an integer linear program over the tables of ``plan.space``, solved by
HiGHS (``highspy``).

Variables (all in [0, 1]):

    x[t, s]        tensor t takes sharding s (binary; one per tensor)
    y[o, c]        op o runs combination c of its tensors' shardings (one per op)
    m[t, s, d]     t, held as s, is moved to target d (paid once, whichever consumers need it)
    g[t, d, A]     the gradient of t at target d is all-reduced over the axis set A (the sum of
                   the consumers whose contributions arrive partial over exactly A)
    z[v]           stream option v (``plan.overlap.StreamOption``) is run (binary)

Constraints:

    sum_s x[t, s] = 1                          every tensor one sharding
    sum_c y[o, c] = 1                          every op one combination
    sum_{c: c_t = s} y[o, c] = x[t, s]         a combination agrees with its tensors
    m[t, s, d] >= sum_{c: moves t s->d} y[o, c]            for each consumer o
    g[t, d, A] >= sum_{c: reduces t at d over A} y[o, c]   for each consumer o
    z[v] <= m[t, s, d]                         a stream of an input move needs the move
    z[v] <= sum_{c in C} y[o, c]               for each condition (o, C) of v (plan.overlap)
    sum_{v: o a site of v} z[v] <= 1           each matmul in one overlap at most
    sum_{v: of t on side} z[v] <= 1            each tensor's side in one overlap at most
    sum_{t, s} memory[t, s] x[t, s] <= budget  (optional)

Objective: ``sum own[c] y + sum price(s->d) m + sum allreduce(A, d) g - sum saving[v] z`` — the
step time of ``plan.estimate`` (streams counted).
With x integral, y is integral too (each op's combination is the one its
tensors' shardings name), m and g are 1 exactly for the moves and gradient sums the plan
makes, so the optimum of the
program is the minimum of the estimate over the space, and only x need be declared integer.
z is declared continuous too: with x integral, z only packs options into the site and side rows,
whose relaxation may split an option (halves of three options sharing matmuls pairwise), so a
solution is kept only when its z is integral as well — then it is the optimum of the program with
z binary (it is feasible there, and nothing there is below it) — and re-solved with z integer
otherwise. HiGHS's branch and bound on x alone is the faster search (a third less time on the
budgeted 2-4 layer cases of bench_auto).
Seconds enter as microseconds and bytes as KiB (exact: a power of two), with HiGHS's gaps set
to 0, so ``gap`` is 0 when HiGHS proves optimality. Each solve runs the LP relaxation first and
keeps its optimum when x and z are integral there (then it is the integer optimum); otherwise
HiGHS's branch and bound runs.

    >>> m = build(tables=(), domains={}, memory={}, prices=None)
    >>> m.ncols
    0
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass, field

from ..errors import ShardingError

US = 1e6  # objective unit: microseconds
KIB = 1024.0  # memory unit in the constraint


class SolverError(ShardingError):
    """HiGHS is missing or failed."""


@dataclass(frozen=True)
class Prices:
    """How the program prices the shared terms: ``move(t, src, dst)`` and ``reduction(t, d, axes)``
    (seconds)."""

    move: object
    reduction: object


@dataclass(frozen=True)
class Model:
    """The ILP in row form: column costs (µs), bounds, integrality, rows, and the maps back:
    ``xcol[(t, s)]`` and ``ycol[(op index, combo index)]``. ``memory_row``: index of the
    budget row (its bound is set per solve), or -1."""

    costs: tuple
    lower: tuple
    upper: tuple
    integer: tuple
    rows: tuple  # ((lower, upper, ((col, value), ...)), ...)
    xcol: dict
    ycol: dict
    memory: tuple  # (col, KiB) of the memory row
    tensors: tuple
    zcol: dict = field(default_factory=dict)  # {col: StreamOption}

    @property
    def ncols(self) -> int:
        """Number of variables."""
        return len(self.costs)


@dataclass(frozen=True)
class Solution:
    """``assignment`` ({tensor: Sharding}), ``objective`` (seconds as HiGHS sums them),
    ``bound`` (its proven lower bound), ``gap`` (relative; 0 when proven optimal), ``memory``
    (bytes), ``status`` and ``seconds`` (HiGHS's run time)."""

    assignment: dict
    objective: float
    bound: float
    gap: float
    memory: int
    status: str
    seconds: float = field(default=0.0, compare=False)
    streams: tuple = ()  # the stream options chosen (plan.overlap.StreamOption)


def build(tables, domains: dict, memory: dict, prices: Prices | None, streams=()) -> Model:
    """The ILP over ``tables`` (``plan.space.OpTable``) with ``domains`` for every tensor they
    touch, ``memory`` ({(t, s): bytes} of the counted tensors), ``prices`` and the stream options
    ``streams`` (``plan.overlap.stream_options``)."""
    costs, lower, upper, integer, rows = [], [], [], [], []

    def col(cost=0.0, integral=False):
        costs.append(cost)
        lower.append(0.0)
        upper.append(1.0)
        integer.append(integral)
        return len(costs) - 1

    tensors = tuple(sorted({t for tb in tables for t in tb.tensors}))
    xcol = {}
    for t in tensors:
        cols = [(col(integral=True), s) for s in domains[t]]
        for c, s in cols:
            xcol[(t, s)] = c
        rows.append((1.0, 1.0, tuple((c, 1.0) for c, _ in cols)))
    ycol = {}
    mcol, gcol = {}, {}
    need_m: dict = {}
    need_g: dict = {}
    for tb in tables:
        ys = []
        marg: dict = {}
        for k, cb in enumerate(tb.combos):
            c = col(cb.own_seconds * US)
            ycol[(tb.index, k)] = c
            ys.append((c, 1.0))
            for t, s in zip(tb.tensors, cb.shardings):
                marg.setdefault((t, s), []).append(c)
            for t, s, d in cb.moves:
                need_m.setdefault((t, s, d), {}).setdefault(tb.index, []).append(c)
            for t, d, axes in cb.reductions:
                need_g.setdefault((t, d, axes), {}).setdefault(tb.index, []).append(c)
        rows.append((1.0, 1.0, tuple(ys)))
        for t in tb.tensors:
            for s in domains[t]:
                ycs = marg.get((t, s), [])
                rows.append((0.0, 0.0, tuple((c, 1.0) for c in ycs) + ((xcol[(t, s)], -1.0),)))
    for key, by_op in need_m.items():
        mcol[key] = c = col(math.fsum(sum(prices.move(*key), ())) * US)
        for ycs in by_op.values():
            rows.append((-math.inf, 0.0, tuple((y, 1.0) for y in ycs) + ((c, -1.0),)))
    for key, by_op in need_g.items():
        gcol[key] = c = col(prices.reduction(*key) * US)
        for ycs in by_op.values():
            rows.append((-math.inf, 0.0, tuple((y, 1.0) for y in ycs) + ((c, -1.0),)))
    zcol = _streams(streams, col, rows, mcol, ycol)
    mem = tuple((xcol[k], b / KIB) for k, b in sorted(memory.items(), key=lambda kv: xcol.get(kv[0], -1))
                if k in xcol and b)
    return Model(tuple(costs), tuple(lower), tuple(upper), tuple(integer), tuple(rows), xcol, ycol, mem, tensors,
                 zcol)


def _streams(streams, col, rows, mcol: dict, ycol: dict) -> dict:
    """The stream columns and rows (module docstring): ``{col: StreamOption}``. The options of
    one move are the leaves of one question tree (``plan.overlap``), so at most one of them runs,
    and an op's condition sets among them are nested or disjoint: per move, op and condition
    set C, ``sum_{v: C_v within C} z[v] <= sum_{c in C} y[o, c]`` — the rows of each leaf, summed
    over the leaves it covers (a tighter relaxation, the same integer points)."""
    zcol, by_site, by_side, by_move = {}, {}, {}, {}
    for v in streams:
        if v.move is not None and v.move not in mcol:
            continue  # no combination makes the move
        c = col(-v.saving * US)  # binary, declared continuous (module docstring)
        zcol[c] = v
        by_move.setdefault(v.group, []).append((c, v))
        for i in v.sites:
            by_site.setdefault(i, []).append(c)
        by_side.setdefault((v.tensor, v.side), []).append(c)
    for members in by_move.values():
        move = members[0][1].move
        if move is not None:
            rows.append((-math.inf, 0.0, tuple((c, 1.0) for c, _ in members) + ((mcol[move], -1.0),)))
        conds = [(c, dict(v.conditions)) for c, v in members]
        sets = dict.fromkeys((i, ks) for _, cond in conds for i, ks in cond.items())
        for i, ks in sets:
            inner = frozenset(ks)
            cols = [c for c, cond in conds if i in cond and inner.issuperset(cond[i])]
            rows.append((-math.inf, 0.0, tuple((c, 1.0) for c in cols) + tuple((ycol[(i, k)], -1.0) for k in ks)))
    for group in (*by_site.values(), *by_side.values()):
        if len(group) > 1:
            rows.append((-math.inf, 1.0, tuple((c, 1.0) for c in group)))
    return zcol


# ------------------------------------------------------------------------------------------
# HiGHS
# ------------------------------------------------------------------------------------------


_QUIET = []


@contextlib.contextmanager
def _stdout_off():
    """highspy prints a banner on stdout (from C) when its first solver is made: send that
    one write to /dev/null, so ``--json`` output stays JSON."""
    if _QUIET:
        yield
        return
    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)
        _QUIET.append(True)


def highs(model: Model, time_limit: float = 60.0):
    """A HiGHS instance holding ``model`` (memory row last when ``model.memory``), silent, exact
    gaps. Re-solve it with :func:`solve` under other bounds. ``solve(highs(m), m, budget=2**20)``"""
    try:
        import highspy
        import numpy as np
    except ImportError as e:  # pragma: no cover - a dependency
        raise SolverError(f"--style auto needs HiGHS: pip install highspy ({e})") from None
    with _stdout_off():
        h = highspy.Highs()
    for name, value in (("output_flag", False), ("mip_rel_gap", 0.0), ("mip_abs_gap", 0.0),
                        ("time_limit", float(time_limit)), ("threads", 1), ("random_seed", 0),
                        ("mip_feasibility_tolerance", 1e-7)):
        h.setOptionValue(name, value)
    n = model.ncols
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.col_cost_ = np.asarray(model.costs, dtype=float)
    lp.col_lower_ = np.asarray(model.lower, dtype=float)
    lp.col_upper_ = np.asarray(model.upper, dtype=float)
    rows = list(model.rows)
    if model.memory:
        rows.append((-math.inf, math.inf, model.memory))
    lp.num_row_ = len(rows)
    lp.row_lower_ = np.asarray([lo if lo > -math.inf else -inf for lo, _, _ in rows], dtype=float)
    lp.row_upper_ = np.asarray([hi if hi < math.inf else inf for _, hi, _ in rows], dtype=float)
    starts, index, value = [0], [], []
    for _, _, entries in rows:
        for c, v in entries:
            index.append(c)
            value.append(v)
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = n
    lp.a_matrix_.num_row_ = len(rows)
    lp.a_matrix_.start_ = np.asarray(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.asarray(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.asarray(value, dtype=float)
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                       for i in model.integer]
    h.passModel(lp)
    return h


def solve(h, model: Model, fixed: dict | None = None, budget: int | None = None,
          objective: str = "time", weight: float = 0.0, starts=()) -> Solution | None:
    """Solve with tensors in ``fixed`` ({t: Sharding}) pinned, the memory row bounded by
    ``budget`` bytes (None: unbounded), minimising ``"time"`` (plus ``weight`` µs per KiB of
    memory: a Lagrangian price) or ``"memory"``; None when infeasible. HiGHS's state (bounds,
    costs) is set afresh on every call; ``objective`` of the result is the time part in seconds
    (``"memory"``: KiB). ``starts``: assignments ``{t: Sharding}`` (a style's plan) whose best
    completion within the budget is handed to the branch and bound as its first incumbent (the
    answer is the same; a good incumbent prunes). ``solve(h, m, {"x": s}, budget=64 * 1024).assignment``"""
    import highspy
    import numpy as np

    n = model.ncols
    upper = np.asarray(model.upper, dtype=float)
    for t, s in (fixed or {}).items():
        for (_, ss), c in _xcols(model, t):
            upper[c] = 1.0 if ss == s else 0.0
    if objective == "memory":  # streams do not change memory: none, so the LP is not degenerate in them
        for c in model.zcol:
            upper[c] = 0.0
    h.changeColsBounds(n, np.arange(n, dtype=np.int32), np.asarray(model.lower, dtype=float), upper)
    if objective == "memory":
        cost = np.zeros(n)
        for c, v in model.memory:
            cost[c] = v
    else:
        cost = np.array(model.costs, dtype=float)
        for c, v in model.memory if weight else ():
            cost[c] += weight * v
    h.changeColsCost(n, np.arange(n, dtype=np.int32), cost)
    if model.memory:
        hi = (budget + 0.5) / KIB if budget is not None else highspy.kHighsInf  # integral bytes: <= budget
        h.changeRowBounds(len(model.rows), -highspy.kHighsInf, hi)
    t0 = time.perf_counter()
    start = _incumbent(h, model, upper, starts) if starts else None
    status = _run(h, model, start)
    took = time.perf_counter() - t0
    if status == highspy.HighsModelStatus.kInfeasible:
        return None
    if status not in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kTimeLimit,
                      highspy.HighsModelStatus.kIterationLimit, highspy.HighsModelStatus.kSolutionLimit):
        raise SolverError(f"HiGHS stopped with status {h.modelStatusToString(status)}; rerun with a longer time limit")
    values = np.asarray(h.getSolution().col_value)
    if status != highspy.HighsModelStatus.kOptimal and (not len(values) or not h.getInfo().primal_solution_status):
        raise SolverError(f"HiGHS found no plan within its time limit ({h.getOptionValue('time_limit')} s); "
                          "give a longer time_limit")
    info = h.getInfo()
    assignment = {}
    for (t, s), c in model.xcol.items():
        if values[c] > 0.5:
            assignment[t] = s
    mem = int(round(sum(v * values[c] for c, v in model.memory) * KIB))
    streams = tuple(v for c, v in model.zcol.items() if values[c] > 0.5)
    obj = float(info.objective_function_value)
    bound = float(info.mip_dual_bound) if status != highspy.HighsModelStatus.kOptimal else obj
    gap = 0.0 if status == highspy.HighsModelStatus.kOptimal else max(0.0, (obj - bound) / obj if obj else 0.0)
    scale = US if objective == "time" else 1.0
    shift = weight * mem / KIB if objective == "time" else 0.0
    return Solution(assignment, (obj - shift) / scale, (bound - shift) / scale, gap, mem,
                    h.modelStatusToString(status), took, streams)


def _incumbent(h, model: Model, upper, starts):
    """The best feasible point among ``starts`` each pinned and completed by HiGHS (every tensor
    fixed: quick), as column values, or None; the bounds ``upper`` are restored."""
    import highspy
    import numpy as np

    n = model.ncols
    cols, lower = np.arange(n, dtype=np.int32), np.asarray(model.lower, dtype=float)
    best = None
    for fixed in starts:
        up = upper.copy()
        for t, s in fixed.items():
            for (_, ss), c in _xcols(model, t):
                up[c] = 1.0 if ss == s and upper[c] > 0 else 0.0
        h.changeColsBounds(n, cols, lower, up)
        h.run()
        if h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
            obj = float(h.getInfo().objective_function_value)
            if best is None or obj < best[0]:
                best = (obj, np.asarray(h.getSolution().col_value).copy())
    h.changeColsBounds(n, cols, lower, upper)
    return None if best is None else best[1]


def _run(h, model: Model, start=None):
    """Run HiGHS: the LP relaxation first; when its optimum gives every tensor exactly one
    sharding and every stream option all or nothing (x and z integral) that optimum is the
    integer program's too (it is feasible for it and no integer point is below the relaxation),
    else the branch and bound on x; when its z is fractional, once more with z integer (module
    docstring). The model status."""
    import highspy
    import numpy as np

    ints = model.__dict__.get("_int_cols")
    if ints is None:
        ints = np.flatnonzero(np.asarray(model.integer, dtype=bool))
        object.__setattr__(model, "_int_cols", ints)
    zs = np.fromiter(model.zcol, dtype=np.int32, count=len(model.zcol))

    def whole(cols) -> bool:
        v = np.asarray(h.getSolution().col_value)[cols]
        return bool(np.all(np.abs(v - np.round(v)) <= 1e-9))

    optimal = highspy.HighsModelStatus.kOptimal
    if len(ints) and _can_relax():
        h.setOptionValue("solve_relaxation", True)
        h.run()
        status = h.getModelStatus()
        h.setOptionValue("solve_relaxation", False)
        if status == highspy.HighsModelStatus.kInfeasible:
            return status
        if status == optimal and whole(ints) and whole(zs):
            return status
    # with stream columns HiGHS's MIP presolve costs more than it saves (a block: 1.1 s -> 0.3 s)
    h.setOptionValue("presolve", "off" if model.zcol else "choose")
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(start)
        h.setSolution(sol)
    h.run()
    status = h.getModelStatus()
    if not len(zs) or status != optimal or whole(zs):
        return status
    kinds = highspy.HighsVarType
    h.changeColsIntegrality(len(zs), zs, np.array([kinds.kInteger] * len(zs)))
    try:
        h.run()
        return h.getModelStatus()
    finally:
        h.changeColsIntegrality(len(zs), zs, np.array([kinds.kContinuous] * len(zs)))


_RELAX: list = []


def _can_relax() -> bool:
    """Whether this HiGHS can solve a MIP's relaxation alone (option ``solve_relaxation``)."""
    if not _RELAX:
        import highspy

        with _stdout_off():
            h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        _RELAX.append(h.setOptionValue("solve_relaxation", True) == highspy.HighsStatus.kOk)
    return _RELAX[0]


def _xcols(model: Model, t):
    got = model.__dict__.get("_by_tensor")
    if got is None:
        got = {}
        for (tt, ss), c in model.xcol.items():
            got.setdefault(tt, []).append(((tt, ss), c))
        object.__setattr__(model, "_by_tensor", got)
    return got.get(t, [])


__all__ = ["Model", "Prices", "Solution", "SolverError", "build", "highs", "solve"]
