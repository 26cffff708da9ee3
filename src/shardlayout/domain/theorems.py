"""Named theorems about IterDomain transforms, each with its preconditions checked on extents.

Every theorem is a function of extents that returns a ``Justification``: the theorem's name,
the IDs it maps, its preconditions with their values (True / False / None when unknown for
symbolic extents) and a one-line reason; a failed precondition is named in the reason. Each
is brute-forced both ways in ``tests/domain/test_theorems.py``: when the preconditions hold
the claim holds on every index of every device; for an "iff" theorem, when one fails a
counter-example exists.

Notation: ``/`` on extents is ``ceilDiv``; an outer split of ``I`` (extent n) by f is
``[f, n/f]``, an inner split ``[n/f, f]``; an ID's *index* is a function of the logical
index ``i`` of the dim it comes from, and two IDs *map* when their extents are equal and
their indices are equal for every ``i`` both tensors hold.

    >>> outer_split_of_merge(4, 2, 2).holds, outer_split_of_merge(3, 2, 2).failed[0].name
    (True, 'e1 | ceilDiv(e0*e1, n)')
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DomainError
from .iterdomain import _add, _ceil_div, _is_int, _le, _mul, divides, equal


@dataclass(frozen=True)
class Precondition:
    """One checked condition: ``Precondition("d | start", True, "2 | 6")``."""

    name: str
    value: bool | None
    detail: str = ""


@dataclass(frozen=True)
class Justification:
    """Why two IDs map (or a sliced / concatenated dim needs no communication): the theorem,
    the mapped IDs, the preconditions with their values, a one-line reason.
    ``split_split_commute(12, 2, 3).holds -> True``."""

    theorem: str
    mapped: tuple
    preconditions: tuple
    reason: str

    @property
    def holds(self) -> bool | None:
        """True when every precondition holds, False when one fails, else None."""
        values = [p.value for p in self.preconditions]
        if any(v is False for v in values):
            return False
        return True if all(v is True for v in values) else None

    @property
    def failed(self) -> tuple:
        """The preconditions that are False. ``inner_split_slice(2, 1, 4).failed[0].name -> 'd | start'``."""
        return tuple(p for p in self.preconditions if p.value is False)


def _and(*vs):
    if any(v is False for v in vs):
        return False
    return True if all(v is True for v in vs) else None


def _or(*vs):
    if any(v is True for v in vs):
        return True
    return False if all(v is False for v in vs) else None


def _justify(theorem: str, mapped, pres, claim: str) -> Justification:
    pres = tuple(pres)
    bad = [p for p in pres if p.value is False]
    unknown = [p for p in pres if p.value is None]
    if bad:
        reason = f"no: {claim} needs {bad[0].name}, which fails ({bad[0].detail})"
    elif unknown:
        reason = f"unknown: {claim} needs {', '.join(p.name for p in unknown)}, not decided by the facts"
    else:
        reason = f"{claim} ({'; '.join(p.detail or p.name for p in pres)})"
    return Justification(theorem, tuple(mapped), pres, reason)


def _positive(name: str, x) -> Precondition:
    return Precondition(f"{name} > 0", _le(1, x), f"{name} = {x}")


def _div(name_m: str, m, name_e: str, e, facts) -> Precondition:
    return Precondition(f"{name_m} | {name_e}", divides(m, e, facts), f"{m} | {e}")


# ------------------------------------------------------------------------------------------
# splits of splits, splits of merges
# ------------------------------------------------------------------------------------------


def split_split_commute(n, a, d, inner: bool = True, facts=None, ids=("X/a/d", "X/d/a")) -> Justification:
    """Two splits of ``X`` (extent n) in either order (nvFuser integer-division Theorem 2.11).

    Extents: ``n/a/d == n/d/a == ceilDiv(n, a*d)``, unconditionally for ``a, d > 0``.

    ``inner=True``: chain A inner-splits X by a (``[X/a, a]``) then ``X/a`` by d (``[X/a/d, d]``);
    chain B by d then a. The quotients ``X/a/d`` and ``X/d/a`` map: both index ``i // (a*d)``
    (``i // a // d == i // (a*d)``), unconditionally. The factor IDs do not map in general
    (``i mod a`` vs ``(i // d) mod a``).

    ``inner=False``: chain A outer-splits X by a (``[a, X/a]``) then ``X/a`` by d (``[d, X/a/d]``);
    chain B by d then a. The remainders ``X/a/d`` and ``X/d/a`` have equal extents c =
    ``ceilDiv(n, a*d)`` but index ``i mod (n/a) mod c`` and ``i mod (n/d) mod c``; they map iff
    ``n/a == n/d`` or each of ``n/a``, ``n/d`` is a multiple of c or at least n (e.g. ``a*d | n``).

    ``split_split_commute(10, 3, 2, inner=False).holds -> False``
    """
    pres = [_positive("a", a), _positive("d", d)]
    c = "ceilDiv(n, a*d)" if n is None else _ceil_div(n, _mul(a, d))
    if inner:
        claim = f"{ids[0]} and {ids[1]} map: extent ceilDiv(n, a*d) = {c}, index i // {_mul(a, d)}"
        return _justify("split_split_commute", [ids], pres, claim)
    if n is None:
        raise DomainError("split_split_commute(inner=False) needs the extent n")
    na, nd = _ceil_div(n, a), _ceil_div(n, d)

    def whole(x):
        return _or(divides(c, x, facts), _le(n, x, facts))

    ok = _or(equal(na, nd, facts), _and(whole(na), whole(nd)))
    pres.append(Precondition("n/a == n/d or c divides (or covers) both n/a and n/d", ok,
                             f"n/a = {na}, n/d = {nd}, c = {c}"))
    claim = f"{ids[0]} and {ids[1]} map: extent {c}, index i mod (n/a) mod c == i mod (n/d) mod c"
    return _justify("split_split_commute", [ids], pres, claim)


def divmod_commute(m, q, facts=None) -> Justification:
    """Splitting a remainder: for every ``x >= 0``, ``(x mod m) // q == (x // q) mod (m/q)`` and
    ``(x mod m) mod q == x mod q``, iff ``q | m``: an inner part of extent m split by q is the
    split by q of the whole, taken mod. ``divmod_commute(6, 3).holds -> True``."""
    pres = [_positive("q", q), _div("q", q, "m", m, facts)]
    claim = "split(x mod m, q) == (x // q mod m/q, x mod q)"
    return _justify("divmod_commute", [("split(I mod m, q)", "split(I, q) mod")], pres, claim)


def split_of_merge(e0, e1, c, facts=None) -> Justification:
    """A split with block ``c`` (``c`` = the inner extent: ``ceilDiv(n, f)`` for an outer split
    by f, ``f`` for an inner one) of ``merge(I0, I1)`` (extents e0, e1) splits I0 alone: its
    outer part is ``I0 // (c/e1)`` and its inner part ``merge(I0 mod (c/e1), I1)``, iff
    ``e1 | c`` (when ``e1 ∤ c`` and ``e0*e1 > c`` the outer part depends on I1).
    ``split_of_merge(4, 2, 2).holds -> True``"""
    pres = [_positive("c", c), _div("e1", e1, "c", c, facts)]
    return _justify("split_of_merge", [("split(merge(I0, I1)).outer", "split(I0).outer")], pres,
                    "the split of the merge splits its outer input alone")


def outer_split_of_merge(e0, e1, n, side: str = "outer", facts=None) -> Justification:
    """An outer split by ``n`` of ``M = merge(I0, I1)`` (extents e0, e1) against an outer split by
    ``n`` of one of the merge's inputs (nvFuser cases A.5-A.7, E.33, E.36; a split reshape
    ``[h] -> [a, h/a]`` is the same statement read backwards, ``h = merge(a, h/a)``).

    ``side="outer"``: ``split(M, n).outer`` maps to ``split(I0, n).outer`` (both extent n;
    indices ``(i0*e1 + i1) // ceilDiv(e0*e1, n)`` and ``i0 // ceilDiv(e0, n)``) iff
    ``ceilDiv(e0*e1, n) == e1 * ceilDiv(e0, n)``, equivalently ``e1 | ceilDiv(e0*e1, n)``.
    ``n | e0`` suffices (nvFuser requires it); it is necessary unless ``e1*(n - e0 mod n) < n``
    (e.g. ``e1 == 1``).

    ``side="inner"``: ``split(M, n).outer`` maps to ``split(I1, n).outer`` iff ``n == 1`` or
    ``e0 == 1`` (a device ID on a merge's inner input does not survive it: nvFuser case A.6).

    ``outer_split_of_merge(3, 2, 2).holds -> False``
    """
    if side not in ("outer", "inner"):
        raise DomainError(f"outer_split_of_merge: side {side!r} is not 'outer' or 'inner'")
    pres = [_positive("n", n)]
    block = _ceil_div(_mul(e0, e1), n)
    if side == "outer":
        pres.append(Precondition("e1 | ceilDiv(e0*e1, n)", divides(e1, block, facts),
                                 f"ceilDiv({e0}*{e1}, {n}) = {block}, e1*ceilDiv(e0, n) = "
                                 f"{_mul(e1, _ceil_div(e0, n))}; n | e0: {divides(n, e0, facts)}"))
        mapped = ("split(merge(I0, I1), n).outer", "split(I0, n).outer")
    else:
        pres.append(Precondition("n == 1 or e0 == 1", _or(equal(n, 1, facts), equal(e0, 1, facts)),
                                 f"n = {n}, e0 = {e0}"))
        mapped = ("split(merge(I0, I1), n).outer", "split(I1, n).outer")
    return _justify("outer_split_of_merge", [mapped], pres, f"{mapped[0]} maps to {mapped[1]}")


# ------------------------------------------------------------------------------------------
# slices and cats of sharded dims
# ------------------------------------------------------------------------------------------


def _check_range(start, end, what: str) -> None:
    if _is_int(start) and _is_int(end) and not 0 <= start < end:
        raise DomainError(f"{what}: slice [{start}, {end}) is empty or negative; give 0 <= start < end")


def inner_split_slice(d, start, end=None, even: bool = True, facts=None) -> Justification:
    """A slice ``[start, end)`` of a dim inner-split by d (loop ``[n/d, d]``, d on devices),
    with the output inner-split by d the same way: rank r holds the elements ``== r mod d``.

    Comm-free (every rank's local slice of its input shard is exactly its output shard, in
    order) iff ``d | start``; with ``even=True`` the claim adds that the output shards are even
    (no padded hole, nvFuser's divisibility rule for device splits), and holds iff ``d | start``
    and ``d | end``. ``inner_split_slice(2, 2, 6).holds -> True``
    """
    if end is None and even:
        raise DomainError("inner_split_slice(even=True) needs the slice's end")
    if end is not None:
        _check_range(start, end, "inner_split_slice")
    pres = [_positive("d", d), _div("d", d, "start", start, facts)]
    if even:
        pres.append(_div("d", d, "end", end, facts))
    claim = "the slice is comm-free" + (" with even output shards" if even else "")
    return _justify("inner_split_slice", [("input d", "output d")], pres, claim)


def _boundaries(c, start, end) -> tuple:
    first = start // c + 1
    return tuple(k * c for k in range(first, -(-end // c)) if start < k * c < end)


def outer_split_slice(n, d, start, end, even: bool = True, facts=None) -> Justification:
    """A slice ``[start, end)`` of a dim of n outer-split by d (loop ``[d, n/d]``), the output
    (L = end - start elements) outer-split by d: rank r holds ``[r*c, (r+1)*c)`` of the input
    (``c = ceilDiv(n, d)``) and ``[r*c', (r+1)*c')`` of the output (``c' = ceilDiv(L, d)``).

    Comm-free iff ``start < c`` (the slice starts in rank 0's shard) and the input's shard
    boundaries inside the slice are exactly the output's: ``{k*c in (start, end)} ==
    {start + k*c' in (start, end)}``; with ``even=True`` also ``d | L``. Generally false: for
    ``d > 1`` and a slice holding more than one shard it needs ``start == 0`` and ``c == c'``.
    ``outer_split_slice(8, 4, 1, 3, even=False).holds -> True``
    """
    _check_range(start, end, "outer_split_slice")
    length = _add(end, _mul(-1, start))
    c, c2 = _ceil_div(n, d), _ceil_div(length, d)
    pres = [_positive("d", d), Precondition("start < ceilDiv(n, d)", _le(_add(start, 1), c, facts), f"{start} < {c}")]
    if all(_is_int(x) for x in (start, end, c, c2)):
        b_in = _boundaries(c, start, end)
        b_out = tuple(start + k * c2 for k in range(1, d + 1) if start + k * c2 < end)
        pres.append(Precondition("shard boundaries coincide", b_in == b_out, f"input {b_in}, output {b_out}"))
    else:
        pres.append(Precondition("shard boundaries coincide", None, "symbolic extents"))
    if even:
        pres.append(_div("d", d, "end - start", length, facts))
    claim = "the slice is comm-free" + (" with even output shards" if even else "")
    return _justify("outer_split_slice", [("input d", "output d")], pres, claim)


def _offsets(extents) -> list:
    out, off = [], 0
    for e in extents:
        out.append((off, _add(off, e)))
        off = _add(off, e)
    return out


def inner_split_cat(extents, d, even: bool = True, facts=None) -> Justification:
    """A cat of dims of ``extents``, each inner-split by d, into a dim inner-split by d: comm-free
    (rank r's output shard is the cat of its input shards) iff every input but the last has
    ``d | extent`` (its offsets fall on shard boundaries); with ``even=True`` (every shard even)
    iff every extent is divisible by d. ``inner_split_cat([4, 6], 2).holds -> True``
    """
    extents = tuple(extents)
    pres = [_positive("d", d)]
    counted = extents if even else extents[:-1]
    pres += [_div("d", d, f"n{k}", e, facts) for k, e in enumerate(counted)]
    claim = "the cat is comm-free" + (" with even shards" if even else "")
    return _justify("inner_split_cat", [(f"input {k} d", "output d") for k in range(len(extents))], pres, claim)


def outer_split_cat(extents, d, even: bool = True, facts=None) -> Justification:
    """A cat of dims of ``extents``, each outer-split by d, into a dim (N = the sum) outer-split
    by d: comm-free iff, for every input k, the output's slice ``[off_k, off_k + n_k)`` is
    comm-free by ``outer_split_slice(N, d, ...)``; with ``even=True`` also ``d | n_k``.
    Generally false: for ``d > 1`` and two inputs it needs the first input to fit in one output
    shard *and* in one of its own (``n0 <= 1``). ``outer_split_cat([4, 4], 2).holds -> False``
    """
    extents = tuple(extents)
    total = extents[0]
    for e in extents[1:]:
        total = _add(total, e)
    pres = [_positive("d", d)]
    for k, (lo, hi) in enumerate(_offsets(extents)):
        j = outer_split_slice(total, d, lo, hi, even=even, facts=facts)
        v = j.holds
        pres.append(Precondition(f"input {k} lines up", v, j.reason))
    claim = "the cat is comm-free" + (" with even shards" if even else "")
    return _justify("outer_split_cat", [(f"input {k} d", "output d") for k in range(len(extents))], pres, claim)
