"""Repeated blocks: cut the program into a chain of blocks, solve each kind of block once per
pair of boundary shardings, and join the blocks by dynamic programming.

**Cuts.** A cut after op i is a point where exactly one value crosses: one tensor made at or
before op i is read after it (the residual stream of a transformer, after each attention and
each MLP). Program inputs may cross too (the RoPE tables every layer reads): they are *shared*
— chosen once for the whole chain (a tuple of shardings :func:`shared_choices` lists), counted
once in memory, and inside a block only sliced locally (``Context.shared``; both this solver and
the full ILP it is tested against search that same space). A shared tensor with a gradient (a
tied weight) makes the program a single block.

**Blocks.** The ops between two cuts; two blocks are the same *kind* when their ops, params,
shapes, dtypes, gradient flags and memory weights are the same with tensor names replaced by
their place in the block (:func:`block_key`) — Llama's layers give an attention kind and an MLP
kind (plus the first and last, whose ends differ). Places of one kind share one domain
(``plan.space.unify``), so a block's ILP (``plan.ilp``) priced once for boundary shardings
``(a, b)`` prices every block of its kind between ``a`` and ``b``: 32 or 80 layers cost what 2
cost, plus a dynamic program over the chain.

**Why it is exact.** Given the boundary shardings and the shared tuple, the blocks' terms are
independent: every consumer of a block's tensors is inside the block (a tensor read by a later
block would cross that block's cut too), moves are shared only among one tensor's consumers,
and a shared tensor's moves are free local slices. So the step time is a sum over blocks of
``T(kind, a, b)`` and the memory a sum of ``M(kind, a, b)`` plus the shared tensors'. Without a
budget the chain optimum is a shortest path over boundary shardings. With one, each pair that
can matter gets the vertices of its (time, memory) lower hull — each a solve of the block's ILP
minimising time + λ·memory — and a dynamic program picks one point per block, the boundaries
agreeing, under the budget (:func:`_pick`: exact over those points); then the memory the
chosen points leave unused is offered back: each block of the path is solved within its memory
plus that slack, and the chain is picked again (:func:`_fill`). The reported gap is the
Lagrangian bound's, which holds for every point of every block, on the hull or not.
``tests/plan/test_auto.py`` checks the chain's optimum equals the full ILP's on small models,
``tests/plan/test_chain.py`` the dynamic program against every path.

    >>> from shardlayout.program.models import llama
    >>> [(s.inp, s.out) for s in segments(llama(layers=1))]
    [(None, 'layers.0.resid1'), ('layers.0.resid1', None)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..program import Program
from . import ilp
from .estimate import grads_of, local_bytes, memory_weights
from .overlap import stream_options
from .space import _order, evaluate, memory_of, priced_move, priced_reduction


@dataclass(frozen=True)
class Segment:
    """Ops ``lo``..``hi - 1`` of the program; ``inp``: the tensor crossing the cut before it
    (None for the first); ``out``: the tensor crossing the cut after it (None for the last);
    ``key``: its kind; ``slots``: its own tensors (own inputs, then op outputs) in block order."""

    lo: int
    hi: int
    inp: str | None
    out: str | None
    key: tuple = field(repr=False)
    slots: tuple = field(repr=False)


def _uses(program: Program) -> tuple:
    first, last = {}, {}
    for i, op in enumerate(program.ops):
        for t in op.inputs:
            if type(t) is str:
                first.setdefault(t, i)
                last[t] = i
    for t in program.outputs:
        last[t] = len(program.ops)
    return first, last


def cuts(program: Program) -> list:
    """``[(i, tensor)]``: after op ``i`` exactly one made tensor, ``tensor``, crosses (program
    inputs may cross too), and it did not cross the cut before (every reader of a crossing value
    is in the block after its cut: a value read in two blocks would have its moves priced by both).
    ``(35, 'layers.0.resid1') in cuts(llama(layers=1)) -> True``"""
    _, last = _uses(program)
    live: set = set()
    out = []
    for i, op in enumerate(program.ops[:-1]):
        live |= {o for o in op.outputs if last.get(o, -1) > i}
        live = {t for t in live if last.get(t, -1) > i}
        if len(live) == 1:
            t = next(iter(live))
            if out and out[-1][1] == t:  # still the same value: its readers would span two blocks
                continue
            out.append((i, t))
    return out


def segments(program: Program, training: str = "adam") -> tuple:
    """The chain of blocks of ``program`` (one block when it has no cut).
    ``len(segments(llama(layers=32))) -> 64``"""
    cs = _coarsen(program, cuts(program))
    bounds = [(-1, None)] + cs + [(len(program.ops) - 1, None)]
    grads = grads_of(program)
    weights = memory_weights(program, training)
    share = shared_inputs(program, [(a + 1, b + 1) for (a, _), (b, _) in zip(bounds, bounds[1:])])
    segs = []
    for (a, inp), (b, out) in zip(bounds, bounds[1:]):
        key, slots = block_key(program, a + 1, b + 1, inp, out, share, grads, weights)
        segs.append(Segment(a + 1, b + 1, inp, out, key, slots))
    return tuple(segs)


def _coarsen(program: Program, cs: list) -> list:
    """Keep the cuts no unshared program input crosses. An input is *shared* when two blocks of
    the same kind (between the cuts ``cs``) read it — the RoPE tables every layer reads; the
    input tokens ``x``, read by the first layer only, keep that layer one block."""
    first, last = _uses(program)
    bounds = [(-1, None)] + cs + [(len(program.ops) - 1, None)]
    readers: dict = {}
    for (a, inp), (b, out) in zip(bounds, bounds[1:]):
        key = block_key(program, a + 1, b + 1, inp, out, _unshared_names(program), frozenset(), {})[0]
        for op in program.ops[a + 1:b + 1]:
            for t in op.inputs:
                if type(t) is str and _is_input(program, t):
                    readers.setdefault(t, []).append(key)
    shared = {t for t, keys in readers.items() if len(keys) != len(set(keys)) and program.tensors[t].kind != "param"}
    return [(i, t) for i, t in cs
            if not any(first[x] <= i < last[x] for x in readers if x not in shared)]


def _unshared_names(program: Program) -> frozenset:
    """Non-parameter inputs, named in a block's key (so blocks reading the same table match)."""
    return frozenset(t for t in program.inputs() if program.tensors[t].kind != "param")


