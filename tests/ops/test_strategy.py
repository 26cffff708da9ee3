"""Op rules checked by simulation, and the strategy search checked against an independent
pricer: the chosen strategy is never costlier than any DTensor-style alternative priced by the
collectives ``plan_move`` emits for it, and every reported price equals DTensor's formulas."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlayout import Mesh, Sharding, ShardingError, UnsupportedOp, propagate
from shardlayout.execute import run_moves
from shardlayout.ops.strategy import choose
from shardlayout.sharding.cost import DEFAULT_COST_MODEL
from shardlayout.sharding.move import plan_move

from .pricing import placement_alternatives, price_collectives

RNG = random.Random(11)


def rand_sharding(rng, mesh, shape, allow_partial=True):
    pl = []
    for _ in range(mesh.ndim):
        k = rng.random()
        if k < 0.3:
            pl.append("R")
        elif k < 0.8:
            pl.append(f"S({rng.randrange(len(shape))})")
        elif k < 0.9:
            pl.append(f"SS({rng.randrange(len(shape))},2)")
        else:
            pl.append("P(sum)" if allow_partial else "R")
    return Sharding.from_placements(mesh, shape, pl)


def rand_mesh(rng, max_dims=3):
    nd = rng.randint(1, max_dims)
    return Mesh(tuple(rng.choice([2, 2, 3, 4]) for _ in range(nd)), ("a", "b", "c", "d")[:nd])


def simulate_op(p, arrays, global_fn, local_fn=None):
    """Run ``local_fn`` on every rank's input-target pieces (after running the planned
    redistributions on the input pieces) and compare the unsharded output with ``global_fn``."""
    local_fn = local_fn or global_fn
    pieces = []
    for s, t, x in zip(p.inputs, p.input_targets, arrays):
        pcs = s.shard(x)
        pcs = run_moves(plan_move(s, t), pcs)
        pieces.append(pcs)
    out = p.outputs[0]
    mesh = out.mesh
    local = {r: np.asarray(local_fn(*(pc[r] for pc in pieces))) for r in mesh.ranks()}
    got = out.unshard(local, tolerance=1e-9)
    want = global_fn(*arrays)
    assert got.shape == want.shape and np.allclose(got, want, atol=1e-9), (p.op, [str(s) for s in p.inputs],
                                                                            [str(o) for o in p.outputs])


SHAPES = [2, 3, 4, 6, 8]


@pytest.mark.parametrize("op,fn", [("add", np.add), ("mul", np.multiply), ("sub", np.subtract),
                                   ("div", np.divide), ("maximum", np.maximum)])
def test_pointwise_binary_with_broadcasting_by_simulation(op, fn):
    rng = random.Random(op)
    for _ in range(60):
        mesh = rand_mesh(rng)
        shape = tuple(rng.choice(SHAPES) for _ in range(rng.randint(1, 3)))
        bshape = shape[rng.randint(0, len(shape) - 1):]
        if rng.random() < 0.3:
            bshape = tuple(1 if rng.random() < 0.5 else n for n in bshape)
        a = rand_sharding(rng, mesh, shape)
        b = rand_sharding(rng, mesh, bshape, allow_partial=op in ("add", "sub", "mul"))
        x = np.random.default_rng(0).standard_normal(shape)
        y = np.random.default_rng(1).standard_normal(bshape) + (3.0 if op == "div" else 0.0)
        p = propagate(op, [a, b])
        simulate_op(p, [x, y], fn)


_UNIT = (lambda v: v / (1 + v))  # noqa: E731  (into (0, 1): asin, acos, atanh)
UNARY = [("neg", np.negative, None, 40), ("rsqrt", lambda v: 1 / np.sqrt(v), None, 40),
         ("silu", lambda v: v / (1 + np.exp(-v)), None, 40)] + [
    (op, fn, domain, 12) for op, fn, domain in [
        ("log1p", np.log1p, None), ("expm1", np.expm1, None), ("log2", np.log2, None), ("exp2", np.exp2, None),
        ("log10", np.log10, None), ("trunc", np.trunc, None), ("tan", np.tan, _UNIT), ("atan", np.arctan, None),
        ("asin", np.arcsin, _UNIT), ("acos", np.arccos, _UNIT), ("sinh", np.sinh, None), ("cosh", np.cosh, None),
        ("asinh", np.arcsinh, None), ("acosh", np.arccosh, lambda v: v + 1), ("atanh", np.arctanh, _UNIT),
        ("isnan", lambda v: np.isnan(v) * 1.0, None), ("isinf", lambda v: np.isinf(v) * 1.0, None)]]


@pytest.mark.parametrize("op,fn,domain,runs", UNARY, ids=[c[0] for c in UNARY])
def test_pointwise_unary_by_simulation(op, fn, domain, runs):
    """Unary pointwise ops (the ones real models emit too: log1p in xIELU, ...): a partial input
    reduced first unless the op is linear, checked on every rank against numpy."""
    rng = random.Random(op)
    for _ in range(runs):
        mesh = rand_mesh(rng)
        shape = tuple(rng.choice(SHAPES) for _ in range(rng.randint(1, 3)))
        a = rand_sharding(rng, mesh, shape)
        x = np.abs(np.random.default_rng(0).standard_normal(shape)) + 0.5
        simulate_op(propagate(op, [a]), [domain(x) if domain else x], fn)


def test_matmul_family_by_simulation():
    rng = random.Random(3)
    for _ in range(80):
        mesh = rand_mesh(rng)
        m, k, n, b = (rng.choice(SHAPES) for _ in range(4))
        kind = rng.choice(["mm", "bmm", "matmul", "einsum", "linear"])
        if kind == "mm" or kind == "einsum":
            sa, sb = (m, k), (k, n)
        elif kind == "linear":
            sa, sb = (b, m, k), (n, k)
        else:
            sa, sb = (b, m, k), (b, k, n)
        A, B = rand_sharding(rng, mesh, sa), rand_sharding(rng, mesh, sb)
        x = np.random.default_rng(0).standard_normal(sa)
        y = np.random.default_rng(1).standard_normal(sb)
        if kind == "einsum":
            p = propagate("einsum", [A, B], equation="mk,kn->mn")
            simulate_op(p, [x, y], lambda u, v: np.einsum("mk,kn->mn", u, v))
        elif kind == "linear":
            p = propagate("linear", [A, B])
            simulate_op(p, [x, y], lambda u, v: u @ v.T)
        else:
            simulate_op(propagate(kind, [A, B]), [x, y], np.matmul)


@pytest.mark.parametrize("op,fn", [("sum", np.sum), ("mean", np.mean), ("amax", np.max), ("amin", np.min)])
def test_reductions_by_simulation(op, fn):
    rng = random.Random(op)
    for _ in range(50):
        mesh = rand_mesh(rng)
        shape = tuple(rng.choice([2, 3, 4, 6, 8]) for _ in range(rng.randint(1, 3)))
        a = rand_sharding(rng, mesh, shape, allow_partial=op in ("sum", "mean"))
        dim = rng.randrange(len(shape))
        keep = rng.random() < 0.3
        x = np.random.default_rng(0).standard_normal(shape)
        p = propagate(op, [a], dim=dim, keepdim=keep)
        init = {"amax": -np.inf, "amin": np.inf}.get(op)
        local = None
        if init is not None:
            local = lambda v, d=dim, k=keep, i=init: fn(v, axis=d, keepdims=k, initial=i)  # noqa: E731
        # an empty uneven piece reduces to the op's identity, as a real kernel's fill does
        simulate_op(p, [x], lambda v, d=dim, k=keep: fn(v, axis=d, keepdims=k), local)


def test_softmax_never_shards_its_dim_and_simulates():
    rng = random.Random(5)

    def softmax(v, d):
        e = np.exp(v - v.max(axis=d, keepdims=True))
        return e / e.sum(axis=d, keepdims=True)

    for _ in range(40):
        mesh = rand_mesh(rng)
        shape = tuple(rng.choice(SHAPES) for _ in range(rng.randint(1, 3)))
        a = rand_sharding(rng, mesh, shape, allow_partial=False)
        d = rng.randrange(len(shape))
        p = propagate("_softmax", [a], dim=d)
        assert all(f.axis is None for f in p.outputs[0].dims[d])
        x = np.random.default_rng(0).standard_normal(shape)
        simulate_op(p, [x], lambda v, dd=d: softmax(v, dd))


def _rand_operand(rng, mesh, shape):
    """A random operand: placements (plain, strided, partial) or a random factor layout."""
    if rng.random() < 0.25:
        from shardlayout.sharding import Factor

        dims, free = [[] for _ in shape], list(mesh.names)
        rng.shuffle(free)
        for a in free[: rng.randint(0, len(free))]:
            d = rng.randrange(len(shape))
            n = mesh.axis_size(a)
            have = 1
            for f in dims[d]:
                have *= f.size
            if shape[d] % (have * n) == 0:
                dims[d].append(Factor(n, a))
        for d, fs in enumerate(dims):  # a local factor before the axes makes them strided
            have = 1
            for f in fs:
                have *= f.size
            if fs and shape[d] % (have * 2) == 0 and rng.random() < 0.5:
                fs.insert(0, Factor(2))
        return Sharding(mesh, shape, dims)
    return rand_sharding(rng, mesh, shape)


def test_search_is_the_minimum_over_dtensor_alternatives_priced_by_emitted_collectives():
    rng = random.Random(17)
    worst = 0.0
    for case in range(150):
        mesh = rand_mesh(rng, max_dims=3)
        kind = rng.choice(["mm", "add"])
        m, k, n = (rng.choice([3, 4, 6, 8, 12, 16]) for _ in range(3))
        if kind == "mm":
            shapes, letters = [(m, k), (k, n)], ["mk", "kn"]
        else:
            shapes, letters = [(m, n), (m, n)], ["mn", "mn"]
        ins = [_rand_operand(rng, mesh, sh) for sh in shapes]
        p = propagate(kind, ins)
        # what the plan reports is the independent price of the collectives it emits
        assert p.cost == pytest.approx(price_collectives(p.collectives), rel=1e-12, abs=1e-15)
        for c in p.candidates:
            assert c.cost == pytest.approx(price_collectives(c.collectives), rel=1e-12, abs=1e-15)
        emitted = [c for s, t in zip(p.inputs, p.input_targets) for c in plan_move(s, t) if c.kind.communicates]
        assert price_collectives(emitted) == pytest.approx(p.cost, rel=1e-12, abs=1e-15)
        # no DTensor-style alternative is cheaper when priced by what plan_move emits for it
        for combo, targets in placement_alternatives(mesh, letters, shapes, "mn", True):
            alt = price_collectives([c for s, t in zip(ins, targets) for c in plan_move(s, t)])
            assert p.cost <= alt * (1 + 1e-9) + 1e-15, (case, kind, [str(x) for x in ins], combo, p.cost, alt)
            worst = max(worst, p.cost - alt)
        # and the chosen strategy computes the right numbers
        if case % 5 == 0:
            x = np.random.default_rng(case).standard_normal(shapes[0])
            y = np.random.default_rng(case + 1).standard_normal(shapes[1])
            simulate_op(p, [x, y], np.matmul if kind == "mm" else np.add)
    assert worst <= 1e-15


def test_free_strategies_are_found_for_strided_operands():
    m = Mesh.parse("a=2,b=2")
    p = propagate("mm", [Sharding.parse("[8, b*4]", m), Sharding.parse("[2*a*2, 8]", m)])
    assert p.cost == 0 and not p.collectives, [str(t) for t in p.input_targets]
    assert [str(t) for t in p.input_targets] == ["[8, b*a*2]", "[b*a*2, 8]"]
    assert str(p.outputs[0]) == "[8, 8] +sum(a,b)"
    x, y = np.arange(64.0).reshape(8, 8), np.arange(64.0).reshape(8, 8) / 7
    simulate_op(p, [x, y], np.matmul)


def test_partial_plus_replicated_partitions_the_replicated_operand_for_free():
    m = Mesh.parse("dp=2,tp=4")
    P, R = Sharding.parse("[8, 12] +sum(tp)", m), Sharding.parse("[8, 12]", m)
    p = propagate("add", [P, R])  # DTensor's P + R -> P: R becomes a partial sum locally
    assert str(p.outputs[0]) == "[8, 12] +sum(tp)" and p.cost == 0
    x, y = np.arange(96.0).reshape(8, 12), np.ones((8, 12))
    simulate_op(p, [x, y], np.add)


def test_partial_rules():
    m = Mesh.parse("dp=2,tp=4")
    P = Sharding.parse("[8, 12] +sum(tp)", m)
    R = Sharding.parse("[8, 12]", m)
    assert propagate("add", [P, P]).outputs[0].partial == (("tp", "sum"),)  # linear: stays partial
    assert propagate("mul", [P, R]).outputs[0].partial == (("tp", "sum"),)
    assert propagate("mul", [P, 3.0]).outputs[0].partial == (("tp", "sum"),)  # scaling is linear
    shifted = propagate("add", [P, 1.0])  # a shift is not: the partial is reduced first
    assert not shifted.outputs[0].partial and shifted.needs_communication
    x = np.arange(96.0).reshape(8, 12)
    simulate_op(shifted, [x], lambda v: v + 1.0, lambda v: v + 1.0)
    assert not propagate("rsqrt", [P]).outputs[0].partial
    mm = propagate("mm", [Sharding.parse("[8, tp*3]", m), Sharding.parse("[tp*3, 6]", m)])
    assert str(mm.outputs[0]) == "[8, 6] +sum(tp)" and not mm.needs_communication
    with pytest.raises(ShardingError, match="depends on the values"):
        propagate("nonzero", [R])
    nz = propagate("nonzero", [Sharding.parse("[dp*4, tp*3]", m)], out_shape=(5, 2))
    assert str(nz.outputs[0]) == "[5, 2]" and [c.kind for c in nz.collectives] == ["all_gather"] * 2
    with pytest.raises(UnsupportedOp, match="no sharding rule"):
        propagate("frobnicate", [R])


def test_a_search_too_large_is_refused_at_once_naming_the_fix():
    """(letters + 2) ** axes grows fast: a 4-letter op on a 6-axis mesh is refused, not run for a minute."""
    from shardlayout.errors import SearchTooLarge
    from shardlayout.ops.strategy import MAX_AXIS_COMBINATIONS

    mesh = Mesh((2,) * 6, tuple("abcdef"))
    x = Sharding(mesh, (4, 4, 4, 4))
    with pytest.raises(SearchTooLarge, match="merge mesh axes") as e:
        propagate("neg", [x])
    assert str(MAX_AXIS_COMBINATIONS) in str(e.value) and "6 axes" in str(e.value)
    propagate("neg", [Sharding(Mesh((2,) * 4, tuple("abcd")), (4, 4, 4, 4))])  # 4 axes: searched


# ------------------------------------------------------------------------------------------
# the ordered search (bounds, early stop) against the exhaustive minimum
# ------------------------------------------------------------------------------------------

def _search_cases(rng):
    """(FactorMap, input shapes, retarget or None, number of pinned outputs) of random ops."""
    from shardlayout.ops.families import _bias_target
    from shardlayout.ops.strategy import MM, FactorMap

    m, k, n, b = (rng.choice([1, 2, 3, 4, 6, 8, 12]) for _ in range(4))
    return rng.choice([
        (MM, [(m, k), (k, n)], None),
        (FactorMap(("bmk", "bkn"), "bmn", linear="multi", broadcast=frozenset("b")), [(b, m, k), (b, k, n)], None),
        (FactorMap(("mn", "mn"), "mn", linear="sum", broadcast=frozenset("mn")), [(m, n), (m, n)], None),
        (FactorMap(("mn", "n"), "mn", linear="sum", broadcast=frozenset("mn")), [(m, n), (n,)], None),
        (FactorMap(("mn",), "m", linear="sum"), [(m, n)], None),
        (FactorMap(("mn",), "m", reduce="max", linear="max"), [(m, n)], None),
        (FactorMap(("mn",), "mn", whole=frozenset("n"), even=frozenset("m")), [(m, n)], None),
        (FactorMap(("n", "mk", "kn"), "mn", linear="multi"), [(n,), (m, k), (k, n)],
         lambda t, o: _bias_target(t, o[0], 0)),
    ])


@given(st.integers(0, 2**32 - 1), st.booleans())
@settings(max_examples=60, deadline=None)
def test_the_ordered_search_finds_the_exhaustive_minimum(seed, pinned):
    """``choose`` visits combinations by a lower bound of their tie-break and stops at the first
    free candidate that beats every remaining bound: the winner must be the least (seconds,
    tie-break, order) over every candidate the exhaustive enumeration builds, and the bound must
    never exceed a built candidate's tie-break (which would fall back to the full list)."""
    from shardlayout.ops.strategy import _all_candidates, _search, _Space, infer_out_shape

    rng = random.Random(seed)
    mesh = rand_mesh(rng, max_dims=3)
    fm, shapes, retarget = _search_cases(rng)
    ins = [_rand_operand(rng, mesh, sh) for sh in shapes]
    out_shape = infer_out_shape(fm, ins)
    pins = (_rand_operand(rng, mesh, out_shape),) if pinned else (None,)
    space = _Space(fm, ins, [out_shape], pins)
    fast = _search(space, pins, DEFAULT_COST_MODEL, "float32", retarget)
    assert fast is not None, "a tie-break bound exceeded a built candidate's tie-break"
    full = min(_all_candidates(space, pins, DEFAULT_COST_MODEL, "float32", retarget), key=lambda c: c[0])[1]
    got = (fast.choices, fast.input_targets, fast.outputs, fast.cost)
    want = (full.choices, full.input_targets, full.outputs, full.cost)
    assert got == want, ([str(x) for x in ins], str(pins[0]), fast.describe(), full.describe())
    # the candidates a user reads (explain) hold the winner, priced the same
    listed = choose(fm, ins, [out_shape], None, "float32", pins, retarget).candidates
    assert any(c.input_targets == fast.input_targets and c.outputs == fast.outputs and c.cost == fast.cost
               for c in listed)
