"""nvFuser's cases in our terms: the four patterns of issue #3987 and the conformance cases of
shared/conformance/nvfuser_cases.md sections A (propagation), D (resharding), E (ID mapping)
and G (local shards). Mesh ``createForShape({2,3})`` is ``y=2,x=3``: DIDx is the last axis.
"""

from __future__ import annotations

import numpy as np
import pytest

from shardlayout import Mesh
from shardlayout.domain import (
    IdGraph,
    ParallelType,
    TensorDomain,
    add_op,
    cat_op,
    inner_split_cat,
    is_resharding,
    matmul_op,
    outer_split_of_merge,
    propagate,
    reshape_op,
    set_op,
    sharded_logical_axis,
    sharding_of,
    slice_op,
    sum_op,
)
from shardlayout.errors import DomainError

from .test_iterdomain import held

DIDx, DIDy = ParallelType.device("x"), ParallelType.device("y")
MESH = Mesh.parse("y=2,x=3")


def did(td: TensorDomain, pos: int, factor: int, ptype=DIDx, inner: bool = False) -> TensorDomain:
    """Split loop ``pos`` by ``factor`` and put the device part on ``ptype`` (nvFuser's DID split)."""
    td = td.split(pos, factor, inner)
    return td.parallelize(pos + 1 if inner else pos, ptype)


# ------------------------------------------------------------------------------------------
# issue #3987
# ------------------------------------------------------------------------------------------


