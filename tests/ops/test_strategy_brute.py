"""The strategy search against brute force: for small mm and mul calls (and add, sub, neg, exp,
bmm, matmul, einsum, addmm, linear, sum, mean, amax, softmax, log_softmax), every (input targets,
output) triple that computes the right value (by simulation on every rank, partial sums split at
random) is priced as the search prices it (``price``: the collectives plan_move emits), and the
search's choice must cost no more than that minimum. This is what catches a missing candidate,
e.g. A @ B with both operands partial on one axis, where reducing one and keeping the other
partial (one all-reduce) beats reducing both."""

from __future__ import annotations

import itertools
import random
from functools import cache

import numpy as np
import pytest

from shardlayout import Mesh, Sharding, propagate
from shardlayout.execute import run_moves
from shardlayout.ops.strategy import price
from shardlayout.sharding import Factor
from shardlayout.sharding.cost import DEFAULT_COST_MODEL
from shardlayout.sharding.move import plan_move

from .checks import random_pieces

OPS = {"mm": np.matmul, "mul": np.multiply}
SHAPE = (4, 4)


def all_shardings(mesh: Mesh, shape: tuple) -> list:
    """Every sharding of ``shape``: per mesh axis replicate, shard a dim (axes on one dim in every
    order) or hold a partial sum."""
    out = set()
    for use in itertools.product(["R", "P"] + list(range(len(shape))), repeat=mesh.ndim):
        on = {d: [a for a, u in zip(mesh.names, use) if u == d] for d in range(len(shape))}
        partial = tuple((a, "sum") for a, u in zip(mesh.names, use) if u == "P")
        for orders in itertools.product(*(itertools.permutations(on[d]) for d in range(len(shape)))):
            dims = []
            for d, order in enumerate(orders):
                n = shape[d]
                fs = [Factor(mesh.axis_size(a), a) for a in order]
                rest = n // int(np.prod([f.size for f in fs])) if fs else n
                dims.append(fs + [Factor(rest)])
            out.add(Sharding(mesh, shape, dims, partial))
    return sorted(out, key=str)


def _valid(fn, shapes: list, mesh_text: str, runs=None) -> tuple:
    """``(input targets, output)`` pairs whose local op ``fn`` on every rank gives the right value
    (inputs drawn from one seeded stream, partial sums split at random); ``runs(pieces, rank)``:
    whether the local op can run on those pieces (else a ValueError from ``fn`` says so)."""
    mesh = Mesh.parse(mesh_text)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(shape) for shape in shapes]
    want = fn(*xs)
    outs = all_shardings(mesh, want.shape)
    found = []
    for targets in itertools.product(*(all_shardings(mesh, shape) for shape in shapes)):
        pieces = [random_pieces(t, x, rng) for t, x in zip(targets, xs)]
        if runs is not None and not all(runs([p[r] for p in pieces]) for r in mesh.ranks()):
            continue  # the local op cannot run on these pieces
        try:
            local = {r: fn(*[p[r] for p in pieces]) for r in mesh.ranks()}
        except ValueError:  # the local op cannot run on these pieces
            continue
        if any(v.shape != local[0].shape for v in local.values()):
            continue
        for o in outs:
            if o.local_shape(0) != local[0].shape:
                continue
            try:
                got = o.unshard(local, tolerance=1e-9)
            except Exception:  # replicas disagree: not this output
                continue
            if np.allclose(got, want, atol=1e-9):
                found.append((targets, o))
    return tuple(found)


def _fits(op: str):
    """mm needs the contracted extents equal, mul equal shapes (no broadcasting of a piece)."""
    if op == "mm":
        return lambda p: p[0].shape[1] == p[1].shape[0]
    return lambda p: p[0].shape == p[1].shape


@cache
def valid_triples(op: str, mesh_text: str) -> tuple:
    """``(target A, target B, output)`` triples whose local op on every rank gives the right value."""
    return tuple((ta, tb, o) for (ta, tb), o in _valid(OPS[op], [SHAPE, SHAPE], mesh_text, _fits(op)))


def brute_minimum(op: str, mesh_text: str, a: Sharding, b: Sharding) -> float:
    return min(price([a, b], (ta, tb), (o,), (None,), DEFAULT_COST_MODEL) for ta, tb, o in valid_triples(op, mesh_text))


CASES = []
for mesh_text in ("tp=2", "dp=2,tp=2"):
    shs = all_shardings(Mesh.parse(mesh_text), SHAPE)
    rng = random.Random(mesh_text)
    pairs = list(itertools.product(shs, shs))
    picked = rng.sample(pairs, min(len(pairs), 40))
    # every pair with both operands partial on one axis: the case the search used to miss
    picked += [(a, b) for a, b in pairs if set(a.partial) & set(b.partial)][:10]
    CASES += [(op, mesh_text, a, b) for op in OPS for a, b in dict.fromkeys(picked)]


