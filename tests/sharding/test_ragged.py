"""The ragged dim of a Sharding (``sharding.ragged``) against an independent oracle: a nested
tensor as a dict of numpy blocks ``{(component, source): rows}``; a rank's piece is the blocks of
the components it holds (``Sharding.indices`` on the component dim) and of its source (its
coordinates on the ragged dim's mesh axes, outermost first; every source without one), cut to its
dense indices, stored component-major then source. Moves planned by ``plan_move`` and run block by
block (``ragged_collective_piece``) must land exactly there on every rank."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from shardlayout.mesh import Mesh
from shardlayout.sharding import Factor, Sharding
from shardlayout.sharding.move import plan_move
from shardlayout.sharding.nested import Nested, RaggedError
from shardlayout.sharding.ragged import (
    Ragged,
    check_ragged,
    nested_piece,
    piece_rows,
    ragged_collective_piece,
    ragged_text,
    source_factors,
)

N = settings.default.max_examples
MESHES = ("a=2", "a=3", "a=2,b=2", "a=2,b=3", "a=3,b=2", "a=2,b=2,c=2")


# -- the oracle --------------------------------------------------------------------------------------
def storage(blocks: dict, sources: int, components: int, dense: tuple) -> np.ndarray:
    parts = [blocks[(c, s)] for c in range(components) for s in range(sources)]
    return np.concatenate(parts, axis=0) if parts else np.zeros((0,) + dense)


def source_digit(mesh: Mesh, rank: int, axes: list) -> int:
    coord = mesh.coord(rank)
    v = 0
    for ax in axes:
        v = v * mesh.axis_size(ax) + coord[mesh.axis_index(ax)]
    return v


def oracle_piece(s: Sharding, src_axes: list, blocks: dict, sources: int, rank: int, routed: list | None = None):
    """(extents, storage) of ``rank``'s piece under ``s`` whose ragged dim is cut by ``src_axes``,
    some or all of the axes ``routed`` the rows came from (default: ``src_axes``): every source
    whose digits on ``src_axes`` are the rank's coordinates."""
    idx = s.indices(rank)
    comps = [int(c) for c in idx[0]]
    routed = list(routed or src_axes)
    mesh, coord = s.mesh, s.mesh.coord(rank)

    def digits(v):
        out = {}
        for ax in reversed(routed):
            out[ax] = v % mesh.axis_size(ax)
            v //= mesh.axis_size(ax)
        return out

    held = [v for v in range(sources) if all(digits(v)[ax] == coord[mesh.axis_index(ax)] for ax in src_axes)]
    dense_idx = idx[2:]
    local = {}
    for i, c in enumerate(comps):
        for j, q in enumerate(held):
            b = blocks[(c, q)]
            for d, pos in enumerate(dense_idx):
                b = np.take(b, np.asarray(pos, dtype=np.int64), axis=d + 1)
            local[(i, j)] = b
    ext = np.array([[local[(i, j)].shape[0] for i in range(len(comps))] for j in range(len(held))],
                   dtype=np.int64).reshape(len(held), len(comps))
    return ext, storage(local, len(held), len(comps), tuple(len(p) for p in dense_idx))


def assert_piece(got: Nested, want):
    ext, data = want
    assert got.dim == 0
    assert got.extents.reshape(-1).tolist() == ext.reshape(-1).tolist()
    assert got.extents.shape[1] == ext.shape[1]
    assert tuple(got.data.shape) == data.shape
    assert np.array_equal(np.asarray(got.data), data)


