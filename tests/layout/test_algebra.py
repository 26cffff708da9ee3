"""Post-conditions of the layout algebra on random layouts (hypothesis), and its errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardlayout.caches import clear_caches
from shardlayout.errors import LayoutError, ShardingError
from shardlayout.layout import (
    Layout,
    blocked_product,
    coalesce,
    complement,
    composition,
    filter,
    flat_divide,
    left_inverse,
    logical_divide,
    logical_product,
    make_layout,
    raked_product,
    right_inverse,
    tiled_divide,
    tiled_product,
    zipped_divide,
    zipped_product,
)

from .strategies import compact_layouts, layouts, tilers_for


def refused_or(f, *args):
    try:
        return f(*args)
    except LayoutError:
        return None


# -- coalesce / filter -------------------------------------------------------------------


@given(layouts())
def test_coalesce_preserves_the_function(A):
    C = coalesce(A)
    assert C.size() == A.size()
    assert C.depth <= 1
    assert C.values() == A.values()


@given(layouts())
def test_coalesce_by_profile_keeps_modes(A):
    prof = tuple(None for _ in range(A.rank)) if A.rank > 1 else None
    C = coalesce(A, prof)
    assert C.values() == A.values()
    if prof is not None:
        assert C.rank == A.rank
        assert [C[i].size() for i in range(C.rank)] == [A[i].size() for i in range(A.rank)]


@given(layouts())
def test_filter_keeps_the_image(A):
    F = filter(A)
    assert sorted(set(F.values())) == sorted(set(A.values()))
    assert 0 not in F.flat_stride or F.size() == 1


# -- composition -------------------------------------------------------------------------


@st.composite
def composable(draw):
    A = draw(layouts())
    B = draw(st.one_of(tilers_for(A), layouts(strides=st.integers(0, 12))))
    return A, B


@given(composable())
def test_composition_is_function_composition(AB):
    A, B = AB
    R = refused_or(composition, A, B)
    if R is None:
        return
    assert R.size() == B.size()
    if type(B.shape) is tuple:  # compatible with B: same modes, each refined
        assert R.rank == B.rank
        assert [R[i].size() for i in range(R.rank)] == [B[i].size() for i in range(B.rank)]
    for i in range(B.size()):
        assert R(i) == A(B(i)), (A, B, R, i)


@given(compact_layouts())
def test_composition_with_tuple_tiler_drops_untouched_modes(A):
    if A.rank < 2:
        return
    R = composition(A, (None,))
    assert R.rank == 1 and R[0] == A[0]


# -- complement --------------------------------------------------------------------------


@given(layouts(strides=st.sampled_from([0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64])), st.integers(1, 300))
def test_complement_postconditions(A, cotarget):
    R = refused_or(complement, A, cotarget)
    if R is None:
        return
    vals = R.values()
    assert all(vals[i] < vals[i + 1] for i in range(len(vals) - 1)), "ordered"
    image = set(A.values())
    assert not any(v in image for v in vals[1:]), "disjoint"
    assert A.cosize() - 1 + R.cosize() >= cotarget, "reaches the cotarget"


@given(compact_layouts(), st.integers(1, 4))
def test_complement_of_compact_layout_tiles_the_range(A, k):
    R = complement(A, A.size() * k)
    both = make_layout(A, R)
    assert sorted(both.values()) == list(range(A.size() * k))


def _gaps_then_coalesce(A: Layout, cotarget: int) -> Layout:
    """The complement as CuTe writes it (every gap between the sorted modes, then coalesce)."""
    modes = sorted((d, s) for s, d in zip(A.flat_shape, A.flat_stride) if s != 1 and d != 0)
    shapes, strides, cur = [], [], 1
    for d, s in modes:
        shapes.append(d // cur)
        strides.append(cur)
        cur = s * d
    shapes.append(-(-cotarget // cur))
    strides.append(cur)
    return coalesce(Layout(tuple(shapes), tuple(strides)))


@given(layouts(strides=st.sampled_from([0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64])), st.integers(1, 300))
def test_complement_gaps_never_merge(A, cotarget):
    # complement() only drops the size-1 gaps instead of coalescing them: no two gaps can merge
    R = refused_or(complement, A, cotarget)
    if R is not None:
        assert R == _gaps_then_coalesce(A, cotarget)


# -- memos: a cold call and a memo hit give the same answer -----------------------------


@given(composable(), st.integers(1, 64))
def test_cold_calls_and_memo_hits_agree(AB, cotarget):
    A, B = AB
    calls = [
        (composition, (A, B)), (logical_divide, (A, B)), (complement, (A, cotarget)),
        (coalesce, (A,)), (filter, (A,)), (right_inverse, (A,)), (logical_product, (A, B)),
    ]
    for f, args in calls:
        clear_caches()
        fresh = tuple(Layout(x.shape, x.stride) if isinstance(x, Layout) else x for x in args)
        cold = refused_or(f, *fresh)
        assert refused_or(f, *fresh) == cold  # a memo hit (or the same refusal)
        assert refused_or(f, *args) == cold  # equal operands, other objects


# -- inverses ----------------------------------------------------------------------------


@given(layouts())
def test_right_inverse(A):
    R = right_inverse(A)
    for i in range(R.size()):
        assert A(R(i)) == i


@given(compact_layouts())
def test_right_inverse_of_bijection_is_full(A):
    R = right_inverse(A)
    assert R.size() == A.size()


@given(layouts(strides=st.sampled_from([0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64])))
def test_left_inverse(A):
    R = refused_or(left_inverse, A)
    if R is None:
        assert len(set(A.values())) < A.size() or A.size() > 1
        return
    for i in range(A.size()):
        assert R(A(i)) == i


@given(compact_layouts())
def test_left_inverse_of_bijection_never_refused(A):
    R = left_inverse(A)
    assert all(R(A(i)) == i for i in range(A.size()))


# -- divides and products ----------------------------------------------------------------


@given(compact_layouts(max_rank=2, max_depth=1), st.data())
def test_logical_divide_is_A_of_B_and_its_complement(A, data):
    B = data.draw(tilers_for(A))
    R = refused_or(logical_divide, A, B)
    if R is None:
        return
    Bc = complement(B, A.size())
    BB = make_layout(B, Bc)
    assert R.rank == 2 and R[0].size() == B.size()
    for i in range(R.size()):
        assert R(i) == A(BB(i))
    if A.size() % B.size() == 0 and len(set(B.values())) == B.size():
        assert sorted(R.values()) == sorted(A.values())


@given(compact_layouts(max_rank=2, max_depth=1), compact_layouts(max_rank=2, max_depth=1))
def test_logical_product_is_A_then_complement_of_A_over_B(A, B):
    R = logical_product(A, B)
    assert R[0] == A
    assert R.size() == A.size() * B.size()
    # A and B compact: the product is a bijection onto [0, size(A)*size(B))
    assert sorted(R.values()) == list(range(A.size() * B.size()))
    Ac = complement(A, A.size() * B.cosize())
    for i in range(B.size()):
        assert R[1](i) == Ac(B(i))


def test_logical_product_with_int_tiler_is_a_product_not_a_divide():
    # pycute divides here; C++ CuTe (and we) take the product
    R = logical_product(Layout((2, 2), (4, 1)), 6)
    assert str(R) == "((2,2),(2,3)):((4,1),(2,8))"


def test_zipped_tiled_flat_divide_shapes():
    A = Layout((4, 6))
    Z = zipped_divide(A, (2, 3))
    T = tiled_divide(A, (2, 3))
    F = flat_divide(A, (2, 3))
    assert str(Z) == "((2,3),(2,2)):((1,4),(2,12))"
    assert str(T) == "((2,3),2,2):((1,4),2,12)"
    assert str(F) == "(2,3,2,2):(1,4,2,12)"
    assert sorted(Z.values()) == list(range(24))
    assert zipped_divide(A, (None, 3))[0].size() == 3


def test_zipped_and_tiled_product():
    Z = zipped_product(Layout((2, 2)), (3, 2))
    assert Z.size() == 24 and Z[0] == Layout((2, 2))
    T = tiled_product(Layout((2, 2)), (3, 2))
    assert T.rank == 3 and T.size() == 24


@given(compact_layouts(max_rank=2, max_depth=0), compact_layouts(max_rank=2, max_depth=0))
def test_blocked_and_raked_products_are_bijections(A, B):
    for f in (blocked_product, raked_product):
        R = f(A, B)
        assert sorted(R.values()) == list(range(A.size() * B.size()))
        assert R.rank == max(A.rank, B.rank)


def test_blocked_product_tiles_a_block():
    R = blocked_product(Layout((2, 2), (1, 2)), Layout((2, 3), (1, 2)))
    # mode 0 is (block rows, tile rows), mode 1 (block cols, tile cols)
    assert R[0].shape == (2, 2) and R[1].shape == (2, 3)
    assert R((1, 0), (0, 0)) == 1 and R((0, 1), (0, 0)) == 4


def test_raked_product_interleaves():
    R = raked_product(Layout((2, 2), (1, 2)), Layout((2, 3), (1, 2)))
    assert R[0].shape == (2, 2) and R[1].shape == (3, 2)


# -- Layout basics and errors ------------------------------------------------------------


@given(layouts())
def test_text_round_trip(A):
    assert Layout.parse(str(A)) == A
    assert hash(Layout.parse(str(A))) == hash(A)


def test_layout_basics():
    L = Layout((4, (2, 3)))
    assert L.stride == (1, (4, 8))
    assert L.size() == 24 and L.rank == 2 and L.depth == 2
    assert L.cosize() == 24
    assert L.flatten() == Layout((4, 2, 3), (1, 4, 8))
    assert L(5) == 5 and L((1, (1, 2))) == 1 + 4 + 16 and L(1, 5) == L((1, 5))
    assert L.idx2crd(5) == (1, (1, 0))
    assert Layout(8, 1).rank == 1 and str(Layout(8)) == "8:1"
    assert Layout([2, 3], [3, 1]) == Layout((2, 3), (3, 1))


@pytest.mark.parametrize("name", ["shape", "stride", "_hash", "_fshape", "_fstride", "other"])
def test_layout_is_immutable(name):
    for L in (Layout((4, 2)), composition(Layout((4, 2)), Layout(2, 2))):  # validated and internal
        hash(L), L.flat_shape  # caches filled: still only readable
        before = (L.shape, L.stride, hash(L))
        with pytest.raises(AttributeError, match="Layout is immutable"):
            setattr(L, name, (8,))
        with pytest.raises(AttributeError, match="Layout is immutable"):
            delattr(L, name)
        assert type(L) is Layout and (L.shape, L.stride, hash(L)) == before


@pytest.mark.parametrize(
    "shape,stride,needle",
    [
        ((2, 0), (1, 2), "not positive"),
        ((2, -3), (1, 2), "not positive"),
        ((2, 2.5), None, "not an integer"),
        ((2, True), None, "not an integer"),
        ((2, 3), 1, "not congruent"),
        ((2, (3, 4)), (1, 2, 3), "not congruent"),
    ],
)
def test_bad_layouts_are_refused(shape, stride, needle):
    with pytest.raises(LayoutError, match=needle):
        Layout(shape, stride)


@pytest.mark.parametrize("text", ["(4,2)", "(4,2):(1,", "4:1:2", "():()", "(4,x):(1,4)"])
def test_bad_text_is_refused(text):
    with pytest.raises(LayoutError, match="Layout.parse"):
        Layout.parse(text)


def test_error_messages_name_operation_operands_and_condition():
    with pytest.raises(LayoutError) as e:
        composition(Layout((4, 6), (6, 1)), 6)
    msg = str(e.value)
    assert "composition((4,6):(6,1), 6:1)" in msg and "shape divisibility" in msg
    with pytest.raises(LayoutError, match="stride divisibility"):
        composition(Layout((6, 2), (1, 7)), Layout(2, 4))
    with pytest.raises(LayoutError, match="not injective"):
        complement(Layout((2, 4), (1, 1)), 16)
    with pytest.raises(LayoutError, match="not injective"):
        left_inverse(Layout((2, 4), (0, 1)))
    with pytest.raises(LayoutError, match="rank"):
        logical_divide(Layout(8), (2, 2))
    with pytest.raises(LayoutError, match="logical_divide"):
        logical_divide(Layout((3, 2), (2, 1)), Layout(4, 1))
    with pytest.raises(LayoutError, match="ambiguous"):
        composition(Layout((6, 1), (1, 1)), Layout(6, 2))
    with pytest.raises(LayoutError, match="tiler"):
        composition(Layout(8), -2)
    assert issubclass(LayoutError, ShardingError)


@pytest.mark.parametrize("call,needle", [
    (lambda: Layout((4, 2), (1, 4))[5], "Layout (4,2):(1,4): mode 5 is not a mode of this rank-2 layout; give an int "
                                        "from -2 to 1"),
    (lambda: Layout((4, 2), (1, 4))["a"], "mode 'a' is not a mode"),
    (lambda: Layout(4, 1)[1], "mode 1 is not a mode of this rank-1 layout"),
    (lambda: Layout(())[0], "a rank-0 layout has no modes"),
    (lambda: Layout((4, 2), (1, 4)).idx2crd(1.5), "idx2crd index 1.5 is not an int; give a 1-D index, e.g. 0 to 7"),
])
def test_modes_and_indices_out_of_the_layout_are_layout_errors(call, needle):
    with pytest.raises(LayoutError) as e:
        call()
    assert needle in str(e.value), str(e.value)


def test_the_rank_0_layout_is_cutes_layout_of_size_and_cosize_1():
    """CuTe's ``Layout<Shape<>, Stride<>>``: size 1 (the empty product), cosize 1 (its coshape), its one
    offset 0; as an A it is 1:0 (what coalescing it gives), and composing by an empty tiler drops
    every mode (as C++ drops the modes a tuple tiler does not touch)."""
    E = Layout(())
    L = Layout((4, 2), (1, 4))
    assert (E.size(), E.cosize(), E(0), E.values(), E.rank) == (1, 1, 0, [0], 0)
    assert composition(L, ()) == E and composition(L, ()).cosize() == 1
    assert composition(E, Layout(4, 2)) == Layout(4, 0) and composition(E, E) == E
    assert coalesce(E) == Layout(1, 0) and logical_product(L, E).size() == 8
    assert L[0:1] == Layout((4,), (1,)) and L[-1] == Layout(2, 4)
