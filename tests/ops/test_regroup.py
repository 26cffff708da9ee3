"""ops/regroup.py: every step of the walk on its worked example, the driver, and the property
that every rank's input-target piece, reshaped, is its output piece (checked by simulation)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from shardlayout import Mesh, NotRepresentable, Propagation, Sharding, ShardingError
from shardlayout.config import options
from shardlayout.ops.regroup import (
    AXIS,
    LOCAL,
    PROGRAM,
    TAIL,
    Obstacle,
    Piece,
    advance,
    below_chunks,
    blame,
    dtensor_obstacle,
    even_prefix,
    fit,
    flat_pieces,
    gather,
    has_placements,
    infer_view_shape,
    leading_locals,
    local,
    merge_ranges,
    place_even,
    place_program,
    place_tail,
    regroup,
    same_chunks,
    same_program_chunks,
    settle_floating,
    split,
    tail_body,
    take_inner,
)
from shardlayout.sharding import Factor
from shardlayout.sharding.core import ChunkProgram, Step

from ..sharding.strategies import shardings
from .checks import local_check, reshape_local
from .test_view import view_shapes


def sh(text: str, mesh: str) -> Sharding:
    return Sharding.parse(text, Mesh.parse(mesh))


def check(s: Sharding, out_shape, subaxes: bool = True) -> tuple:
    """regroup, then simulate: each rank's target piece reshaped is its output piece."""
    target, out = regroup(s, out_shape, subaxes)
    x = np.arange(int(np.prod(s.shape)), dtype=np.float64).reshape(s.shape)
    p = Propagation("view", (s,), (target,), (out,))
    local_check(p, x, lambda a: a.reshape(out.shape), reshape_local)
    return target, out


def walk(s: Sharding, out_shape, subaxes: bool = True):
    return fit(*flat_pieces(s), infer_view_shape(s.shape, out_shape), subaxes)


X, Y = Factor(2, "x"), Factor(2, "y")


# ------------------------------------------------------------------------------------------
# the flat factor list
# ------------------------------------------------------------------------------------------


def test_flat_pieces_even_dims_are_one_piece_per_factor():
    pieces, floating = flat_pieces(sh("[dp*4, tp*3]", "dp=2,tp=4"))
    assert [(p.kind, p.size, p.dim, p.index) for p in map(Piece._make, pieces)] == [  # plain tuples
        (AXIS, 2, 0, 0), (LOCAL, 4, 0, 1), (AXIS, 4, 1, 0), (LOCAL, 3, 1, 1)]
    assert floating == ()


def test_flat_pieces_merge_adjacent_local_factors_across_dims():
    pieces, _ = flat_pieces(sh("[x*2, 3, 4]", "x=2"))
    assert pieces == (Piece(AXIS, (X,), 2, 0, 0), local(24))  # 2*3*4: one digit of 24


def test_flat_pieces_uneven_dim_ends_in_a_tail_after_its_even_prefix():
    pieces, _ = flat_pieces(sh("[x*3 of 5, 4]", "x=2"))
    assert pieces == (Piece(TAIL, (X, Factor(3)), 5, 0, 0), Piece(LOCAL, (Factor(4),), 4, 1, 0))
    # x cuts 10 evenly (5 each), y cuts 5 unevenly: the tail is y*3 of 5
    pieces, _ = flat_pieces(sh("[x*y*3 of 10]", "x=2,y=2"))
    assert pieces == (Piece(AXIS, (X,), 2, 0, 0), Piece(TAIL, (Y, Factor(3)), 5, 0, 1))


def test_flat_pieces_set_extent_one_shards_aside():
    pieces, floating = flat_pieces(sh("[2, x of 1, 3]", "x=2"))
    assert pieces == (local(6),)  # 2 and 3 merge around the all-or-nothing shard
    assert floating == (Piece(TAIL, (X,), 1, 1, 0),)


def test_flat_pieces_chunk_program_is_one_piece():
    s = sh("[chunks(a/3, b) of 16]", "a=2,b=2")
    assert flat_pieces(s) == ((Piece(PROGRAM, (s.dims[0],), 16, 0, 0),), ())


@pytest.mark.parametrize(("spec", "mesh", "known"), [
    ("[x*2, 3, 4]", "x=2", 3), ("[x*3 of 5, 4]", "x=2", 0), ("[4, x*y*3 of 10]", "x=2,y=2", 1),
    ("[2, x of 1, 3]", "x=2", 1), ("[3, chunks(a/3, b) of 16, x*3 of 5]", "a=2,b=2,x=2", 1)])
