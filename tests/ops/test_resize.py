"""Slice, split, cat and slice_backward of sharded dims (``ops.resize``), checked by simulation on
every rank and against a brute-force search for a comm-free answer.

The oracle for "a comm-free answer exists": every output sharding of the cut dim that keeps the
input's mesh-axis factors in their order with any local factors around them (even or
torch.chunk-uneven), tried element by element: it is comm-free when every rank's output shard is
a subset of what the rank holds. Whenever one exists the rule must move nothing, and whatever
the rule answers must equal, on every rank, the output sharding's shard of the global result.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from shardlayout import Mesh, Sharding, propagate
from shardlayout.execute import NumpySimulator
from shardlayout.ops import get_op
from shardlayout.ops.resize import carve, cut, join, local_pad, local_slice, pad, slice_bounds
from shardlayout.sharding import Factor

from ..sharding.strategies import shardings


def run_every_rank(p, arrays, params):
    """Each rank's output pieces, from its inputs moved to their targets, by the registry's
    numpy implementation with the rule's local params (what the simulator runs)."""
    from shardlayout import plan_move
    from shardlayout.execute import run_moves

    opdef = get_op(p.op)
    pieces = [run_moves(plan_move(s, t), s.shard(x)) for s, t, x in zip(p.inputs, p.input_targets, arrays)]
    mesh = p.outputs[0].mesh
    outs = NumpySimulator(mesh).op(opdef, pieces, {**params, **dict(p.local)}, p.outputs)
    return {r: [o[r] for o in outs] for r in mesh.ranks()}


def assert_exact(p, arrays, params, wants):
    got = run_every_rank(p, arrays, params)
    for k, (out, want) in enumerate(zip(p.outputs, wants)):
        shards = out.shard(np.asarray(want))
        for r, outs in got.items():
            assert outs[k].shape == shards[r].shape and np.array_equal(outs[k], shards[r]), (p.op, k, r, str(out))


def _held(s: Sharding, d: int, r: int) -> set:
    return set(s.indices(r)[d].tolist())


