"""The sharding propagation pass with Stream (domain/stream.py): nvFuser's cases B.12-B.14
(tests/cpp/test_stream.cpp), C.17 (test_overlap.cpp) and A.1 / A.3 / A.8 through the new pass,
then properties on random programs: every ID the pass adds is a copy of a neighbour's ID of the
same parallel type (IdGraph.mapped), user shardings are never overwritten, fusion inputs gain
only Stream, and a Stream split never changes which rank holds which element.
Mesh ``createForShape({2,3})`` is ``y=2,x=3``: DIDx is the last axis.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardlayout import Mesh, Sharding
from shardlayout.domain import (
    SERIAL,
    STREAM,
    IdGraph,
    Kind,
    Op,
    OpKind,
    ParallelType,
    TensorDomain,
    add_op,
    factory_op,
    have_different_shardings,
    is_resharding,
    linear_op,
    loop_domain_of,
    matmul_op,
    propagate_shardings,
    reorder_parallelized_to_front,
    reshape_op,
    scatter_op,
    set_op,
    sharded_logical_axis,
    sharding_of,
    stream_allocated,
    sum_op,
)
from shardlayout.errors import DomainError

from ..sharding.strategies import shardings
from .test_iterdomain import expected_held, held, loop_size

DIDx, DIDy = ParallelType.device("x"), ParallelType.device("y")
MESH = Mesh.parse("y=2,x=3")


def did(td: TensorDomain, pos: int, factor: int, ptype=DIDx) -> TensorDomain:
    """Outer-split loop ``pos`` by ``factor`` and run the outer part on ``ptype`` (a DID or Stream)."""
    return td.outer_split(pos, factor).parallelize(pos, ptype)


def loop(td: TensorDomain) -> list:
    return [str(i) for i in td.loop]


def tensors(ops) -> dict:
    return {t.name: t for op in ops for t in op.inputs + (op.output,)}


# ------------------------------------------------------------------------------------------
# B. stream propagation
# ------------------------------------------------------------------------------------------


def test_B12_HaveDifferentShardings():
    tv0 = TensorDomain.create("tv0", (4, 6))
    tv1 = did(set_op(tv0, "tv1").output, 0, 2, STREAM)
    tv2 = did(set_op(tv1, "tv2").output, 0, 2, STREAM)
    tv3 = did(set_op(tv2, "tv3").output, 1, 2, STREAM)
    assert have_different_shardings(tv1, tv2, {STREAM}) is False
    assert have_different_shardings(tv2, tv3, {STREAM}) is True
    assert have_different_shardings(tv2, tv3, {Kind.DEVICE}) is False  # Stream is no device type
    assert have_different_shardings(tv0, tv1, {STREAM}) is True  # only one side has Stream


def test_B13_ForwardPropagation():
    inp = TensorDomain.create("in", (4, 6))
    w = did(TensorDomain.create("w", (6, 8)), 1, 2, STREAM)  # fusion inputs without a mesh
    (op,) = propagate_shardings([matmul_op(inp, w, "out")])
    out = op.output
    assert out.loop[1].ptype == STREAM and loop(out) == ["out.0{4}", "out.1.o{2}@stream", "out.1.i{4}", "rout.2{6}"]
    assert out.mesh is None and op.inputs[0] == inp  # no mesh anywhere; in's dims are not N
    assert IdGraph((op,)).mapped(w.loop[1], out.loop[1]).theorem == "same_transforms"


def test_B14_BackwardPropagation():
    tv0 = TensorDomain.create("tv0", (4, 6))
    op1 = add_op([tv0], "tv1")  # tv1 = tv0 + 1.0
    op2 = add_op([op1.output, op1.output], "tv2")
    op2 = op2.with_domains(did(op2.output, 0, 2, STREAM))
    ops = propagate_shardings([op1, op2])
    ts = tensors(ops)
    for name in ("tv0", "tv1", "tv2"):
        assert ts[name].loop[0].ptype == STREAM, name
    # only the intermediate is allocated per chunk: fusion inputs and outputs keep allocation == logical
    assert [stream_allocated(ops, n) for n in ("tv0", "tv1", "tv2")] == [False, True, False]
    assert stream_allocated(ops, "tv1", outputs=["tv1", "tv2"]) is False


def test_stream_allocation_needs_the_same_stream_sharding_in_every_use():
    tv0 = TensorDomain.create("tv0", (4, 6))
    op1 = set_op(tv0, "tv1")
    op2 = set_op(op1.output, "tv2")
    op3 = set_op(op2.output, "tv3")
    op2 = op2.with_domains(did(op2.output, 1, 2, STREAM))  # the user streams tv2 on axis 1
    ops = propagate_shardings([op1, op2, op3.with_domains(did(op3.output, 0, 2, STREAM))])
    ts = tensors(ops)
    assert sharded_logical_axis(ts["tv1"], STREAM) == 1  # backward from tv2
    assert stream_allocated(ops, "tv1") is True
    assert stream_allocated(ops, "tv2") is False  # its use tv3 streams axis 0
    with pytest.raises(DomainError, match="no tensor 'nope'"):
        stream_allocated(ops, "nope")


# ------------------------------------------------------------------------------------------
# C. linear with DID + Stream
# ------------------------------------------------------------------------------------------


def test_C17_ColumnAndSequenceParallelLinear_Forward():
    d, t, h = 2, 4, 3
    m = Mesh.parse(f"x={d}")
    inp = did(TensorDomain.create("in", (t, h), mesh=m), 0, d)
    w = did(TensorDomain.create("w", (4 * h, h), mesh=m), 0, d)
    op = linear_op(inp, w, "out")
    op = op.with_domains(did(op.output, 0, d, STREAM))  # out has no mesh: the user only streams it
    (got,) = propagate_shardings([op])
    out = got.output
    assert [i.ptype for i in out.loop] == [STREAM, SERIAL, DIDx, SERIAL, SERIAL]  # [S(d), t/d, DIDx(d), 4h/d, r{h}]
    assert [i.extent for i in out.loop] == [d, t // d, d, 4 * h // d, h] and out.loop[4].is_reduction
    assert out.mesh == m and got.inputs == (inp, w)  # in's t is split already: no Stream for it
    assert IdGraph((got,)).mapped(w.loop[0], out.loop[2]).holds  # DIDx came from the weight
    (fin,) = propagate_shardings([op], reorder=True)
    assert [i.ptype for i in fin.output.loop] == [STREAM, DIDx, SERIAL, SERIAL, SERIAL]


def test_weight_is_the_reference_before_the_input():
    m = Mesh.parse("x=2")
    x = did(TensorDomain.create("x", (4, 6), mesh=m), 0, 2)  # M on x
    y = did(TensorDomain.create("y", (6, 8), mesh=m), 1, 2)  # N on x
    (op,) = propagate_shardings([matmul_op(x, y, "z")])
    assert sharded_logical_axis(op.output, DIDx) == 1 and len(op.output.device_ids()) == 1
    b = did(TensorDomain.create("b", (8,), mesh=m), 0, 2)  # linear: w, then the bias, then x
    (lin,) = propagate_shardings([linear_op(x, TensorDomain.create("w", (8, 6), mesh=m), "z", bias=b)])
    assert sharded_logical_axis(lin.output, DIDx) == 1


# ------------------------------------------------------------------------------------------
# A. the DID cases through the new pass: no overwrite of user shardings
# ------------------------------------------------------------------------------------------


def test_A1_PropagateSharding():
    m = Mesh.parse("x=3")
    a = TensorDomain.create("a", (3, 5, 3), mesh=m).parallelize(0, DIDx)
    b = TensorDomain.create("b", (3, 5, 3), mesh=m).parallelize(2, DIDx)
    (op,) = propagate_shardings([add_op([a, b], "c")])
    c = op.output
    assert c.mesh == m and c.loop[0].ptype == DIDx and len(c.device_ids()) == 1  # b's DIDx not added
    assert not have_different_shardings(a, c, op=op) and have_different_shardings(b, c, op=op)
    assert op.inputs == (a, b)


def test_A3_PropagateParallelTypeOnce():
    tv0 = did(TensorDomain.create("tv0", (4, 6)), 0, 2)
    tv1 = did(TensorDomain.create("tv1", (4, 6)), 1, 2)
    (op,) = propagate_shardings([add_op([tv0, tv1], "tv2")])
    assert loop(op.output) == ["tv2.0.o{2}@x", "tv2.0.i{2}", "tv2.1{6}"]


def test_A8_PropagationDoesNotOverwrite():
    tv0 = did(TensorDomain.create("tv0", (6, 4), mesh=MESH), 0, 3, DIDx)
    tv1 = did(TensorDomain.create("tv1", (6, 4), mesh=MESH), 0, 2, DIDy)
    set2 = set_op(tv1, "tv2")
    ops = propagate_shardings([set2, add_op([tv0, set2.output], "tv3")])
    tv2, tv3 = ops[0].output, ops[1].output
    assert tv2.loop[0].ptype == DIDy and tv3.loop[0].ptype == DIDx
    assert not any(i.ptype == DIDy for i in tv3.loop)  # logical i0 is already split: DIDy not added
    assert ops[1].inputs[1] == tv2 and loop(tv2) == ["tv2.0.o{2}@y", "tv2.0.i{3}", "tv2.1{4}"]  # backward kept it
    assert ops[0].inputs[0] == tv1 and ops[1].inputs[0] == tv0


def test_A5_A6_reshape_errors_through_the_new_pass():
    tv0 = did(TensorDomain.create("tv0", (6,), mesh=Mesh.parse("x=2")), 0, 2)
    with pytest.raises(DomainError, match="divisible by the split factor"):
        propagate_shardings([reshape_op(tv0, (3, 2), "tv1")])
    tv0 = did(TensorDomain.create("tv0", (3, 10), mesh=Mesh.parse("x=2")), 1, 2)
    with pytest.raises(DomainError, match="sharding to be on the outer reshaped ID"):
        propagate_shardings([reshape_op(tv0, (30,), "tv1")])


# ------------------------------------------------------------------------------------------
# the other rules
# ------------------------------------------------------------------------------------------


def test_fusion_inputs_receive_only_stream():
    tv0 = did(TensorDomain.create("tv0", (6, 4), mesh=MESH), 1, 2, DIDy)  # user-sharded fusion input
    free = TensorDomain.create("free", (6, 4))  # fusion input, no mesh
    op = add_op([tv0, free], "tv1")
    tv1 = did(did(op.output.with_mesh(MESH), 0, 3, DIDx), 1, 2, STREAM)  # [DIDx(3), S(2), 1, 4]: user-sharded
    (got,) = propagate_shardings([op.with_domains(tv1)])
    new0, new_free = got.inputs
    assert got.output == tv1
    assert [i.ptype for i in new0.loop] == [SERIAL, STREAM, SERIAL, DIDy, SERIAL]  # the split by 3 is replayed
    assert new0.device_ids() == tv0.device_ids()
    assert sharding_of(new0, MESH).without_stream() == sharding_of(tv0, MESH)  # Stream changes no placement
    assert str(sharding_of(new0, MESH)) == "[3*~2, y*2]"  # the Stream ID, after the replayed split by 3
    assert new_free.loop[1].ptype == STREAM and not new_free.device_ids()  # never a DID from propagation
    assert new_free.mesh == MESH  # meshes back-propagate (nvFuser), the tensor is replicated on it


def test_reduction_DID_does_not_block_and_backward_reaches_intermediates():
    """nvFuser's reduce-scatter: s = [i0, r{DIDx(d)}, r{i1/d}] may still take DIDx on i0."""
    m = Mesh.parse("x=2")
    a = did(TensorDomain.create("a", (4, 6), mesh=m), 1, 2)
    s = sum_op(a, [1], "s")
    c = set_op(s.output, "c")
    ops = propagate_shardings([s, c.with_domains(did(c.output.with_mesh(m), 0, 2))])
    sd = ops[0].output
    assert loop(sd) == ["s.0.o{2}@x", "s.0.i{2}", "rs.1.o{2}@x", "rs.1.i{3}"]
    assert have_different_shardings(sd, ops[1].output, op=ops[1]) is False
    assert is_resharding(ops[0])  # the reduce-scatter itself
    assert ops[0].inputs[0] == a  # a user-sharded fusion input takes no DID