def shared_inputs(program: Program, ranges) -> frozenset:
    """Program inputs read in more than one of ``ranges`` (``[(lo, hi)]`` of op indices).
    ``shared_inputs(llama(layers=2), [(0, 36), (50, 86)]) -> frozenset({'cos', 'sin'})``"""
    seen: dict = {}
    for k, (lo, hi) in enumerate(ranges):
        for op in program.ops[lo:hi]:
            for t in op.inputs:
                if type(t) is str and _is_input(program, t):
                    seen.setdefault(t, set()).add(k)
    return frozenset(t for t, ks in seen.items() if len(ks) > 1)


def _is_input(program: Program, t: str) -> bool:
    got = program.__dict__.get("_input_set")
    if got is None:
        got = frozenset(program.inputs())
        object.__setattr__(program, "_input_set", got)
    return t in got


def block_key(program: Program, lo: int, hi: int, inp, out, shared, grads, weights) -> tuple:
    """``(key, slots)``: the block's structure with tensor names replaced by places, and its own
    tensors in place order. ``block_key(prog, 50, 86, "layers.0.resid2", "layers.1.resid1", ...)``"""
    ref: dict = {}
    if inp is not None:
        ref[inp] = ("in",)
    slots = []
    ops = []
    for op in program.ops[lo:hi]:
        args = []
        for t in op.inputs:
            if type(t) is not str:
                args.append(("c", t))
                continue
            if t not in ref:
                if t in shared:
                    ref[t] = ("g", t)
                else:
                    ref[t] = ("p", len(slots))
                    slots.append(t)
            args.append(ref[t])
        outs = []
        for o in op.outputs:
            ref[o] = ("l", len(slots))
            slots.append(o)
            spec = program.tensors[o]
            outs.append((spec.shape, spec.dtype))
        ops.append((op.target, op.params, tuple(args), tuple(outs)))
    specs = tuple((program.tensors[t].shape, program.tensors[t].dtype, program.tensors[t].kind, t in grads,
                   weights.get(t, 0)) for t in slots)
    in_spec = None if inp is None else (program.tensors[inp].shape, program.tensors[inp].dtype, inp in grads)
    return (tuple(ops), specs, in_spec, None if out is None else ref[out]), tuple(slots)


def kinds(segs) -> dict:
    """``{key: [segment, ...]}`` in chain order. ``len(kinds(segments(llama(layers=32)))) -> 4``"""
    out: dict = {}
    for s in segs:
        out.setdefault(s.key, []).append(s)
    return out


def slot_groups(segs) -> list:
    """Tensors at the same place of blocks of one kind (for ``space.unify``).
    ``("layers.1.wq", "layers.2.wq") in slot_groups(segments(llama(layers=3))) -> True``"""
    groups = []
    for same in kinds(segs).values():
        if len(same) > 1:
            groups.extend(zip(*(s.slots for s in same)))
    return groups


