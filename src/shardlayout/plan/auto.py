"""``--style auto``: the minimum-step-time plan of a whole model under a memory budget, found by
an exact ILP and checked by the ordinary planner.

    objective    estimated step time = forward + backward communication (the one cost model,
                 through ``plan_move``) + compute (FLOPs / device FLOP rate); ``plan.estimate``
    constraint   memory per device (parameters x the training mode's copies, inputs,
                 activations kept for backward) <= ``memory_per_device``; ``plan.estimate``
    space        per tensor, the shardings it takes in the seed plans (no pins, each built-in
                 style), mixed freely per tensor; ``plan.space``
    solver       an ILP (``plan.ilp``, HiGHS) over per-op combinations and shared moves; a model
                 with repeated blocks is cut into a chain, each kind of block solved once per pair
                 of boundary shardings and the chain joined by dynamic programming
                 (``plan.chain``) — exactly the full ILP's optimum, in the time of a few blocks
    the plan     ``plan(program, mesh, pins=<the chosen sharding of every tensor>)``: the same
                 planner, verifier and cost model as every other plan. Its estimated step time
                 must equal the solver's prediction to the last bit (both are ``math.fsum`` of
                 the same terms); if not, the ILP's model of the planner is wrong and
                 :class:`ModelMismatch` is raised.

    >>> from shardlayout import Mesh
    >>> from shardlayout.program.models import llama
    >>> a = auto_plan(llama(layers=1), Mesh.parse("dp=2,tp=2"), memory_per_device="64KiB")
    >>> a.gap, a.estimate.memory <= 64 * 1024, a.estimate.seconds == a.predicted
    (0.0, True, True)
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field, replace

from ..errors import ShardingError
from ..mesh import Mesh, as_mesh
from ..sharding.cost import DEFAULT_COST_MODEL, CostModel
from . import Plan, _check_keep, kept_views, pin_shardings, plan
from .chain import segments, shared_inputs, slot_groups, solve_chain
from .estimate import StepEstimate, check_flop_rate, check_training, estimate
from .overlap import segment_options
from .space import Context, _order, domains, evaluate, memory_of, op_table, seed_plans, twin_tables, unify

SMALL_CHAIN = 8
"""Under a binding budget, a chain of at most this many blocks is solved as one ILP (proven
optimal); a longer one by its blocks' (time, memory) hulls, with the Lagrangian gap reported."""


class MemoryBudgetError(ShardingError):
    """A memory budget that is not a size (``80GiB``, ``512MB``, ``1e9``)."""


class NoPlanFits(ShardingError):
    """No plan of the search space fits the memory budget; ``smallest`` is the least budget
    (bytes per device) for which one does."""

    def __init__(self, message: str, smallest: int):
        super().__init__(message)
        self.smallest = smallest


class ModelMismatch(RuntimeError):
    """The solver's predicted step time differs from the planner's: a bug in ``plan.space``, not in
    the input — an internal error (the CLI exits 1 and shows the traceback under ``--debug``)."""


UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30,
         "t": 2**40, "tib": 2**40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_memory(text) -> int:
    """Bytes of a size: a number and an optional unit — ``KiB``/``MiB``/``GiB``/``TiB`` (or ``K``,
    ``M``, ``G``, ``T``) are powers of 1024, ``kB``/``MB``/``GB``/``TB`` powers of 1000, case
    ignored. ``parse_memory("80GiB") -> 85899345920``"""
    if isinstance(text, bool):
        raise MemoryBudgetError(f"memory budget {text!r}: give a size such as 80GiB")
    if isinstance(text, int):
        value, unit = text, ""
    elif isinstance(text, float):
        value, unit = text, ""
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
        if not m or m.group(2).lower() not in UNITS:
            raise MemoryBudgetError(f"memory budget {text!r}: write a number and a unit, e.g. 80GiB, 512MiB, "
                                    "40KiB or 1e9 (bytes)")
        value, unit = float(m.group(1)), m.group(2).lower()
    got = value * UNITS[unit]
    if not math.isfinite(got) or got < 1:
        raise MemoryBudgetError(f"memory budget {text!r}: give at least 1 byte per device")
    return int(got)


