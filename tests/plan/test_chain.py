"""The chain's joining step: the dynamic program over boundary shardings that picks one point per
block under a memory budget is exact (checked against every path), its Lagrangian bound is a lower
bound, and the block solver's LP-first run gives the branch and bound's optimum."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlayout import Mesh
from shardlayout.plan import ilp
from shardlayout.plan.chain import Point, _lagrangian, _pick, prices_of, segments, shared_inputs, slot_groups
from shardlayout.plan.space import Context, domains, memory_of, op_table, seed_plans, unify
from shardlayout.program.models import llama

STATES = ("r", "s0", "s1")


@st.composite
def chains(draw):
    """A chain of 1-5 blocks; each block a few (in, out, point) options over a small set of
    boundary states (None at both ends); a budget somewhere in the range of the memories."""
    n = draw(st.integers(1, 5))
    options = []
    for k in range(n):
        ins = (None,) if k == 0 else STATES
        outs = (None,) if k == n - 1 else STATES
        opts = []
        for _ in range(draw(st.integers(1, 6))):
            a, b = draw(st.sampled_from(ins)), draw(st.sampled_from(outs))
            seconds = draw(st.integers(0, 40)) * 1e-6 + draw(st.sampled_from((0.0, 1e-7, 3e-7)))
            memory = draw(st.integers(0, 12)) * 1024
            opts.append((a, b, Point(seconds, memory, (), {})))
        options.append(opts)
    cap = draw(st.integers(0, 12 * 1024 * n))
    return options, cap


def _every_path(options, cap):
    """(time, memory) of the best chain by enumeration, or None."""
    best = None
    for path in itertools.product(*options):
        if path[0][0] is not None or path[-1][1] is not None:
            continue
        if any(x[1] != y[0] for x, y in zip(path, path[1:])):
            continue
        mem = sum(p.memory for _, _, p in path)
        if mem > cap:
            continue
        key = (sum(p.seconds for _, _, p in path), mem)
        best = key if best is None or key < best else best
    return best


@settings(max_examples=300, deadline=None)
@given(chains())
def test_Pick_EqualsTheBestOfEveryPath(case):
    options, cap = case
    want = _every_path(options, cap)
    got = _pick(options, cap)
    if want is None:
        assert got is None
        return
    path, bound, lam = got
    assert len(path) == len(options)
    assert path[0][0] is None and path[-1][1] is None
    assert all(x[1] == y[0] for x, y in zip(path, path[1:]))
    assert all(step in opts for step, opts in zip(path, options))
    mem = sum(p.memory for _, _, p in path)
    assert mem <= cap
    assert math.isclose(sum(p.seconds for _, _, p in path), want[0], rel_tol=1e-12, abs_tol=1e-18)
    assert bound <= want[0] * (1 + 1e-12) + 1e-18
    assert lam >= 0


@settings(max_examples=200, deadline=None)
@given(chains())
def test_Lagrangian_BoundIsBelowEveryFittingChain_AndItsChainFits(case):
    options, cap = case
    want = _every_path(options, cap)
    bound, lam, ub = _lagrangian(options, cap)
    if want is None:
        assert ub == math.inf
        return
    assert bound <= want[0] * (1 + 1e-12) + 1e-18
    assert ub >= want[0] * (1 - 1e-12) - 1e-18  # ub is the time of a chain that fits


def _block_model():
    """The ILP of the first layer's attention block of a 2-layer Llama on dp=2,tp=2 (the tables
    the chain solver builds)."""
    prog = llama(layers=2)
    mesh = Mesh.parse("dp=2,tp=2")
    segs = segments(prog)
    shared = shared_inputs(prog, [(s.lo, s.hi) for s in segs])
    ctx = Context.of(prog, mesh, shared=shared)
    doms = unify(domains(prog, seed_plans(prog, mesh, {})), slot_groups(segs))
    seg = segs[1]
    tables = tuple(op_table(prog, i, doms, ctx) for i in range(seg.lo, seg.hi))
    sub = {t: doms[t] for tb in tables for t in tb.tensors}
    return ilp.build(tables, sub, memory_of(prog, sub, ctx.training, set(seg.slots)), prices_of(prog, ctx))


def test_Solve_RelaxationFirst_GivesTheBranchAndBoundsOptimum(monkeypatch):
    """ilp.solve runs the LP relaxation first and keeps it when every tensor's column is whole;
    the optimum (time + weight·memory, and the budgeted time) equals branch and bound alone."""
    model = _block_model()
    least = ilp.solve(ilp.highs(model), model, objective="memory").memory
    cases = [dict(weight=w) for w in (0.0, 0.01, 0.3, 2.0, 50.0)] + [dict(objective="memory")] + \
        [dict(budget=int(least * f)) for f in (1.0, 1.2, 1.6)]

    def run(relax):
        monkeypatch.setattr(ilp, "_RELAX", [relax])
        h = ilp.highs(model)
        out = []
        for kw in cases:
            sol = ilp.solve(h, model, **kw)
            w = kw.get("weight", 0.0)
            out.append(None if sol is None else
                       sol.objective * (ilp.US if kw.get("objective", "time") == "time" else 1.0)
                       + w * sol.memory / ilp.KIB)
        return out

    bnb, lp_first = run(False), run(True)
    assert None not in bnb
    for a, b in zip(bnb, lp_first):
        assert math.isclose(a, b, rel_tol=1e-7, abs_tol=1e-9)


def test_Fill_UsesTheMemoryTheHullPointsLeave(monkeypatch):
    """Under a binding budget the hull points alone leave memory unused; re-solving the path's
    blocks within their memory plus that slack (``_fill``) finds a faster plan that still fits,
    never faster than the full ILP's optimum. (1-layer Llama on dp=2,tp=4 at twice the leanest
    style's memory: the hull-only chain is 2.7% slower than the optimum there.)"""
    from shardlayout.plan import chain
    from shardlayout.plan.auto import auto_plan

    prog, mesh = llama(layers=1), Mesh.parse("dp=2,tp=4")
    free = auto_plan(prog, mesh)
    budget = 2 * min(s.estimate.memory for s in free.styles if s.estimate is not None)
    monkeypatch.setattr(chain, "_POLISH_ROUNDS", 0)
    hull_only = auto_plan(prog, mesh, memory_per_device=budget, method="chain")
    monkeypatch.setattr(chain, "_POLISH_ROUNDS", 1)
    filled = auto_plan(prog, mesh, memory_per_device=budget, method="chain")
    full = auto_plan(prog, mesh, memory_per_device=budget, method="full")
    assert filled.estimate.memory <= budget
    assert filled.estimate.seconds < hull_only.estimate.seconds
    assert full.gap == 0 and full.estimate.seconds <= filled.estimate.seconds * (1 + 1e-12)
    assert filled.estimate.seconds * (1 - filled.gap) <= full.estimate.seconds * (1 + 1e-12)