# -- random nested tensors and pairs of shardings --------------------------------------------------
@st.composite
def ragged_moves(draw):
    """(mesh, a, b, source axes of a and of b, sources, blocks, dense shape): a and b differ in
    whether components are on an axis, whether sources are on axes (on two, b may keep some of
    them), whether a dense dim is (each its own)."""
    mesh = Mesh.parse(draw(st.sampled_from(MESHES)))
    names = list(mesh.names)
    size = mesh.axis_size
    components = draw(st.integers(1, 8))
    dense = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))

    src_a = draw(st.lists(st.sampled_from(names), unique=True, max_size=2))
    if len(src_a) == 2:
        src_b = draw(st.sampled_from([list(src_a), [src_a[0]], [src_a[1]], []]))
    elif src_a:  # routed rows are cut only by the axes they came from (another axis is a RaggedError)
        src_b = draw(st.sampled_from([[], list(src_a)]))
    else:
        src_b = draw(st.lists(st.sampled_from(names), unique=True, max_size=1))
    cut = src_a or src_b
    sources = math.prod(size(n) for n in cut) if cut else draw(st.integers(1, 3))
    rows = 2 * sources  # the expected rows: divisible by any source cut

    def free(used):
        return [n for n in names if n not in used]

    comp_a = draw(st.sampled_from([None] + free(src_a)))
    comp_b = draw(st.sampled_from([None] + free(src_b)))
    used_b = src_b + [comp_b]
    dense_b = draw(st.sampled_from([None] + [(d, n) for d in range(len(dense)) for n in free(used_b)]))
    used_a = src_a + [comp_a]
    dense_a = draw(st.sampled_from([None] + [(d, n) for d in range(len(dense)) for n in free(used_a)]))

    def sharding(comp, src, dn):
        n = math.prod(size(x) for x in src)
        dims = [[Factor(size(comp), comp)] if comp else [],
                [Factor(size(x), x) for x in src] + ([Factor(rows // n)] if src and rows // n > 1 else [])]
        dims += [[Factor(size(dn[1]), dn[1])] if dn and dn[0] == d else [] for d in range(len(dense))]
        return Sharding(mesh, (components, rows) + dense, dims)

    a, b = sharding(comp_a, src_a, dense_a), sharding(comp_b, src_b, dense_b)
    assume(a != b)
    counts = draw(st.lists(st.lists(st.integers(0, 3), min_size=components, max_size=components),
                           min_size=sources, max_size=sources))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    blocks = {(c, s): rng.standard_normal((counts[s][c],) + dense) for c in range(components)
              for s in range(sources)}
    return mesh, a, b, src_a, src_b, sources, blocks, dense


def whole_of(blocks, sources, components, dense) -> Nested:
    counts = np.array([[blocks[(c, s)].shape[0] for c in range(components)] for s in range(sources)])
    return Nested(storage(blocks, sources, components, dense), counts, 0)


@pytest.mark.slow
@settings(max_examples=N)
@given(ragged_moves())
def test_planned_moves_land_every_rank_on_its_nested_piece(case):
    mesh, a, b, src_a, src_b, sources, blocks, dense = case
    components, rows = a.shape[0], a.shape[1]
    r = Ragged(1, components, rows, rows)
    routed_axes = src_a if len(src_a) >= len(src_b) else src_b
    routed = source_factors(a, r) if len(src_a) >= len(src_b) else source_factors(b, r)  # as the planner does
    whole = whole_of(blocks, sources, components, dense)
    pieces = {q: nested_piece(a, r, whole, q, routed) for q in mesh.ranks()}
    for q in mesh.ranks():
        assert_piece(pieces[q], oracle_piece(a, src_a, blocks, sources, q, routed_axes))
    moves = plan_move(a, b)
    event(" + ".join(c.kind.value for c in moves) or "nothing moves")
    for c in moves:
        c = dataclasses.replace(c, ragged=(1, routed))
        pieces = {q: ragged_collective_piece(c, q, pieces) for q in mesh.ranks()}
    for q in mesh.ranks():
        want = oracle_piece(b, src_b, blocks, sources, q, routed_axes)
        assert_piece(pieces[q], want)
        assert_piece(nested_piece(b, r, whole, q, routed), want)


def test_the_token_dispatch_and_combine_of_expert_parallelism():
    """[8, ep*4, 3] (each rank its own source block of every expert) -> [ep*2, 16, 3] (its two
    experts, every source) is one all_to_all, and back."""
    mesh = Mesh.parse("ep=4")
    a, b = Sharding.parse("[8, ep*4, 3]", mesh), Sharding.parse("[ep*2, 16, 3]", mesh)
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 4, (4, 8))
    counts[:, 2:4] = 0  # rank 1's experts get nothing
    blocks = {(c, s): rng.standard_normal((counts[s, c], 3)) for c in range(8) for s in range(4)}
    whole = whole_of(blocks, 4, 8, (3,))
    r = Ragged(1, 8, 16, 16)
    there = plan_move(a, b)
    assert [c.kind.value for c in there] == ["all_to_all"]
    pieces = {q: nested_piece(a, r, whole, q) for q in mesh.ranks()}
    moved = {q: ragged_collective_piece(there[0], q, pieces) for q in mesh.ranks()}
    for q in mesh.ranks():
        assert_piece(moved[q], oracle_piece(b, [], blocks, 4, q))
    assert moved[1].data.shape == (0, 3) and moved[1].extents.tolist() == [[0, 0]] * 4
    back = plan_move(b, a)
    assert [c.kind.value for c in back] == ["all_to_all"]
    home = {q: ragged_collective_piece(back[0], q, moved) for q in mesh.ranks()}
    for q in mesh.ranks():
        assert_piece(home[q], oracle_piece(a, ["ep"], blocks, 4, q))


@pytest.mark.parametrize("src,dst,src_axes", [
    ("[4, b*2, 3] +sum(a)", "[4, b*2, 3]", ["b"]),  # all_reduce
    ("[4, b*2, 3] +sum(a)", "[a*2, b*2, 3]", ["b"]),  # reduce_scatter onto the components
    ("[4, 4, 3] +sum(a)", "[4, 4, 3]", []),
    ("[b*2, 4, 3] +sum(a)", "[4, 4, 3]", []),  # reduce, then gather the components
])
def test_partial_ragged_values_are_summed_block_by_block(src, dst, src_axes):
    mesh = Mesh.parse("a=2,b=2")
    a, b = Sharding.parse(src, mesh), Sharding.parse(dst, mesh)
    sources = 2 if src_axes else 1
    dst_axes = src_axes
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 3, (sources, 4))
    summands = [{(c, s): rng.standard_normal((counts[s, c], 3)) for c in range(4) for s in range(sources)}
                for _ in range(2)]
    total = {k: summands[0][k] + summands[1][k] for k in summands[0]}
    plain = Sharding(mesh, a.shape, a.dims)
    r = Ragged(1, 4, 4, 4)
    pieces = {q: nested_piece(plain, r, whole_of(summands[mesh.coord(q)[0]], sources, 4, (3,)), q)
              for q in mesh.ranks()}  # rank q holds the summand of its coordinate on a
    for c in plan_move(a, b):
        pieces = {q: ragged_collective_piece(c, q, pieces) for q in mesh.ranks()}
    for q in mesh.ranks():
        ext, data = oracle_piece(b, dst_axes, total, sources, q)
        assert pieces[q].extents.reshape(-1).tolist() == ext.reshape(-1).tolist()
        assert np.allclose(pieces[q].data, data, rtol=1e-12, atol=1e-12)


def test_gathering_a_dense_dim_of_a_ragged_tensor():
    mesh = Mesh.parse("a=2")
    a, b = Sharding.parse("[2, 2, a*2]", mesh), Sharding.parse("[2, 2, 4]", mesh)
    rng = np.random.default_rng(0)
    blocks = {(c, 0): rng.standard_normal((c + 1, 4)) for c in range(2)}
    whole = whole_of(blocks, 1, 2, (4,))
    r = Ragged(1, 2, 2, 2)
    pieces = {q: nested_piece(a, r, whole, q) for q in mesh.ranks()}
    for c in plan_move(a, b):
        pieces = {q: ragged_collective_piece(c, q, pieces) for q in mesh.ranks()}
    for q in mesh.ranks():
        assert_piece(pieces[q], oracle_piece(b, [], blocks, 1, q))


# sources on two mesh axes: plan_move goes one axis at a time through shardings that cut the ragged
# dim by part of the routing's axes; with the routing's source factors attached (as the planner does,
# Collective.ragged) every piece on the way holds the sources whose digits are its own
@pytest.mark.parametrize("ms,src,dst,src_axes,dst_axes", [
    ("a=2,b=2", "[2, a*b*2, 4]", "[2, 8, 4]", ["a", "b"], []),
    ("a=2,b=2", "[4, a*b*2, 4]", "[a*b, 8, 4]", ["a", "b"], []),
    ("a=3,b=2", "[a*2, 12, 1]", "[6, b*a*2, 1]", [], ["b", "a"]),
])
def test_moving_sources_that_span_two_axes(ms, src, dst, src_axes, dst_axes):
    mesh = Mesh.parse(ms)
    a, b = Sharding.parse(src, mesh), Sharding.parse(dst, mesh)
    components, sources = a.shape[0], math.prod(mesh.axis_size(x) for x in src_axes or dst_axes)
    rng = np.random.default_rng(0)
    blocks = {(c, s): rng.standard_normal((int(rng.integers(0, 3)), a.shape[2])) for c in range(components)
              for s in range(sources)}
    whole = whole_of(blocks, sources, components, (a.shape[2],))
    r = Ragged(1, components, a.shape[1], a.shape[1])
    routed = source_factors(a, r) or source_factors(b, r)
    pieces = {q: nested_piece(a, r, whole, q, routed) for q in mesh.ranks()}
    for c in plan_move(a, b):
        c = dataclasses.replace(c, ragged=(1, routed))
        pieces = {q: ragged_collective_piece(c, q, pieces) for q in mesh.ranks()}
    for q in mesh.ranks():
        assert_piece(pieces[q], oracle_piece(b, dst_axes, blocks, sources, q))


def test_nested_piece_refuses_a_source_cut_that_is_not_the_routed_one():
    mesh = Mesh.parse("a=2")
    whole = Nested(np.zeros((3, 2)), np.array([[1, 2, 0]]), 0)  # one source
    with pytest.raises(RaggedError, match="source blocks"):
        nested_piece(Sharding.parse("[3, a*2, 2]", mesh), Ragged(1, 3, 4, 4), whole, 0)


def test_check_ragged_refuses_a_mesh_factor_inside_a_local_one():
    mesh = Mesh.parse("ep=2")
    r = Ragged(1, 4, 4, 8)
    check_ragged(Sharding.parse("[ep*2, 4, 3]", mesh), r)
    check_ragged(Sharding.parse("[4, ep*2, 3]", mesh), r)
    with pytest.raises(RaggedError, match="inside a local one"):
        check_ragged(Sharding.parse("[4, 2*ep, 3]", mesh), r)
    with pytest.raises(RaggedError, match="dims"):
        check_ragged(Sharding.parse("[4]", mesh), r)


# -- piece_rows against a brute-force count ------------------------------------------------------------
def brute_rows(s: Sharding, src_axis, tokens: int, k: int, experts: int) -> tuple:
    """Over every routing (each token picks k distinct experts), tokens in consecutive equal source
    blocks: (largest mean rows of a device's piece, most rows any device's piece ever holds)."""
    mesh = s.mesh
    n = mesh.axis_size(src_axis) if src_axis else 1
    block = tokens // n
    choices = list(itertools.combinations(range(experts), k))
    most, means = 0, []
    for rank in mesh.ranks():
        comps = set(int(c) for c in s.indices(rank)[0])
        mine = range(tokens) if src_axis is None else range(block * mesh.coord(rank)[mesh.axis_index(src_axis)],
                                                            block * (mesh.coord(rank)[mesh.axis_index(src_axis)] + 1))
        per_choice = [len(comps & set(ch)) for ch in choices]
        total = Fraction(0)
        for routing in itertools.product(range(len(choices)), repeat=tokens):
            rows = sum(per_choice[routing[t]] for t in mine)
            most = max(most, rows)
            total += rows
        means.append(total / len(choices) ** tokens)
    return max(means), most


def routed(tokens: int, k: int, experts: int) -> Ragged:
    """The ragged dim of routing ``tokens`` to ``k`` distinct experts each: ceil(T*k/E) expected
    rows per expert, at most T (one per token), T*k in all."""
    return Ragged(1, experts, -(-tokens * k // experts), tokens, tokens * k)


ROWS_CASES = [
    ("a=2", 4, 1, 2), ("a=2", 4, 2, 4), ("a=2", 2, 2, 2), ("a=3", 3, 1, 3), ("a=2,b=2", 4, 2, 4),
    ("a=2,b=2", 4, 1, 4), ("a=2", 4, 1, 3), ("a=2", 3, 2, 4), ("a=3", 3, 2, 4), ("a=2,b=2", 4, 3, 5),
]


@pytest.mark.parametrize("ms,tokens,k,experts", ROWS_CASES)
def test_piece_rows_against_every_routing(ms, tokens, k, experts):
    mesh = Mesh.parse(ms)
    r = routed(tokens, k, experts)
    for comp in [None, *mesh.names]:
        for src in [None, *mesh.names]:
            if src is not None and (src == comp or tokens % mesh.axis_size(src)):
                continue
            n = mesh.axis_size(src) if src else 1
            rag = [Factor(n, src)] + ([Factor(r.expected // n)] if r.expected % n == 0 and r.expected > n else []) \
                if src else []
            try:
                s = Sharding(mesh, (experts, r.expected, 2), [[Factor(mesh.axis_size(comp), comp)] if comp else [],
                                                             rag, []])
            except Exception:  # noqa: BLE001 - a source cut the expected rows cannot take
                continue
            expected, most = piece_rows(s, r)
            mean, bf_most = brute_rows(s, src, tokens, k, experts)
            assert most == bf_most, (str(s), most, bf_most)
            assert expected >= mean  # expected rows are rounded up per expert: never below the true mean
            if tokens * k % experts == 0:
                assert expected == math.ceil(mean), (str(s), expected, mean)


def test_piece_rows_never_expects_more_than_the_maximum():
    mesh = Mesh.parse("a=2")
    r = routed(4, 2, 3)
    expected, most = piece_rows(Sharding(mesh, (3, r.expected, 2)), r)
    assert expected <= most


# -- Ragged JSON and text ----------------------------------------------------------------------------
@given(st.integers(1, 5), st.integers(1, 64), st.integers(0, 100), st.integers(0, 100),
       st.one_of(st.none(), st.integers(0, 10**6)), st.text(max_size=20))
def test_ragged_json_round_trip(dim, components, expected, extra, total, counts):
    r = Ragged(dim, components, expected, expected + extra, total, counts)
    text = json.dumps(r.to_json())
    assert Ragged.from_json(json.loads(text)) == r


@pytest.mark.parametrize("bad", [
    {"components": 4, "expected": 4, "maximum": 8},  # no dim
    {"dim": "one", "components": 4, "expected": 4, "maximum": 8},
    {"dim": None, "components": 4, "expected": 4, "maximum": 8},
    {"dim": 1, "components": 4, "expected": 4, "maximum": 8, "total": "many"},
    ["dim", 1],
    "ragged",
    None,
    {"dim": 0, "components": 4, "expected": 4, "maximum": 8},  # no component dim before it
    {"dim": 1, "components": 0, "expected": 4, "maximum": 8},
    {"dim": 1, "components": 4, "expected": 9, "maximum": 8},  # expected above the maximum
    {"dim": 1, "components": 4, "expected": -1, "maximum": 8},
])
def test_bad_ragged_json_is_refused(bad):
    with pytest.raises(RaggedError):
        Ragged.from_json(bad)


def test_ragged_json_refuses_a_fractional_dim():
    with pytest.raises(RaggedError):
        Ragged.from_json({"dim": 1.5, "components": 4, "expected": 4, "maximum": 8})


@pytest.mark.parametrize("text,want", [
    ("[4, ep*2, 3]", "[4, ragged(ep*2), 3]"),
    ("[ep*2, 4, 3]", "[ep*2, ragged(4), 3]"),
    ("[ep*2, 4, 3] +sum(tp)", "[ep*2, ragged(4), 3] +sum(tp)"),
    ("[4, ep*tp, 3]", "[4, ragged(ep*tp), 3]"),
    ("[4, 4, tp*3 of 5]", "[4, ragged(4), tp*3 of 5]"),
])
def test_ragged_text_marks_the_ragged_dim(text, want):
    mesh = Mesh.parse("ep=2,tp=2")
    assert ragged_text(Sharding.parse(text, mesh), Ragged(1, 4, 4, 8, 16)) == want


def test_ragged_text_of_a_later_ragged_dim():
    mesh = Mesh.parse("ep=2")
    s = Sharding.parse("[5, ep*2, 4, 3]", mesh)
    assert ragged_text(s, Ragged(2, 4, 4, 8)) == "[5, ep*2, ragged(4), 3]"


def test_piece_rows_of_uneven_token_shards():
    # 10 tokens on ep=4 are cut 3, 3, 3, 1: a 3-token rank can send 3 * top_k = 6 rows
    mesh = Mesh.parse("ep=4")
    r = Ragged(1, 4, 5, 10, 20)
    assert piece_rows(Sharding.parse("[4, ep*2 of 5, 4]", mesh), r) == (5, 6)