def test_flat_pieces_known_skips_only_what_the_view_rule_saw(spec, mesh, known):
    # known: where the view rule's evenness check stops (the dims before even, that one uneven or a
    # program); the pieces are the ones flat_pieces finds by itself
    assert flat_pieces(sh(spec, mesh), known) == flat_pieces(sh(spec, mesh))


def test_even_prefix():
    assert even_prefix(12, (X, Factor(6))) == 2  # even: all
    assert even_prefix(10, (X, Y, Factor(3))) == 1  # 10 = 2*5, then y cuts 5 unevenly
    assert even_prefix(5, (X, Factor(3))) == 0


def test_piece_sharded():
    assert Piece(AXIS, (X,), 2).sharded and Piece(TAIL, (X,), 3).sharded and not local(4).sharded


# ------------------------------------------------------------------------------------------
# the walk
# ------------------------------------------------------------------------------------------


def test_advance_moves_past_full_and_size_one_dims():
    assert advance((4, 1, 6), 0, 1) == (2, 6)
    assert advance((4, 6), 0, 2) == (0, 2)
    assert advance((4,), 0, 1) == (1, 1)  # the end
    assert advance((1, 1), -1, 1) == (2, 1)  # the start of an all-ones shape is its end


def test_split_axis_factor_into_sub_axes():
    assert split(Factor(4, "tp"), 2) == (Factor(2, "tp", 1), Factor(2, "tp", 2))
    assert split(Factor(8, "x", 2), 2) == (Factor(2, "x", 2), Factor(4, "x", 4))
    assert split(Factor(6), 3) == (Factor(3), Factor(2))


def test_place_even_design_example():
    # mesh dp=2, tp=4; (8,12) [dp*4, tp*3] -> (16,6): after dp 4, room 2 is left in dim 0
    pieces, _ = flat_pieces(sh("[dp*4, tp*3]", "dp=2,tp=4"))
    items, cur, rest = place_even(pieces, 0, (0, 16), (16, 6), True)
    assert items == ((0, Factor(2, "dp")),) and cur == (0, 8) and rest is pieces
    items, cur, _ = place_even(pieces, 2, (0, 2), (16, 6), True)
    assert items == ((0, Factor(2, "tp", 1)), (1, Factor(2, "tp", 2))) and cur == (1, 3)


def test_place_even_axis_cut_without_sub_axes_is_the_obstacle():
    pieces, _ = flat_pieces(sh("[x]", "x=4"))
    ob = place_even(pieces, 0, (0, 2), (2, 2), False)
    assert ob == Obstacle(pieces[0], 1, ob.why) and "sub-axes are disabled" in ob.why


def test_blame_axis_piece_keeps_its_outer_gcd_with_sub_axes():
    # [x*3] (x=4) -> (6, 2): x(4) at room 6 -> keep x:(1)2, gather its minor half
    pieces, _ = flat_pieces(sh("[x*3]", "x=4"))
    assert blame(pieces, 0, 6, True).keep == 2
    assert blame(pieces, 0, 6, False).keep == 1
    assert walk(sh("[x*3]", "x=4"), (6, 2)) == Obstacle(pieces[0], 2, "a boundary cuts 4 at 6")


def test_blame_local_piece_gathers_the_sharded_neighbour():
    # [3*a] (a=2) -> (2, 3): the boundary at 2 falls inside local 3; a is next to it
    pieces, _ = flat_pieces(sh("[3*a]", "a=2"))
    assert blame(pieces, 0, 2, True).piece == pieces[1]
    # the next piece first, then the previous one
    ps = (Piece(AXIS, (X,), 2, 0, 0), local(3), Piece(AXIS, (Y,), 2, 1, 0))
    assert blame(ps, 1, 2, True).piece == ps[2]
    assert blame(ps[:2], 1, 2, True).piece == ps[0]


def test_tail_body_drops_the_enumerating_local_factor():
    assert tail_body(Piece(TAIL, (X, Factor(3)), 5)) == (X,)
    assert tail_body(Piece(TAIL, (Factor(2, "x"),), 1)) == (X,)


def test_place_tail_fills_the_room():
    # [x*3 of 5, 4] -> (5, 2, 2): the tail is dim 0, 4 splits freely (test_view's case)
    assert walk(sh("[x*3 of 5, 4]", "x=2"), (5, 2, 2)) == ((X, Factor(3)), (Factor(2),), (Factor(2),))
    assert str(check(sh("[x*3 of 5, 4]", "x=2"), (5, 2, 2))[1]) == "[x*3 of 5, 2, 2]"