def test_backward_carries_a_reduction_DID_to_the_contracted_dim():
    """nvFuser's rule: r{DIDx} does not count as present, and backward it reaches the operands' K."""
    m = Mesh.parse("x=2")
    x0, y0 = TensorDomain.create("x0", (4, 6), mesh=m), TensorDomain.create("y0", (6, 8), mesh=m)
    sx, sy = set_op(x0, "x"), set_op(y0, "y")
    mm = matmul_op(sx.output, sy.output, "z")
    z = did(mm.output.with_mesh(m), 2, 2)  # the user asks for a partial sum: [M, N, r{DIDx(2)}, r{3}]
    ops = propagate_shardings([sx, sy, mm.with_domains(z)])
    assert sharded_logical_axis(ops[0].output, DIDx) == 1 and sharded_logical_axis(ops[1].output, DIDx) == 0
    r = is_resharding(ops[2])  # K sharded alike in x, y and z: the only communication is z's reduction
    assert r and all("allreduce over x" in why for why in r.reasons)
    assert not ops[0].inputs[0].device_ids()  # the fusion inputs take no DID: set reshards them


def test_scatter_outputs_are_skipped():
    m = Mesh.parse("x=2")
    x = did(TensorDomain.create("x", (4, 6), mesh=m), 0, 2)
    idx, src = TensorDomain.create("i", (2, 6)), TensorDomain.create("s", (2, 6))
    op = scatter_op(x, 0, idx, src, "y")
    use = set_op(op.output, "z")
    ops = propagate_shardings([op, use.with_domains(did(use.output, 1, 2, STREAM))])
    y = ops[0].output
    assert y.loop == op.output.loop and y.mesh == m  # neither forward nor backward splits it; the mesh arrives
    with pytest.raises(DomainError, match="src the index's shape"):
        scatter_op(x, 0, idx, TensorDomain.create("s", (3, 6)), "y")