def test_a_budget_equal_to_the_smallest_that_fits_is_solved():
    """At the least budget any plan fits, the leanest chain's time + λ·(memory - cap) cancels to its
    time only up to the rounding of λ·cap (about 1e10 bytes here): the pruning must keep it (it raised
    'no chain met the time of a known one' at Llama-3-8B's width on dp=8,tp=8)."""
    from shardlayout.plan.auto import NoPlanFits, auto_plan

    prog = llama(layers=32, dim=4096, heads=32, ffn=14336, batch=8, seq=4096)
    mesh = Mesh.parse("dp=8,tp=8")
    with pytest.raises(NoPlanFits) as e:
        auto_plan(prog, mesh, memory_per_device=1, training="adam")
    a = auto_plan(prog, mesh, memory_per_device=e.value.smallest, training="adam")
    assert a.estimate.memory <= e.value.smallest and a.estimate.seconds == a.predicted


def test_a_budgeted_chain_reuses_the_unbudgeted_calls_blocks_and_gets_the_same_plan():
    """``solve_chain(..., built=)``: the budgeted call after the unbudgeted one (what auto does
    when the budget binds) re-solves none of the first call's block points — its solve count is
    what it adds — and its plan equals a call on fresh blocks."""
    from shardlayout.plan.auto import _tables
    from shardlayout.plan.chain import solve_chain

    prog, mesh = llama(layers=3), Mesh.parse("dp=2,tp=4")
    segs = segments(prog)
    doms = unify(domains(prog, seed_plans(prog, mesh, {})), slot_groups(segs))
    ctx = Context.of(prog, mesh)
    free, _ = solve_chain(prog, segs, doms, ctx, None, 60.0, _tables(prog))
    budget = int(free.memory * 0.8)
    fresh, _ = solve_chain(prog, segs, doms, ctx, budget, 60.0, _tables(prog))
    built: dict = {}
    first, _ = solve_chain(prog, segs, doms, ctx, None, 60.0, _tables(prog), built=built)
    again, _ = solve_chain(prog, segs, doms, ctx, budget, 60.0, _tables(prog), built=built)
    assert fresh is not None and fresh.memory <= budget < free.memory
    assert (again.assignment, again.terms, again.memory, again.gap) == \
        (fresh.assignment, fresh.terms, fresh.memory, fresh.gap)
    assert first.solves == free.solves and again.solves < fresh.solves
