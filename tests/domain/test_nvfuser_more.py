"""More of nvFuser's own tests, in our terms (NVIDIA/Fuser at 81c4b22), beyond the conformance
subset of test_nvfuser_cases.py. Each test names the nvFuser test it ports; every expected answer
is that test's assertion (or, for an execution test, what its expected local output says about
the sharding), never our code's output. nvFuser's code is not used, only its facts.

    tests/cpp/test_sharding.cpp                  ShardingTest              propagation, isSharded, reorder
    tests/cpp/test_multidevice_sharding.cpp      MultiDeviceTest, ...      propagation + local outputs
    tests/cpp/test_stream.cpp                    StreamTest                Stream propagation, allocation
    tests/cpp/test_multidevice_stream_parallel_type.cpp                    Stream over collectives
    tests/cpp/test_overlap.cpp                   RingBasedOverlapTest, ... linear / matmul + DID + Stream
    tests/cpp/test_resharding.cpp                ReshardingTest, ...       isResharding, haveDifferentShardings
    tests/python/multidevice/test_sharding.py    TestShardTensor           local shards
    tests/python/multidevice/test_multidevice.py                           local shards after propagation

Meshes: ``createForNumDevices(d)`` / ``DeviceMesh({0..d-1})`` is ``x=d``; ``createForShape({a, b})``
and ``arange(d).reshape(a, b)`` are ``y=a,x=b`` (DIDx, mesh_x, is the last axis). A tensor an nvFuser
op creates after its input got a mesh inherits that mesh; here it is given explicitly.
"""

from __future__ import annotations

import numpy as np
import pytest

from shardlayout import Mesh, Sharding
from shardlayout.domain import (
    SERIAL,
    STREAM,
    ParallelType,
    TensorDomain,
    add_op,
    factory_op,
    have_different_shardings,
    index_map,
    is_resharding,
    linear_op,
    loop_indices,
    matmul_op,
    permute_op,
    propagate_shardings,
    reorder_parallelized_to_front,
    reshape_op,
    ring_domains,
    select_op,
    set_op,
    sharded_logical_axis,
    sharding_of,
    stream_allocated,
    sum_op,
)
from shardlayout.errors import DomainError

from .test_iterdomain import held

DIDx, DIDy, DIDz = ParallelType.device("x"), ParallelType.device("y"), ParallelType.device("z")
M2, M3 = Mesh.parse("x=2"), Mesh.parse("x=3")
M23 = Mesh.parse("y=2,x=3")  # createForShape({2, 3})


def did(td: TensorDomain, pos: int, factor: int, ptype=DIDx, inner: bool = False) -> TensorDomain:
    """nvFuser's ``outer_split(pos, factor); axis(pos)->parallelize(ptype)`` (inner: the inner part)."""
    td = td.split(pos, factor, inner)
    return td.parallelize(pos + 1 if inner else pos, ptype)


def tensors(ops) -> dict:
    return {t.name: t for op in ops for t in op.inputs + (op.output,)}


def ptypes(td: TensorDomain) -> list:
    return [i.ptype for i in td.loop]


def pieces(td: TensorDomain, mesh: Mesh, array: np.ndarray) -> dict:
    """rank -> its local piece of ``array`` as the Sharding the loop domain expresses cuts it, after
    checking that the brute-force reading of the loop domain (``held``) holds the same elements."""
    s = sharding_of(td, mesh)
    got = s.shard(array)
    flat = np.arange(array.size).reshape(array.shape)
    mine = s.shard(flat)
    for r, idx in held(td, mesh).items():
        want = sorted(int(flat[ix]) for ix in idx)
        assert sorted(mine[r].ravel().tolist()) == want, (td.name, r)
    return got


def same_pieces(got: dict, want) -> None:
    for r, piece in got.items():
        w = want(r)
        assert piece.shape == w.shape and np.array_equal(piece, w), (r, piece, w)


# ------------------------------------------------------------------------------------------
# A. propagation, isSharded, getShardedLogicalAxis, reorder (test_sharding.cpp, ShardingTest)
# ------------------------------------------------------------------------------------------


def test_LogicalIsSharded():
    x = TensorDomain.create("x", (8, 5, 3)).parallelize(2, DIDx).split(0, 4, True)  # split(0, 4): inner
    assert x.is_sharded()


def test_AllocationIsSharded():
    x = TensorDomain.create("x", (3, 8, 5)).split(1, 4, True).parallelize(1, DIDx)
    assert x.is_sharded()


def test_MultipleDIDx():
    x = TensorDomain.create("x", (6,)).split(0, 2, True).parallelize(0, DIDx).parallelize(1, DIDx)
    with pytest.raises(DomainError, match="both run on x"):
        x.is_sharded()