def test_place_tail_outer_cut_where_chunks_line_up():
    # [a*3 of 9] (a=4) -> (3, 3): 9 cut 4 ways is [0,3) [3,6) [6,9) []; 3 cut 4 ways, in
    # blocks of 3, is the same: a ends dim 0, the inner 3 is dim 1
    s = sh("[a*3 of 9]", "a=4")
    pieces, _ = flat_pieces(s)
    items, cur, _ = place_tail(pieces, 0, (0, 3), (3, 3), True)
    assert items == ((0, Factor(4, "a")), (1, Factor(3))) and cur == (2, 1)
    assert check(s, (3, 3)) == (s, sh("[a of 3, 3]", "a=4"))


def test_place_tail_outer_cut_whose_inner_part_straddles_a_boundary_is_the_obstacle():
    s = sh("[b*4 of 10, 9]", "a=4,b=3")
    ob = walk(s, (5, 3, 6))
    assert ob.piece.kind == TAIL and "straddles" in ob.why
    assert str(check(s, (5, 3, 6))[0]) == "[10, 9]"


def test_place_tail_inner_merge_takes_local_factors_after_it():
    # [x of 3, 4] (x=4) -> (6, 2): the tail takes 2 of the 4 after it (same chunks)
    s = sh("[x of 3, 4]", "x=4")
    pieces, _ = flat_pieces(s)
    items, cur, rest = place_tail(pieces, 0, (0, 6), (6, 2), True)
    assert items == ((0, Factor(4, "x")),) and rest[1] == Piece(LOCAL, (Factor(2),), 2, 1, 0)
    assert check(s, (6, 2)) == (s, sh("[x*2 of 6, 2]", "x=4"))
    assert str(check(sh("[a of 3, 3]", "a=4"), (9,))[1]) == "[a*3 of 9]"


def test_place_tail_region_of_tail_and_local_factors():
    # [x*2 of 6, 3] (x=4) -> (9, 2): 9 divides neither 6 nor 6*k, but the region 6*3 = 18
    # cut 4 ways holds the same blocks either way: [0,6) [6,12) [12,18) []
    s = sh("[x*2 of 6, 3]", "x=4")
    pieces, _ = flat_pieces(s)
    items, cur, rest = place_tail(pieces, 0, (0, 9), (9, 2), True)
    assert items == ((0, Factor(4, "x")),) and cur == (1, 2)
    assert rest[1:] == (local(2), Piece(LOCAL, (Factor(1),), 1, 1, 0))  # the rest; 3 used up
    assert check(s, (9, 2)) == (s, sh("[x*3 of 9, 2]", "x=4"))


def test_place_tail_that_would_change_its_chunks_is_the_obstacle():
    s = sh("[x*3 of 5, 4]", "x=2")  # test_view: merging the uneven dim with 4
    ob = walk(s, (20,))
    assert ob == Obstacle(flat_pieces(s)[0][0], 1, ob.why)
    assert check(s, (20,)) == (sh("[5, 4]", "x=2"), sh("[20]", "x=2"))


def test_place_program_whole_merged_cut_or_obstacle():
    s = sh("[chunks(a) of 5]", "a=4")
    assert walk(s, (5,)) == (s.dims[0],)
    s = sh("[chunks(a) of 8, 2]", "a=2")  # the 2 after it merges in: DTensor's chunks agree
    assert check(s, (16,))[1].dims == (s.dims[0],)
    s = sh("[chunks(a) of 8]", "a=2")  # cut: the program keeps the outer 4, 2 is local
    pieces, _ = flat_pieces(s)
    items, cur, rest = place_program(pieces, 0, (0, 4), (4, 2), True)
    assert items == ((0, s.dims[0]),) and rest == pieces + (local(2),)
    assert str(check(s, (4, 2))[1]) == "[chunks(a) of 4, 2]"
    for text, mesh, shape in [("[chunks(a) of 10]", "a=3", (2, 5)), ("[chunks(a) of 5, 2]", "a=4", (10,)),
                              ("[chunks(a/3, b) of 16]", "a=2,b=2", (4, 4))]:
        s = sh(text, mesh)
        ob = walk(s, shape)
        assert type(ob) is Obstacle and ob.piece.kind == PROGRAM, text
        target, _ = check(s, shape)
        assert not isinstance(target.dims[0], ChunkProgram)


def test_leading_locals_and_take_inner():
    xp, yp = Piece(AXIS, (X,), 2, 0, 0), Piece(AXIS, (Y,), 2, 1, 0)
    ps = (xp, Piece(LOCAL, (Factor(6),), 6, 0, 1), yp)
    assert leading_locals(ps, 1) == 1 and leading_locals(ps, 2) == 0
    assert take_inner(ps, 0, 2) == (xp, Piece(LOCAL, (Factor(3),), 3, 0, 1), yp)
    assert take_inner(ps, 0, 4) is None  # 6 has no outer digit 4
    assert take_inner(ps, 0, 12) is None  # y is in the way
    assert take_inner(ps, 0, 6) == (xp, Piece(LOCAL, (Factor(1),), 1, 0, 1), yp)  # used up


