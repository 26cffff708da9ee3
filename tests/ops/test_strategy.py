"""Op rules checked by simulation, and the strategy search proven exact by brute force."""

from __future__ import annotations

import random

import numpy as np
import pytest

from shardlayout import Mesh, Sharding, ShardingError, UnsupportedOp, propagate
from shardlayout.ops.families import parse_einsum, pointwise_map, reduction_map
from shardlayout.ops.strategy import FactorMap, brute_force, search
from shardlayout.sharding.redistribute import plan_redistribution, run_plan

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
        pcs = run_plan(plan_redistribution(s, t), pcs)
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


@pytest.mark.parametrize("op,fn", [("neg", np.negative), ("rsqrt", lambda v: 1 / np.sqrt(v)),
                                   ("silu", lambda v: v / (1 + np.exp(-v)))])
def test_pointwise_unary_by_simulation(op, fn):
    rng = random.Random(op)
    for _ in range(40):
        mesh = rand_mesh(rng)
        shape = tuple(rng.choice(SHAPES) for _ in range(rng.randint(1, 3)))
        a = rand_sharding(rng, mesh, shape)
        x = np.abs(np.random.default_rng(0).standard_normal(shape)) + 0.5
        simulate_op(propagate(op, [a]), [x], fn)


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


def test_search_equals_brute_force_on_500_cases_up_to_4d_meshes():
    rng = random.Random(17)
    total = 0
    for _ in range(500):
        mesh = rand_mesh(rng, max_dims=4)
        kind = rng.choice(["mm", "add", "sum", "einsum3"])
        if kind == "mm":
            fm = FactorMap(("mk", "kn"), "mn", linear="multi")
            ins = [rand_sharding(rng, mesh, (8, 12)), rand_sharding(rng, mesh, (12, 16))]
        elif kind == "add":
            ins = [rand_sharding(rng, mesh, (8, 12)), rand_sharding(rng, mesh, (8, 12))]
            fm = pointwise_map("add", ins)
        elif kind == "sum":
            ins = [rand_sharding(rng, mesh, (8, 12, 4))]
            fm = reduction_map("sum", ins[0], 1, False)[0]
        else:
            fm = parse_einsum("bhk,hkd->bd", 2)
            ins = [rand_sharding(rng, mesh, (4, 8, 6)), rand_sharding(rng, mesh, (8, 6, 4))]
        chosen, considered = search(fm, ins)
        best, count = brute_force(fm, ins)
        assert sum(c.cost for c in chosen) == pytest.approx(best)
        assert len(considered) < count or mesh.ndim == 1
        total += 1
    assert total == 500


def test_partial_rules():
    m = Mesh.parse("dp=2,tp=4")
    P = Sharding.parse("[8, 12] +sum(tp)", m)
    R = Sharding.parse("[8, 12]", m)
    assert propagate("add", [P, P]).outputs[0].partial == (("tp", "sum"),)  # linear: stays partial
    out = propagate("add", [P, R])  # partial + replicated is not linear: reduced first
    assert not out.outputs[0].partial and out.needs_communication
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
    assert str(nz.outputs[0]) == "[5, 2]" and [r.kind for r in nz.redistributions] == ["all_gather"] * 2
    with pytest.raises(UnsupportedOp, match="no sharding rule"):
        propagate("frobnicate", [R])