def test_Allreduce_is_not_sharded():
    op = sum_op(TensorDomain.create("x", (2, 4)).parallelize(0, DIDx), [0], "y")
    y = op.output.parallelize(0, DIDx)  # r{DIDx}: summed, replicated
    assert not y.is_sharded() and sharded_logical_axis(y, DIDx) is None


def test_ReductionScatter_is_sharded():
    op = sum_op(TensorDomain.create("x", (2, 2)).parallelize(0, DIDx), [0], "y")
    y = op.output.parallelize(0, DIDx).parallelize(1, DIDx)  # [r{DIDx}, DIDx]
    assert y.is_sharded()


def test_ResidualAdd():
    tv0 = did(TensorDomain.create("tv0", (4, 6), mesh=M2), 0, 2)
    tv1 = factory_op((4, 6), "tv1")  # uniform(shape(tv0))
    ops = propagate_shardings([tv1, add_op([tv0, tv1.output], "tv2")])
    t = tensors(ops)
    assert t["tv1"].mesh == M2
    assert sharded_logical_axis(t["tv0"], DIDx) == 0 == sharded_logical_axis(t["tv1"], DIDx)


def test_PropagateParallelTypeOnce_through_the_full_pass():
    tv0 = did(TensorDomain.create("tv0", (4, 6), mesh=M2), 0, 2)
    tv1 = did(TensorDomain.create("tv1", (4, 6), mesh=M2), 1, 2)
    (op,) = propagate_shardings([add_op([tv0, tv1], "tv2")])
    assert sum(p == DIDx for p in ptypes(op.output)) == 1


def test_ReductionDIDxIsIgnored():
    m, n, k = 4, 8, 6
    tv0 = did(TensorDomain.create("tv0", (m, k), mesh=M2), 1, 2)  # K
    tv1 = did(TensorDomain.create("tv1", (n, k), mesh=M2), 1, 2)  # K
    tv2 = did(TensorDomain.create("tv2", (m, n), mesh=M2), 1, 2)  # N
    lin = linear_op(tv0, tv1, "tv3")  # [M, N, r{K}]
    ops = propagate_shardings([lin, add_op([tv2, lin.output], "tv4")])
    t = tensors(ops)
    axis = sharded_logical_axis(t["tv2"], DIDx)
    assert axis == 1
    assert sharded_logical_axis(t["tv3"], DIDx) == axis  # backward: r{DIDx} on K does not block N
    assert sharded_logical_axis(t["tv4"], DIDx) == axis  # forward from tv2


def test_BackpropagateToShardedTvs():
    tv0 = did(TensorDomain.create("tv0", (6, 4), mesh=M23), 0, 3, DIDx)
    tv1 = did(TensorDomain.create("tv1", (6, 4), mesh=M23), 1, 2, DIDy)
    s = set_op(tv1, "tv2")
    t = tensors(propagate_shardings([s, add_op([tv0, s.output], "tv3")]))
    for name in ("tv2", "tv3"):
        assert sharded_logical_axis(t[name], DIDx) == 0, name
        assert sharded_logical_axis(t[name], DIDy) == 1, name


def test_ReorderParallelizedToFront():
    tv = did(TensorDomain.create("tv", (4, 6), mesh=M2), 0, 2)  # [DIDx(2), 2, 6]
    tv = did(tv, 2, 3, STREAM)  # [DIDx(2), 2, S(3), 2]
    assert ptypes(reorder_parallelized_to_front(tv))[:2] == [STREAM, DIDx]


# ------------------------------------------------------------------------------------------
# A'. propagation read off expected local outputs (test_multidevice_sharding.cpp, MultiDeviceTest)
# ------------------------------------------------------------------------------------------


def test_MultiDeviceTest_Reduction():
    d = 3
    inp = TensorDomain.create("in", (d, 4), mesh=M3).parallelize(0, DIDx)
    (op,) = propagate_shardings([sum_op(inp, [0], "out")])
    assert op.output.loop[0].is_reduction and op.output.loop[0].ptype == DIDx  # r{DIDx}: reduced
    ref = np.arange(d * 4.0).reshape(d, 4)
    same_pieces(pieces(op.output, M3, ref.sum(0)), lambda r: ref.sum(0))  # every rank: the whole sum
    assert is_resharding(op)


def test_BackpropMeshes():
    d = 2
    x = TensorDomain.create("x", (d, 4), mesh=M2).parallelize(0, DIDx)
    y = factory_op((d, 4), "y")
    t = tensors(propagate_shardings([y, add_op([x, y.output], "z")]))
    assert t["y"].mesh == M2 and t["z"].mesh == M2
    s = sharding_of(t["z"], M2)
    assert all(s.local_shape(r) == (1, 4) for r in M2.ranks())  # z_tensor.sizes() == (1, 4)