def test_settle_floating_extent_one_shards():
    s = sh("[2, x of 1, 3]", "x=2")
    assert str(check(s, (1, 6))[1]) == "[x of 1, 6]"  # a free size-1 dim
    assert str(check(s, (2, 1, 3))[1]) == "[2, x of 1, 3]"
    assert str(check(s, (6,))[1]) == "[6*x of 6]"  # innermost in the last dim
    t = Piece(TAIL, (X,), 1, 0, 0)
    assert settle_floating((), (t,), ()) == Obstacle(t, 1, "a shard of extent 1 needs an output dim to live in")
    assert check(sh("[x of 1]", "x=2"), ()) == (sh("[1]", "x=2"), Sharding(Mesh.parse("x=2"), ()))


@pytest.mark.parametrize(
    "text,mesh,shape,want",
    [
        # the old regrouping appended c right after b, cutting b's chunks of 2 (wrong numbers)
        ("[2*c of 2, 3*b of 9, 2]", "a=2,b=4,c=2", (36,), "[6*b*2*c of 36]"),
        ("[a of 1, b of 2, 2]", "a=2,b=3", (4,), "[b*2*a of 4]"),
        ("[4, c of 2, 2*b of 2]", "a=4,b=4,c=3", (4, 4), "[4, c*2*b of 4]"),
        # the tail's own local 2 already cuts b's chunks down to 1: nothing to add
        ("[2*c of 6, 2*b of 1, 2]", "a=2,b=2,c=4", (12,), "[2*c*2*b of 12]"),
    ],
)
def test_floating_tail_goes_below_the_last_dims_chunks(text, mesh, shape, want):
    s = sh(text, mesh)
    assert check(s, shape) == (s, sh(want, mesh))


def test_below_chunks():
    b, c = Factor(4, "b"), Factor(2, "c")
    assert below_chunks(36, (Factor(6), b), (c,)) == (Factor(6), b, Factor(2), c)
    assert below_chunks(12, (Factor(2), Factor(4, "c")), (Factor(2), Y)) == (Factor(2), Factor(4, "c"), Factor(2), Y)
    assert below_chunks(8, (Factor(2), X, Factor(4)), (Y,)) == (Factor(2), X, Factor(4), Y)  # even: chunks of 1


def test_fit_gives_dims_or_the_obstacle():
    s = sh("[dp*4, tp*3]", "dp=2,tp=4")
    assert walk(s, (16, 6)) == (
        (Factor(2, "dp"), Factor(4), Factor(2, "tp", 1)), (Factor(2, "tp", 2), Factor(3)))
    assert walk(s, (16, 6), subaxes=False).piece == flat_pieces(s)[0][2]


# ------------------------------------------------------------------------------------------
# chunks that line up
# ------------------------------------------------------------------------------------------


def test_same_chunks_and_merge_ranges():
    assert merge_ranges([(0, 2), (2, 4), (5, 5), (6, 7)]) == ((0, 4), (6, 7))
    assert same_chunks((Factor(4, "a"),), 9, 3, 1, 3)  # [0,3) [3,6) [6,9) [] either way
    assert not same_chunks((Factor(2, "x"),), 5, 10, 2, 1)  # [0,3)[3,5) in blocks of 2 vs [0,5)[5,10)
    prog = ChunkProgram([Step(2, "x")])
    assert same_program_chunks(prog, 4, 2) and not same_program_chunks(prog, 3, 2)  # [0,2)[2,3) vs [0,3)
    assert not same_program_chunks(ChunkProgram([Step(4, "a")]), 5, 2)


# ------------------------------------------------------------------------------------------
# the driver
# ------------------------------------------------------------------------------------------


def test_gather_each_kind_of_piece():
    s = sh("[x*3]", "x=4")
    assert gather(s, Obstacle(flat_pieces(s)[0][0], 2, "")) == sh("[x:(1)2*6]", "x=4")
    assert gather(s, Obstacle(flat_pieces(s)[0][0], 1, "")) == sh("[12]", "x=4")
    s = sh("[x*y*3 of 10, 2]", "x=2,y=2")
    assert gather(s, Obstacle(flat_pieces(s)[0][1], 1, "")) == sh("[x*5, 2]", "x=2,y=2")
    s = sh("[chunks(a/3, b) of 16, 2]", "a=2,b=2")
    assert gather(s, Obstacle(flat_pieces(s)[0][0], 1, "")) == sh("[16, 2]", "a=2,b=2")