def fmt_bytes(n: int) -> str:
    """``fmt_bytes(48096) -> '47.0 KiB'``"""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class StyleCost:
    """A built-in style's plan under the same cost model: its ``estimate`` and whether it
    ``fits`` the budget; ``error`` when the style does not apply."""

    style: str
    estimate: StepEstimate | None
    fits: bool
    error: str | None = None


@dataclass(frozen=True)
class BlockReport:
    """Blocks of one kind that resemble one style: a ``label`` (their first and last ops' names,
    varying parts as ranges), how many, the style (or ``replicated``: the plan without pins;
    ``mixed (closest: ...)`` when under half agree), and how many of their own tensors (parameters
    and op outputs) have that style's sharding (``matched`` of ``tensors``)."""

    label: str
    count: int
    style: str
    matched: int
    tensors: int


@dataclass(frozen=True)
class AutoPlan:
    """The auto plan and how it was found. ``plan``: the ordinary Plan; ``estimate``: its step
    time and memory; ``predicted``: the solver's step time (equal); ``method``: "chain" or
    "full"; ``gap``: relative optimality gap (0: proven optimal); ``seconds``: wall time of the
    whole search; ``solver_seconds``: HiGHS's share; ``binding``: what limits the plan;
    ``styles``: the built-in styles priced alike; ``blocks``: the style each block resembles."""

    plan: Plan
    estimate: StepEstimate
    predicted: float
    method: str
    gap: float
    seconds: float
    solver_seconds: float
    budget: int | None
    fastest_memory: int
    styles: tuple
    blocks: tuple
    stats: dict = field(default_factory=dict)

    @property
    def binding(self) -> str:
        """``"memory"`` when the budget cuts off the fastest plan of the space, else ``"none"``."""
        return "memory" if self.budget is not None and self.fastest_memory > self.budget else "none"

    def best_style(self) -> StyleCost | None:
        """The fastest built-in style that fits the budget (None when none does)."""
        fit = [s for s in self.styles if s.estimate is not None and s.fits]
        return min(fit, key=lambda s: (s.estimate.seconds, s.estimate.memory), default=None)

    def to_json(self) -> dict:
        """JSON-able summary (no plan: ``Plan.to_json`` has it)."""
        best = self.best_style()
        return {
            "method": self.method, "gap": self.gap, "solve_seconds": self.seconds,
            "solver_seconds": self.solver_seconds, "predicted_seconds": self.predicted,
            "estimate": self.estimate.to_json(), "memory_budget_bytes": self.budget,
            "binding": self.binding, "fastest_plan_memory_bytes": self.fastest_memory,
            "best_style": None if best is None else best.style,
            "vs_best_style": None if best is None or not best.estimate.seconds
            else self.estimate.seconds / best.estimate.seconds,
            "styles": [{"style": s.style, "fits": s.fits, "error": s.error,
                        **({} if s.estimate is None else {"seconds": s.estimate.seconds,
                                                          "memory_bytes": s.estimate.memory})}
                       for s in self.styles],
            "blocks": [{"ops": b.label, "count": b.count, "resembles": b.style, "matched": b.matched,
                        "tensors": b.tensors} for b in self.blocks],
            "stats": dict(self.stats),
        }

    def text(self) -> str:
        """The explanation ``shardlayout plan --style auto`` prints."""
        e, st = self.estimate, self.stats
        how = (f"a chain of {st['blocks']} blocks of {st['kinds']} kinds ({st['solves']} block ILPs, joined by "
               "dynamic programming)" if self.method == "chain" else f"one exact ILP over {st['ops']} ops")
        proof = "proven optimal (gap 0)" if self.gap == 0 else (
            f"within {self.gap:.2%} of optimal (Lagrangian bound of the memory-bound chain)"
            if st.get("gap_bound") == "lagrangian" else f"within {self.gap:.2%} of optimal at the time limit")
        lines = [f"auto: HiGHS over {st['choices']} sharding choices, {how}; {proof}; "
                 f"solved in {self.seconds:.2f} s",
                 f"estimated step {e.seconds * 1e6:.1f} µs = forward comm {e.forward * 1e6:.1f} + backward comm "
                 f"{e.backward * 1e6:.1f} + compute {e.compute * 1e6:.1f}"
                 + (f" - stream overlap {e.overlap * 1e6:.1f}" if e.overlap else "") + f" ({e.training}); "
                 f"memory {fmt_bytes(e.memory)} per device"
                 + (f" of {fmt_bytes(self.budget)}" if self.budget is not None else "")]
        if self.binding == "memory":
            lines.append(f"binding constraint: memory (the fastest plan needs {fmt_bytes(self.fastest_memory)})")
        elif self.budget is not None:
            lines.append(f"binding constraint: none (the fastest plan needs {fmt_bytes(self.fastest_memory)})")
        else:
            lines.append("binding constraint: none (no memory budget; --memory sets one)")
        lines.append("")
        w = max([len(b.label) for b in self.blocks] + [6])
        lines.append(f"{'blocks'.ljust(w)}  count  resembles")
        for b in self.blocks:
            lines.append(f"{b.label.ljust(w)}  {b.count:>5}  {b.style}, {b.matched}/{b.tensors} tensors alike")
        lines.append("")
        lines.append(f"{'style':<12}{'step µs':>10}{'memory':>12}  fits")
        for s in self.styles:
            if s.estimate is None:
                lines.append(f"{s.style:<12}{'-':>10}{'-':>12}  n/a ({s.error})")
            else:
                lines.append(f"{s.style:<12}{s.estimate.seconds * 1e6:>10.1f}{fmt_bytes(s.estimate.memory):>12}  "
                             f"{'yes' if s.fits else 'no'}")
        best = self.best_style()
        ratio = "" if best is None else (
            f"  ({e.seconds / best.estimate.seconds:.2f}x the best style that fits, {best.style})"
            if best.estimate.seconds else f"  (the best style that fits, {best.style}, takes 0 µs)")
        lines.append(f"{'auto':<12}{e.seconds * 1e6:>10.1f}{fmt_bytes(e.memory):>12}  yes{ratio}")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# the search
