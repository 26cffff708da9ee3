"""Resize ops — slice, narrow, split, cat, slice_backward — and when they run on local shards.

A slice, a split or a cat of a sharded dim moves no data whenever each rank's local slice (or
cat) of its own shard is exactly its shard of the result. With a dim written as factors (a
chunk tree, ``sharding/factors.py``), that is decided from the factors alone:

* **cut** (slice, narrow, each piece of a split): walk the factors outer to inner. A range that
  is a union of whole chunks of a *local* factor keeps the factors inside it (``[3*tp*8]``
  cut at multiples of 16 gives ``[tp*8]`` pieces: nvFuser's inner-split slice, seed issue
  #3987 case 3); a range inside one chunk of a local factor descends into it; a range that
  cuts the chunks of a mesh-axis factor is held by some ranks only, and needs a gather.
  A step keeps the factors when it divides an innermost local factor. A local factor whose
  chunks the ranks hold unequal pieces of (torch.chunk-uneven) has no whole groups: each
  chunk's part of the range is cut alone and the parts joined, when every rank's parts meet
  in its shard (``[2*a*2 of 5]`` cut ``[0:2]``: a's first rank keeps the head of its shard).
* **join** (cat): inputs whose dims are the same factors under an outer local factor join
  into one dim with the outer factors added up (``[tp*4]`` and ``[tp*4]`` give ``[2*tp*4]``;
  ``[hq/d*tp]``, ``[hk/d*tp]`` give ``[(hq+hk)/d*tp]``: case 4 of #3987).
* **pad** (slice_backward): the inverse of a cut by whole chunks.

The local run reads the local array of the dim as ``(groups, -1)`` and slices (or places)
whole groups — the same on every rank even when inner factors are uneven
(``local_slice``, ``local_pad``). When a precondition fails, the rule says which (a note,
shown by ``explain``) and gathers the dim as before.

    >>> from shardlayout.sharding import Factor
    >>> cut((Factor(3), Factor(2, "tp"), Factor(8)), 48, 16, 32).factors
    (Factor(size=2, axis='tp', pre=1), Factor(size=8, axis=None, pre=1))
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from ..errors import OpError
from ..sharding import Factor, Sharding
from ..sharding.core import ChunkProgram, _product
from ..sharding.cost import DEFAULT_COST_MODEL
from ..sharding.factors import chunk_counts, chunk_length, held_length
from .families import LETTERS, _whole, local_propagation
from .registry import register_op
from .result import ByCoord, Propagation


class Cut(NamedTuple):
    """A comm-free cut of one dim: the result's ``factors``, and the local run — the local
    array of the dim read as ``(groups, -1)``, groups ``start:stop:step`` kept."""

    factors: tuple
    groups: int
    start: int
    stop: int
    step: int = 1
    head: bool = False  # then keep only (local output size) elements from ``offset``: short shards
    offset: int | ByCoord = 0  # where each rank's kept elements begin (ByCoord: differs by rank)


def _sharded(fs) -> bool:
    return type(fs) is not ChunkProgram and any(f.axis is not None for f in fs)


def _describe(f: Factor) -> str:
    return str(f.size) if f.axis is None else (f.axis if f.pre == 1 else f"{f.axis}:({f.pre}){f.size}")


def cut(fs, n: int, start: int, stop: int, step: int = 1) -> Cut | str:
    """See :func:`_cut`; a prefix whose chunk boundaries all line up (``_prefix_kept``) is also
    comm-free: every rank keeps the head of its shard. ``cut((Factor(2, "c"), Factor(2, "b")), 4, 0, 3).head
    -> True``"""
    got = _cut(fs, n, start, stop, step)
    if isinstance(got, str) and start == 0 and step == 1 and 0 < stop < n and type(fs) is not ChunkProgram \
            and _prefix_kept(tuple(fs), n, stop):
        return Cut(tuple(fs), 1, 0, 1, 1, True)
    return got


def _prefix_kept(fs, n: int, t: int) -> bool:
    """Does the chunk tree ``fs`` cut ``[0, t)`` exactly as it cuts the first ``t`` of ``[0, n)``
    (so each rank's shard of the prefix is the head of its shard)?"""
    while fs and t:
        k = fs[0].size
        c, ct = -(-n // k), -(-t // k)
        if t <= ct:  # all in the first chunk of both
            n, fs = c, fs[1:]
            continue
        if ct != c:
            return False
        m = -(-t // c)
        n, t, fs = chunk_length(n, k, m - 1), t - (m - 1) * c, fs[1:]
    return True


def _cut(fs, n: int, start: int, stop: int, step: int = 1) -> Cut | str:
    """The comm-free cut of ``[start:stop:step]`` (bounds already clamped, ``0 <= start <= stop
    <= n``) of a dim of ``n`` with factors ``fs``, or the reason there is none (a string naming
    the failed precondition).

    ``cut((Factor(2, "tp"), Factor(8)), 16, 4, 8)`` -> a string (the range cuts tp's shards)

    A range that ends inside the last chunk it takes still keeps the shards when the result
    is the same chunk tree cut short (torch.chunk's trailing short or empty shards): ``[tp*2]``
    of 8 sliced ``[0:6]`` is ``[tp*2 of 6]``, each rank keeping the head of its shard.
    """
    if type(fs) is ChunkProgram:
        return "the dim is cut by DTensor's uneven chunks (no factor layout)"
    count = len(range(start, stop, step))
    if count == 0:
        return "the slice is empty"
    if count == 1:
        step = 1  # one element: its step does not matter
    span = count * step  # the elements start, start+step, ... lie in [start, start + span)
    fs = tuple(fs)
    groups, prefix, lo, ext, i = 1, 0, start, n, 0  # lo: start within the current chunk of ext
    first = ()  # mesh-axis factors whose first chunk holds the whole range
    while True:
        if i == len(fs):  # the rest of the dim is local and contiguous on every rank
            a = prefix * ext + lo
            if first:  # the ranks first on those axes keep the elements, the others none
                return Cut(((Factor(count),) if count > 1 else ()) + first, groups * ext, a,
                           a + (count - 1) * step + 1, step, True)
            return Cut((), groups * ext, a, a + (count - 1) * step + 1, step)
        f = fs[i]
        if first and all(g.axis is None for g in fs[i:]):
            i = len(fs)  # the chunk's elements are local and contiguous
            continue
        if first:
            if f.axis is not None and lo + (count - 1) * step < -(-ext // f.size):
                first, ext, i = first + (f,), -(-ext // f.size), i + 1
                continue
            if f.axis is not None or ext % f.size:
                return (f"the slice [{start}:{start + count * step}] lies in the first shards of "
                        f"{', '.join(map(_describe, first))} but not in one chunk of {_describe(f)}")
            c = ext // f.size
            if lo // c != (lo + (count - 1) * step) // c:
                return (f"the slice [{start}:{start + count * step}] lies in the first shards of "
                        f"{', '.join(map(_describe, first))} but spans chunks of {_describe(f)}")
            groups, prefix, lo, ext, i = groups * f.size, prefix * f.size + lo // c, lo % c, c, i + 1
            continue
        if step == 1 and lo == 0 and count == ext:
            return Cut(fs[i:], groups, prefix, prefix + 1)
        if f.axis is not None:
            c = -(-ext // f.size)
            if lo + (count - 1) * step < c:  # all in the first shard of f
                first, ext, i = (f,), c, i + 1
                continue
            if step == 1 and lo < c and all(g.axis is None for g in fs[i + 1:]):
                c2 = -(-count // f.size)  # the result's chunks
                if lo == 0 and c2 == c:  # every rank keeps the head of its shard, the last ones short
                    return Cut((f,), groups, prefix, prefix + 1, 1, True)
                if c2 == c - lo and count <= 2 * c2:  # the first rank keeps its tail, the second its head
                    return Cut((f,), groups, prefix, prefix + 1, 1, True,
                               ByCoord(f.axis, f.pre, f.size, (lo,) + (0,) * (f.size - 1)))
        if ext % f.size:
            if f.axis is None:  # the ranks' pieces of f's chunks differ in length
                return _in_chunks(f.size, fs[i + 1:], ext, lo, count, step, groups, prefix)
            return (f"factor {_describe(f)} cuts a chunk of {ext} unevenly, so the ranks' local pieces of its "
                    f"chunks differ in length")
        c = ext // f.size
        rest = fs[i + 1:]
        if step == 1 and lo % c == 0 and count < ext and (count % c or f.axis is not None):
            short = _short(f, rest, c, lo // c, count, groups, prefix)
            if short is not None:
                return short
        o = lo % c if lo % c < step else 0  # a stepped slice may start o < step into its first chunk
        if (lo - o) % c == 0 and span % c == 0:  # whole chunks j0..j1 of f (every step-th element from o)
            j0, j1 = (lo - o) // c, (lo - o) // c + span // c
            if f.axis is not None and (j0, j1) != (0, f.size):
                return (f"the slice [{start}:{start + span}] takes chunks {j0}..{j1 - 1} of mesh axis "
                        f"{_describe(f)}'s {f.size} shards (size {c}): only some ranks hold it")
            if step == 1:
                m = j1 - j0
                return Cut(((Factor(m),) if m > 1 else ()) + fs[i + 1:], groups * f.size,
                           prefix * f.size + j0, prefix * f.size + j1)
            return _stepped(f, fs[i + 1:], c, j0, j1, step, groups, prefix, o)
        if lo // c == (lo + (count - 1) * step) // c:  # inside one chunk of f
            if f.axis is not None:
                return (f"the slice [{start}:{start + span}] lies inside one shard of mesh axis {_describe(f)} "
                        f"(chunks of {c}): only one rank holds it")
            groups, prefix, lo, ext, i = groups * f.size, prefix * f.size + lo // c, lo % c, c, i + 1
            continue
        if f.axis is None and not _even(rest, c):  # the ranks' pieces of f's chunks differ in length
            got = _in_chunks(f.size, rest, ext, lo, count, step, groups, prefix)
            if not isinstance(got, str):
                return got
        return (f"the bounds [{start}:{start + span}] do not fall on the boundaries of factor {_describe(f)}'s "
                f"chunks (multiples of {c} within a chunk of {ext})")


def _even(fs, n: int) -> bool:
    return _product(f.size for f in fs) == n


def _in_chunks(k: int, rest, ext: int, lo: int, count: int, step: int, groups: int, prefix: int) -> Cut | str:
    """``[lo, lo + span)`` of a chunk of ``ext`` (group ``prefix`` of ``groups``) cut into ``k``
    by a local factor, the chunks cut by ``rest`` — when the ranks' pieces of the chunks differ
    in length (``k`` cuts ``ext`` unevenly, or ``rest`` cuts its chunks unevenly), so whole
    groups do not line up. Each chunk's part of the range is cut alone (``cut``); a rank's
    shard of the group is its pieces of the chunks in order, and it keeps a contiguous run of
    it when, counted by lengths (``held_length``) for every digit of the mesh-axis factors in
    ``rest``, the runs kept in consecutive chunks meet. The result is the parts joined
    (``join``); each rank keeps its output's length from an offset that is the same everywhere
    or depends on one factor's digit (``ByCoord``). ``[2*a*2 of 5]`` sliced ``[0:2]``: ``a``'s
    first rank keeps the head of its shard, the other nothing; ``[1:4]``: ``[2*a of 3]``, ``a``'s
    first rank keeps its elements 1..2, the other its element 0."""
    c, q, r = chunk_counts(ext, k)
    j0, j1 = lo // c, (lo + (count - 1) * step) // c
    if j0 != j1 and step != 1:
        return f"a step of {step} across factor {k}'s uneven chunks of {ext}"
    parts = []  # (chunk, its cut, length of its part of the range)
    for j in range(j0, j1 + 1):
        a, b = max(lo, j * c) - j * c, min(lo + (count - 1) * step + 1, (j + 1) * c) - j * c
        got = cut(rest, chunk_length(ext, k, j), a, b, step)
        if isinstance(got, str):
            return f"chunk {j} of factor {k}: {got}"
        if got.step != 1:
            return f"a step of {step} inside factor {k}'s uneven chunks of {ext}"
        parts.append((j, got, len(range(a, b, step))))
    factors = parts[0][1].factors if len(parts) == 1 else join([(g.factors, m) for _, g, m in parts])
    if isinstance(factors, str):
        return f"the parts of factor {k}'s chunks do not join: {factors}"
    axes = [g for g in rest if g.axis is not None]
    offsets = {}  # digits of ``axes`` -> where that rank's output begins in its shard of the group
    for ds in itertools.product(*(range(g.size) for g in axes)):
        digit = dict(zip(axes, ds))
        held = [held_length(x, rest, [digit.get(g) for g in rest]) for x in (c, r)]  # a chunk of c, of r
        end = None  # where the run kept so far ends
        for j, got, m in parts:
            size = held_length(m, got.factors, [digit.get(g) for g in got.factors])
            if not size:
                continue  # this rank keeps nothing of chunk j
            here = held[0] if j < q else held[1]
            if here % got.groups:
                return f"the ranks' pieces of chunk {j} of factor {k} do not split into {got.groups} groups"
            off = got.offset
            if type(off) is ByCoord:
                off = off.values[ds[[(g.axis, g.pre, g.size) for g in axes].index(off[:3])]]
            begin = min(j, q) * held[0] + (j > q) * held[1] + got.start * (here // got.groups) + off
            if end is not None and begin != end:
                return (f"a rank keeps pieces of chunks of factor {k} (cutting a chunk of {ext}) that are not "
                        f"next to each other in its shard")
            offsets.setdefault(ds, begin)
            end = begin + size
    values = set(offsets.values()) or {0}
    if len(values) == 1:
        return Cut(tuple(factors), groups, prefix, prefix + 1, 1, True, values.pop())
    for i, g in enumerate(axes):  # the offset as a function of one factor's digit
        by = {}
        if all(by.setdefault(ds[i], v) == v for ds, v in offsets.items()):
            return Cut(tuple(factors), groups, prefix, prefix + 1, 1, True,
                       ByCoord(g.axis, g.pre, g.size, tuple(by.get(d, 0) for d in range(g.size))))
    return (f"the ranks' runs in factor {k}'s chunks (cutting a chunk of {ext}) begin at offsets that "
            f"depend on several mesh axes")


def _short(f: Factor, rest, c: int, j0: int, count: int, groups: int, prefix: int) -> Cut | None:
    """Chunks of ``f`` from ``j0``, the last one cut short, as a chunk tree of ``count`` whose
    trailing shards are short (``Cut.head``), or None when the shards would not line up."""
    m = -(-count // c)
    if f.axis is not None:
        return None
    if -(-count // m) != c or not rest or rest[0].axis is None or any(g.axis is not None for g in rest[1:]):
        return None
    k = rest[0].size
    t = count - (m - 1) * c  # the last chunk's length
    if c % k or -(-t // k) != c // k:
        return None
    return Cut(((Factor(m),) if m > 1 else ()) + (rest[0],), groups * f.size, prefix * f.size + j0,
               prefix * f.size + j0 + m, 1, True)


def local_run(c: Cut) -> str:
    """What each rank does for a comm-free cut, in words (``explain``).
    ``local_run(Cut((), 4, 1, 3)) -> 'each rank keeps groups 1:3 of the 4 in its shard, no data moves'``"""
    keep = f"groups {c.start}:{c.stop}" + (f":{c.step}" if c.step != 1 else "") + f" of the {c.groups} in its shard"
    if type(c.offset) is ByCoord:
        who = c.offset.axis if c.offset.pre == 1 else f"{c.offset.axis}:({c.offset.pre}){c.offset.size}"
        return (f"each rank keeps {keep} from element {', '.join(map(str, c.offset.values))} (by its coordinate "
                f"on {who}), cut to the length of its shard of the result; no data moves")
    if c.head:
        return f"each rank keeps {keep}, cut to the length of its shard of the result (short or empty at the end); " \
               "no data moves"
    return f"each rank keeps {keep}, no data moves"


def _stepped(f: Factor, rest, c: int, j0: int, j1: int, step: int, groups: int, prefix: int,
             o: int = 0) -> Cut | str:
    """Chunks ``j0..j1`` of ``f`` (``c`` elements each, factors ``rest``), every ``step``-th
    element from the ``o``-th (``o < step``: ``x[..., 1::2]``, the odd half of an interleaved
    pair): the factors stay when ``rest`` is even and ``step`` divides its innermost local factor,
    so an element's place modulo ``step`` is the same in the shard as in the whole; the local run
    takes every ``step``-th element of those chunks, from the ``o``-th."""
    if not rest or rest[-1].axis is not None or rest[-1].size % step or _product(g.size for g in rest) != c:
        return f"a step of {step} needs even chunks and an innermost local factor divisible by {step}"
    last = rest[-1].size // step
    inner = tuple(rest[:-1]) + ((Factor(last),) if last > 1 else ())
    per = _product(g.size for g in rest if g.axis is None)  # local elements per chunk
    if f.axis is not None:  # every chunk of f: one per rank
        return Cut((f,) + inner, groups * per, prefix * per + o, (prefix + 1) * per, step)
    m = j1 - j0
    first = (prefix * f.size + j0) * per
    return Cut(((Factor(m),) if m > 1 else ()) + inner, groups * f.size * per, first + o, first + m * per, step)


def _strip(fs) -> tuple:
    """``fs`` without its trailing local factors (they do not change who holds what)."""
    fs = tuple(fs)
    while fs and fs[-1].axis is None:
        fs = fs[:-1]
    return fs


def join(parts) -> tuple | str:
    """The factors of the cat of dims ``parts`` (``(factors, size)`` each) when every rank's local
    cat is its shard of the result, or the reason there are none: the parts, each cut into the
    chunks of its outermost local factor, must be the torch.chunk pieces of the total (equal
    chunks, the last one possibly short) with the same shards inside every chunk.

    ``join([((Factor(2, "tp"), Factor(4)), 8)] * 2)`` -> ``(Factor(2), Factor(2, "tp"), Factor(4))``;
    ``[2*tp*2]`` ++ ``[tp]`` (8 + 2 on tp=2) -> ``[3*tp*2 of 10]``
    """
    chunks = []  # (size, rest) of every top-level chunk, in order
    for k, (fs, n) in enumerate(parts):
        if type(fs) is ChunkProgram:
            return f"input {k}'s dim is cut by DTensor's uneven chunks (no factor layout)"
        fs = tuple(fs)
        if fs and fs[0].axis is None:  # the torch.chunk pieces of its outermost local factor
            chunks += [(chunk_length(n, fs[0].size, i), fs[1:]) for i in range(fs[0].size)]
        else:
            chunks.append((n, fs))
    chunks = [(c, r) for c, r in chunks if c > 0]
    sizes = [c for c, _ in chunks]
    total, m = sum(sizes), len(chunks)
    want = [chunk_length(total, m, i) for i in range(m)]
    if sizes != want:
        return (f"the inputs' chunks {sizes} are not the pieces torch.chunk cuts {total} into ({want}): the "
                "shards would not line up")
    rests = {_strip(r) for _, r in chunks}
    if len(rests) > 1:
        cuts = " vs ".join(sorted("*".join(map(_describe, r)) or "local" for r in rests))
        return f"the inputs' chunks are cut differently ({cuts})"
    rest = chunks[0][1]
    if any(r != rest for _, r in chunks) or _product(f.size for f in rest) != sizes[0]:
        rest = _strip(rest)  # ownership is the same; the trailing local factors are left implicit
    return ((Factor(m),) if m > 1 else ()) + tuple(rest)


def pad(fs, m: int, n: int, start: int) -> Cut | str:
    """The factors of a dim of ``n`` made by placing a dim of ``m`` (factors ``fs``) at ``start``
    in zeros, when every rank can place its own shard (the inverse of a cut by whole chunks),
    or the reason. ``pad((Factor(2, "tp"), Factor(4)), 8, 24, 8)`` -> ``Cut((3, tp, 4), 3, 1, 2)``"""
    fs = tuple(fs)
    k, rest, c = (fs[0].size, fs[1:], m // fs[0].size) if fs and fs[0].axis is None and m % fs[0].size == 0 \
        else (1, fs, m)
    if c == 0 or start % c or n % c:
        return f"the gradient's shards (chunks of {c}) do not line up with [{start}:{start + m}] of {n}"
    return Cut(((Factor(n // c),) if n // c > 1 else ()) + tuple(rest), n // c, start // c, start // c + k)


def local_slice(x, dim: int, groups: int, start: int, stop: int, step: int = 1, head: bool = False,
                offset: int = 0, size: int | None = None):
    """Groups ``start:stop:step`` of ``x``'s ``dim`` read as ``(groups, -1)`` (numpy or torch);
    with ``head``, only ``size`` elements of that from ``offset``.
    ``local_slice(np.arange(6), 0, 3, 1, 2).tolist() -> [2, 3]``"""
    shape = tuple(x.shape)
    if head and size == 0:  # a rank that keeps nothing (its shard of the result is empty)
        return x[(slice(None),) * dim + (slice(0, 0),)]
    per = shape[dim] // groups
    g = x.reshape(shape[:dim] + (groups, per) + shape[dim + 1:])
    g = g[(slice(None),) * dim + (slice(start, stop, step),)]
    out = g.reshape(shape[:dim] + (g.shape[dim] * per,) + shape[dim + 1:])
    return out[(slice(None),) * dim + (slice(offset, offset + size),)] if head else out


def local_pad(x, shape, dim: int, groups: int, start: int, zeros):
    """``x`` placed at groups ``start..`` of a ``zeros(shape)`` array's ``dim`` read as
    ``(groups, -1)``. ``local_pad(np.ones(2), (6,), 0, 3, 1, np.zeros).tolist() -> [0, 0, 1, 1, 0, 0]``"""
    shape = tuple(shape)
    per = shape[dim] // groups
    out = zeros(shape)
    view = out.reshape(shape[:dim] + (groups, per) + shape[dim + 1:])
    k = x.shape[dim] // per if per else 0
    xs = x.reshape(tuple(x.shape[:dim]) + (k, per) + tuple(x.shape[dim + 1:]))
    view[(slice(None),) * dim + (slice(start, start + k),)] = xs
    return out


# ------------------------------------------------------------------------------------------
# the rules
# ------------------------------------------------------------------------------------------


def slice_bounds(n: int, start, end, step) -> tuple:
    """``(start, end, size)`` of ``x[start:end:step]`` on a dim of ``n`` (torch's clamping).
    ``slice_bounds(10, -4, None, 1) -> (6, 10, 4)``"""
    a = 0 if start is None else (start + n if start < 0 else start)
    b = n if end is None else (end + n if end < 0 else end)
    a, b = max(0, min(a, n)), max(0, min(b, n))
    return a, b, max(0, -(-(b - a) // step))


def slice_range(name: str, n: int, params: dict) -> tuple:
    """``(start, stop, step)`` of a ``slice`` or ``narrow`` call on a dim of ``n``, clamped as torch
    does. ``slice_range("narrow", 10, {"start": -4, "length": 2}) -> (6, 8, 1)``"""
    if name == "narrow":
        start = params["start"] + n if params["start"] < 0 else params["start"]
        return start, start + params["length"], 1
    step = params.get("step", 1)
    a, b, _ = slice_bounds(n, params.get("start"), params.get("end"), step)
    return a, b, step


def _with_dim(s: Sharding, d: int, size: int, factors) -> Sharding:
    return Sharding._trusted(s.mesh, s.shape[:d] + (size,) + s.shape[d + 1:],
                             tuple(s.dims[:d]) + (tuple(factors),) + tuple(s.dims[d + 1:]), s.partial)


def _slice_rule(name, inputs, dim=0, start=None, end=None, step=1, length=None, cost_model=None,
                tensor_dtype="float32", out_pins=(), **_):
    """A slice keeps its dim's shards when the cut falls on them (``cut``); otherwise the dim
    is gathered and the others shard freely."""
    s = inputs[0]
    n = s.shape[dim]
    a, b, step = slice_range(name, n, {"start": start, "end": end, "step": step, "length": length})
    size = len(range(a, b, step))
    shape = s.shape[:dim] + (size,) + s.shape[dim + 1:]
    lx = LETTERS[: s.ndim]
    cm = cost_model or DEFAULT_COST_MODEL

    def gather(why=()):
        p = _whole(name, [s], [lx], lx[:dim] + "Z" + lx[dim + 1:], {lx[dim], "Z"}, [shape], cm, tensor_dtype,
                   out_pins)
        return replace(p, notes=tuple(why) + p.notes)

    if not _sharded(s.dims[dim]):
        return gather()
    got = cut(s.dims[dim], n, a, b, step)
    if isinstance(got, str):
        return gather((f"dim {dim}: not comm-free: {got}",))
    out = _with_dim(s, dim, size, got.factors)
    note = f"dim {dim}: [{a}:{b}" + (f":{step}" if step != 1 else "") + f"] falls on the shards: {local_run(got)}"
    return local_propagation(name, (s,), (out,), note, cm, tensor_dtype, out_pins, gather,
                  (("local", tuple(got[1:])),))


def _np_slice(x, dim=0, start=None, end=None, step=1, local=None, out_shapes=None):
    if local is not None:  # the comm-free cut's local run (``cut``)
        return local_slice(x, dim, *local, size=out_shapes[0][dim])
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(start, end, step)
    return x[tuple(idx)]


def _check_narrow(name, inputs, params):
    n = inputs[0].shape[params["dim"]]
    start = params["start"] + n if params["start"] < 0 else params["start"]
    if not (0 <= start and start + params["length"] <= n):
        raise OpError(f"op narrow: start {params['start']} + length {params['length']} exceeds dim "
                      f"{params['dim']} of size {n}; give -{n} <= start and start + length <= {n}")


def _np_narrow(a, dim, start, length, local=None, out_shapes=None):
    if local is not None:
        return local_slice(a, dim, *local, size=out_shapes[0][dim])
    s = start % max(a.shape[dim], 1)
    return _np_slice(a, dim, s, s + length)


register_op("slice", "x ; dim: dim = 0, start: int? = None, end: int? = None, step: int[1..] = 1", _slice_rule,
            _np_slice, shape_driven=True)
register_op("narrow", "x ; dim: dim, start: int, length: int[0..]", _slice_rule, _np_narrow, check=_check_narrow,
            shape_driven=True)


def _cat_rule(name, inputs, dim=0, cost_model=None, tensor_dtype="float32", out_pins=(), **_):
    """Inputs whose cat dims are the same shards repeated (``join``), and equal elsewhere, are
    concatenated locally; otherwise the cat dim is gathered in every input."""
    ref = inputs[0]
    cm = cost_model or DEFAULT_COST_MODEL
    lx = LETTERS[: ref.ndim]
    shape = list(ref.shape)
    shape[dim] = sum(s.shape[dim] for s in inputs)

    def gather(why=()):
        letters = [lx[:dim] + f"{LETTERS[20 + i % 6].upper()}" + lx[dim + 1:] for i in range(len(inputs))]
        whole = {lt[dim] for lt in letters} | {"Z"}
        p = _whole(name, inputs, letters, lx[:dim] + "Z" + lx[dim + 1:], whole, [tuple(shape)], cm, tensor_dtype,
                   out_pins)
        return replace(p, notes=tuple(why) + p.notes)

    if not any(_sharded(s.dims[dim]) for s in inputs):
        return gather()
    others = [(tuple(s.dims[:dim]) + tuple(s.dims[dim + 1:]), s.partial) for s in inputs]
    if any(o != others[0] for o in others[1:]):
        return gather((f"dim {dim}: not comm-free: the inputs are sharded differently outside the cat dim",))
    got = join([(s.dims[dim], s.shape[dim]) for s in inputs])
    if isinstance(got, str):
        return gather((f"dim {dim}: not comm-free: {got}",))
    out = _with_dim(ref, dim, shape[dim], got)
    note = f"dim {dim}: the inputs' shards line up: each rank concatenates its own, no data moves"
    return local_propagation(name, tuple(inputs), (out,), note, cm, tensor_dtype, out_pins, gather)


def _check_cat(name, inputs, params):
    ref, d = inputs[0], params["dim"]
    for k, s in enumerate(inputs[1:], 1):
        if s.ndim != ref.ndim or any(a != b for i, (a, b) in enumerate(zip(s.shape, ref.shape)) if i != d):
            raise OpError(f"op {name}: input {k} has shape {s.shape}, input 0 has {ref.shape}; all dims but the "
                          f"cat dim {d} must match")


register_op("cat", "*xs ; dim: dim = 0", _cat_rule, lambda *xs, dim=0: np.concatenate(xs, axis=dim),
            check=_check_cat, aliases=("concat", "concatenate"))


def split_sizes_of(name: str, n: int, params: dict) -> list:
    """The piece sizes of a split of a dim of ``n`` (split_with_sizes / split / chunk / unbind).
    ``split_sizes_of("chunk", 10, {"chunks": 4, "dim": 0}) -> [3, 3, 3, 1]``"""
    if name == "unbind":
        return [1] * n
    if params.get("split_sizes") is not None:
        sizes = list(params["split_sizes"])
    elif name == "chunk":
        c = -(-n // params["chunks"])
        sizes = [min(c, n - i) for i in range(0, n, c)]
    else:
        step = params["split_size"]
        sizes = [min(step, n - i) for i in range(0, n, step)] if n else [0]
    if sum(sizes) != n or any(k < 0 for k in sizes):
        raise OpError(f"op {name}: sizes {sizes} do not add up to dim {params['dim']} of size {n}; make them")
    return sizes


def carve(fs, n: int, sizes) -> list | str:
    """The cuts of a split: one :class:`Cut` per piece of ``sizes`` of a dim of ``n`` with factors
    ``fs`` when every piece falls on the shards (``cut``), else the reason for the first that
    does not. ``[c.factors for c in carve((Factor(3), Factor(2, "tp"), Factor(8)), 48, [16] * 3)]``
    -> three ``(tp*2, 8)``"""
    out, at = [], 0
    for k in sizes:
        got = cut(fs, n, at, at + k)
        if isinstance(got, str):
            return f"piece [{at}:{at + k}]: {got}"
        out.append(got)
        at += k
    return out


def _split_rule(name, inputs, dim=0, cost_model=None, tensor_dtype="float32", out_pins=(), **params):
    """The split dim is whole — unless every piece falls on its shards (``carve``): then every
    piece keeps its shards, nothing moves. One output per piece, other dims as the input."""
    s = inputs[0]
    cm = cost_model or DEFAULT_COST_MODEL
    sizes = split_sizes_of(name, s.shape[dim], {**params, "dim": dim})
    fs = s.dims[dim]
    why = ()
    if name != "unbind" and _sharded(fs):
        pieces = carve(fs, s.shape[dim], sizes)
        if not isinstance(pieces, str):
            outs = tuple(_with_dim(s, dim, k, p.factors) for k, p in zip(sizes, pieces))
            return Propagation(name, (s,), (s,), outs, (), (f"dim {dim}: cut between shards, no data moves",), (),
                               cm, local=(("local", tuple(tuple(p[1:]) for p in pieces)),))
        why = (f"dim {dim}: not comm-free: {pieces}",)
    lx = LETTERS[: s.ndim]
    base = _whole(name, [s], [lx], lx, {lx[dim]}, None, cm, tensor_dtype)
    o = base.outputs[0]
    outs = []
    for k in sizes:
        if name == "unbind":
            outs.append(Sharding(s.mesh, s.shape[:dim] + s.shape[dim + 1:], list(o.dims[:dim]) + list(o.dims[dim + 1:]),
                                 o.partial))
        else:
            outs.append(Sharding(s.mesh, s.shape[:dim] + (k,) + s.shape[dim + 1:],
                                 list(o.dims[:dim]) + [[]] + list(o.dims[dim + 1:]), o.partial))
    return replace(base, outputs=tuple(outs), notes=why + base.notes)


def _np_split(a, dim=0, out_shapes=None, local=None, **params):
    """Split at the sizes of the (local) output shapes, or by the pieces' groups (a carved split)."""
    if local is not None:
        return tuple(local_slice(a, dim, *g, size=shp[dim]) for g, shp in zip(local, out_shapes))
    sizes = [shp[dim] for shp in out_shapes]
    return tuple(np.split(a, np.cumsum(sizes)[:-1], axis=dim))


register_op("split_with_sizes", "x ; split_sizes: ints, dim: dim = 0", _split_rule, _np_split, shape_driven=True)
register_op("split", "x ; split_size: int[1..], dim: dim = 0", _split_rule, _np_split, shape_driven=True)
register_op("chunk", "x ; chunks: int[1..], dim: dim = 0", _split_rule, _np_split, shape_driven=True)
register_op("unbind", "x ; dim: dim = 0", _split_rule, lambda a, dim=0: tuple(np.moveaxis(a, dim, 0)))


def _slice_backward_rule(name, inputs, input_sizes=None, dim=0, start=0, end=None, step=1, cost_model=None,
                         tensor_dtype="float32", out_pins=(), **_):
    """Scatter a slice's gradient into zeros of ``input_sizes``: each rank places its own shard
    when the gradient's shards line up with the slice (``pad``); else that dim is whole."""
    g = inputs[0]
    cm = cost_model or DEFAULT_COST_MODEL
    lx = LETTERS[: g.ndim]
    shape = tuple(input_sizes)

    def gather(why=()):
        p = _whole(name, [g], [lx], lx[:dim] + "Z" + lx[dim + 1:], {lx[dim], "Z"}, [shape], cm, tensor_dtype,
                   out_pins, linear="sum")
        return replace(p, notes=tuple(why) + p.notes)

    if not _sharded(g.dims[dim]):
        return gather()
    a = slice_bounds(shape[dim], start, end, step)[0]
    got = pad(g.dims[dim], g.shape[dim], shape[dim], a) if step == 1 else f"a step of {step}"
    if isinstance(got, str):
        return gather((f"dim {dim}: not comm-free: {got}",))
    out = _with_dim(g, dim, shape[dim], got.factors)
    note = f"dim {dim}: each rank places its own shard at groups {got.start}:{got.stop} of {got.groups}"
    return local_propagation(name, (g,), (out,), note, cm, tensor_dtype, out_pins, gather,
                  (("local", (got.groups, got.start)),))


def _np_slice_backward(g, input_sizes, dim=0, start=None, end=None, step=1, out_shapes=None, local=None):
    shape = tuple(out_shapes[0]) if out_shapes else tuple(input_sizes)
    if local is not None:
        return local_pad(g, shape, dim, *local, lambda s: np.zeros(s, dtype=np.result_type(g, np.float64)))
    out = np.zeros(shape, dtype=np.result_type(g, np.float64))
    idx = [slice(None)] * out.ndim
    idx[dim] = slice(start, end, step)
    out[tuple(idx)] = g
    return out


register_op("slice_backward", "grad ; input_sizes: ints, dim: dim, start: int, end: int, step: int[1..] = 1",
            _slice_backward_rule, _np_slice_backward, shape_driven=True)


__all__ = ["Cut", "carve", "cut", "join", "local_pad", "local_run", "local_slice", "pad", "slice_bounds",
           "slice_range", "split_sizes_of"]
