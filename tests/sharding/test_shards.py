"""Local pieces: shard/unshard, partial values, replicas, the CuTe layout of a sharding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from shardlayout import Mesh, NotRepresentable, Sharding, ShardMismatch
from shardlayout.simulate import simulate, spmd

from .strategies import shardings


@given(shardings())
def test_unshard_of_shard_is_identity(s):
    x = np.random.default_rng(0).integers(-50, 50, size=s.shape).astype(np.float64)
    assert np.allclose(s.unshard(s.shard(x)), x, rtol=1e-12, atol=1e-12)


@given(shardings(partial=False))
def test_every_element_held_and_local_shapes(s):
    count = np.zeros(s.shape, dtype=int)
    for r in s.mesh.ranks():
        idx = s.indices(r)
        assert tuple(len(i) for i in idx) == s.local_shape(r)
        count[np.ix_(*idx)] += 1
    replicas = 1
    for a in s.replicated_axes():
        replicas *= s.mesh.axis_size(a)
    assert (count == replicas).all()


@given(shardings(uneven=False))
def test_layout_maps_local_and_device_coordinates_to_global_offsets(s):
    L = s.layout()
    mesh = s.mesh
    for r in mesh.ranks():
        idx = s.indices(r)
        local = s.local_shape(r)
        coord = mesh.coord(r)
        for flat in range(int(np.prod(local))):
            lc = np.unravel_index(flat, local)
            want = np.ravel_multi_index(tuple(i[c] for i, c in zip(idx, lc)), s.shape)
            assert L((tuple(int(c) for c in lc), coord)) == want


def test_partial_values_follow_dtensor():
    m = Mesh.parse("x=2,y=2")
    x = np.arange(6.0).reshape(2, 3)
    s = Sharding.parse("[2, 3] +sum(x)", m)
    pieces = s.shard(x)
    assert np.allclose(pieces[0], x / 2) and np.allclose(s.unshard(pieces), x)
    for op in ("max", "min", "avg"):
        t = Sharding.parse(f"[2, 3] +{op}(x,y)", m)
        assert all(np.array_equal(p, x) for p in t.shard(x).values())
        assert np.allclose(t.unshard(t.shard(x)), x)
    # partial pieces that differ reduce as the op says
    t = Sharding.parse("[2, 3] +max(y)", m)
    got = t.unshard({r: x + m.coord(r)[1] for r in m.ranks()})
    assert np.array_equal(got, x + 1)


def test_replicas_that_disagree_are_refused():
    m = Mesh.parse("x=2")
    s = Sharding.parse("[4]", m)
    with pytest.raises(ShardMismatch, match="disagrees"):
        s.unshard({0: np.zeros(4), 1: np.ones(4)})
    with pytest.raises(ShardMismatch, match="rank 1 holds a piece of shape"):
        s.unshard({0: np.zeros(4), 1: np.zeros(3)})
    with pytest.raises(ShardMismatch, match="no piece for rank 1"):
        s.unshard({0: np.zeros(4)})
    with pytest.raises(ShardMismatch, match="does not match"):
        s.shard(np.zeros(5))


def test_partial_replicas_that_disagree_are_refused():
    m = Mesh.parse("x=2,y=2")
    t = Sharding.parse("[2, 3] +max(y)", m)
    x = np.zeros((2, 3))
    with pytest.raises(ShardMismatch, match="disagrees"):
        t.unshard({r: x + r for r in m.ranks()})


def test_uneven_layout_is_refused():
    s = Sharding.parse("[x*3 of 5]", Mesh.parse("x=2"))
    with pytest.raises(Exception, match="uneven"):
        s.layout()


def test_simulate_matmul_row_parallel_gives_partial_sum():
    m = Mesh.parse("tp=2")
    a = np.arange(12.0).reshape(3, 4)
    b = np.arange(8.0).reshape(4, 2)
    sa = Sharding.parse("[3, tp*2]", m)
    sb = Sharding.parse("[tp*2, 2]", m)
    out = Sharding.parse("[3, 2] +sum(tp)", m)
    got = simulate(lambda r, x, y: x @ y, [(sa, a), (sb, b)], out)
    assert np.allclose(got, a @ b)
    with pytest.raises(ShardMismatch):  # without the partial sum the replicas disagree
        simulate(lambda r, x, y: x @ y, [(sa, a), (sb, b)], Sharding.parse("[3, 2]", m))


def test_spmd_runs_every_rank():
    m = Mesh.parse("x=3")
    outs = spmd(lambda r, a: (a + r, a * r), m, [{r: np.zeros(2) for r in m.ranks()}])
    assert len(outs) == 2 and np.array_equal(outs[0][2], np.full(2, 2.0))


def test_sub_axis_sharding_shards_and_has_no_placements():
    m = Mesh.parse("dp=2,tp=4")
    s = Sharding.parse("[dp*4*tp:(1)2, tp:(2)2*3]", m)
    x = np.arange(96.0).reshape(16, 6)
    assert np.allclose(s.unshard(s.shard(x)), x, rtol=1e-12, atol=1e-12)
    with pytest.raises(NotRepresentable, match="sub-axes"):
        s.to_placements()
    with pytest.raises(NotRepresentable, match="strided"):
        s.to_partition_spec()  # dp*4*tp:(1)2 is not a contiguous block split
    t = Sharding.parse("[dp*tp:(1)2*4, tp:(2)2*3]", m)
    assert t.to_partition_spec() == (("dp", "tp:(1)2"), "tp:(2)2")
    assert Sharding.from_partition_spec(m, t.shape, t.to_partition_spec()) == t


_S = Sharding.parse("[dp*4, tp*3]", Mesh.parse("dp=2,tp=4"))


@pytest.mark.parametrize("call,needle", [
    (lambda: _S.unshard(None), "pieces must be a dict {rank: local piece}, got NoneType None"),
    (lambda: _S.unshard([np.zeros((4, 3))] * 8), "got list [array("),
    (lambda: _S.unshard({r: np.zeros((4, 3)) for r in range(9)}), "key 8 is not a rank of mesh dp=2,tp=4 (ranks 0 to "
                                                                  "7); give one piece per rank, no more"),
    (lambda: _S.unshard({r: np.zeros((4, 3)) for r in range(8)}, tolerance=-1), "tolerance -1 must be a finite "
                                                                                "number >= 0"),
    (lambda: _S.unshard({r: np.zeros((4, 3)) for r in range(8)}, tolerance="a"), "tolerance 'a' must be a finite"),
])
def test_unshard_refuses_what_is_not_one_piece_per_rank(call, needle):
    with pytest.raises(ShardMismatch) as e:
        call()
    assert needle in str(e.value), str(e.value)


def test_unshard_takes_a_list_turned_into_a_dict():
    assert _S.unshard(dict(enumerate([np.zeros((4, 3))] * 8)), tolerance=0.5).shape == (8, 12)
