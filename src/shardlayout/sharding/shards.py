"""Local pieces of a sharded tensor: which global elements each rank holds.

These functions read a Sharding's fields (``ShardingLike``); the ``Sharding`` methods
``local_shape``, ``indices``, ``layout``, ``shard`` and ``unshard`` call them. So this
module needs only ``factors.py``, never ``core.py``, which is built on it.

    >>> from shardlayout.mesh import Mesh
    >>> from shardlayout.sharding.core import Sharding
    >>> s = Sharding.parse("[dp*tp*3 of 9]", Mesh.parse("dp=2,tp=2"))
    >>> [local_shape(s, r) for r in range(4)]
    [(3,), (2,), (2,), (2,)]
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Mapping

import numpy as np

from ..caches import memo
from ..errors import ShardingSpecError, ShardMismatch
from ..layout import Layout
from ..layout.inttuple import ceil_div
from .factors import ChunkProgram, ShardingLike, factor_digit, held_length, program_length


def _chunk(lo: int, hi: int, k: int, i: int) -> tuple:
    c = ceil_div(hi - lo, k) if hi > lo else 0
    s = lo + i * c
    if s >= hi:
        return hi, hi
    return s, min(s + c, hi)


def dim_ranges(n: int, factors: tuple, digits) -> list:
    """The global ranges ``[(lo, hi)]`` a device holds along one dim, in local order.

    ``digits[j]`` is the device's digit for axis factor ``j`` (ignored for local ones).
    ``dim_ranges(9, (Factor(2, "x"), Factor(5)), [1, None]) -> [(5, 9)]``
    """
    if isinstance(factors, ChunkProgram):
        return _program_ranges(n, factors, digits)
    ranges = [(0, n)]
    last = len(factors) - 1
    for j, f in enumerate(factors):
        if f.axis is None:
            if j == last:
                break
            # the non-empty chunks only: a large local factor on a short range stays cheap
            ranges = [(a, min(a + c, hi)) for lo, hi in ranges if hi > lo
                      for c in (ceil_div(hi - lo, f.size),) for a in range(lo, hi, c)]
        else:
            g = digits[j]
            ranges = [_chunk(lo, hi, f.size, g) for lo, hi in ranges if hi > lo]
    return [r for r in ranges if r[1] > r[0]]


def _program_ranges(n: int, prog: ChunkProgram, digits) -> list:
    """DTensor's cuts, step by step, on the list of held ranges (concatenated)."""
    ranges = [(0, n)]
    for st, g in zip(prog, digits):
        ranges = [r for grp in _cut_ranges(ranges, st.sf) for r in _piece(grp, st.size, g)]
    return [r for r in ranges if r[1] > r[0]]


def _cut_ranges(ranges: list, k: int) -> list:
    """The non-empty parts of torch.chunk of the concatenation of ``ranges`` into k parts, each
    a list of ranges (at most as many parts as elements, however large k is)."""
    total = sum(hi - lo for lo, hi in ranges)
    if not total:
        return []
    c = ceil_div(total, k)
    parts, cur, filled = [], [], 0
    for lo, hi in ranges:
        while lo < hi:
            take = min(hi - lo, c - filled)
            cur.append((lo, lo + take))
            lo += take
            filled += take
            if filled == c:
                parts.append(cur)
                cur, filled = [], 0
    if cur:
        parts.append(cur)
    return parts


def _piece(ranges: list, k: int, i: int) -> list:
    """Part ``i`` of torch.chunk of the concatenation of ``ranges`` into k parts."""
    total = sum(hi - lo for lo, hi in ranges)
    c = ceil_div(total, k) if total else 0
    start, end = i * c, min((i + 1) * c, total)
    out, pos = [], 0
    for lo, hi in ranges:
        a, b = max(lo, lo + start - pos), min(hi, lo + end - pos)
        if a < b:
            out.append((a, b))
        pos += hi - lo
    return out


def _dim_digits(s: ShardingLike, d: int, coord: tuple) -> list:
    return [None if f.axis is None else factor_digit(s.mesh, f, coord) for f in s.dims[d]]