def test_mesh_must_have_the_axis_with_the_same_size():
    a = did(TensorDomain.create("a", (6, 4), mesh=Mesh.parse("x=2")), 0, 2)
    a = did(a, 2, 2, STREAM)
    op = set_op(a, "b")
    other = op.output.with_mesh(Mesh.parse("x=3"))
    (got,) = propagate_shardings([op.with_domains(other)], user_sharded=["a"])  # b may receive
    assert not got.output.device_ids() and sharded_logical_axis(got.output, STREAM) == 1  # Stream needs no mesh


def test_2d_sharding_of_one_dim_crosses_as_a_whole():
    a = TensorDomain.create("a", (12, 5), mesh=MESH)
    a = did(did(a, 0, 2, DIDy), 1, 3, DIDx)  # [DIDy(2), DIDx(3), 2, 5]
    (op,) = propagate_shardings([set_op(a, "b")])
    assert [i.ptype for i in op.output.loop] == [DIDy, DIDx, SERIAL, SERIAL] and not is_resharding(op)
    (op,) = propagate_shardings([reshape_op(a, (6, 2, 5), "r")])  # 12 = [6, 2]: both land on the 6
    assert [(i.extent, i.ptype) for i in op.output.loop[:3]] == [(2, DIDy), (3, DIDx), (1, SERIAL)]
    assert not is_resharding(op)