@pytest.mark.parametrize("op,mesh_text,a,b", CASES, ids=[f"{o}-{m}-{a}-{b}" for o, m, a, b in CASES])
def test_the_search_finds_the_brute_force_minimum(op, mesh_text, a, b):
    p = propagate(op, [a, b])
    best = brute_minimum(op, mesh_text, a, b)
    # at most the minimum (it may be below: the search also tries strided structures such as [2*tp, 4],
    # which the brute force does not list; what it chose is checked to compute the value below)
    assert p.cost <= best * (1 + 1e-9), (f"{op}({a}, {b}) on {mesh_text}: chose {[str(t) for t in p.input_targets]} -> "
                                         f"{p.outputs[0]} at {p.cost:.3e} s; the minimum is {best:.3e} s")
    rng = np.random.default_rng(1)  # and what it chose computes the value
    x, y = rng.standard_normal(SHAPE), rng.standard_normal(SHAPE)
    pieces = [run_moves(plan_move(s, t), s.shard(v)) for s, t, v in zip(p.inputs, p.input_targets, (x, y))]
    mesh = p.outputs[0].mesh
    got = p.outputs[0].unshard({r: OPS[op](pieces[0][r], pieces[1][r]) for r in mesh.ranks()}, tolerance=1e-9)
    assert np.allclose(got, OPS[op](x, y))


def test_both_partial_operands_of_a_product_pay_one_all_reduce():
    m = Mesh.parse("tp=4")
    a = b = Sharding.parse("[64, 64] +sum(tp)", m)
    p = propagate("mm", [a, b])
    assert [c.kind.value for c in p.collectives] == ["all_reduce"] and str(p.outputs[0]) == "[64, 64] +sum(tp)"


# -- more ops: every (input targets, output) that computes the value, priced; the search's choice
# costs no more than the cheapest

MORE = {  # op: (numpy, input shapes, params, meshes, cases per mesh)
    "add": (np.add, [(4, 4), (4, 4)], {}, ("dp=2,tp=2",), 16),
    "bmm": (np.matmul, [(4, 4, 4), (4, 4, 4)], {}, ("tp=2", "dp=2,tp=2"), 12),
    "addmm": (lambda b, x, y: b + x @ y, [(4,), (4, 4), (4, 4)], {}, ("tp=2",), 16),
    "sum": (lambda x: x.sum(axis=1), [(4, 4)], {"dim": [1]}, ("dp=2,tp=2",), 12),
    "softmax": (lambda x: np.exp(x) / np.exp(x).sum(axis=1, keepdims=True), [(4, 4)], {"dim": 1}, ("dp=2,tp=2",),
                12),
    "sub": (np.subtract, [(4, 4), (4, 4)], {}, ("dp=2,tp=2",), 12),
    "neg": (np.negative, [(4, 4)], {}, ("dp=2,tp=2",), 8),  # linear: a partial sum stays one
    "exp": (np.exp, [(4, 4)], {}, ("dp=2,tp=2",), 8),
    "mean": (lambda x: x.mean(axis=1), [(4, 4)], {"dim": [1]}, ("dp=2,tp=2",), 8),
    "amax": (lambda x: x.max(axis=1), [(4, 4)], {"dim": [1]}, ("dp=2,tp=2",), 8),
    "log_softmax": (lambda x: x - x.max(1, keepdims=True) - np.log(np.exp(x - x.max(1, keepdims=True)).sum(
        1, keepdims=True)), [(4, 4)], {"dim": 1}, ("dp=2,tp=2",), 8),
    "linear": (lambda x, w, b: x @ w.T + b, [(4, 4), (4, 4), (4,)], {}, ("tp=2",), 12),
    "matmul": (np.matmul, [(4, 4), (4, 4)], {}, ("dp=2,tp=2",), 12),
    "einsum": (lambda a, b: np.einsum("bij,bkj->bik", a, b), [(4, 4, 4), (4, 4, 4)], {"equation": "bij,bkj->bik"},
               ("tp=2",), 12),
}


@cache
def valid_targets(op: str, mesh_text: str) -> tuple:
    """``(input targets, output)`` pairs whose local op on every rank gives the right value."""
    fn, shapes, _, _, _ = MORE[op]
    return _valid(fn, shapes, mesh_text)


MORE_CASES = []
for _op, (_fn, _shapes, _params, _meshes, _n) in MORE.items():
    for _mesh_text in _meshes:
        _combos = list(itertools.product(*(all_shardings(Mesh.parse(_mesh_text), s) for s in _shapes)))
        _picked = random.Random(_op + _mesh_text).sample(_combos, min(_n, len(_combos)))
        MORE_CASES += [(_op, _mesh_text, c) for c in _picked]


@pytest.mark.parametrize("op,mesh_text,inputs", MORE_CASES,
                         ids=[f"{o}-{m}-{'-'.join(map(str, c))}" for o, m, c in MORE_CASES])
def test_more_ops_find_the_brute_force_minimum(op, mesh_text, inputs):
    fn, shapes, params, _, _ = MORE[op]
    p = propagate(op, list(inputs), **params)
    best = min(price(list(inputs), targets, (o,), (None,), DEFAULT_COST_MODEL)
               for targets, o in valid_targets(op, mesh_text))
    assert p.cost <= best * (1 + 1e-9), (f"{op}({', '.join(map(str, inputs))}) on {mesh_text}: chose "
                                         f"{[str(t) for t in p.input_targets]} -> {p.outputs[0]} at {p.cost:.3e} s; "
                                         f"the minimum is {best:.3e} s")
    rng = np.random.default_rng(1)  # and what it chose computes the value
    xs = [rng.standard_normal(shape) for shape in shapes]
    pieces = [run_moves(plan_move(s, t), s.shard(v)) for s, t, v in zip(p.inputs, p.input_targets, xs)]
    mesh = p.outputs[0].mesh
    got = p.outputs[0].unshard({r: fn(*[pc[r] for pc in pieces]) for r in mesh.ranks()}, tolerance=1e-9)
    assert np.allclose(got, fn(*xs))
