"""IterDomain transforms, index maps, and the loop domain of a Sharding (both ways).

The brute-force helpers here (``held``, ``id_values``) read a TensorDomain by enumerating
its loop domain; the other domain tests reuse them.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardlayout import Mesh, Sharding
from shardlayout.domain import (
    SERIAL,
    STREAM,
    IterDomain,
    Merge,
    ParallelType,
    Resize,
    TensorDomain,
    cat,
    index_map,
    loop_domain_of,
    loop_indices,
    merge,
    resize,
    root_index,
    sharded_logical_axis,
    sharding_of,
    split,
)
from shardlayout.domain.iterdomain import _ceil_div, _div_exact, _mul, divides, equal
from shardlayout.errors import DomainError, ShardingError
from shardlayout.sharding import Factor
from shardlayout.sharding.factors import factor_digit

from ..sharding.strategies import shardings

X = ParallelType.device("x")

# ------------------------------------------------------------------------------------------
# brute force
# ------------------------------------------------------------------------------------------


def loop_size(td: TensorDomain) -> int:
    n = 1
    for i in td.loop:
        n *= i.extent
    return n


def id_values(td: TensorDomain, iid) -> dict:
    """Root index tuple -> the value of loop ID ``iid`` at that element (holes skipped)."""
    key = iid.id if isinstance(iid, IterDomain) else iid
    pos = td.position(key)
    f = index_map(td)
    out = {}
    for li in loop_indices(td):
        logical = f(li)
        if logical is None:
            continue
        root = root_index(td, logical)
        if root is not None:
            out[root] = li[pos]
    return out


def held(td: TensorDomain, mesh: Mesh) -> dict:
    """rank -> the logical index tuples of the tensor's dims it holds, in loop order. A reduction ID on a
    device (``r{DIDx}``: already summed) and a partial ID (each device's partial sum of every element)
    choose no elements."""
    keep = [k for k, i in enumerate(td.logical) if not (i.is_reduction or i.is_partial)]
    dev = [(k, i.ptype) for k, i in enumerate(td.loop) if i.ptype.is_device and not (i.is_reduction or i.is_partial)]
    f = index_map(td)
    by_key: dict = {}
    for li in loop_indices(td):
        logical = f(li)
        if logical is not None:
            by_key.setdefault(tuple(li[k] for k, _ in dev), []).append(tuple(logical[k] for k in keep))
    out = {}
    for r in mesh.ranks():
        coord = mesh.coord(r)
        key = tuple(factor_digit(mesh, Factor(p.axis_size(mesh), p.axis, p.pre), coord) for _, p in dev)
        out[r] = list(dict.fromkeys(by_key.get(key, [])))  # a reduction / partial ID repeats every element
    return out


def expected_held(s: Sharding) -> dict:
    return {r: list(itertools.product(*(map(int, ix) for ix in s.indices(r)))) for r in s.mesh.ranks()}


# ------------------------------------------------------------------------------------------
# transforms
# ------------------------------------------------------------------------------------------


def test_split_extents_follow_nvfuser_ceil_div():
    i = IterDomain("t.0", 10)
    o = split(i, 4, inner=False)
    n = split(i, 4, inner=True)
    assert (o.outer.extent, o.inner.extent) == (4, 3)
    assert (n.outer.extent, n.inner.extent) == (3, 4)
    # zasdfgbnm's remark on #3987: split(5, 100, outer) is [100, 1], split(5, 1, inner) is [5, 1]
    assert [x.extent for x in split(IterDomain("t.0", 5), 100, False).outputs] == [100, 1]
    assert [x.extent for x in split(IterDomain("t.0", 5), 1, True).outputs] == [5, 1]


def test_merge_resize_and_cat_records():
    a, b = IterDomain("t.0", 3), IterDomain("t.1", 10)
    m = merge(a, b)
    assert isinstance(m, Merge) and m.output.extent == 30 and m.inputs == (a, b)
    r = resize(IterDomain("t.2", 8), -2, -1, "slice")
    assert isinstance(r, Resize) and r.output.extent == 5 and r.kind == "slice"
    assert resize(IterDomain("t.2", 8), 1, 2).output.extent == 11
    out = IterDomain("o.0", 9)
    rs = cat([IterDomain("x.0", 4), IterDomain("y.0", 5)], out)
    assert [(x.input.id, x.output.id, x.left, x.right) for x in rs] == [("o.0", "x.0", 0, -5), ("o.0", "y.0", -4, 0)]
    with pytest.raises(DomainError, match="add up to 9, not 10"):
        cat([IterDomain("x.0", 4), IterDomain("y.0", 5)], IterDomain("o.0", 10))
    with pytest.raises(DomainError, match="keep at least one element"):
        resize(IterDomain("t.2", 3), -2, -1)


def test_index_map_pads_holes_and_inverts_merges():
    td = TensorDomain.create("t", (10,)).outer_split(0, 4)
    f = index_map(td)
    assert [f((3, k)) for k in range(3)] == [(9,), None, None]
    td2 = TensorDomain.create("t", (3, 4)).merge(0).inner_split(0, 5)
    f2 = index_map(td2)
    assert f2((0, 4)) == (1, 0) and f2((2, 1)) == (2, 3) and f2((2, 2)) is None
    with pytest.raises(DomainError, match="outside the loop extents"):
        f2((3, 0))


@st.composite
def transformed(draw):
    """A random 1-3 dim TensorDomain with random splits and merges of its loop domain."""
    shape = tuple(draw(st.integers(1, 7)) for _ in range(draw(st.integers(1, 3))))
    td = TensorDomain.create("t", shape)
    for _ in range(draw(st.integers(0, 4))):
        pos = draw(st.integers(0, len(td.loop) - 1))
        if draw(st.booleans()) and pos + 1 < len(td.loop):
            td = td.merge(pos)
        else:
            td = td.split(pos, draw(st.integers(1, 5)), draw(st.booleans()))
    return td


@settings(max_examples=80)
@given(transformed())
def test_index_map_is_a_bijection_from_non_holes_to_logical(td):
    assume(loop_size(td) <= 4000)
    f = index_map(td)
    hits = [f(li) for li in loop_indices(td)]
    real = [h for h in hits if h is not None]
    assert sorted(real) == list(itertools.product(*(range(i.extent) for i in td.logical)))


def test_tensor_domain_checks_positions_and_types():
    td = TensorDomain.create("t", (8, 12))
    with pytest.raises(DomainError, match="outside the loop domain of 2 IDs"):
        td.outer_split(2, 2)
    with pytest.raises(DomainError, match="no loop ID after it"):
        td.merge(1)
    with pytest.raises(DomainError, match="not a ParallelType"):
        td.parallelize(0, "tp")
    with pytest.raises(DomainError, match="split it by 4 first"):
        td.with_mesh(Mesh.parse("tp=4")).parallelize(0, ParallelType.device("tp"))
    with pytest.raises(DomainError, match="it was split or merged already"):
        td.outer_split(0, 2).position("t.0")
    with pytest.raises(DomainError, match="positive int"):
        IterDomain("t.0", 0)
    with pytest.raises(DomainError, match="only a device"):
        ParallelType(axis="tp")
    assert issubclass(DomainError, ShardingError)


def test_parallelize_keeps_ids_and_marks():
    td = TensorDomain.create("t", (4, 6), reductions=[1]).outer_split(0, 2)
    td = td.parallelize(0, ParallelType.device("x")).parallelize(1, STREAM)
    assert [str(i) for i in td.loop] == ["t.0.o{2}@x", "t.0.i{2}@stream", "rt.1{6}"]
    assert td.shape == (4,) and td.loop[2].is_reduction and td.loop[1].ptype != SERIAL
    assert td.current("t.0.o").ptype == ParallelType.device("x")
    assert str(ParallelType.device("tp", 2, 2)) == "tp:(2)2"


def test_helpers_are_int_exact():
    assert _ceil_div(7, 2) == 4 and _mul(3, 4) == 12 and _div_exact(12, 4) == 3
    assert divides(2, 6) is True and divides(4, 6) is False and equal(3, 3) is True
    with pytest.raises(DomainError, match="not divisible"):
        _div_exact(7, 2)



def test_helpers_take_symbolic_extents_and_facts():
    from shardlayout.symbolic import FactBase, sym

    n = sym("n")
    facts = FactBase().assume("n % 4 == 0")
    assert divides(2, 4 * n) is True and divides(4, 2 * n) is None and divides(4, 2 * n, facts) is True
    assert equal(n + n, 2 * n) is True and equal(n, n + 1) is False and equal(n, sym("m")) is None
    assert str(_ceil_div(4 * n, 4)) == "n" and _div_exact(4 * n, 2) == 2 * n
    td = TensorDomain.create("t", (4 * n,)).outer_split(0, 2).inner_split(1, 2)
    assert [str(i.extent) for i in td.loop] == ["2", "n", "2"]
    with pytest.raises(DomainError, match="bind the symbols first"):
        index_map(td)


# ------------------------------------------------------------------------------------------
# Sharding <-> loop domain
# ------------------------------------------------------------------------------------------


def test_loop_domain_of_design_example():
    m = Mesh.parse("dp=2,tp=4")
    s = Sharding.parse("[dp*4*tp:(1)2, tp:(2)2*3]", m)
    td = loop_domain_of(s, "x")
    assert [str(i) for i in td.loop] == ["x.0.o{2}@dp", "x.0.i.o{4}", "x.0.i.i{2}@tp:(1)2",
                                         "x.1.o{2}@tp:(2)2", "x.1.i{3}"]
    assert sharding_of(td, m) == s
    assert held(td, m) == expected_held(s)


def test_a_pending_partial_sum_is_a_partial_id_not_a_reduction_id():
    m = Mesh.parse("dp=2,tp=2")
    s = Sharding.parse("[dp*3] +sum(tp)", m)
    td = loop_domain_of(s)
    assert [str(i) for i in td.loop] == ["t.0.o{2}@dp", "t.0.i{3}", "pt.1{2}@tp"]
    assert td.shape == (6,) and sharding_of(td, m) == s
    assert held(td, m) == expected_held(s)
    with pytest.raises(DomainError, match="only a pending sum"):
        loop_domain_of(Sharding.parse("[dp*3] +max(tp)", m))
    with pytest.raises(DomainError, match="partial ID"):  # a partial sum held on a sub-axis is no Sharding
        sharding_of(TensorDomain.create("p", (6, 2), mesh=m, partials=[1]).outer_split(1, 2)
                    .parallelize(1, ParallelType.device("tp", 1, 2)), m)
    with pytest.raises(DomainError, match="neither a reduction"):
        IterDomain("t.0", 2, is_partial=True, is_reduction=True)


# nvFuser's ShardingTest.Allreduce / ReductionScatter / MultipleDIDx: r{DIDx} is reduced, hence replicated
def _summed(scatter: bool) -> TensorDomain:
    m = Mesh.parse("x=2")
    y = TensorDomain.create("y", (2, 6), mesh=m, reductions=[0]).parallelize(0, X)  # y = sum(x [DIDx{2}, 6], {0})
    return y.outer_split(1, 2).parallelize(1, X) if scatter else y


def test_a_device_reduction_id_is_reduced_and_replicated():
    m = Mesh.parse("x=2")
    allreduced, scattered = _summed(False), _summed(True)
    assert [str(i) for i in scattered.loop] == ["ry.0{2}@x", "y.1.o{2}@x", "y.1.i{3}"]
    assert not allreduced.is_sharded() and scattered.is_sharded()
    assert sharding_of(allreduced, m) == Sharding.parse("[6]", m)  # the allreduce's output: every rank has it all
    assert sharding_of(scattered, m) == Sharding.parse("[x*3]", m)  # the reduce-scatter's: rank r has its half
    for td in (allreduced, scattered):  # brute force over the loop domain agrees rank by rank
        assert held(td, m) == expected_held(sharding_of(td, m))
    assert sharded_logical_axis(allreduced, X) is None and sharded_logical_axis(scattered, X) == 0


def test_two_loop_ids_on_one_device_type_is_an_error():
    twice = TensorDomain.create("t", (4,), mesh=Mesh.parse("x=2")).outer_split(0, 2).parallelize(0, X)
    with pytest.raises(DomainError, match="both run on x"):
        twice.parallelize(1, X).is_sharded()


@settings(max_examples=120)
@given(shardings(uneven=False, partial=False))
def test_even_shardings_round_trip(s):
    td = loop_domain_of(s)
    assert sharding_of(td, s.mesh) == s
    axis_factors = [f for fs in s.dims for f in fs if f.axis is not None]
    assert [(i.extent, i.ptype.axis) for i in td.device_ids()] == [(f.size, f.axis) for f in axis_factors]


@settings(max_examples=60)
@given(shardings(uneven=False, partial=False))
def test_even_loop_domains_hold_what_the_sharding_holds(s):
    td = loop_domain_of(s)
    assume(loop_size(td) <= 3000)
    assert held(td, s.mesh) == expected_held(s)


@settings(max_examples=120)
@given(shardings(uneven=True, partial=False))
def test_uneven_shardings_are_exact_or_refused(s):
    """An uneven dim is either cut by the padded splits exactly as torch.chunk cuts it (then
    every rank holds the same elements) or refused with the reason."""
    try:
        td = loop_domain_of(s)
    except DomainError as e:
        assert "torch.chunk" in str(e) or "strided uneven" in str(e)
        return
    assert sharding_of(td, s.mesh) == s
    if loop_size(td) <= 3000:
        assert held(td, s.mesh) == expected_held(s)


def test_uneven_cases_from_design():
    m = Mesh.parse("x=2,y=2")
    # 9 elements [S(0), S(0)] on 2x2: torch.chunk gives [0,1,2] [3,4] [5,6] [7,8], padding would not
    with pytest.raises(DomainError, match="torch.chunk"):
        loop_domain_of(Sharding.from_placements(m, (9,), ["S(0)", "S(0)"]))
    # one uneven cut is the padded split exactly: 10 on 4 -> 3, 3, 3, 1
    s = Sharding(Mesh.parse("x=4"), (10,), [["x"]])
    td = loop_domain_of(s)
    assert held(td, s.mesh) == expected_held(s)
    assert [len(v) for v in held(td, s.mesh).values()] == [3, 3, 3, 1]


def test_sharding_of_refuses_what_no_sharding_says():
    m = Mesh.parse("x=2,y=3")
    x = ParallelType.device("x")
    two = TensorDomain.create("t", (4, 6)).outer_split(0, 2).outer_split(2, 2).parallelize(0, x).parallelize(2, x)
    with pytest.raises(DomainError, match="both on mesh axis 'x'"):
        sharding_of(two, m)
    merged = TensorDomain.create("t", (4, 6)).merge(0).outer_split(0, 2).parallelize(0, x)
    with pytest.raises(DomainError, match="under merge"):
        sharding_of(merged, m)
    wrong = TensorDomain.create("t", (6,)).outer_split(0, 3).parallelize(0, x)
    with pytest.raises(DomainError, match="extent 3 but x spans 2"):
        sharding_of(wrong, m)
    tree = TensorDomain.create("t", (7,)).outer_split(0, 2).outer_split(0, 2).parallelize(0, x)
    with pytest.raises(DomainError, match="tree, not a chain"):
        sharding_of(tree, m)
    overlap = (TensorDomain.create("t", (4, 4)).outer_split(0, 2).outer_split(2, 2)
               .parallelize(0, ParallelType.device("y", 1, 2)))
    with pytest.raises(DomainError):
        sharding_of(overlap, m)


def test_serial_merges_and_stream_ids_read_as_local():
    m = Mesh.parse("x=2")
    td = (TensorDomain.create("t", (4, 3)).outer_split(0, 2).parallelize(0, ParallelType.device("x"))
          .merge(1).parallelize(1, STREAM))
    s = sharding_of(td, m)
    assert str(s) == "[x*2, 3]"


def test_inner_split_on_device_reads_as_a_strided_sharding():
    m = Mesh.parse("x=4")
    td = TensorDomain.create("t", (12,)).inner_split(0, 4).parallelize(1, ParallelType.device("x"))
    s = sharding_of(td, m)
    assert str(s) == "[3*x]"
    assert held(td, m) == expected_held(s)
    # uneven inner split: 10 = [3, 4] padded, torch.chunk of 10 by 3 then each by 4 agrees
    td = TensorDomain.create("t", (10,)).inner_split(0, 4).parallelize(1, ParallelType.device("x"))
    s = sharding_of(td, m)
    assert held(td, m) == expected_held(s)


# ------------------------------------------------------------------------------------------
# Stream: a Sharding's stream factor is a Stream ID of its loop domain, and back
# ------------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_a_stream_factor_is_a_stream_id_covering_its_chunks_and_reads_back(data):
    """For random even shardings with a stream ``~k`` anywhere it cuts local factors only: the loop
    domain has one Stream ID of extent k, walking the domain's index map with the Stream index at
    ``j`` covers exactly chunk ``j``'s positions (``execute.stream.chunk_positions_global``, an
    independent formula), and ``sharding_of`` gives the same Sharding back, stream included."""
    from shardlayout.domain.iterdomain import Kind
    from shardlayout.execute.stream import chunk_positions_global
    from shardlayout.sharding.factors import stream_cut

    mesh = Mesh.parse(data.draw(st.sampled_from(["x=2", "x=2,y=3", "x=4"]), label="mesh"))
    s = data.draw(shardings(mesh, max_ndim=2, uneven=False, partial=False), label="s")
    d = data.draw(st.integers(0, s.ndim - 1), label="d")
    fs, n = s.dims[d], s.shape[d]
    options = [(outer, k) for k in (2, 3, 4) for outer in range(1, n + 1)
               if n % (outer * k) == 0 and stream_cut(fs, n, outer, k) is not None]
    assume(options)
    outer, k = data.draw(st.sampled_from(options), label="outer, k")
    streamed = Sharding(mesh, s.shape, s.dims, s.partial, (d, outer, k))
    td = loop_domain_of(streamed, "t")
    at = [i for i, x in enumerate(td.loop) if x.ptype.kind is Kind.STREAM]
    assert len(at) == 1 and td.loop[at[0]].extent == k
    f = index_map(td)
    chunks = chunk_positions_global(streamed)
    for j in range(k):
        covered = {f(ix)[d] for ix in loop_indices(td) if ix[at[0]] == j}
        assert covered == set(chunks[j].tolist())
    assert sharding_of(td, mesh) == streamed and sharding_of(td, mesh).stream == (d, outer, k)


def test_two_stream_ids_are_refused_naming_the_fix():
    m = Mesh.parse("x=2")
    td = TensorDomain.create("t", (8, 4), mesh=m).outer_split(0, 2).parallelize(0, STREAM).parallelize(2, STREAM)
    with pytest.raises(DomainError, match="one stream"):
        sharding_of(td, m)