def test_backward_through_a_reshape():
    x = TensorDomain.create("x", (4, 6))
    op = reshape_op(x, (24,), "y")
    (got,) = propagate_shardings([op.with_domains(did(op.output, 0, 2, STREAM))])
    assert loop(got.inputs[0]) == ["x.0.o{2}@stream", "x.0.i{2}", "x.1{6}"]  # merge(4, 6) split by 2 = 4 by 2
    op = reshape_op(TensorDomain.create("x", (3, 8)), (24,), "y")
    with pytest.raises(DomainError, match="make 2 divide 3"):
        propagate_shardings([op.with_domains(did(op.output, 0, 2, STREAM))])


def test_reorder_parallelized_to_front():
    td = TensorDomain.create("t", (6, 4, 6), mesh=MESH)
    td = did(did(did(td, 0, 3, DIDx), 2, 2, STREAM), 4, 2, DIDy)  # [x3, 2, S2, 2, y2, 3]
    r = reorder_parallelized_to_front(td)
    assert [i.ptype for i in r.loop] == [STREAM, DIDy, DIDx, SERIAL, SERIAL, SERIAL]  # Stream < DIDy < DIDx
    assert {k: sorted(v) for k, v in held(r, MESH).items()} == {k: sorted(v) for k, v in held(td, MESH).items()}
    flipped = reorder_parallelized_to_front(td, Mesh.parse("x=3,y=2"))  # DIDx is the last mesh axis
    assert [i.ptype for i in flipped.loop[:3]] == [STREAM, DIDx, DIDy]