def shared_choices(shared, doms: dict) -> tuple:
    """The tuples of shardings the shared tensors may take together: every combination of
    their domains (sorted); ``({},)`` when nothing is shared. ``shared_choices(frozenset(), {}) -> ({},)``"""
    names = sorted(shared)
    out = [{}]
    for t in names:
        out = [{**g, t: s} for g in out for s in doms[t]]
    return tuple(out)


# ------------------------------------------------------------------------------------------
# the chain
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One solution of a block between fixed boundaries: ``terms`` (its exact step-time terms,
    ``plan.space.evaluate``), ``seconds`` (their sum), ``memory`` (bytes of the block's own
    tensors), ``assignment`` of the representative block's tensors, HiGHS's ``gap`` and the
    ``streams`` chosen (``plan.overlap.StreamOption`` of the representative block)."""

    seconds: float
    memory: int
    terms: tuple = field(repr=False)
    assignment: dict = field(repr=False)
    gap: float = 0.0
    streams: tuple = field(default=(), repr=False)


class Block:
    """One kind of block with its ILP, built once and re-solved per boundary pair (solutions
    memoised)."""

    def __init__(self, program, rep: Segment, tables, doms: dict, memory: dict, ctx, time_limit: float):
        self.program, self.rep, self.tables, self.ctx = program, rep, tables, ctx
        self.memory = memory
        options = stream_options(program, tables, ctx, frozenset({rep.out}) - {None})
        self.model = ilp.build(tables, doms, memory, prices_of(program, ctx), options)
        self.highs = ilp.highs(self.model, time_limit)
        self.solves = 0
        self.seconds = 0.0
        self._memo: dict = {}
        self._best: dict = {}

    def _fixed(self, a, b) -> dict:
        fixed = {}
        if self.rep.inp is not None:
            fixed[self.rep.inp] = a
        if self.rep.out is not None:
            fixed[self.rep.out] = b
        return fixed

    def point(self, a, b, objective="time", weight=0.0, budget=None):
        """The block's optimum between ``a`` and ``b`` (``objective``, ``weight`` and ``budget``
        — bytes of the block's own tensors — as in ``ilp.solve``), or None when no plan exists
        between them."""
        key = (a, b, objective, weight, budget)
        if key not in self._memo:
            sol = ilp.solve(self.highs, self.model, self._fixed(a, b), budget, objective, weight)
            self.solves += 1
            self._memo[key] = None if sol is None else self.at(sol.assignment, sol.gap, sol.streams)
            if sol is not None:
                self.seconds += sol.seconds
        return self._memo[key]

    def at(self, assignment: dict, gap: float = 0.0, streams: tuple | None = None) -> Point:
        """The exact point of an assignment of the representative block's tensors with the
        stream options ``streams`` (None: the best ones for it, one solve of the block with
        every tensor fixed; KeyError when the assignment is outside the block's space)."""
        if streams is None:
            key = frozenset(assignment.items())
            if key not in self._best:
                sol = ilp.solve(self.highs, self.model, assignment)
                self.solves += 1
                self._best[key] = None if sol is None else sol.streams
            streams = self._best[key]
            if streams is None:
                raise KeyError("the assignment is outside the block's space")
        terms = evaluate(self.program, self.tables, assignment, self.ctx, streams)
        mem = sum(self.memory.get((t, s), 0) for t, s in assignment.items())
        return Point(_total(terms), mem, terms, assignment, gap, streams)

    def fastest(self, a, b):
        """A minimum-time point."""
        return self.point(a, b)

    def leanest(self, a, b):
        """A minimum-memory point."""
        return self.point(a, b, objective="memory")

    def hull(self, a, b) -> tuple:
        """The vertices of the lower convex hull of the block's (time, memory) points between
        ``a`` and ``b``, fastest first, each the minimum of time + λ·memory for some λ (the
        non-inferior set estimation: each edge's λ is tried until no point lies below an edge).
        The lean end is the fastest of the leanest: a price on memory above the whole time
        range per byte (memory is whole bytes)."""
        fast, lean = self.fastest(a, b), self.leanest(a, b)
        if fast is None:
            return ()
        if lean.memory >= fast.memory:
            return (fast,)
        if lean.seconds <= fast.seconds:
            return (lean,)
        big = 2.0 * (lean.seconds - fast.seconds) * ilp.US * ilp.KIB
        end = self.point(a, b, weight=big)
        lean = end if end.memory == lean.memory else lean
        found = []
        stack = [(fast, lean)]
        while stack:
            p, q = stack.pop()
            lam = (q.seconds - p.seconds) * ilp.US / ((p.memory - q.memory) / ilp.KIB)
            r = self.point(a, b, weight=lam)
            line = p.seconds * ilp.US + lam * p.memory / ilp.KIB
            val = r.seconds * ilp.US + lam * r.memory / ilp.KIB
            if val < line - 1e-9 * max(1.0, abs(line)) and q.memory < r.memory < p.memory:
                found.append(r)
                stack.extend([(p, r), (r, q)])
        return (fast,) + tuple(sorted(found, key=lambda x: -x.memory)) + (lean,)


def prices_of(program, ctx) -> ilp.Prices:
    """The shared terms' prices (``plan.space.priced_move`` / ``priced_reduction``) as seconds.
    ``prices_of(prog, ctx).move("x", src, dst)``"""
    tensors, cm = program.tensors, ctx.cost_model
    return ilp.Prices(lambda t, s, d: priced_move(s, d, tensors[t].dtype, t in ctx.grads, cm),
                      lambda t, d, u: priced_reduction(d, u, tensors[t].dtype, cm))


@dataclass(frozen=True)
class ChainResult:
    """The chain's optimum: ``assignment`` of every tensor, its exact ``terms``, ``memory``
    (bytes per device), ``gap`` (0 when proven optimal), ``fastest_memory`` (the memory of the
    fastest chain, budget ignored), and solver statistics."""

    assignment: dict
    terms: tuple
    memory: int
    gap: float
    solves: int
    solver_seconds: float
    kinds: int
    fastest_memory: int = 0
    streams: tuple = ()  # the stream options chosen, named as in the program (StreamOption.renamed)


def _shortest(options: list, key) -> list | None:
    """One option per block, consecutive boundaries agreeing, minimising the sum of ``key``
    (a pair, compared as a tuple); ``options[k]``: ``[(a, b, point)]``. Dynamic programming
    over the boundary shardings."""
    best = {None: ((0.0, 0.0), [])} if options else {}
    for opts in options:
        nxt: dict = {}
        for a, b, pt in opts:
            if a not in best:
                continue
            (u, v), path = best[a]
            k = key(pt)
            val = (u + k[0], v + k[1])
            if b not in nxt or val < nxt[b][0]:
                nxt[b] = (val, path + [(a, b, pt)])
        best = nxt
    return best[None][1] if None in best else None


def _least(options: list, lam: float):
    """The chain's least time + ``lam``·memory (``lam`` seconds per byte), ties to less memory:
    ``(value, memory, time)`` of that chain, or None when no chain exists."""
    best = {None: (0.0, 0, 0.0)} if options else {}
    for opts in options:
        nxt: dict = {}
        for a, b, p in opts:
            got = best.get(a)
            if got is None:
                continue
            v = (got[0] + p.seconds + lam * p.memory, got[1] + p.memory, got[2] + p.seconds)
            old = nxt.get(b)
            if old is None or v[:2] < old[:2]:
                nxt[b] = v
        best = nxt
    return best.get(None)


def _lagrangian(options: list, cap: int) -> tuple:
    """``(bound, λ, ub)``: the Lagrangian bound max over λ >= 0 of (the chain's least time +
    λ·memory) − λ·cap — no chain of these options within ``cap`` bytes is faster — the λ that
    gives it, and ``ub``, the time of the fastest chain within ``cap`` the bisection met
    (inf when none). Bisection on the subgradient (the argmin chain's memory)."""
    got = _least(options, 0.0)
    if got is None:
        return math.inf, 0.0, math.inf
    if got[1] <= cap:
        return got[2], 0.0, got[2]
    best, ub = (got[0], 0.0), math.inf
    lo, hi = 0.0, 1e-15
    while True:
        got = _least(options, hi)
        best = max(best, (got[0] - hi * cap, hi))
        if got[1] <= cap:
            ub = got[2]
            break
        if hi > 1e6:  # nothing fits
            return best[0], best[1], math.inf
        lo, hi = hi, hi * 4
    for _ in range(40):
        mid = (lo + hi) / 2
        got = _least(options, mid)
        best = max(best, (got[0] - mid * cap, mid))
        if got[1] > cap:
            lo = mid
        else:
            hi, ub = mid, min(ub, got[2])
    return best[0], best[1], ub


def _sweep(options: list, key, forward: bool = False) -> list:
    """``[{boundary: least sum of key(point)}]`` for positions k = 0..n: over the blocks before
    ``k`` (``forward``) or from ``k`` on (backward); a boundary no chain reaches is absent."""
    n = len(options)
    acc = [dict() for _ in range(n + 1)]
    acc[0 if forward else n][None] = 0
    for k in (range(n) if forward else range(n - 1, -1, -1)):
        src, dst = (acc[k], acc[k + 1]) if forward else (acc[k + 1], acc[k])
        for a, b, p in options[k]:
            frm, to = (a, b) if forward else (b, a)
            if frm in src:
                v = src[frm] + key(p)
                if v < dst.get(to, math.inf):
                    dst[to] = v
    return acc


def _pick(options: list, cap: int):
    """One point per block, boundaries agreeing, memory within ``cap`` bytes, least time (then
    least memory): ``(path, bound, λ)`` — the Lagrangian bound and its λ (:func:`_lagrangian`) — or
    None when no choice fits. Exact over ``options``: a dynamic program whose labels per boundary
    are the Pareto set of (memory, time) of the chains so far; a label is dropped when even its
    least completion cannot fit, or cannot be faster than a guess (its time + the least
    time + λ·memory of the rest − λ·(the memory left)). A guess just above the bound is tried
    first; when no chain meets it, a larger one, up to a known chain's time (which always
    survives)."""
    import numpy as np

    given = options
    ids: dict = {None: None}  # boundary shardings as small ints: cheap to hash and compare
    options = [[(ids.setdefault(a, len(ids)), ids.setdefault(b, len(ids)), p) for a, b, p in opts]
               for opts in given]
    lb, lam, ub = _lagrangian(options, cap)
    if ub == math.inf:
        return None
    n = len(options)
    sufm = _sweep(options, lambda p: p.memory)
    sufl = _sweep(options, lambda p: p.seconds + lam * p.memory)
    from_a = []
    for opts in options:
        by: dict = {}
        for j, (a, b, p) in enumerate(opts):
            by.setdefault(a, []).append((j, b, p))
        from_a.append(by)
    step = 1e-3
    while True:
        guess = min(ub, lb * (1 + step)) if lb > 0 else ub
        # rounding: the bound's terms are of the size of λ·cap (at a budget the leanest chain just fits,
        # its time + λ·(memory - cap) cancels to its time only up to that magnitude's last digits)
        limit = guess + 1e-9 * max(1.0, abs(guess), lam * cap)
        labels = {None: (np.zeros(1, dtype=np.int64), np.zeros(1))}  # boundary -> (memory, time)
        trail = []
        for k in range(n):
            parts: dict = {}
            rest_m, rest_l = sufm[k + 1], sufl[k + 1]
            for a, (mem, sec) in labels.items():
                for j, b, p in from_a[k].get(a, ()):
                    if b not in rest_m:
                        continue
                    hi = int(np.searchsorted(mem, cap - rest_m[b] - p.memory, side="right"))
                    if not hi:
                        continue
                    mm, tt = mem[:hi] + p.memory, sec[:hi] + p.seconds
                    idx = np.flatnonzero(tt + (rest_l[b] - lam * cap) + lam * mm <= limit)
                    if idx.size:
                        parts.setdefault(b, []).append((mm[idx], tt[idx], a, idx, j))
            labels, back = {}, {}
            for b, ps in parts.items():
                mm = np.concatenate([x[0] for x in ps])
                tt = np.concatenate([x[1] for x in ps])
                order = np.lexsort((tt, mm))  # by memory, then time; stable
                mm, tt = mm[order], tt[order]
                keep = tt < np.concatenate(([math.inf], np.minimum.accumulate(tt)[:-1]))  # Pareto
                src = np.concatenate([np.full(x[3].size, i) for i, x in enumerate(ps)])[order][keep]
                at = np.concatenate([x[3] for x in ps])[order][keep]
                labels[b] = (mm[keep], tt[keep])
                back[b] = ([(x[2], x[4]) for x in ps], src, at)
            trail.append(back)
        ends = labels.get(None)
        if ends is not None and ends[1][-1] <= limit:  # the last label is the fastest
            path, b, i = [], None, ends[1].size - 1
            for k in range(n - 1, -1, -1):
                froms, src, at = trail[k][b]
                a, j = froms[src[i]]
                path.append(given[k][j])
                b, i = a, int(at[i])
            return path[::-1], lb, lam
        if guess >= ub:  # pragma: no cover - the chain of time ub always survives the pruning
            raise ilp.SolverError("chain: no chain met the time of a known one (please report it)")
        step *= 4


def _useful(segs, fast: list, lean: list, cap: int, ub: float) -> set:
    """``{(kind, a, b)}`` worth a hull: some block of that kind between ``a`` and ``b`` can be
    part of a chain within ``cap`` bytes faster than ``ub`` (bounds from the fastest and the
    leanest chains before and after it). A chain through any other pair is slower than ``ub``,
    which a known chain (the leanest) achieves, or does not fit."""
    n = len(fast)
    pre_t, suf_t = _sweep(fast, lambda p: p.seconds, True), _sweep(fast, lambda p: p.seconds)
    pre_m, suf_m = _sweep(lean, lambda p: p.memory, True), _sweep(lean, lambda p: p.memory)
    keep = set()
    for k in range(n):
        times = {(a, b): p.seconds for a, b, p in fast[k]}
        for a, b, p in lean[k]:
            t = pre_t[k].get(a, math.inf) + times.get((a, b), math.inf) + suf_t[k + 1].get(b, math.inf)
            m = pre_m[k].get(a, math.inf) + p.memory + suf_m[k + 1].get(b, math.inf)
            if m <= cap and t <= ub * (1 + 1e-12):
                keep.add((segs[k].key, a, b))
    return keep


def solve_chain(program, segs, doms: dict, base_ctx, budget: int | None, time_limit: float, table, seeds=(),
                built: dict | None = None):
    """The optimum over the chain ``segs`` (module docstring): ``(ChainResult, None)``, or
    ``(None, smallest budget)`` when nothing fits ``budget``. ``table(i, doms, ctx)`` builds op
    ``i``'s table (memoised by the caller); ``seeds`` (``(label, Plan)``) add their own blocks'
    points to the choices under a budget. ``built``: the blocks of an earlier call over the same
    ``doms`` (filled here; a second call, with a budget, re-solves none of the first's points).

    Shared tensors (the RoPE tables): first every block may choose their shardings freely — a
    relaxation of every tuple. When its fastest chain agrees on them (and fits) it is the
    answer. Otherwise the tuple most blocks chose is solved, and it is the answer when it is as
    fast as the relaxation (no budget) or, under a budget, with the gap to the relaxation's
    Lagrangian bound (which holds for every tuple). Failing that, every tuple is solved."""
    shared = shared_inputs(program, [(s.lo, s.hi) for s in segs])
    ctx = replace(base_ctx, shared=shared)
    groups = kinds(segs)
    stats = [0, 0.0]
    built = {} if built is None else built
    if shared:
        free = _attempt(program, segs, groups, doms, ctx, None, None, time_limit, table, seeds, stats, built)
        if free.result is not None and (budget is None or free.fastest[1] <= budget):
            return _finish(free, stats)
        if free.hint is not None:
            got = _attempt(program, segs, groups, doms, ctx, free.hint, budget, time_limit, table, seeds, stats, built)
            res = got.result
            if res is not None and budget is None and _total(res.terms) <= free.bound:
                return _finish(got, stats)
            if res is not None and budget is not None and got.lam is not None:
                lb = free.relaxed(got.lam, budget)
                ub = _total(res.terms)
                gap = max(res.gap, 0.0 if ub <= 0 else max(0.0, (ub - lb) / ub))
                return _finish(replace(got, result=replace(res, gap=0.0 if gap < 1e-9 else gap)), stats)
    best, smallest, fastest = None, None, None
    for choice in shared_choices(shared, doms):
        got = _attempt(program, segs, groups, doms, ctx, choice, budget, time_limit, table, seeds, stats, built)
        if got.fastest is not None and (fastest is None or got.fastest < fastest):
            fastest = got.fastest
        if got.smallest is not None:
            smallest = got.smallest if smallest is None else min(smallest, got.smallest)
        res = got.result
        if res is not None and (best is None or (_total(res.terms), res.memory) < (_total(best.terms), best.memory)):
            best = res
    return _finish(Attempt(best, smallest, fastest), stats)


@dataclass(frozen=True)
class Attempt:
    """One solve of the chain: the ``result`` (None when nothing fits, or, with the shared
    tensors free, when the blocks disagree on them), the ``smallest`` budget that fits when
    nothing did, the ``fastest`` chain's (time, memory); with the shared tensors free, its time
    as a ``bound``, the tuple to try (``hint``: the one most blocks chose) and ``relaxed(λ,
    budget)``: a Lagrangian lower bound for every tuple; under a budget, the ``lam`` of the bound."""

    result: ChainResult | None
    smallest: int | None
    fastest: tuple | None
    bound: float | None = None
    hint: dict | None = None
    relaxed: object = None
    lam: float | None = None


def _finish(got: Attempt, stats) -> tuple:
    if got.result is None:
        return None, got.smallest
    return replace(got.result, solves=stats[0], solver_seconds=stats[1], fastest_memory=got.fastest[1]), None


def _attempt(program, segs, groups, doms, ctx, choice, budget, time_limit, table, seeds, stats, built) -> Attempt:
    """The chain with the shared tensors fixed to ``choice`` — or, ``choice`` None, free in every
    block, with no budget (see :func:`solve_chain`); ``built``: blocks by (kind, choice), reused."""
    weights = memory_weights(program, ctx.training)
    local = dict(doms) if choice is None else {**doms, **{t: (s,) for t, s in choice.items()}}
    fixed = None if choice is None else tuple(sorted(choice.items(), key=lambda kv: kv[0]))
    blocks = {}
    for key, same in groups.items():
        if (key, fixed, ctx) not in built:
            built[(key, fixed, ctx)] = _block(program, same, local, ctx, time_limit, table)
        blocks[key] = built[(key, fixed, ctx)]
    before = {key: (b.solves, b.seconds) for key, b in blocks.items()}  # a reused block's earlier solves

    def options(pick):
        return [[(a, b, pt) for a in (local[s.inp] if s.inp is not None else (None,))
                 for b in (local[s.out] if s.out is not None else (None,)) for pt in pick(blocks[s.key], a, b)]
                for s in segs]

    def shared_memory(ch):
        return sum(weights.get(t, 0) * local_bytes(v, program.tensors[t].dtype) for t, v in ch.items())

    def done(path, gap, fastest, smallest=None, **more):
        stats[0] += sum(b.solves - before[k][0] for k, b in blocks.items())
        stats[1] += sum(b.seconds - before[k][1] for k, b in blocks.items())
        res = None
        ch = choice if choice is not None else (_agreed(path, ctx.shared) if path is not None else None)
        if path is not None and ch is not None:
            res = _assemble(segs, blocks, path, ch, shared_memory(ch), gap, len(groups))
        return Attempt(res, smallest, fastest, **more)

    fast = _shortest(options(lambda blk, a, b: [p for p in [blk.fastest(a, b)] if p]),
                     lambda p: (p.seconds, p.memory))
    if fast is None:
        return done(None, 0.0, None)
    if choice is None:  # the relaxation
        least = {t: min(doms[t], key=lambda v, t=t: shared_memory({t: v})) for t in ctx.shared}

        def relaxed(lam, budget):
            w = lam * ilp.US * ilp.KIB  # seconds per byte -> µs per KiB
            path = _shortest(options(lambda blk, a, b: [p for p in [blk.point(a, b, weight=w)] if p]),
                             lambda p: (p.seconds + lam * p.memory, p.memory))
            return sum(p.seconds + lam * p.memory for _, _, p in path) - lam * (budget - shared_memory(least))

        agreed = _agreed(fast, ctx.shared)
        fkey = None if agreed is None else (_total(_sum_terms(fast)),
                                            shared_memory(agreed) + sum(p.memory for _, _, p in fast))
        return done(fast, 0.0, fkey, bound=_total(_sum_terms(fast)), hint=agreed or _majority(fast, ctx),
                    relaxed=relaxed)
    mem = shared_memory(choice)
    fkey = (_total(_sum_terms(fast)), mem + sum(p.memory for _, _, p in fast))
    if budget is None or fkey[1] <= budget:
        return done(fast, 0.0, fkey)
    lean = _shortest(options(lambda blk, a, b: [p for p in [blk.leanest(a, b)] if p]),
                     lambda p: (p.memory, p.seconds))
    low = mem + sum(p.memory for _, _, p in lean)
    if low > budget:
        return done(None, 0.0, fkey, low)
    cap = budget - mem
    ends = options(lambda blk, a, b: [p for p in (blk.fastest(a, b), blk.leanest(a, b)) if p])
    extra = _seed_points(segs, blocks, choice, seeds)
    first, _, _ = _pick([e + x for e, x in zip(ends, extra)], cap)  # feasible: the leanest fits
    keep = _useful(segs, options(lambda blk, a, b: [p for p in [blk.fastest(a, b)] if p]),
                   options(lambda blk, a, b: [p for p in [blk.leanest(a, b)] if p]),
                   cap, sum(p.seconds for _, _, p in first))
    hulls = options(lambda blk, a, b: blk.hull(a, b) if (blk.rep.key, a, b) in keep else ())
    opts = [h + x + e for h, x, e in zip(hulls, extra, ends)]
    path, lb, lam = _pick(opts, cap)
    for _ in range(_POLISH_ROUNDS):
        more = _fill(segs, blocks, path, cap)
        if not more:
            break
        opts = [o + more.get(k, []) for k, o in enumerate(opts)]
        path, _, _ = _pick(opts, cap)
    ub = sum(p.seconds for _, _, p in path)
    gap = 0.0 if ub <= 0 else max(0.0, (ub - lb) / ub)
    return done(path, 0.0 if gap < 1e-9 else gap, fkey, lam=lam)


_POLISH_ROUNDS = 1  # a second round found nothing more on the bench cases


def _fill(segs, blocks, path, cap) -> dict:
    """Points off the hulls that can use the memory ``path`` leaves free: per kind, boundary
    pair and point on the path, the block's fastest plan within that point's memory plus the
    slack (``cap`` minus the path's memory) — one budgeted solve each. ``{position: [(a, b,
    point)]}`` for every block of that kind between those boundaries, when faster."""
    slack = cap - sum(p.memory for _, _, p in path)
    if slack <= 0:
        return {}
    found: dict = {}
    for s, (a, b, p) in zip(segs, path):
        key = (s.key, a, b, p.memory)
        if key not in found:
            r = blocks[s.key].point(a, b, budget=p.memory + slack)
            found[key] = r if r is not None and r.seconds < p.seconds else None
    out: dict = {}
    for (kind, a, b, _), r in found.items():
        if r is None:
            continue
        for k, s in enumerate(segs):
            if s.key == kind and (s.inp is None) == (a is None) and (s.out is None) == (b is None):
                out.setdefault(k, []).append((a, b, r))
    return out


def _majority(path, ctx) -> dict:
    """Per shared tensor, the sharding most blocks of ``path`` chose (ties: the first)."""
    votes: dict = {}
    for _, _, p in path:
        for t in ctx.shared:
            if t in p.assignment:
                votes.setdefault(t, []).append(p.assignment[t])
    return {t: max(dict.fromkeys(vs), key=vs.count) for t, vs in votes.items()}


def _sum_terms(path) -> tuple:
    return tuple(sum((p.terms[k] for _, _, p in path), ()) for k in range(4))


def _agreed(path, shared) -> dict | None:
    """The shardings the blocks of ``path`` give the shared tensors, when they all agree."""
    out: dict = {}
    for _, _, p in path:
        for t in shared:
            if t in p.assignment:
                if out.setdefault(t, p.assignment[t]) != p.assignment[t]:
                    return None
    return out


def _total(terms) -> float:
    return math.fsum(sum(terms, ()))


def _block(program, same, local, ctx, time_limit, table) -> Block:
    rep = same[0]
    here = dict(local)
    if rep.inp is not None:  # every in-boundary sharding any block of this kind may receive
        here[rep.inp] = tuple(sorted({v for s in same for v in local[s.inp]}, key=_order))
    tabs = tuple(table(i, here, ctx) for i in range(rep.lo, rep.hi))
    sub = {t: here[t] for tb in tabs for t in tb.tensors}
    return Block(program, rep, tabs, sub, memory_of(program, sub, ctx.training, set(rep.slots)), ctx, time_limit)


def _seed_points(segs, blocks, choice, seeds) -> list:
    """Per block, the points the seed plans (built-in styles) take in it, when they agree with
    the shared choice and lie in the space."""
    out = []
    for s in segs:
        blk = blocks[s.key]
        rep = blk.rep
        rename = dict(zip(rep.slots, s.slots))
        if rep.inp is not None:
            rename[rep.inp] = s.inp
        pts = []
        for _, p in seeds:
            if any(p.shardings[t] != v for t, v in (choice or {}).items()):
                continue
            asg = {t: p.shardings[rename.get(t, t)] for t in blk.model.tensors}
            if any((t, v) not in blk.model.xcol for t, v in asg.items()):
                continue
            try:
                pt = blk.at(asg)
            except KeyError:  # a combination outside the space (a shared tensor moved)
                continue
            pts.append((asg.get(rep.inp) if rep.inp is not None else None,
                        asg.get(rep.out) if rep.out is not None else None, pt))
        out.append(pts)
    return out


def _assemble(segs, blocks, path, choice, shared_mem, gap, nkinds) -> ChainResult:
    assignment = dict(choice)
    terms, streams = ((), (), (), ()), []
    for seg, (_, _, pt) in zip(segs, path):
        blk = blocks[seg.key]
        rep = blk.rep
        rename = dict(zip(rep.slots, seg.slots))
        assignment.update({rename[t]: v for t, v in pt.assignment.items() if t in rename})
        terms = tuple(x + y for x, y in zip(terms, pt.terms))
        if rep.inp is not None:
            rename[rep.inp] = seg.inp
        streams.extend(v.renamed(rename, seg.lo - rep.lo, blk.program) for v in pt.streams)
    mem = shared_mem + sum(p.memory for _, _, p in path)
    gap = max([gap] + [p.gap for _, _, p in path])
    return ChainResult(assignment, terms, mem, gap, 0, 0.0, nkinds, streams=tuple(streams))


__all__ = ["Block", "ChainResult", "Point", "Segment", "block_key", "cuts", "kinds", "prices_of", "segments",
           "shared_choices", "shared_inputs", "slot_groups", "solve_chain"]