def test_Issue2758():
    d = 2
    inp = TensorDomain.create("in", (d, d, 4), mesh=M2).parallelize(0, DIDx)
    rs = sum_op(inp, [0], "rs")
    rs = rs.with_domains(rs.output.parallelize(1, DIDx))  # [r{d}, DIDx{d}, 4]: a reduce-scatter
    ops = propagate_shardings([rs, add_op([rs.output], "out")], user_sharded=["in"])  # out = rs + size
    t = tensors(ops)
    assert is_resharding(ops[0]) and not is_resharding(ops[1])
    ref = np.arange(d * d * 4.0).reshape(d, d, 4).sum(0) + d
    same_pieces(pieces(t["out"], M2, ref), lambda r: ref[r : r + 1])  # shardTensor1D(sum, 0) + size


def test_Transpose():
    inp = did(TensorDomain.create("in", (4, 6), mesh=M2), 0, 2)
    (op,) = propagate_shardings([permute_op(inp, (1, 0), "out")])
    assert sharded_logical_axis(op.output, DIDx) == 1 and not is_resharding(op)
    ref = np.arange(24.0).reshape(4, 6)
    loc = pieces(inp, M2, ref)
    same_pieces(pieces(op.output, M2, ref.T), lambda r: loc[r].T)  # in_tensor.transpose(0, 1)


@pytest.mark.parametrize("src,dst", [((4, 15), (4, 3, 5)), ((4, 3, 5), (4, 15))], ids=["ViewWithSplit",
                                                                                        "ViewWithMerge"])
def test_ViewWithSplit_ViewWithMerge(src, dst):
    inp = did(TensorDomain.create("in", src, mesh=M2), 0, 2)
    op = reshape_op(inp, dst, "out")
    op = op.with_domains(did(op.output.with_mesh(M2), 0, 2))
    assert not is_resharding(op)
    ref = np.arange(60.0).reshape(src)
    loc = pieces(inp, M2, ref)
    same_pieces(pieces(op.output, M2, ref.reshape(dst)), lambda r: loc[r].reshape((-1,) + dst[1:]))


@pytest.mark.parametrize("name", ["LoopShardedSplitReshapeIds", "LoopShardedMergeReshapeIds",
                                  "MultipleTransformReshape"])
def test_loop_sharded_reshapes(name):
    d, b, s, h, e = 2, 2, 3, 2, 3
    src, axis, dst, local_dst = {
        "LoopShardedSplitReshapeIds": ((b, s, d * h * e), 2, (b, s, d * h, e), (b, s, h, e)),
        "LoopShardedMergeReshapeIds": ((b, s, d * h, e), 2, (b, s, d * h * e), (b, s, h * e)),
        "MultipleTransformReshape": ((d * b, s, h * e), 0, (d * b * s * h, e), (b * s * h, e)),
    }[name]
    tv0 = did(TensorDomain.create("tv0", src, mesh=M2), axis, d)
    (op,) = propagate_shardings([reshape_op(tv0, dst, "tv1")])
    assert not is_resharding(op)
    ref = np.arange(float(np.prod(src))).reshape(src)
    loc = pieces(tv0, M2, ref)
    same_pieces(pieces(op.output, M2, ref.reshape(dst)), lambda r: loc[r].reshape(local_dst))  # sharded_inp.view


