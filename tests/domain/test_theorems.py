"""Every theorem, brute-forced both ways on small extents (1..24, factors 1..6): when its
preconditions hold the claim holds on every index of every device; for an "iff" theorem, when
one fails a counter-example exists. The claims are read off real TensorDomains by
enumeration (``index_map``), never recomputed with the theorem's own formula.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlayout.domain import (
    Justification,
    TensorDomain,
    divmod_commute,
    index_map,
    inner_split_cat,
    inner_split_slice,
    loop_indices,
    outer_split_cat,
    outer_split_of_merge,
    outer_split_slice,
    split_of_merge,
    split_split_commute,
)
from shardlayout.errors import DomainError

extents = st.integers(1, 24)
factors = st.integers(1, 6)


def values(td: TensorDomain, pos: int) -> dict:
    """Logical index tuple -> the value of loop position ``pos`` (holes skipped)."""
    f = index_map(td)
    out = {}
    for li in loop_indices(td):
        logical = f(li)
        if logical is not None:
            out[logical] = li[pos]
    return out


def shards(td: TensorDomain, pos: int, d: int) -> list:
    """Per device r (the value of loop position ``pos``): its logical indices in loop order."""
    f = index_map(td)
    out = [[] for _ in range(d)]
    for li in loop_indices(td):
        logical = f(li)
        if logical is not None:
            out[li[pos]].append(logical[0])
    return out


def has_holes(td: TensorDomain) -> bool:
    f = index_map(td)
    return any(f(li) is None for li in loop_indices(td))


def test_justification_records_values_and_the_failed_precondition():
    j = inner_split_slice(2, 1, 4)
    assert isinstance(j, Justification) and j.theorem == "inner_split_slice"
    assert j.holds is False and [p.name for p in j.failed] == ["d | start"]
    assert [(p.name, p.value, p.detail) for p in j.preconditions] == [
        ("d > 0", True, "d = 2"), ("d | start", False, "2 | 1"), ("d | end", True, "2 | 4")]
    assert j.reason.startswith("no: the slice is comm-free with even output shards needs d | start")
    ok = inner_split_slice(2, 2, 6)
    assert ok.holds is True and not ok.failed and ok.reason.startswith("the slice is comm-free")


# ------------------------------------------------------------------------------------------
# split_split_commute
# ------------------------------------------------------------------------------------------


@settings(max_examples=150)
@given(extents, factors, factors, st.booleans())
def test_split_split_commute(n, a, d, inner):
    """Chain A splits by a then its remainder by d, chain B by d then a; the remainders have
    extent ceilDiv(n, a*d) both ways, and map (same index for every i) as the theorem says."""
    chain_a = TensorDomain.create("t", (n,)).split(0, a, inner)
    chain_b = TensorDomain.create("t", (n,)).split(0, d, inner)
    rest = 0 if inner else 1  # the remainder of a split: outer part of an inner split, inner of an outer
    chain_a, chain_b = chain_a.split(rest, d, inner), chain_b.split(rest, a, inner)
    pos = 0 if inner else 2
    ra, rb = chain_a.loop[pos], chain_b.loop[pos]
    assert ra.extent == rb.extent == -(-n // (a * d))  # Theorem 2.11, unconditional
    j = split_split_commute(n, a, d, inner=inner)
    same = values(chain_a, pos) == values(chain_b, pos)
    assert j.holds is same
    if inner:
        assert j.holds is True


def test_split_split_commute_outer_counter_example():
    j = split_split_commute(10, 3, 2, inner=False)
    assert j.holds is False and "n/a = 4, n/d = 5, c = 2" in j.failed[0].detail
    assert split_split_commute(12, 3, 2, inner=False).holds is True


# ------------------------------------------------------------------------------------------
# splits of merges
# ------------------------------------------------------------------------------------------


@settings(max_examples=150)
@given(st.integers(1, 12), st.integers(1, 12), factors, st.sampled_from(["outer", "inner"]))
def test_outer_split_of_merge(e0, e1, n, side):
    """``split(merge(I0, I1), n).outer`` against ``split(I_side, n).outer``, element by element."""
    merged = TensorDomain.create("t", (e0, e1)).merge(0).outer_split(0, n)
    alone = TensorDomain.create("t", (e0, e1)).outer_split(0 if side == "outer" else 1, n)
    pos = 0 if side == "outer" else 1
    same = values(merged, 0) == values(alone, pos)
    j = outer_split_of_merge(e0, e1, n, side=side)
    assert j.holds is same
    if side == "outer" and e0 % n == 0:
        assert j.holds  # nvFuser's sufficient condition


def test_outer_split_of_merge_needs_more_than_divisibility_only_sometimes():
    # n does not divide e0 = 2, yet ceilDiv(4, 3) = 2 = e1 * ceilDiv(2, 3): the device IDs still map
    assert outer_split_of_merge(2, 2, 3).holds is True
    assert outer_split_of_merge(3, 2, 2).holds is False  # nvFuser case A.5: [6] -> [3, 2], split by 2
    assert outer_split_of_merge(3, 10, 2, side="inner").holds is False  # case A.6
    assert outer_split_of_merge(1, 10, 2, side="inner").holds is True
    with pytest.raises(DomainError, match="side"):
        outer_split_of_merge(3, 2, 2, side="middle")


def test_outer_split_of_merge_on_the_nvfuser_cases():
    assert outer_split_of_merge(9, 5, 3).holds and outer_split_of_merge(14, 9, 2).holds  # A.7
    assert outer_split_of_merge(4, 2, 2).holds  # E.33 [8] -> [4, 2] and E.36 [4, 2] -> [8]
    # E.34: [12] split by 2 vs [6, 2] split by 3 -- different device extents, nothing to map;
    # and split by 3 of [12] = merge(6, 2) does map to split by 3 of 6:
    assert outer_split_of_merge(6, 2, 3).holds


@settings(max_examples=100)
@given(st.integers(1, 8), st.integers(1, 8), st.integers(1, 12))
def test_split_of_merge(e0, e1, c):
    j = split_of_merge(e0, e1, c)
    outer = {(i0, i1): (i0 * e1 + i1) // c for i0 in range(e0) for i1 in range(e1)}
    if j.holds:
        q = c // e1
        assert all(v == i0 // q for (i0, _), v in outer.items())
        assert all((i0 * e1 + i1) % c == (i0 % q) * e1 + i1 for i0, i1 in outer)
    elif e0 * e1 > c:
        assert any(len({outer[(i0, i1)] for i1 in range(e1)}) > 1 for i0 in range(e0))


@settings(max_examples=100)
@given(st.integers(1, 24), factors)
def test_divmod_commute(m, q):
    j = divmod_commute(m, q)
    xs = range(3 * m * q)
    if j.holds:
        assert all((x % m) // q == (x // q) % (m // q) and (x % m) % q == x % q for x in xs)
    else:
        assert any((x % m) % q != x % q for x in xs)


# ------------------------------------------------------------------------------------------
# slices and cats
# ------------------------------------------------------------------------------------------


def slice_case(n, d, start, end, inner):
    """(comm-free, output even) of a slice of [n] split by d, output split by d, read off domains."""
    inp = TensorDomain.create("x", (n,)).split(0, d, inner)
    out = TensorDomain.create("y", (end - start,)).split(0, d, inner)
    dev = 1 if inner else 0
    local = [[x - start for x in shard if start <= x < end] for shard in shards(inp, dev, d)]
    return local == shards(out, dev, d), not has_holes(out)


@st.composite
def slices(draw):
    n = draw(extents)
    start = draw(st.integers(0, n - 1))
    return n, draw(factors), start, draw(st.integers(start + 1, n))


@settings(max_examples=200)
@given(slices(), st.booleans())
def test_inner_split_slice(case, even):
    n, d, start, end = case
    comm_free, out_even = slice_case(n, d, start, end, inner=True)
    assert inner_split_slice(d, start, end, even=even).holds is (comm_free and (out_even or not even))


@settings(max_examples=200)
@given(slices(), st.booleans())
def test_outer_split_slice(case, even):
    n, d, start, end = case
    comm_free, out_even = slice_case(n, d, start, end, inner=False)
    assert outer_split_slice(n, d, start, end, even=even).holds is (comm_free and (out_even or not even))


def test_outer_split_slice_is_rarely_comm_free():
    assert outer_split_slice(8, 2, 0, 8).holds is True  # the whole dim
    assert outer_split_slice(8, 2, 0, 4).holds is False  # the first half: rank 0 holds it all
    assert outer_split_slice(8, 4, 1, 3, even=False).holds is True  # straddles one boundary, lands on it
    with pytest.raises(DomainError, match="empty"):
        outer_split_slice(8, 2, 3, 3)


def cat_case(ns, d, inner):
    """(comm-free, every shard even) of a cat of dims ``ns`` split by d into a dim split by d."""
    dev = 1 if inner else 0
    out = TensorDomain.create("y", (sum(ns),)).split(0, d, inner)
    local = [[] for _ in range(d)]
    off, even = 0, not has_holes(out)
    for k, n in enumerate(ns):
        inp = TensorDomain.create(f"x{k}", (n,)).split(0, d, inner)
        even = even and not has_holes(inp)
        for r, shard in enumerate(shards(inp, dev, d)):
            local[r] += [off + j for j in shard]
        off += n
    return local == shards(out, dev, d), even


@settings(max_examples=150)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=4), factors, st.booleans(), st.booleans())
def test_cats(ns, d, inner, even):
    comm_free, all_even = cat_case(ns, d, inner)
    theorem = inner_split_cat(ns, d, even=even) if inner else outer_split_cat(ns, d, even=even)
    assert theorem.holds is (comm_free and (all_even or not even))


@settings(max_examples=100)
@given(st.lists(st.integers(2, 12), min_size=2, max_size=4), st.integers(2, 6))
def test_outer_split_cat_is_never_comm_free_past_trivial_cases(ns, d):
    assert outer_split_cat(ns, d, even=False).holds is False
    assert cat_case(ns, d, inner=False)[0] is False


def test_inner_split_cat_on_case_4():
    assert inner_split_cat([4, 6, 8], 2).holds is True
    j = inner_split_cat([3, 6, 8], 2)
    assert j.holds is False and j.failed[0].name == "d | n0"
    assert inner_split_cat([4, 6, 7], 2, even=False).holds is True  # the last input may be ragged