def split_reshape(h, a, d, inner=False):
    """Case 1. in: logical [h], loop [d, h/d]; out: root [h], logical [a, h/a], loop [d, a/d, h/a]."""
    x = did(TensorDomain.create("in", (h,)), 0, d, inner=inner)
    op = reshape_op(x, (a, h // a), "out")
    return op.with_domains(did(op.output, 0, d, inner=inner))


def test_3987_case1_split_reshape_Mapped():
    op = split_reshape(24, 6, 2)  # a % d == 0, h % a == 0: wujingyue's conditions
    x, y = op.inputs[0], op.output
    j = IdGraph((op,)).mapped(x.loop[0], y.loop[0])
    assert j is not None and j.holds and "in.0 // 12" in j.reason
    assert not is_resharding(op)
    # the same fact as a theorem: h = merge(a, h/a), an outer split by d of it is one of a
    assert outer_split_of_merge(6, 4, 2).holds


def test_3987_case1_NonDivisible_Resharding():
    op = split_reshape(12, 3, 2)  # a % d != 0: in.d is i // 6, out.d is i // 8
    assert IdGraph((op,)).mapped(op.inputs[0].loop[0], op.output.loop[0]) is None
    assert is_resharding(op)
    assert not outer_split_of_merge(3, 4, 2).holds


def test_3987_case1_InnerSplit_Resharding():
    # "I don't think whether inner or outer will make a whole lot of difference": for case 1 it
    # does -- with inner splits in.d is i mod d but out.d is (i // (h/a)) mod d.
    op = split_reshape(24, 6, 2, inner=True)
    assert is_resharding(op)


def test_3987_case1_split_split_commute():
    # naoyam's reading: split i0 by d then by a, against by a then by d: i0/d/a == i0/a/d
    x = TensorDomain.create("x", (23,)).inner_split(0, 2).inner_split(0, 3)
    op = set_op(x, "y")
    y = op.output.inner_split(0, 3).inner_split(0, 2)
    j = IdGraph.of([op], y).mapped(x.loop[0], y.loop[0])
    assert j is not None and "split_split_commute" in j.theorem and j.mapped == (("x.0.o.o", "y.0.o.o"),)


def merge_reshape(a, h, d):
    """Case 2. in: logical [a, h/a], loop [d, a/d, h/a]; out: root [a, h/a], logical [h], loop [d, h/d]."""
    x = did(TensorDomain.create("in", (a, h // a)), 0, d)
    op = reshape_op(x, (h,), "out")
    return op.with_domains(did(op.output, 0, d))


def test_3987_case2_merge_reshape_Mapped():
    op = merge_reshape(6, 24, 2)
    j = IdGraph((op,)).mapped(op.inputs[0].loop[0], op.output.loop[0])
    assert j.theorem == "outer_split_of_merge" and not is_resharding(op)
    assert is_resharding(merge_reshape(3, 12, 2))  # a % d != 0


def qkv(hq, hk, hv, d, b=2, s=3):
    x = did(TensorDomain.create("in", (b, s, hq + hk + hv)), 2, d, inner=True)
    bounds = {"q": (0, hq), "k": (hq, hq + hk), "v": (hq + hk, hq + hk + hv)}
    ops = [slice_op(x, 2, lo, hi, n) for n, (lo, hi) in bounds.items()]
    return [op.with_domains(did(op.output, 2, d, inner=True)) for op in ops]


def test_3987_case3_slice_Mapped():
    ops = qkv(4, 6, 8, 2)
    for op in ops:
        assert not is_resharding(op), op.output.name
    j = IdGraph((ops[1],)).mapped(ops[1].inputs[0].loop[3], ops[1].output.loop[3])
    assert j.theorem == "inner_split_slice" and j.holds


def test_3987_case3_OffsetNotOnShardBoundary_Resharding():
    q, k, v = qkv(3, 6, 7, 2)
    assert not is_resharding(q) and is_resharding(k) and is_resharding(v)


def cat_grads(ns, d, b=2, s=3):
    xs = [did(TensorDomain.create(n, (b, s, e)), 2, d, inner=True) for n, e in zip(("dq", "dk", "dv"), ns)]
    op = cat_op(xs, 2, "out")
    return op.with_domains(did(op.output, 2, d, inner=True))


def test_3987_case4_cat_Mapped():
    assert not is_resharding(cat_grads([4, 6, 8], 2))
    r = is_resharding(cat_grads([3, 6, 8], 2))
    assert r and any("dk" in x for x in r.reasons)


# ------------------------------------------------------------------------------------------
# A. sharding propagation
# ------------------------------------------------------------------------------------------


def test_A1_PropagateSharding():
    m = Mesh.parse("x=3")
    a = TensorDomain.create("a", (3, 5, 3), mesh=m).parallelize(0, DIDx)
    b = TensorDomain.create("b", (3, 5, 3), mesh=m).parallelize(2, DIDx)
    (op,) = propagate([add_op([a, b], "c")])
    c = op.output
    assert c.mesh == m and c.loop[0].ptype == DIDx and len(c.device_ids()) == 1  # b's DIDx not added
    assert IdGraph((op,)).mapped(a.loop[0], c.loop[0]).theorem == "exact"


def test_A3_PropagateParallelTypeOnce():
    tv0 = did(TensorDomain.create("tv0", (4, 6)), 0, 2)
    tv1 = did(TensorDomain.create("tv1", (4, 6)), 1, 2)
    (op,) = propagate([add_op([tv0, tv1], "tv2")])
    assert [str(i) for i in op.output.loop] == ["tv2.0.o{2}@x", "tv2.0.i{2}", "tv2.1{6}"]


def test_A5_ShardedNonDivisibleReshape():
    tv0 = did(TensorDomain.create("tv0", (6,), mesh=Mesh.parse("x=2")), 0, 2)
    with pytest.raises(DomainError, match="divisible by the split factor"):
        propagate([reshape_op(tv0, (3, 2), "tv1")])


def test_A6_ShardedInnerReshape():
    tv0 = did(TensorDomain.create("tv0", (3, 10), mesh=Mesh.parse("x=2")), 1, 2)
    with pytest.raises(DomainError, match="sharding to be on the outer reshaped ID"):
        propagate([reshape_op(tv0, (30,), "tv1")])


def test_A7_ShardedReshapeWithIndependentSplit():
    dx, dy = 3, 2
    tv0 = TensorDomain.create("tv0", (3 * dx, 5, 7 * dy, 9), mesh=MESH)
    tv0 = did(did(tv0, 0, dx, DIDx), 3, dy, DIDy)  # axis 3 of [dx, 3, 5, 7dy, 9] is 7dy
    (op,) = propagate([reshape_op(tv0, (3 * dx * 5, 7 * dy * 9), "tv1")])
    assert sharded_logical_axis(op.output, DIDx) == 0 and sharded_logical_axis(op.output, DIDy) == 1
    assert not is_resharding(op)


def test_A8_PropagationDoesNotOverwrite():
    tv0 = did(TensorDomain.create("tv0", (6, 4), mesh=MESH), 0, 3, DIDx)
    tv1 = did(TensorDomain.create("tv1", (6, 4), mesh=MESH), 0, 2, DIDy)
    set2 = set_op(tv1, "tv2")
    ops = propagate([set2, add_op([tv0, set2.output], "tv3")])
    tv2, tv3 = ops[0].output, ops[1].output
    assert tv2.loop[0].ptype == DIDy and tv3.loop[0].ptype == DIDx
    assert not any(i.ptype == DIDy for i in tv3.loop)  # logical i0 is already split: DIDy not added
    assert ops[1].inputs[1] == tv2


# ------------------------------------------------------------------------------------------
# D. resharding
# ------------------------------------------------------------------------------------------


def test_D22_SplitingView():
    b, s, h, e = 2, 3, 96, 128
    x = did(TensorDomain.create("in", (b, s, h * e)), 2, 2)
    op = reshape_op(x, (b, s, h, e), "out")
    assert not is_resharding(op.with_domains(did(op.output, 2, 2)))


def test_D23_MergingView():
    b, s, h, e = 2, 3, 96, 128
    x = did(TensorDomain.create("in", (b, s, h, e)), 2, 2)
    op = reshape_op(x, (b, s, h * e), "out")
    assert not is_resharding(op.with_domains(did(op.output, 2, 2)))


def test_D24_Set():
    m = Mesh.parse("x=2")
    x = TensorDomain.create("in", (2, 4), mesh=m)
    op = set_op(x, "out")
    sharded = op.output.with_mesh(m).parallelize(0, DIDx)
    assert is_resharding(op.with_domains(sharded))  # Set_DifferentParallelTypes
    assert not is_resharding(op.with_domains(x.parallelize(0, DIDx), sharded))  # Set_SameMesh_SameParallelType
    other = op.output.with_mesh(Mesh.parse("z=2"))  # Set_DifferentMeshes ({0,1} vs {0,2}: our meshes differ)
    r = is_resharding(op.with_domains(other))
    assert r and "different meshes" in r.reasons[0]


def test_D25_Sum():
    x = TensorDomain.create("in", (2, 4, 5)).parallelize(0, DIDx)
    r = is_resharding(sum_op(x, [0], "out"))  # Sum_AllReduce
    assert r and "allreduce" in r.reasons[0]
    op = sum_op(x, [1], "out")  # Sum_UnshardedAxis
    assert not is_resharding(op.with_domains(op.output.parallelize(0, DIDx)))
    op = sum_op(TensorDomain.create("in", (2, 2, 5)).parallelize(0, DIDx), [2], "out")
    assert is_resharding(op.with_domains(op.output.parallelize(1, DIDx)))  # Sum_ParallelizeDifferentAxes


def test_D27_Matmul():
    x = did(TensorDomain.create("x", (4, 6)), 0, 2)
    y = TensorDomain.create("y", (6, 8))
    op = matmul_op(x, y, "z")
    z = did(op.output, 0, 2)
    assert not is_resharding(op.with_domains(z))  # Matmul_NoResharding
    r = is_resharding(op.with_domains(did(y, 1, 2), z))  # Matmul_Resharding: N is sharded in y, not in z
    assert r and "y's" in r.reasons[0] and "lost" in r.reasons[0]


# ------------------------------------------------------------------------------------------
# E. almost-exact mapping of DID-style outer splits
# ------------------------------------------------------------------------------------------


def test_E33_SplittingReshape_Mapped():
    x = TensorDomain.create("in", (8,)).outer_split(0, 2)
    op = reshape_op(x, (4, 2), "out")
    y = op.output.outer_split(0, 2)
    g = IdGraph.of([op], y)
    assert g.mapped(x.loop[0], y.loop[0])
    assert g.mapped(x.loop[0], y.loop[1]) is None and g.mapped(x.loop[1], y.loop[2]) is None


def test_E34_SplitingReshape_DifferentExtents_NotMapped():
    x = TensorDomain.create("in", (12,)).outer_split(0, 2)
    op = reshape_op(x, (6, 2), "out")
    y = op.output.outer_split(0, 3)
    assert IdGraph.of([op], y).mapped(x.loop[0], y.loop[0]) is None


def test_E36_MergingReshapeOuterSplit_Mapped():
    x = TensorDomain.create("in", (4, 2)).outer_split(0, 2)
    op = reshape_op(x, (8,), "out")
    y = op.output.outer_split(0, 2)
    j = IdGraph.of([op], y).mapped(x.loop[0], y.loop[0])
    assert j.theorem == "outer_split_of_merge"


# ------------------------------------------------------------------------------------------
# G. local shards of loop-domain shardings
# ------------------------------------------------------------------------------------------


def local_pieces(td: TensorDomain, mesh: Mesh) -> dict:
    t = np.arange(td.logical[0].extent)
    return {r: t[[i for (i,) in idx]] for r, idx in held(td, mesh).items()}


def agrees_with_sharding(td: TensorDomain, mesh: Mesh, pieces: dict) -> None:
    s = sharding_of(td, mesh)
    got = s.shard(np.arange(td.logical[0].extent))
    assert all(np.array_equal(got[r], pieces[r]) for r in mesh.ranks())


@pytest.mark.parametrize("d", [2, 3])
def test_G41_inner_split(d):
    m = Mesh.parse(f"x={d}")
    td = did(TensorDomain.create("tv", (3 * d,)), 0, d, inner=True)
    t = np.arange(3 * d)
    pieces = local_pieces(td, m)
    assert all(np.array_equal(pieces[r], t.reshape(3, d)[:, r]) for r in m.ranks())
    agrees_with_sharding(td, m, pieces)


def test_G42_nonoutermost_split():
    d = 3
    m = Mesh.parse(f"x={d}")
    td = did(TensorDomain.create("tv", (2 * d * 3,)).outer_split(0, 2), 1, d)
    t = np.arange(2 * d * 3)
    pieces = local_pieces(td, m)
    assert all(np.array_equal(pieces[r], t.reshape(2, d, 3)[:, r, :].flatten()) for r in m.ranks())
    agrees_with_sharding(td, m, pieces)


def test_G43_2d_sharded_vector():
    dp, rows, tp, cols = 2, 3, 3, 2
    m = Mesh.parse(f"y={dp},x={tp}")
    td = TensorDomain.create("tv", (dp * rows * tp * cols,)).inner_split(0, tp * cols)
    td = did(did(td, 0, dp, DIDy), 2, tp, DIDx)
    t = np.arange(dp * rows * tp * cols)
    pieces = local_pieces(td, m)
    want = {r: t.reshape(dp, rows, tp, cols)[r // tp, :, r % tp, :].flatten() for r in m.ranks()}
    assert all(np.array_equal(pieces[r], want[r]) for r in m.ranks())
    agrees_with_sharding(td, m, pieces)


def test_3987_cases_3_and_4_with_symbolic_extents():
    """"d, a, h* are static" in the issue; here they need not be: the graph asks a FactBase."""
    from shardlayout.symbolic import FactBase, sym

    hq, hk, hv = sym("hq"), sym("hk"), sym("hv")
    even = FactBase().assume("hq % 2 == 0").assume("hk % 2 == 0").assume("hv % 2 == 0")
    ops = qkv(hq, hk, hv, 2)
    assert not any(is_resharding(op, facts=even) for op in ops)
    unknown = FactBase().assume("hk % 2 == 0")
    assert [bool(is_resharding(op, facts=unknown)) for op in ops] == [False, True, True]  # not shown: resharding
    assert not is_resharding(cat_grads([hq, hk, hv], 2), facts=even)
    j = IdGraph((ops[1],), even).mapped(ops[1].inputs[0].loop[3], ops[1].output.loop[3])
    assert j.theorem == "inner_split_slice" and j.holds
    assert inner_split_cat([hq, hk, hv], 2, facts=even).holds is True
    assert inner_split_cat([hq, hk, hv], 2, facts=unknown).holds is None