def test_have_different_shardings_checks_its_operands():
    a = TensorDomain.create("a", (4, 6))
    op = set_op(a, "b")
    with pytest.raises(DomainError, match="pass the op that relates them"):
        have_different_shardings(op.output, a, op=op)
    with pytest.raises(DomainError, match="no set of a .*pass the op"):
        have_different_shardings(a, TensorDomain.create("c", (4, 7)), {STREAM})
    with pytest.raises(DomainError, match="not a ParallelType or Kind"):
        have_different_shardings(a, op.output, {"stream"})
    on_mesh = op.output.with_mesh(Mesh.parse("x=2"))
    assert have_different_shardings(a, on_mesh, {DIDx}) and not have_different_shardings(a, on_mesh, {STREAM})


# ------------------------------------------------------------------------------------------
# properties on random programs
# ------------------------------------------------------------------------------------------


@st.composite
def placed(draw, td: TensorDomain) -> TensorDomain:
    """Random Stream / DIDx / DIDy outer splits of ``td``'s dims, at most one of each type."""
    free = [STREAM, DIDx, DIDy]
    for lid in [i for i in td.logical if not i.is_reduction]:
        p = draw(st.sampled_from(free + [None, None]))
        if p is None or lid.id not in {i.id for i in td.loop}:
            continue
        factor = {STREAM: 2, DIDx: 3, DIDy: 2}[p]
        td = did(td, td.position(lid.id), factor, p)
        free.remove(p)
    if any(i.ptype.is_device for i in td.loop) or draw(st.booleans()):
        td = td.with_mesh(MESH)
    return td


@st.composite
def programs(draw):
    """Up to 4 ops (set, add, sum, matmul, linear, reshape) over [6|12, 6|12] inputs with random
    placements; some outputs are user-sharded."""
    names = iter(f"t{k}" for k in range(100))
    made: list = []

    def new_input(shape):
        td = draw(placed(TensorDomain.create(next(names), shape)))
        made.append(td)
        return td

    dim = st.sampled_from([6, 12])
    new_input((draw(dim), draw(dim)))
    ops = []
    for _ in range(draw(st.integers(1, 4))):
        a = draw(st.sampled_from(made))
        kind = draw(st.sampled_from(["set", "add", "sum", "matmul", "linear", "reshape"]))
        name = next(names)
        if kind == "set":
            op = set_op(a, name)
        elif kind == "add":
            same = [t for t in made if t.shape == a.shape]
            op = add_op([a, draw(st.sampled_from(same))], name)
        elif kind == "sum" and len(a.shape) == 2:
            op = sum_op(a, draw(st.integers(0, 1)), name)
        elif kind == "matmul" and len(a.shape) == 2:
            ws = [t for t in made if len(t.shape) == 2 and t.shape[0] == a.shape[1]]
            w = draw(st.sampled_from(ws)) if ws and draw(st.booleans()) else new_input((a.shape[1], draw(dim)))
            op = matmul_op(a, w, name)
        elif kind == "linear" and len(a.shape) == 2:
            op = linear_op(a, new_input((draw(dim), a.shape[1])), name)
        elif kind == "reshape" and len(a.shape) == 2:
            op = reshape_op(a, draw(st.sampled_from([(a.shape[0] * a.shape[1],), a.shape[::-1]])), name)
        else:
            op = set_op(a, name)
        if draw(st.integers(0, 3)) == 0:
            op = op.with_domains(draw(placed(op.output)))
        ops.append(op)
        made.append(op.output)
    return ops


def _mapped_in_neighbour(ops, name: str, iid) -> bool:
    for op in ops:
        if op.output.name == name:
            others = [t for t in op.inputs]
        elif name in {t.name for t in op.inputs}:
            others = [op.output]
        else:
            continue
        g = IdGraph((op,))
        if any(j.ptype == iid.ptype and g.mapped(iid, j) for t in others for j in t.loop):
            return True
    return False