def _candidates(mesh, fs, m: int):
    """Factor lists of a dim of ``m`` keeping the mesh-axis factors of ``fs`` in order, with local
    factors (1..m) before, between and after them (chunk trees, even or not)."""
    devs = [f for f in fs if f.axis is not None]
    prod = 1
    for f in devs:
        prod *= f.size
    sizes = sorted({k for k in range(1, m + 1) if m % k == 0} | {-(-m // x) for x in range(1, 13)} | {1, 2, 3, 4})
    sizes = [k for k in sizes if k <= m]
    for locs in itertools.product(sizes, repeat=len(devs) + 1):
        total = prod
        for k in locs:
            total *= k
        if total > m * max(prod, 1) * 2 or (total < m and locs[-1] != 1):
            continue
        out = []
        for k, f in zip(locs, devs + [None]):
            if k > 1:
                out.append(Factor(k))
            if f is not None:
                out.append(f)
        try:
            yield Sharding(mesh, (m,), [out])
        except Exception:
            continue


def comm_free_exists(s: Sharding, d: int, a: int, b: int, step: int) -> bool:
    """Brute force: is there an output sharding of the slice every rank can cut from its own shard?"""
    idx = list(range(a, b, step))
    one = Sharding(s.mesh, (s.shape[d],), [s.dims[d]])
    for cand in _candidates(s.mesh, s.dims[d], len(idx)):
        if all({idx[i] for i in cand.indices(r)[0].tolist()} <= _held(one, 0, r) for r in s.mesh.ranks()):
            return True
    return False


def _even_or_tree(s):
    return all(not type(fs).__name__ == "ChunkProgram" for fs in s.dims)


# ------------------------------------------------------------------------------------------
# the seed's cases (nvFuser issue #3987, cases 3 and 4) and hand cases
# ------------------------------------------------------------------------------------------


def test_inner_split_slice_is_comm_free_case_3():
    """qkv [b, s, hq+hk+hv] inner-split by d: q, k, v each keep [h/d*tp] (GQA sizes)."""
    m = Mesh.parse("tp=4")
    hq, hk, hv = 32, 8, 8
    x = Sharding(m, (2, 3, hq + hk + hv), [[], [], [Factor((hq + hk + hv) // 4), Factor(4, "tp")]])
    xs = np.arange(2 * 3 * 48.0).reshape(2, 3, 48)
    for a, b in [(0, hq), (hq, hq + hk), (hq + hk, hq + hk + hv)]:
        p = propagate("slice", [x], dim=2, start=a, end=b)
        assert not p.collectives and p.outputs[0].dims[2] == (Factor((b - a) // 4), Factor(4, "tp"))
        assert_exact(p, [xs], {"dim": 2, "start": a, "end": b, "step": 1}, [xs[:, :, a:b]])


def test_inner_split_cat_is_comm_free_case_4():
    m = Mesh.parse("tp=4")
    parts = [Sharding(m, (2, n), [[], [Factor(n // 4), Factor(4, "tp")]]) for n in (32, 8, 8)]
    p = propagate("cat", parts, dim=1)
    assert not p.collectives and p.outputs[0].dims[1] == (Factor(12), Factor(4, "tp"))
    vals = [np.arange(2 * n, dtype=float).reshape(2, n) + 100 * k for k, n in enumerate((32, 8, 8))]
    assert_exact(p, vals, {"dim": 1}, [np.concatenate(vals, axis=1)])


def test_outer_split_cat_becomes_strided_and_slices_back():
    """[tp*4] ++ [tp*4] -> [2*tp*4] locally; slicing that back gives [tp*4] again, no data moved."""
    m = Mesh.parse("tp=2")
    a = Sharding.parse("[tp*4]", m)
    p = propagate("cat", [a, a], dim=0)
    assert str(p.outputs[0]) == "[2*tp*4]" and not p.collectives
    vals = [np.arange(8.0), np.arange(8.0) + 10]
    assert_exact(p, vals, {"dim": 0}, [np.concatenate(vals)])
    back = propagate("slice", [p.outputs[0]], dim=0, start=8, end=16)
    assert str(back.outputs[0]) == "[tp*4]" and not back.collectives


def test_uneven_pieces_cut_and_join():
    """Each part of a fused dim of 3x10 chunked on tp=4 (3,3,3,1): cut and joined locally."""
    m = Mesh.parse("tp=4")
    x = Sharding(m, (30,), [[Factor(3), Factor(4, "tp")]])
    assert not x.is_even()
    xs = np.arange(30.0)
    p = propagate("slice", [x], dim=0, start=10, end=20)
    assert not p.collectives and str(p.outputs[0]) == str(Sharding(m, (10,), [[Factor(4, "tp")]]))
    assert_exact(p, [xs], {"dim": 0, "start": 10, "end": 20, "step": 1}, [xs[10:20]])
    parts = [Sharding(m, (10,), [[Factor(4, "tp")]])] * 3
    c = propagate("cat", parts, dim=0)
    assert not c.collectives and c.outputs[0] == x
    assert_exact(c, [xs[:10], xs[10:20], xs[20:]], {"dim": 0}, [xs])
    sp = propagate("split", [x], split_size=10, dim=0)
    assert not sp.collectives
    assert_exact(sp, [xs], {"dim": 0, "split_size": 10}, [xs[:10], xs[10:20], xs[20:]])


def test_two_d_mesh_and_steps():
    m = Mesh.parse("dp=2,tp=2")
    x = Sharding.parse("[dp*3, 2*tp*6]", m)
    xs = np.arange(6 * 24.0).reshape(6, 24)
    for a, b, s in [(12, 24, 1), (0, 24, 2), (0, 24, 3), (12, 24, 2), (1, 24, 2), (13, 24, 2), (2, 24, 3)]:
        p = propagate("slice", [x], dim=1, start=a, end=b, step=s)
        assert not p.collectives, (a, b, s, p.notes)
        assert_exact(p, [xs], {"dim": 1, "start": a, "end": b, "step": s}, [xs[:, a:b:s]])


def test_the_odd_half_of_interleaved_pairs_stays_sharded():
    """GPT-OSS's experts split their fused gate|up by interleaving, ``x[..., ::2]`` and
    ``x[..., 1::2]``: both halves of a column-parallel ``[E, dim, tp*2f]`` stay on tp."""
    m = Mesh.parse("tp=2")
    x = Sharding.parse("[4, 8, tp*16]", m)
    xs = np.arange(4 * 8 * 32.0).reshape(4, 8, 32)
    for a in (0, 1):
        p = propagate("slice", [x], dim=2, start=a, end=32, step=2)
        assert not p.collectives and str(p.outputs[0]) == "[4, 8, tp*8]", p.notes
        assert_exact(p, [xs], {"dim": 2, "start": a, "end": 32, "step": 2}, [xs[:, :, a::2]])


def test_needs_communication_says_why():
    m = Mesh.parse("tp=4")
    x = Sharding.parse("[tp*8]", m)
    p = propagate("slice", [x], dim=0, start=0, end=16)
    assert p.collectives and any("only some ranks hold it" in n or "one shard" in n for n in p.notes)
    y = Sharding.parse("[4*tp*2]", m)
    q = propagate("slice", [y], dim=0, start=0, end=4)  # cuts inside a chunk of 8 held by 4 ranks
    assert q.collectives and any("do not fall on the boundaries" in n or "only some" in n for n in q.notes)


def test_explain_names_the_failed_precondition():
    import contextlib
    import io

    from shardlayout.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["explain", "slice", "--mesh", "tp=4", "--inputs", "[4*tp*2]", "--param", "dim=0",
                   "--param", "start=0", "--param", "end=4"])
    assert rc == 0 and "not comm-free" in out.getvalue()


def test_slice_backward_places_each_shard():
    m = Mesh.parse("tp=2")
    g = Sharding.parse("[2*tp*4]", m)
    p = propagate("slice_backward", [g], input_sizes=[48], dim=0, start=16, end=32, step=1)
    assert not p.collectives and str(p.outputs[0]) == "[6*tp*4]"
    gs = np.arange(16.0)
    want = np.zeros(48)
    want[16:32] = gs
    assert_exact(p, [gs], {"input_sizes": [48], "dim": 0, "start": 16, "end": 32, "step": 1}, [want])


def test_local_helpers():
    assert local_slice(np.arange(6), 0, 3, 1, 2).tolist() == [2, 3]
    assert local_pad(np.ones(2), (6,), 0, 3, 1, np.zeros).tolist() == [0, 0, 1, 1, 0, 0]
    assert isinstance(cut((Factor(2, "tp"), Factor(8)), 16, 6, 12), str)  # 2 + 4: not [tp*3]
    assert cut((Factor(2, "tp"), Factor(8)), 16, 6, 10).offset.values == (6, 0)  # tail of rank 0, head of 1
    assert cut((Factor(2, "tp"), Factor(8)), 16, 4, 8).head  # all on rank 0: the others keep none
    assert [c.factors for c in carve((Factor(3), Factor(2, "tp"), Factor(8)), 48, [32, 16])] == \
        [(Factor(2), Factor(2, "tp"), Factor(8)), (Factor(2, "tp"), Factor(8))]
    assert isinstance(carve((Factor(3), Factor(2, "tp"), Factor(8)), 48, [24, 24]), str)
    assert join([((Factor(2, "tp"), Factor(4)), 8)] * 2) == (Factor(2), Factor(2, "tp"), Factor(4))
    assert pad((Factor(2, "tp"), Factor(4)), 8, 24, 8).factors == (Factor(3), Factor(2, "tp"), Factor(4))


# ------------------------------------------------------------------------------------------
# properties: exact on every rank; comm-free whenever a comm-free answer exists
# ------------------------------------------------------------------------------------------


@st.composite
def slice_cases(draw):
    s = draw(shardings(max_ndim=2, partial=False))
    d = draw(st.integers(0, s.ndim - 1))
    n = s.shape[d]
    a = draw(st.integers(0, n))
    b = draw(st.integers(a, n))
    step = draw(st.sampled_from([1, 1, 1, 2, 3]))
    return s, d, a, b, step


@given(slice_cases())
@example((Sharding.parse("[2*a*2 of 5]", Mesh.parse("a=2,b=2,c=2")), 0, 0, 2, 1))  # found by hypothesis
def test_slice_exact_and_comm_free_when_possible(case):
    s, d, a, b, step = case
    n = s.shape[d]
    if slice_bounds(n, a, b, step)[2] == 0:
        return
    p = propagate("slice", [s], dim=d, start=a, end=b, step=step)
    xs = np.arange(float(np.prod(s.shape))).reshape(s.shape)
    idx = (slice(None),) * d + (slice(a, b, step),)
    assert_exact(p, [xs], {"dim": d, "start": a, "end": b, "step": step}, [xs[idx]])
    # comm-free whenever possible: asserted for unit steps (a step is kept when it divides an innermost
    # local factor, or picks one element; other stepped answers are exact but may gather) on dims cut
    # by one mesh-axis factor (with several, boxes and prefixes are comm-free; a window across an outer
    # axis's shard boundary with inner axes inside may gather: a documented limit)
    if step == 1 and sum(f.axis is not None for f in s.dims[d]) == 1 and _even_or_tree(s) \
            and comm_free_exists(s, d, a, b, step):
        assert not p.collectives, (str(s), d, a, b, step, p.notes)


@pytest.mark.parametrize("a,b,want", [(0, 2, "[2*a of 2]"), (0, 3, "[a*2 of 3]"), (1, 3, "[a]"), (3, 5, "[a]"),
                                      (1, 4, "[2*a of 3]"), (1, 5, "[2*a]")])
def test_uneven_local_factor_outside_the_mesh_factor(a, b, want):
    """[2*a*2 of 5] on a=2: chunks [0,1,2] and [3,4] of the outer 2, cut by a into [0,1] | [2] and
    [3] | [4]: a's ranks hold [0,1,3] and [2,4], unequal pieces of each chunk, so no whole groups.
    A range inside one chunk, or across both whose parts meet in every rank's shard, is still kept
    locally: [0:2] is the head of a's first rank's shard (the other keeps none), [3:5] element 2 of
    the first rank's and 1 of the other's, [1:4] elements 1..2 of the first rank's and 0 of the other's."""
    m = Mesh.parse("a=2,b=2,c=2")
    s = Sharding.parse("[2*a*2 of 5]", m)
    assert [s.indices(r)[0].tolist() for r in (0, 4)] == [[0, 1, 3], [2, 4]]  # a=0, a=1
    assert comm_free_exists(s, 0, a, b, 1)
    p = propagate("slice", [s], dim=0, start=a, end=b)
    assert not p.collectives and str(p.outputs[0]) == want, (str(p.outputs[0]), p.notes)
    xs = np.arange(5.0)
    assert_exact(p, [xs], {"dim": 0, "start": a, "end": b, "step": 1}, [xs[a:b]])
    sizes = [k for k in (a, b - a, 5 - b) if k]  # the split around it: exact too (comm-free or not)
    sp = propagate("split_with_sizes", [s], split_sizes=sizes, dim=0)
    assert_exact(sp, [xs], {"dim": 0, "split_sizes": sizes}, np.split(xs, np.cumsum(sizes)[:-1]))


def test_uneven_local_factor_cut_offsets():
    fs = (Factor(2), Factor(2, "a"), Factor(2))
    assert cut(fs, 5, 0, 2) == (fs[:2], 1, 0, 1, 1, True, 0)  # the head of every shard of the group
    assert cut(fs, 5, 3, 5).offset.values == (2, 1)  # after a's pieces of chunk 0: 2 elements, then 1
    assert isinstance(cut(fs, 5, 2, 3), str)  # element 2 is a's second rank's: no [a of 1] keeps it
    assert isinstance(cut(fs, 5, 0, 4, 3), str)  # a step across the uneven chunks: gathered


@given(shardings(max_ndim=2, partial=False), st.data())
def test_split_and_cat_round_trip(s, data):
    d = data.draw(st.integers(0, s.ndim - 1))
    n = s.shape[d]
    if n < 2:
        return
    k = data.draw(st.integers(1, n - 1))
    sp = propagate("split_with_sizes", [s], split_sizes=[k, n - k], dim=d)
    xs = np.arange(float(np.prod(s.shape))).reshape(s.shape)
    parts = np.split(xs, [k], axis=d)
    assert_exact(sp, [xs], {"dim": d, "split_sizes": [k, n - k]}, parts)
    c = propagate("cat", list(sp.outputs), dim=d)
    assert_exact(c, parts, {"dim": d}, [xs])
    boxes = not sp.collectives and all(not g[4] for g in dict(sp.local).get("local", ()))  # no short shards
    if boxes and any(f.axis is not None for f in s.dims[d]):
        assert not c.collectives and c.outputs[0] == s  # cut then joined: the same shards


def test_random_cat_cases_against_brute_force():
    """Cats of random same-sharded parts: comm-free exactly when every rank's local cat is its shard."""
    rng = random.Random(7)
    for _ in range(60):
        mesh = rng.choice([Mesh.parse("tp=2"), Mesh.parse("tp=4"), Mesh.parse("dp=2,tp=2")])
        dev = [Factor(n, a) for a, n in zip(mesh.names, mesh.shape)]
        inner = rng.choice([1, 2, 3])
        rest = tuple(dev[-1:]) + ((Factor(inner),) if inner > 1 else ())
        parts = []
        for _ in range(rng.randint(2, 3)):
            m = rng.choice([1, 2, 3])
            fs = ((Factor(m),) if m > 1 else ()) + rest
            size = m * dev[-1].size * inner
            parts.append(Sharding(mesh, (2, size), [[], list(fs)]))
        p = propagate("cat", parts, dim=1)
        assert not p.collectives, [str(x) for x in parts]
        vals = [np.arange(float(np.prod(x.shape))).reshape(x.shape) + 1000 * i for i, x in enumerate(parts)]
        assert_exact(p, vals, {"dim": 1}, [np.concatenate(vals, axis=1)])


@pytest.mark.parametrize("text,n,a,b", [("[tp*8]", 32, 0, 16), ("[tp*2]", 8, 1, 7), ("[tp*3 of 10]", 10, 0, 5)])
def test_no_comm_free_answer_exists_and_none_is_claimed(text, n, a, b):
    m = Mesh.parse("tp=4")
    s = Sharding.parse(text, m) if "of" in text else Sharding(m, (n,), Sharding.parse(text, m).dims)
    assert not comm_free_exists(s, 0, a, b, 1)
    p = propagate("slice", [s], dim=0, start=a, end=b)
    xs = np.arange(float(n))
    assert_exact(p, [xs], {"dim": 0, "start": a, "end": b, "step": 1}, [xs[a:b]])


# ------------------------------------------------------------------------------------------
# the rule against the domain layer's theorems (an independent statement of the same facts)
# ------------------------------------------------------------------------------------------


def test_cut_agrees_with_the_split_theorems():
    """Inner split ``[K*tp]``: the theorem's even form (``d | start``, ``d | end``) implies a
    comm-free cut, and a comm-free cut implies its general form (``d | start``). Outer split
    ``[tp*K]``: comm-free exactly when ``outer_split_slice`` holds (the output split by d too)
    or the slice lies in the first rank's shard (then that rank keeps it all)."""
    from shardlayout.domain.theorems import inner_split_slice, outer_split_slice

    for d in (2, 3, 4):
        m = Mesh((d,), ("tp",))
        for k in range(1, 6):
            n = k * d
            inner = Sharding(m, (n,), [[Factor(k), Factor(d, "tp")]])
            outer = Sharding(m, (n,), [[Factor(d, "tp"), Factor(k)]])
            for a in range(n):
                for b in range(a + 1, n + 1):
                    ours = not propagate("slice", [inner], dim=0, start=a, end=b).collectives
                    if inner_split_slice(d, a, b, even=True).holds:
                        assert ours, (d, k, a, b)
                    if ours:
                        assert inner_split_slice(d, a, b, even=False).holds, (d, k, a, b)
                    ours = not propagate("slice", [outer], dim=0, start=a, end=b).collectives
                    theorem = bool(outer_split_slice(n, d, a, b, even=False).holds)
                    in_first_shard = b <= k  # also comm-free: [L*tp of L], all on the first rank
                    assert ours == (theorem or in_first_shard), (d, k, a, b, ours)


def _random_parts(rng, m):
    devs = [Factor(n, a) for a, n in zip(m.names, m.shape)]
    parts = []
    for _ in range(rng.randint(2, 3)):
        fs = []
        for d in [d for d in devs if rng.random() < 0.8] or devs[-1:]:
            if rng.random() < 0.5:
                fs.append(Factor(rng.choice([2, 3])))
            fs.append(d)
        if rng.random() < 0.6:
            fs.append(Factor(rng.choice([2, 3])))
        n = int(np.prod([f.size for f in fs]))
        if rng.random() < 0.2 and fs[-1].axis is None:
            n, fs = max(1, n - rng.randint(1, fs[-1].size - 1)), fs[:-1]
        parts.append(Sharding(m, (n,), [fs]))
    return parts


def test_cat_comm_free_whenever_possible():
    """Random cats (even and uneven parts, 1-D and 2-D meshes): exact on every rank, and
    comm-free whenever some output sharding makes every rank's local cat its shard."""
    rng = random.Random(5)
    meshes = [Mesh.parse("tp=2"), Mesh.parse("tp=4"), Mesh.parse("dp=2,tp=2")]
    free = 0
    for _ in range(150):
        m = rng.choice(meshes)
        parts = _random_parts(rng, m)
        p = propagate("cat", parts, dim=0)
        vals = [np.arange(float(s.shape[0])) + 100 * i for i, s in enumerate(parts)]
        assert_exact(p, vals, {"dim": 0}, [np.concatenate(vals)])
        total = sum(s.shape[0] for s in parts)
        offs = np.cumsum([0] + [s.shape[0] for s in parts[:-1]])
        local = {r: [o + i for s, o in zip(parts, offs) for i in s.indices(r)[0].tolist()] for r in m.ranks()}
        exists = any(all(c.indices(r)[0].tolist() == local[r] for r in m.ranks())
                     for c in _candidates(m, parts[0].dims[0], total))
        if exists:
            assert not p.collectives, [str(s) for s in parts]
            free += 1
    assert free >= 20