# ------------------------------------------------------------------------------------------


def _check_pins(program, mesh: Mesh, pins) -> dict:
    out = {}
    for k, s in pin_shardings(program, mesh, pins, "auto_plan").items():
        if k not in program.tensors:
            raise ShardingError(f"pin {k!r}: the program has no such tensor")
        if s.shape != program.tensors[k].shape:
            raise ShardingError(f"pin {k!r}: sharding {s} has shape {s.shape}, the tensor has "
                                f"{program.tensors[k].shape}")
        out[k] = s
    return out


def _tables(program):
    """A memo of op tables keyed by the op and its tensors' domains (blocks of one kind under
    different shared choices reuse the tables of ops that do not read the shared tensors)."""
    cache: dict = {}

    def table(i, doms, ctx):
        op = program.ops[i]
        names = tuple(dict.fromkeys([t for t in op.inputs if type(t) is str] + list(op.outputs)))
        key = (i, tuple(doms[t] for t in names), ctx)
        if key not in cache:
            cache[key] = op_table(program, i, doms, ctx)
        return cache[key]

    return table


def _solve_full(program, segs, doms, ctx, budget, time_limit, table, seeds=()):
    from . import ilp
    from .chain import prices_of

    tabs, twins = twin_tables(program, segs, doms, ctx, table)
    mem = memory_of(program, doms, ctx.training)
    model = ilp.build(tabs, doms, mem, prices_of(program, ctx), segment_options(program, tabs, segs, ctx, twins))
    h = ilp.highs(model, time_limit)
    took = 0.0
    fastest = ilp.solve(h, model)
    took += fastest.seconds if fastest else 0.0
    sol = fastest
    if fastest is not None and budget is not None and _memory(mem, fastest.assignment) > budget:
        starts = [{t: p.shardings[t] for t in model.tensors if t in p.shardings} for _, p in seeds]
        sol = ilp.solve(h, model, budget=budget, starts=starts)
        took += sol.seconds if sol else 0.0
    if sol is None:
        low = ilp.solve(h, model, objective="memory")
        smallest = None if low is None else _memory(mem, low.assignment)
        return None, smallest, took, None
    terms = evaluate(program, tabs, sol.assignment, ctx, sol.streams)
    return (sol.assignment, terms, _memory(mem, sol.assignment), sol.gap, sol.streams), None, took, \
        _memory(mem, fastest.assignment)


def _memory(mem: dict, assignment: dict) -> int:
    return sum(mem.get((t, s), 0) for t, s in assignment.items())