def test_dtensor_obstacle_is_the_innermost_sharded_piece():
    s = sh("[dp*4, tp*3]", "dp=2,tp=4")
    out = Sharding._trusted(s.mesh, (16, 6), walk(s, (16, 6)), ())
    assert not has_placements(out) and has_placements(s)
    assert dtensor_obstacle(s, out).piece == flat_pieces(s)[0][2]  # tp
    assert dtensor_obstacle(s, s) is None


def test_regroup_design_example():
    # DESIGN.md "The one idea": exact with sub-axes; without them, only tp is gathered
    s = sh("[dp*4, tp*3]", "dp=2,tp=4")
    assert check(s, (96,)) == (s, sh("[dp*4*tp*3]", "dp=2,tp=4"))
    assert check(s, (16, 6)) == (s, sh("[dp*4*tp:(1)2, tp:(2)2*3]", "dp=2,tp=4"))
    target, out = check(s, (16, 6), subaxes=False)
    assert str(target) == "[dp*4, 12]" and out.to_placements() == ("S(0)", "R")
    with options(subaxes=False):
        assert regroup(s, (16, 6)) == (target, out)


def test_regroup_gathers_only_the_minor_part_of_an_axis():
    s = sh("[x*3]", "x=4")
    assert check(s, (6, 2)) == (sh("[x:(1)2*6]", "x=4"), sh("[x:(1)2*3, 2]", "x=4"))
    assert check(s, (6, 2), subaxes=False)[0] == sh("[12]", "x=4")


def test_infer_view_shape():
    assert infer_view_shape((8, 12), (-1, 6)) == (16, 6)
    assert infer_view_shape((8, 12), [96]) == (96,)
    assert infer_view_shape((4,), 4) == (4,)
    assert infer_view_shape((1,), ()) == ()
    with pytest.raises(ShardingError, match="more than one -1"):
        infer_view_shape((8, 12), (-1, -1))
    with pytest.raises(ShardingError, match="cannot view"):
        infer_view_shape((8, 12), (-1, 7))
    with pytest.raises(ShardingError, match="keeps the number of elements"):
        infer_view_shape((8, 12), (5, 5))


# ------------------------------------------------------------------------------------------
# the property, by simulation
# ------------------------------------------------------------------------------------------


@st.composite
def placement_shardings(draw):
    """DTensor placements, S and SS on small (often uneven) sizes: ChunkProgram dims too."""
    nd = draw(st.integers(1, 3))
    mesh = Mesh(tuple(draw(st.sampled_from([2, 2, 3, 4])) for _ in range(nd)), ("a", "b", "c")[:nd])
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 5, 6, 8, 9, 10, 12]), min_size=1, max_size=3)))
    pl = []
    for _ in range(nd):
        d = draw(st.integers(0, len(shape) - 1))
        pl.append(draw(st.sampled_from(["R", f"S({d})", f"SS({d},2)", f"SS({d},3)"])))
    try:
        return Sharding.from_placements(mesh, shape, pl)
    except NotRepresentable:
        assume(False)


def held(s: Sharding, rank: int) -> list:
    return [set(ix.tolist()) for ix in s.indices(rank)]


def check_property(s: Sharding, shape, subaxes: bool) -> None:
    target, out = check(s, shape, subaxes)  # exact on every rank
    assert regroup(target, shape, subaxes) == (target, out)  # the target needs no more moves
    dims = walk(s, shape, subaxes)
    if target == s:  # no move: the input fits as it is
        assert type(dims) is not Obstacle
    else:  # a move only when the input is in the way, and it only gathers
        assert type(dims) is Obstacle or not (subaxes or has_placements(Sharding._trusted(
            s.mesh, out.shape, dims, s.partial)))
        for r in s.mesh.ranks():
            assert all(a >= b for a, b in zip(held(target, r), held(s, r)))
    if not subaxes and has_placements(s):
        assert has_placements(out)


@given(shardings(max_ndim=4), st.data(), st.booleans())
def test_regroup_is_exact_and_moves_only_what_is_in_the_way(s, data, subaxes):
    check_property(s, data.draw(view_shapes(int(np.prod(s.shape)))), subaxes)


@given(placement_shardings(), st.data(), st.booleans())
def test_regroup_dtensor_placements_and_chunk_programs(s, data, subaxes):
    check_property(s, data.draw(view_shapes(int(np.prod(s.shape)))), subaxes)