def test_MultipleCompatibleReshapes():
    d, b, s, h = 2, 1, 4, 6
    tv0 = did(TensorDomain.create("tv0", (b, s, h), mesh=M2), 2, d)
    cast = set_op(tv0, "tv1")
    r2, r3 = reshape_op(cast.output, (b, s, d, h // d), "tv2"), reshape_op(cast.output, (b, s, d, h // d), "tv3")
    a4, a5 = add_op([r2.output], "tv4"), add_op([r3.output], "tv5")
    ops = propagate_shardings([cast, r2, r3, a4, a5, set_op(a4.output, "tv6"), set_op(a5.output, "tv7")])
    assert not any(is_resharding(op) for op in ops)  # one unsegmented kernel: no communication
    assert sharded_logical_axis(tensors(ops)["tv7"], DIDx) == 2


def test_DecomposeRowParallelLinearWithBias():
    d, b, s, e = 2, 2, 3, 5
    tv0 = did(TensorDomain.create("tv0", (b, s, d * e), mesh=M2), 2, d)
    tv1 = did(TensorDomain.create("tv1", (e, d * e), mesh=M2), 1, d)
    tv2 = TensorDomain.create("tv2", (e,), mesh=M2)
    lin = linear_op(tv0, tv1, "tv3", bias=tv2)
    ops = propagate_shardings([lin, set_op(lin.output, "tv4")])  # tv4 = cast(tv3)
    r = is_resharding(ops[0])
    assert r and "allreduce" in " ".join(r.reasons)  # the partial sums over K are reduced
    tv4 = tensors(ops)["tv4"]
    assert not tv4.is_sharded() and not is_resharding(ops[1])  # the output: the whole linear, replicated
    assert sharding_of(tv4, M2) == Sharding.parse("[2, 3, 5]", M2)


@pytest.mark.parametrize("sharded", [0, 1])
def test_MultiDeviceReductionTest_UnshardedInput_ShardedOutput(sharded):
    d = 2
    shape = [2, 3, 2, d]
    shape[sharded] = d
    shape = tuple(shape)
    tv0 = TensorDomain.create("tv0", shape, mesh=M2)
    s1 = set_op(tv0, "tv1")
    s1 = s1.with_domains(s1.output.with_mesh(M2).parallelize(sharded, DIDx))
    a2 = add_op([s1.output], "tv2")
    a2 = a2.with_domains(a2.output.with_mesh(M2).parallelize(sharded, DIDx))
    r3 = sum_op(a2.output, [sharded], "tv3")
    r3 = r3.with_domains(r3.output.with_mesh(M2).parallelize(3, DIDx))  # tv3->axis(-1)
    assert [bool(is_resharding(op)) for op in (s1, a2, r3)] == [True, False, True]
    x0 = np.arange(float(np.prod(shape))).reshape(shape)
    same_pieces(pieces(s1.output, M2, x0), lambda r: np.take(x0, [r], axis=sharded))  # shardTensor(x0, tv1)
    x3 = (x0 + x0).sum(sharded)
    same_pieces(pieces(r3.output, M2, x3), lambda r: x3[..., r : r + 1])  # shardTensor(sum, tv3): last axis


@pytest.mark.parametrize("sharded", [0, 1])
def test_MultiDeviceReductionTest_ShardedInput_ReplicatedOutput(sharded):
    d = 2
    shape = [3, 2, 5]
    shape[sharded] = d
    tv0 = TensorDomain.create("tv0", tuple(shape), mesh=M2).parallelize(sharded, DIDx)
    s1 = set_op(tv0, "tv1")
    s1 = s1.with_domains(s1.output.with_mesh(M2))
    assert is_resharding(s1)  # an allgather
    x1 = np.arange(float(np.prod(shape))).reshape(shape)
    same_pieces(pieces(s1.output, M2, x1), lambda r: x1)  # tv1 == x1, unsharded


# ------------------------------------------------------------------------------------------
# B. Stream (test_stream.cpp, StreamTest; test_multidevice_stream_parallel_type.cpp)
# ------------------------------------------------------------------------------------------


def test_StreamTest_AddPerStream():
    c = 3
    inp = did(TensorDomain.create("in", (5, c * 2)), 1, c, STREAM)
    op = add_op([inp], "out")  # in + in
    op = op.with_domains(did(op.output, 1, c, STREAM))
    assert have_different_shardings(inp, op.output, {STREAM}, op=op) is False
    f = index_map(op.output)
    for li in loop_indices(op.output):  # stream index i computes chunk i of out.chunk(c, 1)
        assert 2 * li[1] <= f(li)[1] < 2 * (li[1] + 1)
    assert sharding_of(op.output, Mesh.parse("x=1")).stream == (1, 1, c)


def _allocation_program(stream_tv2: bool):
    s = 2
    tv0 = did(TensorDomain.create("tv0", (4, 6, 5)), 0, s, STREAM)
    a1 = add_op([tv0], "tv1")  # tv0 + 1
    r2 = sum_op(a1.output, [2], "tv2")
    if stream_tv2:
        r2 = r2.with_domains(did(r2.output, 1, s, STREAM))
    d3 = add_op([a1.output], "tv3")  # tv1 / 2
    return propagate_shardings([a1, r2, d3], reorder=True)  # PreSegmenter: propagation, then finalize


def test_StreamTest_ShardedAllocation():
    ops = _allocation_program(False)
    t = tensors(ops)
    for name in ("tv0", "tv1", "tv2", "tv3"):
        assert t[name].loop[0].ptype == STREAM, name
    # fusion inputs and outputs: allocation == logical; the intermediate: allocation == loop
    assert [stream_allocated(ops, n) for n in ("tv0", "tv1", "tv2", "tv3")] == [False, True, False, False]


def test_StreamTest_ReplicatedAllocation():
    ops = _allocation_program(True)
    t = tensors(ops)
    for name in ("tv0", "tv1", "tv2", "tv3"):
        assert t[name].loop[0].ptype == STREAM, name  # tv2's own Stream (axis 1), reordered to the front
    assert sharded_logical_axis(t["tv2"], STREAM) == 1  # no second Stream from tv1
    assert not any(stream_allocated(ops, n) for n in ("tv0", "tv1", "tv2", "tv3"))  # tv1's uses differ


def test_StreamParallelType_Allgather():
    d = 2
    tv0 = TensorDomain.create("tv0", (4, d), mesh=M2).parallelize(1, DIDx)
    op = set_op(tv0, "tv1")
    op = op.with_domains(op.output.with_mesh(M2).parallelize(0, STREAM))
    assert is_resharding(op)
    ref = np.arange(4.0 * d).reshape(4, d)
    same_pieces(pieces(op.output, M2, ref), lambda r: ref)  # output == unsharded_input
    assert sharding_of(op.output, M2).stream == (0, 1, 4)


def test_StreamParallelType_Allreduce():
    d = 2
    tv0 = TensorDomain.create("tv0", (4, d, 8), mesh=M2).parallelize(1, DIDx)
    op = sum_op(tv0, [1], "tv1")
    op = op.with_domains(op.output.with_mesh(M2).parallelize(0, STREAM))
    assert is_resharding(op)
    ref = np.arange(4.0 * d * 8).reshape(4, d, 8).sum(1)
    same_pieces(pieces(op.output, M2, ref), lambda r: ref)  # unsharded_input.sum(1) on every rank


def test_StreamParallelType_ReduceScatter():
    d = 2
    tv0 = TensorDomain.create("tv0", (4, d, d, 8), mesh=M2).parallelize(1, DIDx)
    op = sum_op(tv0, [1], "tv1")
    op = op.with_domains(op.output.with_mesh(M2).parallelize(0, STREAM).parallelize(2, DIDx))
    assert is_resharding(op)
    ref = np.arange(4.0 * d * d * 8).reshape(4, d, d, 8).sum(1)
    same_pieces(pieces(op.output, M2, ref), lambda r: ref[:, r : r + 1])  # shardTensor1D(sum(1), axis 1)


def test_Swizzle1D_DIDToStream():
    """ReshardingTest: in [DIDx(d), n/d] -> out [Stream(d) swizzled by DIDx, n/d], the ring's two
    domains (``ring_domains``: chunk j of the stream is device j's shard)."""
    inp, out = ring_domains(Sharding.parse("[~x*3]", M2), "in")
    assert have_different_shardings(inp, out, {STREAM}) is True
    assert have_different_shardings(inp, out, {DIDx}) is True


def test_Swizzle1D_ConsistentSwizzle():
    s = Sharding.parse("[~x*3]", M2)
    inp, out = ring_domains(s, "in")[1], ring_domains(s, "out")[1]
    assert have_different_shardings(inp, out, {STREAM}) is False


# ------------------------------------------------------------------------------------------
# C. linear / matmul with DID + Stream (test_overlap.cpp)
# ------------------------------------------------------------------------------------------

D, T, H = 2, 4, 3  # h = 12288 in nvFuser; any h divisible the same way


def test_ColumnAndSequenceParallelLinear_WeightGrad():
    inp = did(TensorDomain.create("in", (T, H), mesh=M2), 0, D)  # [DIDx(d), t/d, h]
    out = did(TensorDomain.create("out", (T, 4 * H), mesh=M2), 1, D)  # [t, DIDx(d), 4h/d]
    tr = permute_op(out, (1, 0), "outT")
    mm = matmul_op(tr.output, inp, "w")  # w = transpose(out) @ in: [4h, h, r{t}]
    mm = mm.with_domains(did(mm.output, 2, D, STREAM))  # [4h, h, S(d), r{t/d}]
    t = tensors(propagate_shardings([tr, mm]))
    assert ptypes(t["out"]) == [STREAM, SERIAL, DIDx, SERIAL]  # the fusion input takes Stream only


def test_RowAndSequenceParallelLinear_WeightGrad():
    inp = did(did(TensorDomain.create("in", (T, 4 * H), mesh=M2), 1, D), 0, D, STREAM)  # [S, t/d, DIDx, 4h/d]
    out = did(TensorDomain.create("out", (T, H), mesh=M2), 0, D)  # [DIDx(d), t/d, h]
    tr = permute_op(out, (1, 0), "outT")
    t = tensors(propagate_shardings([tr, matmul_op(tr.output, inp, "w")]))
    assert ptypes(t["w"]) == [SERIAL, DIDx, SERIAL, STREAM, SERIAL]  # [h, DIDx(d), 4h/d, S(d), r{t/d}]
    assert t["w"].loop[3].is_reduction


def test_RowAndSequenceParallelLinear_InputGrad():
    out = did(TensorDomain.create("out", (T, H), mesh=M2), 0, D)
    w = did(TensorDomain.create("w", (H, 4 * H), mesh=M2), 1, D)
    mm = matmul_op(out, w, "in")  # [t, 4h, r{h}], no mesh
    mm = mm.with_domains(did(mm.output, 0, D, STREAM))
    (op,) = propagate_shardings([mm])
    assert ptypes(op.output) == [STREAM, SERIAL, DIDx, SERIAL, SERIAL]  # w first: out's DIDx is skipped
    assert op.output.mesh == M2


def test_CollectiveBasedOverlap_RowParallelLinear_Forward():
    inp = did(did(TensorDomain.create("in", (T, 4 * H), mesh=M2), 0, D, STREAM), 2, D)  # [S, t/d, DIDx, 4h/d]
    w = did(TensorDomain.create("w", (H, 4 * H), mesh=M2), 1, D)
    (op,) = propagate_shardings([linear_op(inp, w, "out")])
    # nvFuser's DecomposeReshardings then leaves the output [S, t/d, h, r{DIDx}] (the local r{4h/d} moves
    # into the linear): the same first four loop IDs as the propagated linear output here
    assert ptypes(op.output)[:4] == [STREAM, SERIAL, SERIAL, DIDx] and op.output.loop[3].is_reduction
    r = is_resharding(op)
    assert r and "allreduce" in " ".join(r.reasons)
    assert sharding_of(op.output, M2) == Sharding.parse("[~2*2, 3]", M2)  # replicated, streamed over t


def test_stream_on_a_reduction_id_blocks_a_second_stream():
    """nvFuser's getParallelTypesToPropagate: a target's Stream counts even on a reduction ID (only
    DIDs on reduction IDs are ignored), so a matmul streamed over r{K} takes no Stream from A's M."""
    x = did(TensorDomain.create("x", (4, 6)), 0, 2, STREAM)  # Stream on M, no mesh
    y = TensorDomain.create("y", (6, 8))
    mm = matmul_op(x, y, "z")
    mm = mm.with_domains(did(mm.output, 2, 2, STREAM))  # the user streams r{K}
    (op,) = propagate_shardings([mm])
    assert [i.ptype for i in op.output.loop].count(STREAM) == 1 and op.output.loop[2].is_reduction


# ------------------------------------------------------------------------------------------
# D. resharding (test_resharding.cpp, ReshardingTest, ReshardingSelectOpTest)
# ------------------------------------------------------------------------------------------


def t3(name, mesh=None, shape=(2, 3, 4)):
    return TensorDomain.create(name, shape, mesh=mesh)


def test_Set_SameMesh_NoParallelTypes():
    op = set_op(t3("in", M2), "out")
    assert not is_resharding(op.with_domains(op.output.with_mesh(M2)))


def test_Sum_SameMesh_NoParallelTypes():
    op = sum_op(t3("in", M3), [0], "out")
    assert not is_resharding(op.with_domains(op.output.with_mesh(M3)))


def test_Sum_DifferentMeshes():
    op = sum_op(t3("in", M2), [0], "out")  # {0, 1} -> {0, 1, 2}
    assert is_resharding(op.with_domains(op.output.with_mesh(M3)))


def _add(mesh_xy, mesh_z, sharded=(), shape=(2, 3, 4)):
    x, y = t3("x", mesh_xy, shape), t3("y", mesh_xy, shape)
    x, y = (t.parallelize(0, DIDx) if t.name in sharded else t for t in (x, y))
    op = add_op([x, y], "z")
    z = op.output.with_mesh(mesh_z)
    return op.with_domains(z.parallelize(0, DIDx) if "z" in sharded else z)


def test_Add_SameMesh_NoParallelTypes():
    assert not is_resharding(_add(M2, M2))


def test_Add_DifferentMeshes():
    assert is_resharding(_add(M2, M3))


def test_Add_OnlyOutputParallelized():
    assert is_resharding(_add(M2, M2, ("z",)))


def test_Add_OnlyInputsParallelized():
    assert is_resharding(_add(M2, M2, ("x", "y")))


def test_Add_SameMesh_SameParallelTypes():
    assert not is_resharding(_add(M2, M2, ("x", "y", "z")))


def test_Add_InputsParallelizedDifferently():
    assert is_resharding(_add(M3, M3, ("x", "z"), shape=(3, 3, 4)))


def test_Add_Broadcast():
    x = TensorDomain.create("x", (2, 4), mesh=M2).parallelize(0, DIDx)
    y = TensorDomain.create("y", (1, 4), broadcasts=(0,)).parallelize(0, DIDx).with_mesh(M2)  # b(DIDx{1})
    op = add_op([x, y], "z")
    assert not is_resharding(op.with_domains(op.output.with_mesh(M2).parallelize(0, DIDx)))


def test_Allgather():
    op = set_op(did(TensorDomain.create("in", (4, 3), mesh=M2), 0, 2), "out")
    assert is_resharding(op.with_domains(op.output.with_mesh(M2)))


def test_ReduceScatter():
    d = 2
    op = sum_op(TensorDomain.create("in", (d, 2, d * 3), mesh=M2).parallelize(0, DIDx), [0], "out")
    assert is_resharding(op.with_domains(did(op.output.with_mesh(M2), 2, d)))  # [r{d}, 2, DIDx(d), 3]


def test_Allreduce():
    d = 2
    ar = sum_op(TensorDomain.create("in", (d, 2, 3), mesh=M2).parallelize(0, DIDx), [0], "allreduce")
    ar = ar.with_domains(ar.output.with_mesh(M2))
    out = add_op([ar.output, ar.output], "out")
    assert is_resharding(ar)
    assert not is_resharding(out.with_domains(out.output.with_mesh(M2)))


def test_ReshardingSqueeze():
    inp = TensorDomain.create("in", (2, 1), mesh=M2, broadcasts=(1,)).merge(0).parallelize(0, DIDx)
    op = reshape_op(inp, (2,), "out")  # squeeze(in, {1})
    assert is_resharding(op.with_domains(op.output.with_mesh(M2)))


def test_DIDsNotInvolved():
    inp = TensorDomain.create("in", (2,), mesh=M2).parallelize(0, DIDx)
    op = set_op(inp, "out")
    out = op.output.with_mesh(Mesh.parse("x=1"))  # gather on two GPUs to one
    assert have_different_shardings(inp, out, {DIDx}) is True
    assert have_different_shardings(inp, out, {DIDy}) is False
    assert have_different_shardings(inp, out, {DIDz}) is False


def test_haveDifferentShardings_without_meshes_compares_only_Stream():
    """resharding.cpp: ``if (!producer->hasDeviceMesh() && !consumer->hasDeviceMesh() &&
    !parallel_types.count(Stream)) return false`` -- device types need a mesh to differ on."""
    inp = did(TensorDomain.create("in", (4, 6)), 0, 2)  # DIDx, but no mesh
    op = set_op(inp, "out")
    assert have_different_shardings(inp, op.output, {DIDx}) is False
    streamed = did(op.output, 0, 2, STREAM)
    assert have_different_shardings(inp, streamed, {DIDx, STREAM}) is True  # Stream is still compared


M1 = Mesh.parse("x=1")  # DeviceMesh({0})


def test_Select_NonResharding():
    tv0 = TensorDomain.create("tv0", (3, 1, 4), mesh=M1).parallelize(1, DIDx)
    op = select_op(tv0, 0, "tv1")
    assert not is_resharding(op.with_domains(op.output.with_mesh(M1).parallelize(0, DIDx)))


def test_Select_ReshardinSelectIntoDeviceDim():
    op = select_op(TensorDomain.create("tv0", (1, 3, 4), mesh=M1).parallelize(0, DIDx), 0, "tv1")
    assert is_resharding(op.with_domains(op.output.with_mesh(M1)))


def test_Select_ReshardingSelectIntoNonDeviceDim():
    op = select_op(TensorDomain.create("tv0", (3, 1, 4), mesh=M1).parallelize(1, DIDx), 0, "tv1")
    assert is_resharding(op.with_domains(op.output.with_mesh(M1)))


def test_permute_and_select_check_their_operands():
    x = TensorDomain.create("x", (2, 3))
    with pytest.raises(DomainError, match="no permutation"):
        permute_op(x, (0, 0), "y")
    with pytest.raises(DomainError, match="not one of"):
        select_op(x, 2, "y")


# ------------------------------------------------------------------------------------------
# E. local shards (tests/python/multidevice/test_sharding.py, TestShardTensor; test_multidevice.py;
#    ShardTensor_OuterSplit of test_multidevice_sharding.cpp)
# ------------------------------------------------------------------------------------------


def test_ShardTensor_OuterSplit():
    d = 3
    tv = did(TensorDomain.create("tv", (2, d * 3), mesh=M3), 1, d)
    t = np.arange(2.0 * d * 3).reshape(2, d * 3)
    same_pieces(pieces(tv, M3, t), lambda r: t.reshape(2, d, 3)[:, r, :])  # sizes (2, 3)


def test_parallel_reduction():
    d = 2
    inp = did(TensorDomain.create("inp", (2, d * 3), mesh=M2), 1, d)
    op = sum_op(inp, [1], "out")
    out = did(op.output.with_mesh(M2), 1, d)  # [2, r{DIDx(d)}, r{3}]
    ref = np.arange(2.0 * d * 3).reshape(2, d * 3)
    same_pieces(pieces(inp, M2, ref), lambda r: ref[:, r * 3 : (r + 1) * 3])
    same_pieces(pieces(out, M2, ref.sum(1)), lambda r: ref.sum(1))  # reduced: every rank the whole sum


def test_2d_sharded_matrix():
    tp, dp, rows, cols = 2, 2, 2, 3
    m = Mesh.parse(f"y={dp},x={tp}")
    tv = did(did(TensorDomain.create("tv", (dp * rows, tp * cols), mesh=m), 0, dp, DIDy), 2, tp, DIDx)
    t = np.arange(float(dp * rows * tp * cols)).reshape(dp * rows, tp * cols)
    same_pieces(pieces(tv, m, t), lambda r: t[(r // tp) * rows : (r // tp + 1) * rows,
                                              (r % tp) * cols : (r % tp + 1) * cols])


def test_context_and_tensor_parallel():
    tp, cp, b, e = 2, 2, 2, 5
    s = tp * cp * 3
    m = Mesh.parse(f"y={cp},x={tp}")
    tv = did(TensorDomain.create("tv", (b, s, e), mesh=m), 1, tp, DIDx)  # [b, DIDx(tp), s/tp, e]
    tv = did(tv, 2, cp, DIDy)  # [b, DIDx(tp), DIDy(cp), 3, e]
    tv = reorder_parallelized_to_front(tv)  # tv.reorder({2: 0, 1: 1})
    assert ptypes(tv)[:3] == [DIDy, DIDx, SERIAL]
    t = np.arange(float(b * s * e)).reshape(b, s, e)
    same_pieces(pieces(tv, m, t), lambda r: t.reshape(b, tp, cp, 3, e)[:, r % tp, r // tp, :, :])


def test_expanded_broadcast():
    d = 2
    tv = did(TensorDomain.create("tv", (2, d * 3), mesh=M2), 1, d)  # an expanded broadcast is cut as a dim
    t = np.broadcast_to(np.arange(2.0)[:, None], (2, d * 3))
    same_pieces(pieces(tv, M2, t), lambda r: np.broadcast_to(np.arange(2.0)[:, None], (2, 3)))


def test_broadcast():
    d = 2
    tv = did(TensorDomain.create("tv", (1, d * 3), mesh=M2, broadcasts=(0,)), 1, d)
    t = np.arange(float(d * 3))[None, :]
    same_pieces(pieces(tv, M2, t), lambda r: t[:, r * 3 : (r + 1) * 3])


def test_reduction_with_2d_mesh():
    tp, dp, rows, cols = 2, 2, 2, 3
    m = Mesh.parse(f"y={dp},x={tp}")
    inp = did(TensorDomain.create("inp", (dp * rows, tp * cols), mesh=m), 0, dp, DIDy)
    inp = did(inp, 2, tp, DIDx)  # outer_split(-1, tp); axis(-2) on mesh_x
    (op,) = propagate_shardings([sum_op(inp, [1], "out")])
    ref = np.arange(float(dp * rows * tp * cols)).reshape(dp * rows, tp * cols).sum(1)
    same_pieces(pieces(op.output, m, ref), lambda r: ref[(r // tp) * rows : (r // tp + 1) * rows])
    r = is_resharding(op)
    assert r and "allreduce" in " ".join(r.reasons)  # over x; DIDy passes through



@pytest.mark.parametrize("forward_only", [True, False])
def test_forward_takes_the_weight_first_and_reduction_DIDs_do_not_block(forward_only):
    """getOrderedReferenceInputs and getParallelTypesToPropagate (propagate_shardings.cpp), for the
    forward-only ``propagate`` too: B before A, and r{DIDx} does not block DIDx ("if tv is [i0,
    r{DIDx(d)}, r{i1/d}], then we allow parallelizing i0 with DIDx": a reduce-scatter)."""
    from shardlayout.domain import propagate

    run = propagate if forward_only else propagate_shardings
    x = did(TensorDomain.create("x", (4, 6), mesh=M2), 1, 2)  # K
    y = did(TensorDomain.create("y", (6, 8), mesh=M2), 1, 2)  # N
    (op,) = run([matmul_op(x, y, "z")])
    assert sharded_logical_axis(op.output, DIDx) == 1  # N from the weight; x's K is then blocked
    assert not any(i.ptype.is_device for i in op.output.loop if i.is_reduction)
    x = did(TensorDomain.create("x", (4, 6), mesh=M2), 0, 2)  # M
    y = did(TensorDomain.create("y", (6, 8), mesh=M2), 0, 2)  # K
    (op,) = run([matmul_op(x, y, "z")])
    assert sharded_logical_axis(op.output, DIDx) == 0  # [DIDx(2), M/2, N, r{DIDx(2)}, r{K/2}]
    assert [i.ptype for i in op.output.loop if i.is_reduction] == [DIDx, SERIAL]


def test_an_expanded_broadcast_is_refused_as_a_broadcast_ID():
    """MultiDeviceBroadcastTest.Expanded / test_expanded_broadcast: nvFuser's expanded broadcast
    (extent 1, expanded extent n) has no IterDomain here: a broadcast ID has extent 1. The layer
    says so; an expanded dim is written as a plain dim of extent n (test_expanded_broadcast)."""
    with pytest.raises(DomainError, match="broadcast ID has extent 1"):
        TensorDomain.create("in", (6, 8), mesh=M2, broadcasts=(0,))