@dataclass(frozen=True)
class Found:
    """What a solver found: the ``assignment`` of every tensor, its exact step-time ``terms``,
    its ``memory``, the ``gap``, the memory of the fastest plan, the solver's seconds, the
    ``method``, statistics and the ``streams`` chosen (``plan.overlap.StreamOption``)."""

    assignment: dict
    terms: tuple
    memory: int
    gap: float
    fastest_memory: int
    solver_seconds: float
    method: str
    stats: dict
    streams: tuple = ()


def auto_plan(program, mesh: Mesh, pins: dict | None = None, memory_per_device=None,
              cost_model: CostModel | None = None, flop_rate: float | None = None, training: str = "adam",
              method: str = "auto", time_limit: float = 60.0, keep=(), streams: bool = True) -> AutoPlan:
    """The minimum-step-time plan of ``program`` on ``mesh`` within ``memory_per_device`` (bytes
    or a size like ``"80GiB"``; None: no budget), with ``pins`` kept. ``method``: "chain"
    (repeated blocks), "full" (one ILP) or "auto" (the chain when the program has cuts, the
    full ILP when a budget binds a chain of at most ``SMALL_CHAIN`` blocks). ``keep``: pinned
    tensors no collective may move, nor the views made of them in place (a style's or TP plan's
    promise, as ``plan(..., keep=)``). ``streams``: stream overlaps are options of the search
    (``plan.overlap``) and the plan runs the ones it chose; False: no overlap at all (the plan
    runs none). Raises :class:`NoPlanFits` with the smallest budget that works when nothing fits.
    ``auto_plan(llama(layers=8), Mesh.parse("dp=2,tp=4"), memory_per_device="64KiB").plan``"""
    t0 = time.perf_counter()
    mesh = as_mesh(mesh, "auto_plan")
    cm = cost_model or DEFAULT_COST_MODEL
    check_training(training)
    rate = check_flop_rate(flop_rate)
    budget = None if memory_per_device is None else parse_memory(memory_per_device)
    if method not in ("auto", "chain", "full"):
        raise ShardingError(f"auto_plan: method {method!r}: choose auto, chain or full")
    pins = _check_pins(program, mesh, pins)
    keep = _check_keep(keep, pins)
    seeds = seed_plans(program, mesh, pins, cm, keep)
    segs = segments(program, training)
    shared = shared_inputs(program, [(s.lo, s.hi) for s in segs]) if len(segs) > 1 else frozenset()
    ctx = Context.of(program, mesh, cm, training, rate, shared, kept_views(program, keep), streams)
    doms = unify(domains(program, seeds, pins), slot_groups(segs))
    idle, idle_mem = _idle(program, doms, training)
    try:
        found = _search(program, segs, doms, ctx, None if budget is None else budget - idle_mem, method, time_limit,
                        seeds)
    except NoPlanFits as e:
        if not e.smallest:
            raise
        _no_fit(budget, e.smallest + idle_mem)  # the budgets the user gave and needs, idle inputs counted
    found = replace(found, assignment={**found.assignment, **idle}, memory=found.memory + idle_mem,
                    fastest_memory=found.fastest_memory + idle_mem)
    final = plan(program, mesh, found.assignment, cm, keep=keep)
    install_streams(final, found.streams, rate)
    est = estimate(final, training, rate)
    predicted = math.fsum(sum(found.terms, ()))
    if est.seconds != predicted or est.memory != found.memory:
        raise ModelMismatch(f"auto: the solver predicted {predicted!r} s and {found.memory} bytes, the planner "
                            f"gives {est.seconds!r} s and {est.memory} bytes; the ILP's model of plan() is wrong")
    styles = tuple(_style_cost(label, p, training, rate, budget) for label, p in seeds if label not in REFERENCE)
    styles += tuple(StyleCost(s, None, False, "does not apply to this program") for s in _missing_styles(seeds))
    stats = {**found.stats, "ops": len(program.ops), "tensors": len(program.tensors),
             "choices": sum(len(v) for v in doms.values())}
    return AutoPlan(final, est, predicted, found.method, found.gap, time.perf_counter() - t0, found.solver_seconds,
                    budget, found.fastest_memory, styles, _blocks(program, segs, final, seeds), stats)