@memo(1 << 16)
def local_indices(s: ShardingLike, rank: int) -> tuple:
    """Global indices per dim (read-only int arrays, local order) held by ``rank``."""
    coord = s.mesh.coord(rank)
    out = []
    for n, fs, plan in _digit_plans(s):
        digits = tuple([None if p is None else coord[p[0]] // p[1] % p[2] for p in plan])  # factor_digit's
        try:  # ranks with the same digits on a dim hold the same indices there: made once
            out.append(_dim_indices(n, fs, digits))
        except TypeError:  # a dim's factors that do not hash
            out.append(_dim_indices.__wrapped__(n, fs, digits))
    return tuple(out)


@memo(1 << 14)
def _digit_plans(s: ShardingLike) -> tuple:
    """Per dim of ``s``: ``(extent, factors, plan)``, ``plan`` per factor None (local) or
    ``(coordinate position, divisor, size)``: its digit is ``coord[position] // divisor % size``,
    as :func:`factor_digit` computes it."""
    mesh = s.mesh
    return tuple((n, fs, tuple(None if f.axis is None else (mesh.axis_index(f.axis),
                                                            mesh.axis_size(f.axis) // (f.pre * f.size), f.size)
                               for f in fs))
                 for n, fs in zip(s.shape, s.dims))


_NONE = np.zeros(0, dtype=np.int64)
_NONE.setflags(write=False)


@memo(1 << 16)
def _dim_indices(n: int, factors, digits: tuple) -> np.ndarray:
    """The global indices of one dim at ``digits`` (read-only; every empty piece gets one shared
    empty array, so ranks holding nothing there hold the same array)."""
    rs = dim_ranges(n, factors, digits)
    if not rs:
        return _NONE
    idx = np.arange(*rs[0]) if len(rs) == 1 else np.concatenate([np.arange(lo, hi) for lo, hi in rs])
    idx.setflags(write=False)
    return idx


@memo(1 << 16)
def local_shape(s: ShardingLike, rank: int) -> tuple:
    """Shape of the piece ``rank`` holds (uneven shards: torch.chunk sizes, possibly 0), from
    chunk lengths alone. ``local_shape(Sharding.parse("[x*3 of 5]", m), 1) -> (2,)``"""
    return _local_shape(s, rank)


def _local_shape(s: ShardingLike, rank: int) -> tuple:
    coord = s.mesh.coord(rank)
    return tuple(dim_length(s.shape[d], s.dims[d], _dim_digits(s, d, coord)) for d in range(s.ndim))


def dim_length(n: int, factors, digits) -> int:
    """How many elements a device holds along one dim: ``dim_ranges``' total, from chunk lengths
    alone (its cost does not grow with ``n`` or with the number of held ranges).

    ``dim_length(9, (Factor(2, "x"), Factor(5)), [1, None]) -> 4``
    """
    if isinstance(factors, ChunkProgram):
        return program_length(n, factors, digits)
    return held_length(n, factors, digits)


def _partial_divisor(s: ShardingLike) -> int:
    p = 1
    for axis, op in s.partial:
        if op == "sum":
            p *= s.mesh.axis_size(axis)
    return p


def shard(s: ShardingLike, array) -> dict:
    """``{rank: piece}``; onto partial(sum) axes each rank gets ``v / n`` (DTensor's
    ``Partial._partition_value``), onto avg/max/min it gets ``v``."""
    a = np.asarray(array)
    if a.shape != s.shape:
        raise ShardMismatch(
            f"shard: array of shape {a.shape} does not match sharding {s} of shape {s.shape}"
        )
    div = _partial_divisor(s)
    if div != 1:
        a = a / div
    return {r: a[np.ix_(*local_indices(s, r))] for r in s.mesh.ranks()}


_REDUCE = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min}


def unshard(s: ShardingLike, pieces: dict, tolerance: float = 0.0):
    """The global array from ``{rank: piece}``: partial axes reduced, replicas checked.

    Raises ``ShardMismatch`` naming the rank and the problem when a piece is missing, has
    the wrong shape, or replicas of the same element disagree (beyond ``tolerance``).
    """
    mesh = s.mesh
    if not isinstance(pieces, Mapping):
        raise ShardMismatch(f"unshard {s}: pieces must be a dict {{rank: local piece}}, got "
                            f"{type(pieces).__name__} {reprlib.repr(pieces)}; e.g. dict(enumerate(pieces)) for a "
                            "list in rank order")
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) or not math.isfinite(tolerance) \
            or tolerance < 0:
        raise ShardMismatch(f"unshard {s}: tolerance {reprlib.repr(tolerance)} must be a finite number >= 0 (how far "
                            "replicas of one element may differ; 0: exactly equal)")
    for r in mesh.ranks():
        if r not in pieces:
            raise ShardMismatch(f"unshard {s}: no piece for rank {r} (mesh {mesh} has {mesh.size} ranks)")
    if len(pieces) > mesh.size:  # every rank is there: the others are not ranks of the mesh
        extra = next(k for k in pieces if not (isinstance(k, numbers.Integral) and 0 <= k < mesh.size))
        raise ShardMismatch(f"unshard {s}: key {reprlib.repr(extra)} is not a rank of mesh {mesh} (ranks 0 to "
                            f"{mesh.size - 1}); give one piece per rank, no more")
    for r in mesh.ranks():
        want = local_shape(s, r)
        got = np.shape(pieces[r])
        if tuple(got) != want:
            raise ShardMismatch(
                f"unshard {s}: rank {r} holds a piece of shape {tuple(got)}, expected {want}"
            )
    sample = np.asarray(pieces[0])
    out = None
    written = np.zeros(s.shape, dtype=bool)
    partial_idx = [mesh.axis_index(a) for a, _ in s.partial]
    for r in mesh.ranks():
        coord = mesh.coord(r)
        if any(coord[i] != 0 for i in partial_idx):
            continue
        value = np.asarray(pieces[r])
        if partial_idx:
            value = _reduce_group(s, pieces, coord, partial_idx)
        if out is None:
            out = np.zeros(s.shape, dtype=np.result_type(value.dtype, sample.dtype))
        idx = np.ix_(*local_indices(s, r))
        seen = written[idx]
        if seen.any():
            old = out[idx][seen]
            new = value[seen]
            bad = ~np.isclose(old, new, rtol=tolerance, atol=tolerance) if tolerance else old != new
            if np.any(bad):
                raise ShardMismatch(
                    f"unshard {s}: rank {r} {coord} disagrees with another replica of the same "
                    f"elements ({int(np.sum(bad))} values differ, e.g. {new[bad][0]!r} vs {old[bad][0]!r})"
                )
        out[idx] = value
        written[idx] = True
    if out is None:
        out = np.zeros(s.shape, dtype=sample.dtype)
    return out


def _reduce_group(s: ShardingLike, pieces: dict, coord: tuple, partial_idx: list):
    """Reduce the pieces of the ranks that differ from ``coord`` only on partial axes, axis by
    axis in mesh order (sum and avg commute; one op per axis)."""
    mesh = s.mesh
    sizes = [mesh.shape[i] for i in partial_idx]
    first = np.asarray(pieces[mesh.rank_of(coord)])
    stacked = np.zeros(tuple(sizes) + first.shape, dtype=np.result_type(first.dtype, np.float64))
    for digits in np.ndindex(*sizes):
        c = list(coord)
        for i, g in zip(partial_idx, digits):
            c[i] = g
        stacked[digits] = pieces[mesh.rank_of(tuple(c))]
    ops = dict(s.partial)
    kinds = {ops[mesh.names[i]] for i in partial_idx}
    if len(kinds) > 1 and not kinds <= {"sum", "avg"}:
        raise ShardingSpecError(
            f"unshard {s}: partial axes with reduce ops {sorted(kinds)} do not commute; "
            "redistribute one of them first"
        )
    for i in partial_idx:
        stacked = _REDUCE[ops[mesh.names[i]]](stacked, axis=0)
    return stacked


def sharding_layout(s: ShardingLike):
    """The CuTe layout ``((local dims), (mesh axes)) -> global row-major offset``.

    Each local-dim mode lists that dim's local factors, each mesh-axis mode the pieces of
    that axis (minor first, as CuTe modes are column-major); an axis piece that shards
    nothing has stride 0. Defined for even shardings only.
    """
    if not s.is_even():
        raise ShardingSpecError(
            f"layout of {s}: uneven dims are not a single layout (chunk sizes depend on the "
            "device); use indices(rank) or make the dims even"
        )
    gstride = [1] * s.ndim
    for d in range(s.ndim - 2, -1, -1):
        gstride[d] = gstride[d + 1] * s.shape[d + 1]
    local_modes = []
    axis_pieces: dict = {n: [] for n in s.mesh.names}
    for d, fs in enumerate(s.dims):
        inner = 1
        strides = [0] * len(fs)
        for j in range(len(fs) - 1, -1, -1):
            strides[j] = inner * gstride[d]
            inner *= fs[j].size
        locs = [(f.size, strides[j]) for j, f in enumerate(fs) if f.local]
        locs.reverse()  # column-major inside a mode: innermost first
        local_modes.append(_mode(locs))
        for j, f in enumerate(fs):
            if f.axis is not None:
                axis_pieces[f.axis].append((f.pre, f.size, strides[j]))
    device_modes = []
    for name, n in zip(s.mesh.names, s.mesh.shape):
        ps = sorted(axis_pieces[name])
        parts = []  # major first
        covered = 1
        for pre, size, stride in ps:
            if pre > covered:
                parts.append((pre // covered, 0))
            parts.append((size, stride))
            covered = pre * size
        if covered < n:
            parts.append((n // covered, 0))
        parts.reverse()
        device_modes.append(_mode(parts))
    shape = (tuple(m[0] for m in local_modes), tuple(m[0] for m in device_modes))
    stride = (tuple(m[1] for m in local_modes), tuple(m[1] for m in device_modes))
    return Layout(shape, stride)


def _mode(parts: list) -> tuple:
    parts = [p for p in parts if p[0] != 1] or [(1, 0)]
    if len(parts) == 1:
        return parts[0]
    return tuple(p[0] for p in parts), tuple(p[1] for p in parts)