@settings(max_examples=120)
@given(programs())
def test_every_added_ID_copies_a_neighbour_and_user_shardings_stay(ops):
    before = tensors(ops)
    try:
        after = propagate_shardings(ops)
    except DomainError as e:  # a device split that does not survive a reshape: refused with nvFuser's reasons
        assert "reshape" in str(e) or "merge" in str(e), str(e)
        return
    got = tensors(after)
    produced = {op.output.name for op in ops}
    user = {n for n, t in before.items() if t.mesh is not None or t.device_ids()}
    for name, old in before.items():
        new = got[name]
        assert new.logical == old.logical or [i.id for i in new.logical] == [i.id for i in old.logical]
        if name in user and name in produced:
            assert new == old, name  # never overwritten
        if name not in produced:  # fusion inputs: only Stream IDs are added
            assert new.device_ids() == old.device_ids(), name
            assert new.mesh == old.mesh or old.mesh is None
        kept = {i.id: i.ptype for i in old.loop}
        added = [i for i in new.loop if i.ptype != SERIAL and kept.get(i.id) != i.ptype]
        assert all(kept.get(i.id, SERIAL) == SERIAL for i in added), name  # a parallel ID is never re-typed
        for i in added:
            assert _mapped_in_neighbour(after, name, i), (name, str(i), [str(t) for t in got.values()])
        types = [i.ptype for i in new.loop if i.ptype != SERIAL and not i.is_reduction]
        assert len(types) == len(set(types)), str(new)  # each parallel type once


@settings(max_examples=80)
@given(shardings(uneven=True, partial=False), st.data())
def test_a_stream_split_never_moves_an_element_between_ranks(s, data):
    """Stream is no mesh axis: splitting a serial loop ID on Stream keeps what every rank holds,
    and ``sharding_of`` reads the Stream ID as a local factor (the same Sharding back)."""
    try:
        td = loop_domain_of(s)
    except DomainError:
        assume(False)
    serial = [k for k, i in enumerate(td.loop) if i.ptype == SERIAL and not i.is_reduction]
    assume(serial)
    pos = data.draw(st.sampled_from(serial))
    factor = data.draw(st.integers(1, 4))
    streamed = td.outer_split(pos, factor).parallelize(pos, STREAM)
    assume(loop_size(streamed) <= 2000)
    want = {r: sorted(v) for r, v in expected_held(s).items()}
    assert {r: sorted(v) for r, v in held(streamed, s.mesh).items()} == want
    try:
        back = sharding_of(streamed, s.mesh)
    except DomainError as e:  # an uneven Stream split of an uneven dim may read as no torch.chunk
        assert "torch.chunk" in str(e) or "chain" in str(e) or "stream cuts an even dim" in str(e), str(e)
        return
    assert back.without_stream() == s
    assert (back.stream[2] if back.stream else 1) == factor  # the Stream ID is the Sharding's stream


def test_a_tensor_used_twice_by_one_op_splits_each_target_ID_once():
    a = did(did(TensorDomain.create("a", (6, 4), mesh=MESH), 0, 3), 2, 2, STREAM)  # [DIDx(3), 2, S(2), 2]
    (op,) = propagate_shardings([add_op([a, a], "z")])
    assert [i.ptype for i in op.output.loop] == [DIDx, SERIAL, STREAM, SERIAL]
    sq = did(did(TensorDomain.create("sq", (6, 6), mesh=MESH), 0, 3), 2, 2, STREAM)  # sq @ sq: M and N
    (mm,) = propagate_shardings([matmul_op(sq, sq, "z")])
    assert [(i.extent, i.ptype) for i in mm.output.loop] == [(3, DIDx), (2, SERIAL), (2, STREAM), (3, SERIAL),
                                                            (6, SERIAL)]


def test_a_stream_on_an_output_dim_and_on_its_reduction_reaches_an_input_once():
    """t1 = t0 @ t2 with t2's K on Stream (so t1's reduction ID carries it) and t1 then streamed on
    M by its user: going back, both Stream IDs tie to t0 (K and M); t0 takes the first one only —
    each parallel type once per tensor (hypothesis found the case)."""
    t0 = TensorDomain.create("t0", (6, 12))
    t2 = did(did(TensorDomain.create("t2", (12, 6), mesh=MESH), 0, 2, STREAM), 2, 3)  # [S(2), 6, DIDx(3), 2]
    mm = matmul_op(t0, t2, "t1")
    out = set_op(mm.output, "t3")
    t3 = did(did(out.output.with_mesh(MESH), 0, 2, STREAM), 2, 3)
    got = tensors(propagate_shardings([mm, out.with_domains(out.inputs[0], t3)]))
    for t in got.values():
        types = [i.ptype for i in t.loop if i.ptype != SERIAL and not i.is_reduction]
        assert len(types) == len(set(types)), str(t)
    assert [i.ptype for i in got["t0"].loop].count(STREAM) == 1