def install_streams(final: Plan, streams, rate: float) -> tuple:
    """Give ``final`` the stream choices the search priced (``plan.overlap.StreamOption``), at
    ``rate``, instead of the ones ``plan.stream``'s greedy would choose: what ``estimate``,
    ``verify``, ``run`` and the report read. Each must be the plan's own candidate for its move
    to the bit (``plan.stream.move_candidate``) and together they keep the rules (each matmul and
    each tensor's side in one overlap at most); otherwise :class:`ModelMismatch`.
    ``install_streams(plan, found.streams, 1e14)`` -> the choices, in program order"""
    from .stream import _candidates

    have = list(_candidates(final, rate, False)) if streams else []
    chosen, used = [], set()
    for v in streams:
        got = next((x for x in have if x[1] == v.choice), None)
        if got is None or got[0] != v.saving:
            raise ModelMismatch(f"auto: the solver chose the stream {v.choice.text} of {v.tensor} ({v.side} "
                                f"{', '.join(v.choice.ops)}) saving {v.saving!r} s; the planner's plan "
                                f"{'has no such stream' if got is None else f'saves {got[0]!r} s with it'}")
        marks = set(v.choice.ops) | {(v.tensor, v.side)}
        if used & marks:
            raise ModelMismatch(f"auto: the solver overlapped {sorted(map(str, used & marks))} twice")
        used |= marks
        chosen.append(got)
    order = {op.name: i for i, op in enumerate(final.program.ops)}
    chosen.sort(key=lambda x: (order[x[1].ops[0]], x[1].tensor))
    final.flop_rate = rate
    final.__dict__.setdefault("_stream_chosen", {})[(rate, final.cost_model, False)] = chosen
    return tuple(c for _, c in chosen)


def _idle(program, doms: dict, training: str) -> tuple:
    """``({tensor: sharding}, bytes)`` of the program inputs no op reads (a buffer the export kept,
    e.g. a rotary table's original copy): no op's table holds them, yet they are on the device.
    Each takes its leanest sharding of its domain. ``_idle(prog, doms, "adam") -> ({}, 0)``"""
    used = {t for op in program.ops for t in (*op.inputs, *op.outputs) if type(t) is str}
    mem = memory_of(program, {t: v for t, v in doms.items() if t not in used and v}, training)
    idle = {}
    for t in sorted(set(program.inputs()) - used):
        if doms.get(t):
            idle[t] = min(doms[t], key=lambda s: (mem.get((t, s), 0), _order(s)))
    return idle, sum(mem.get((t, s), 0) for t, s in idle.items())


def _search(program, segs, doms, ctx, budget, method, time_limit, seeds) -> Found:
    """The chain solver or the full ILP, as ``method`` and the budget say (``auto_plan``)."""
    chainable = len(segs) > 1 and not (ctx.shared & ctx.grads)
    short = budget is not None and len(segs) <= SMALL_CHAIN  # a budget may bind: the one exact ILP at once
    use = ("chain" if chainable and not short else "full") if method == "auto" else method
    if use == "chain" and not chainable:
        raise ShardingError("auto_plan: method='chain' needs a program with cuts and no shared tensor with a "
                            "gradient; use method='full'")
    table, built = _tables(program), {}
    if use == "chain":
        res, smallest = solve_chain(program, segs, doms, ctx, None, time_limit, table, seeds, built)
        if res is None:
            _no_fit(budget, smallest)
        binds = budget is not None and res.memory > budget
        if not binds or method == "chain" or len(segs) > SMALL_CHAIN:
            fastest = res.memory
            if binds:
                res, smallest = solve_chain(program, segs, doms, ctx, budget, time_limit, table, seeds, built)
                if res is None:
                    _no_fit(budget, smallest)
            return Found(res.assignment, res.terms, res.memory, res.gap, fastest, res.solver_seconds, "chain",
                         {"blocks": len(segs), "kinds": res.kinds, "solves": res.solves,
                          "gap_bound": "proven" if res.gap == 0 else "lagrangian"}, res.streams)
    got, smallest, solver_s, fastest = _solve_full(program, segs, doms, ctx, budget, time_limit, table, seeds)
    if got is None:
        _no_fit(budget, smallest)
    assignment, terms, mem, gap, streams = got
    return Found(assignment, terms, mem, gap, fastest, solver_s, "full",
                 {"blocks": len(segs), "kinds": 1, "solves": 1, "gap_bound": "proven" if gap == 0 else "time limit"},
                 streams)