# -- meshes compared on the parallel types they have (nvFuser's haveDifferentShardings) ----------


def test_different_meshes_differ_only_on_a_type_one_of_them_has():
    a = TensorDomain.create("a", (4, 6), mesh=Mesh.parse("x=2"))
    b = set_op(a, "b").output.with_mesh(Mesh.parse("x=4"))
    c = set_op(a, "c").output.with_mesh(Mesh.parse("y=2"))
    assert have_different_shardings(a, b, {DIDx}) is True  # x is on both meshes, which differ
    assert have_different_shardings(a, b, {DIDy}) is False  # neither mesh has y
    assert have_different_shardings(a, b, {STREAM}) is False  # Stream is no mesh axis
    assert have_different_shardings(a, c, {DIDy}) is True  # c's mesh has y
    assert have_different_shardings(a, b) is True  # by default every axis of either mesh
    same = set_op(a, "d").output.with_mesh(Mesh.parse("x=2"))
    assert have_different_shardings(a, same) is False


# -- a factory (no tensor input) gets its sharding backward from its users ------------------------


def test_a_factory_output_takes_its_users_sharding_backward():
    """nvFuser's ShardingTest.ResidualAdd: tv1 = uniform(shape(tv0)); tv2 = tv0 + tv1; only tv0 is
    sharded. Forward gives tv2 tv0's DIDx; backward carries it (and the mesh) to tv1."""
    m = Mesh.parse("x=2")
    tv0 = did(TensorDomain.create("tv0", (4, 6), mesh=m), 0, 2)
    make = factory_op((4, 6), "tv1")
    ops = propagate_shardings([make, add_op([tv0, make.output], "tv2")])
    tv1, tv2 = ops[0].output, ops[1].output
    assert tv1.mesh == m and tv2.mesh == m
    assert sharded_logical_axis(tv1, DIDx) == sharded_logical_axis(tv0, DIDx) == 0
    assert loop(tv1) == ["tv1.0.o{2}@x", "tv1.0.i{2}", "tv1.1{6}"]
    assert not is_resharding(ops[0]) and not is_resharding(ops[1])
    assert sharding_of(tv1, m) == sharding_of(tv0, m)


def test_a_factory_user_sharded_keeps_its_sharding():
    m = Mesh.parse("x=2")
    tv0 = did(TensorDomain.create("tv0", (4, 6), mesh=m), 0, 2)
    make = factory_op((4, 6), "u", mesh=m)  # placed by the user: replicated on the mesh
    ops = propagate_shardings([make, add_op([tv0, make.output], "z")])
    assert loop(ops[0].output) == ["u.0{4}", "u.1{6}"]
    assert is_resharding(ops[1])  # z takes tv0's DIDx; u is replicated: no communication, but a slice


def test_factory_ops_are_checked():
    x = TensorDomain.create("x", (4,))
    with pytest.raises(DomainError, match="a factory has no tensor input"):
        Op(OpKind.FACTORY, (x,), TensorDomain.create("y", (4,)))
    with pytest.raises(DomainError, match="needs at least one input"):
        Op(OpKind.SET, (), TensorDomain.create("y", (4,)))
    with pytest.raises(DomainError, match="plain dims only"):
        Op(OpKind.FACTORY, (), TensorDomain.create("y", (4, 2), reductions=[1]))


def test_a_pending_partial_sum_is_reduced_by_its_use():
    """A partial ID (the per-device sums before a reduction) set into a plain tensor is an allreduce."""
    m = Mesh.parse("x=2")
    p = loop_domain_of(Sharding.parse("[4, 6] +sum(x)", m), "p")
    r = is_resharding(set_op(p, "q").with_domains(set_op(p, "q").output.with_mesh(m)))
    assert r and "holds partial sums over x" in r.reasons[0]