def _no_fit(budget, smallest):
    if smallest is None:
        raise NoPlanFits("auto: no plan of the search space is valid (the pins contradict each other); relax "
                         "the pins", 0)
    raise NoPlanFits(f"no plan fits {fmt_bytes(budget)} ({budget} bytes) per device; the smallest budget with a "
                     f"plan is {smallest} bytes ({fmt_bytes(smallest)}): give --memory {smallest} or more",
                     smallest)


def _missing_styles(seeds) -> list:
    from ..program.models import STYLES

    have = {label for label, _ in seeds}
    return [s for s in STYLES if s not in have]


def _style_cost(label, p, training, rate, budget) -> StyleCost:
    e = estimate(p, training, rate)
    return StyleCost(label, e, budget is None or e.memory <= budget)


# ------------------------------------------------------------------------------------------
# which style each block resembles
# ------------------------------------------------------------------------------------------


REFERENCE = {"none": "replicated", "pins": "pins only"}
"""Names of the seed plans that are not styles, when a block resembles one."""


def _blocks(program, segs, final: Plan, seeds) -> tuple:
    """Per kind of block, the seed plan whose shardings of the block's own tensors (parameters
    and op outputs) agree most with the auto plan's ("mixed" when under half agree)."""
    styles = [(label, p) for label, p in seeds if label not in REFERENCE] + \
        [(REFERENCE[label], p) for label, p in seeds if label in REFERENCE]
    rows: dict = {}
    for seg in segs:
        own = seg.slots
        scores = [(sum(p.shardings[t] == final.shardings[t] for t in own), -k, label)
                  for k, (label, p) in enumerate(styles)]
        matched, _, label = max(scores)
        if 2 * matched < len(own):
            label = f"mixed (closest: {label})"
        rows.setdefault((seg.key, label), []).append((seg, matched, len(own)))
    out = []
    for (_, label), items in rows.items():
        names = [program.ops[s.lo].name for s, _, _ in items]
        lasts = [program.ops[s.hi - 1].name for s, _, _ in items]
        text = f"{_pattern(names)} .. {_pattern(lasts)}" if len(program.ops) > 1 else _pattern(names)
        out.append(BlockReport(text, len(items), label, sum(m for _, m, _ in items), sum(n for _, _, n in items)))
    return tuple(out)


def _pattern(names: list) -> str:
    """``["layers.0.sq", "layers.1.sq"] -> "layers.0-1.sq"``: varying integer parts as ranges."""
    parts = [n.split(".") for n in names]
    if len({len(p) for p in parts}) != 1:
        return names[0] + (f" (+{len(names) - 1})" if len(names) > 1 else "")
    out = []
    for col in zip(*parts):
        if len(set(col)) == 1:
            out.append(col[0])
        elif all(c.isdigit() for c in col):
            nums = sorted({int(c) for c in col})
            out.append(f"{nums[0]}-{nums[-1]}" if nums == list(range(nums[0], nums[-1] + 1))
                       else ",".join(map(str, nums)))
        else:
            out.append("*")
    return ".".join(out)


def plan_style(program, mesh: Mesh, style: str, pins=None, cost_model=None, memory_per_device=None, **options):
    """``plan(..., style=...)``: ``"auto"`` is :func:`auto_plan`'s plan; a built-in style is the
    plan with its pins (``pins`` override them). ``plan_style(prog, mesh, "megatron")``"""
    if style == "auto":
        return auto_plan(program, mesh, pins, memory_per_device, cost_model, **options).plan
    if memory_per_device is not None or options:
        raise ShardingError(f"plan(style={style!r}): memory_per_device and {sorted(options) or 'the search options'} "
                            "apply to style='auto' only; pass style='auto'")
    from ..program.styles import apply_style, kept_pins

    got = apply_style(program, mesh, style)
    final = {**got.pins, **(pins or {})}
    return plan(program, mesh, final, cost_model, keep=kept_pins(pin_shardings(program, mesh, final), got))


__all__ = ["AutoPlan", "BlockReport", "MemoryBudgetError", "ModelMismatch", "NoPlanFits", "StyleCost", "auto_plan",
           "install_streams",
           "fmt_bytes", "parse_memory", "plan_style"]
