"""Index-level proof of a plan: from the layouts alone, for every rank, no values involved.

Three checks, each a pure function of immutable records, each returning a :class:`Check`:

* ``check_wiring(plan, i)``: op ``i``'s inputs reach their targets by a connected chain of
  planned collectives starting at the tensor's sharding, and its outputs reach their final
  shardings the same way (what ``execute.walk`` runs);
* ``check_op(mesh, imap, inputs, outputs)``: with the op's index map (``execute.indexmap``),
  every rank's local inputs hold exactly the global indices its local run needs and its
  local outputs are exactly the shards the output shardings name — pass-through letters hold
  the same indices everywhere, reduced letters partition their dim over exactly the output's
  partial axes, whole letters are whole, partial inputs pass only through linear ops; views
  keep each rank's row-major flat offsets (compared as CuTe layouts, ``coalesce`` per mode);
* ``check_collective(c)``: each rank's target piece is held by its group in the source
  (by some member for a gather or all-to-all, by every member for a reduction, by itself for
  a local step), and partial axes are reduced, kept or created only as the kind allows.

Why this is a proof: a dim's indices on a rank depend only on the digits its coordinate gives
that dim's axis factors (``execute.classes``), so every "for every rank" is checked by
enumerating the coordinates of the few axes a dim reads — or, when two dims have the same
factor list, by comparing the lists. Nothing grows with the element count or the rank count
(only with the sizes of the axes one dim reads). By induction over the program, a plan whose
wiring, ops and collectives all pass computes every tensor's planned shard on every rank, for
every input value, given that each op's index map is its true semantics — which the numeric
oracle (``execute.verify``) samples.

    >>> from shardlayout import Mesh, Sharding
    >>> from shardlayout.execute.indexmap import index_map
    >>> m = Mesh.parse("tp=2")
    >>> a, b = Sharding.parse("[4, tp*4]", m), Sharding.parse("[tp*4, 6]", m)
    >>> check_op(m, index_map("mm", (a, b), {}), (a, b), (Sharding.parse("[4, 6] +sum(tp)", m),)).status
    'proven'
    >>> check_op(m, index_map("mm", (a, b), {}), (a, b), (Sharding.parse("[4, 6]", m),)).message[:60]
    "output 0: index 'k' is reduced and sharded on tp in input 0,"
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from operator import itemgetter

import numpy as np

from ..layout import Layout, coalesce
from ..mesh import Mesh
from ..sharding import Sharding
from ..sharding.collective import CollectiveKind
from ..sharding.core import format_dim
from .classes import coordinates, dim_axes, ranges_at
from .indexmap import IndexMap


@dataclass(frozen=True)
class Check:
    """The outcome of one check: ``status`` is ``"proven"``, ``"failed"`` or ``"unproven"``
    (not decidable within the budget, or no index map); ``message`` says what and the fix."""

    status: str
    message: str = ""

    @property
    def failed(self) -> bool:
        """True for a failed check. ``Check("failed", "x").failed -> True``"""
        return self.status == "failed"


PROVEN = Check("proven")


def _fail(msg: str) -> Check:
    return Check("failed", msg)


def _merge(ranges) -> tuple:
    """Adjacent or empty ranges merged: ``((0, 2), (2, 4), (5, 5)) -> ((0, 4),)``."""
    out: list = []
    for lo, hi in ranges:
        if hi <= lo:
            continue
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def _where(axes, coords) -> str:
    return ", ".join(f"{a}={c}" for a, c in zip(axes, coords)) or "every rank"


def _dim_text(s: Sharding, d: int) -> str:
    return f"dim {d} ({format_dim(s, d)})"


def _at(mesh: Mesh, n: int, fs, axes: tuple, coords: tuple) -> tuple:
    at = dict(zip(axes, coords))
    return _merge(ranges_at(mesh, n, fs, tuple(at[a] for a in dim_axes(mesh, fs))))


def _reader(mesh: Mesh, n: int, fs, axes: tuple):
    """``coords -> _at(mesh, n, fs, axes, coords)``, each made once per distinct coordinate of the
    axes the dim reads (a check enumerates every coordinate of ``axes``; most dims read few)."""
    pos = tuple(axes.index(a) for a in dim_axes(mesh, fs))
    if not pos:
        const = _merge(ranges_at(mesh, n, fs, ()))
        return lambda coords: const
    pick = itemgetter(*pos)  # one position: the coordinate itself, several: a tuple
    made: dict = {}

    def at(coords: tuple) -> tuple:
        key = pick(coords)
        got = made.get(key)
        if got is None:
            got = made[key] = _merge(ranges_at(mesh, n, fs, key if len(pos) > 1 else (key,)))
        return got

    return at


# ------------------------------------------------------------------------------------------
# ops
# ------------------------------------------------------------------------------------------


def same_indices(mesh: Mesh, dims: list):
    """None when every ``(extent, factors)`` in ``dims`` holds the same global indices, in the same
    order, on every rank; else ``(i, axes, coords, ranges_0, ranges_i)`` for the first that differs.
    ``same_indices(m, [(8, (Factor(2, "x"), Factor(4)))] * 2) -> None``"""
    first = dims[0]
    if all(d == first for d in dims[1:]):
        return None
    axes = tuple(a for a in mesh.names if any(a in dim_axes(mesh, fs) for _, fs in dims))
    readers = [_reader(mesh, n, fs, axes) for n, fs in dims]
    for coords in coordinates(mesh, axes):
        want = readers[0](coords)
        for i, at in enumerate(readers[1:], 1):
            got = at(coords)
            if got != want:
                return i, axes, coords, want, got
    return None


def _whole_axes(mesh: Mesh, fs) -> bool:
    return all(f.pre == 1 and f.size == mesh.axis_size(f.axis) for f in fs if f.axis is not None)


def partition(mesh: Mesh, n: int, fs, op: str):
    """None when the chunks of one dim over the coordinates of its axes partition ``[0, n)``
    (for ``avg``, ``max``, ``min`` also into equal, non-empty chunks); else what is wrong.
    ``partition(m, 8, (Factor(2, "x"), Factor(4)), "sum") -> None``"""
    axes = dim_axes(mesh, fs)
    chunks = []
    for coords in coordinates(mesh, axes):
        chunks.append(_merge(ranges_at(mesh, n, fs, coords)))
    flat = sorted(r for c in chunks for r in c)
    pos = 0
    for lo, hi in flat:
        if lo != pos:
            what = "overlap" if lo < pos else "leave a gap"
            return f"the chunks over {','.join(axes)} {what} at index {min(lo, pos)}"
        pos = hi
    if pos != n:
        return f"the chunks over {','.join(axes)} cover [0, {pos}) of [0, {n})"
    if op != "sum":
        sizes = {sum(hi - lo for lo, hi in c) for c in chunks}
        if len(sizes) > 1 or 0 in sizes:
            return f"a {op} of unequal or empty chunks (sizes {sorted(sizes)}) is not the {op} of the dim"
    return None


def _carriers(imap: IndexMap, inputs, outputs) -> tuple:
    ins: dict = {}
    outs: dict = {}
    for i, (x, lt) in enumerate(zip(inputs, imap.inputs)):
        if lt is None or not isinstance(x, Sharding):
            continue
        for d, L in enumerate(lt):
            if x.shape[d] > 1 or x.dims[d]:
                ins.setdefault(L, []).append((f"input {i}", x, d))
    for k, (o, lt) in enumerate(zip(outputs, imap.outputs)):
        for d, L in enumerate(lt):
            if o.shape[d] > 1 or o.dims[d]:
                outs.setdefault(L, []).append((f"output {k}", o, d))
    return ins, outs


def _check_arity(imap: IndexMap, inputs, outputs):
    if len(outputs) != len(imap.outputs):
        return _fail(f"the op has {len(outputs)} outputs, its index map names {len(imap.outputs)}")
    for i, (x, lt) in enumerate(zip(inputs, imap.inputs)):
        if lt is not None and isinstance(x, Sharding) and len(lt) != x.ndim:
            return _fail(f"input {i} has {x.ndim} dims, the index map names {len(lt)} ({lt!r})")
    for k, (o, lt) in enumerate(zip(outputs, imap.outputs)):
        if len(lt) != o.ndim:
            return _fail(f"output {k} has {o.ndim} dims, the index map names {len(lt)} ({lt!r})")
    return None


def _check_letters(mesh: Mesh, imap: IndexMap, inputs, outputs, skip: frozenset = frozenset()) -> Check:
    ins, outs = _carriers(imap, inputs, outputs)
    for L in sorted(set(ins) | set(outs)):
        if L in skip:
            continue
        ci, co = ins.get(L, []), outs.get(L, [])
        if L in imap.whole or (not ci and L not in imap.free):
            for label, x, d in ci + co:
                if dim_axes(mesh, x.dims[d]):
                    return _fail(
                        f"{label} {_dim_text(x, d)}: index {L!r} must be whole on every rank (the local op reads "
                        f"or writes all of it), but it is sharded on {','.join(dim_axes(mesh, x.dims[d]))}; "
                        "gather that dim first")
            continue
        if not ci:
            continue
        carriers = ci + co
        diff = same_indices(mesh, [(x.shape[d], x.dims[d]) for _, x, d in carriers])
        if diff is not None:
            i, axes, coords, want, got = diff
            (la, xa, da), (lb, xb, db) = carriers[0], carriers[i]
            return _fail(
                f"index {L!r}: {lb} {_dim_text(xb, db)} holds {list(got)} where {la} {_dim_text(xa, da)} holds "
                f"{list(want)} (at {_where(axes, coords)}); every operand carrying {L!r} must be sharded alike")
    return _check_partials(mesh, imap, inputs, outputs, ins)


def _reduced_axes(mesh: Mesh, imap: IndexMap, lt_out: str, ins: dict, k: int):
    """``({axis: (letter, label)}, failure)`` for the letters output ``k`` reduces."""
    out = {}
    for L, carriers in sorted(ins.items()):
        if L in lt_out or L in imap.whole:
            continue
        label, x, d = carriers[0]
        fs = x.dims[d]
        axes = dim_axes(mesh, fs)
        if not axes:
            continue
        if not _whole_axes(mesh, fs):
            return out, _fail(
                f"output {k}: index {L!r} is reduced and sharded on a sub-axis in {label} {_dim_text(x, d)}; a "
                "partial value is partial over whole mesh axes only — shard it on whole axes or gather it")
        bad = partition(mesh, x.shape[d], fs, imap.reduce)
        if bad:
            return out, _fail(f"output {k}: index {L!r} is reduced over {label} {_dim_text(x, d)}, but {bad}")
        for a in axes:
            out[a] = (L, label)
    return out, None


def _linear_op(imap: IndexMap, inputs, partial_in: dict):
    """The partial op the output must carry when ``partial_in`` ({input: op}) are partial on one
    axis, or None when the op is not linear that way."""
    ops = set(partial_in.values())
    tensors = [i for i, (x, lt) in enumerate(zip(inputs, imap.inputs)) if lt is not None and isinstance(x, Sharding)]
    if len(ops) != 1:
        return None
    op = next(iter(ops))
    lin = imap.linear
    if lin == "any":
        return op if sorted(partial_in) == tensors else None
    if lin in ("max", "min"):
        return op if op == lin else None
    if op not in ("sum", "avg"):
        return None
    if lin == "sum" and sorted(partial_in) == tensors:
        return op
    if lin == "multi" and len(partial_in) == 1:
        return op
    if lin == "first" and list(partial_in) == [0]:
        return op
    return None


def _check_partials(mesh: Mesh, imap: IndexMap, inputs, outputs, ins: dict) -> Check:
    for k, (o, lt) in enumerate(zip(outputs, imap.outputs)):
        reduced, bad = _reduced_axes(mesh, imap, lt, ins, k)
        if bad:
            return bad
        out_ops = dict(o.partial)
        for a in mesh.names:
            partial_in = {i: dict(x.partial)[a] for i, (x, li) in enumerate(zip(inputs, imap.inputs))
                          if li is not None and isinstance(x, Sharding) and a in dict(x.partial)}
            got = out_ops.get(a)
            if a in reduced:
                L, label = reduced[a]
                if partial_in:
                    return _fail(f"output {k}: inputs {sorted(partial_in)} are partial on {a} and index {L!r} is "
                                 f"reduced over {a} too; reduce the inputs first")
                if got != imap.reduce:
                    return _fail(
                        f"output {k}: index {L!r} is reduced and sharded on {a} in {label}, so output {k} must be "
                        f"partial({imap.reduce}) on {a}; it is {o}. Mark it partial or gather {L!r} first")
                continue
            if not partial_in:
                if got is not None:
                    return _fail(f"output {k} ({o}) is partial({got}) on {a}, but no input is partial there and no "
                                 f"reduced index is sharded on it: every rank holds the full value")
                continue
            want = _linear_op(imap, inputs, partial_in)
            if want is None:
                return _fail(
                    f"inputs {sorted(partial_in)} are partial({','.join(sorted(set(partial_in.values())))}) on {a} "
                    f"but the op is not linear in them that way (linear={imap.linear!r}); reduce them first")
            if got != want:
                return _fail(f"output {k} ({o}) must be partial({want}) on {a}, as its partial inputs are; "
                             f"it is {'not partial' if got is None else f'partial({got})'} there")
    return PROVEN


def flat_form(s: Sharding) -> tuple:
    """An even sharding as CuTe layouts: ``(local row-major index -> global flat offset, (per mesh
    axis: coordinate -> offset))``, each coalesced. Two shardings of one element count have equal
    forms iff every rank lists the same flat offsets in the same local order. ``flat_form(s)``"""
    mesh = s.mesh
    g = [1] * s.ndim
    for d in range(s.ndim - 2, -1, -1):
        g[d] = g[d + 1] * s.shape[d + 1]
    local = []
    pieces: dict = {a: [] for a in mesh.names}
    for d, fs in enumerate(s.dims):
        inner = 1
        strides = []
        for f in reversed(fs):
            strides.append(inner * g[d])
            inner *= f.size
        for f, st in zip(fs, reversed(strides)):
            if f.axis is None:
                local.append((f.size, st))
            else:
                pieces[f.axis].append((f.pre, f.size, st))
    dev = []
    for a, n in zip(mesh.names, mesh.shape):
        parts, covered = [], 1
        for pre, size, st in sorted(pieces[a]):
            if pre > covered:
                parts.append((pre // covered, 0))
            parts.append((size, st))
            covered = pre * size
        if covered < n:
            parts.append((n // covered, 0))
        dev.append(_layout(parts))
    return _layout(local), tuple(dev)


def _layout(parts) -> Layout:
    """``parts`` major first -> the coalesced CuTe layout (column-major: minor first)."""
    parts = [p for p in parts if p[0] != 1]
    if not parts:
        return Layout(1, 0)
    rev = parts[::-1]
    if len(rev) == 1:
        return coalesce(Layout(rev[0][0], rev[0][1]))
    return coalesce(Layout(tuple(p[0] for p in rev), tuple(p[1] for p in rev)))


def flat_offsets(s: Sharding, axes: tuple, coords: tuple) -> np.ndarray:
    """Row-major global flat offsets of the piece at ``coords`` (of ``axes``), in local order.
    ``flat_offsets(Sharding.parse("[x*2, 3]", m), ("x",), (1,)) -> array([6, 7, 8, 9, 10, 11])``"""
    idx = []
    for d in range(s.ndim):
        rs = _at(s.mesh, s.shape[d], s.dims[d], axes, coords)
        idx.append(np.concatenate([np.arange(lo, hi) for lo, hi in rs]) if rs else np.zeros(0, dtype=np.int64))
    if not idx:
        return np.zeros(1, dtype=np.int64)
    return np.ravel_multi_index(np.ix_(*idx), s.shape).reshape(-1)


def check_reshape(mesh: Mesh, src: Sharding, dst: Sharding, budget: int = 1 << 22) -> Check:
    """A view that keeps row-major order: every rank's local input and output list the same global
    flat offsets, in the same order (so the local reshape is the global one restricted). Even
    shardings compare as layouts; others are enumerated over the coordinates of the axes they
    read, within ``budget`` elements. ``check_reshape(m, s, t).status``"""
    if src.partial != dst.partial:
        return _fail(f"a view keeps partial values as they are: input {src} but output {dst}")
    if src.is_even() and dst.is_even() and flat_form(src) == flat_form(dst):
        return PROVEN
    axes = tuple(a for a in mesh.names if any(a in dim_axes(mesh, fs) for s in (src, dst) for fs in s.dims))
    count = 1
    for a in axes:
        count *= mesh.axis_size(a)
    zero = tuple(0 for _ in axes)
    per_rank = max(len(flat_offsets(s, axes, zero)) for s in (src, dst))
    if count * max(per_rank, 1) > budget:
        return Check("unproven", f"view {src} -> {dst}: {count} coordinates x {per_rank} elements exceed the "
                                 f"budget of {budget}")
    for coords in coordinates(mesh, axes):
        a, b = flat_offsets(src, axes, coords), flat_offsets(dst, axes, coords)
        if a.shape != b.shape or not np.array_equal(a, b):
            first = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
            return _fail(
                f"view {src} -> {dst}: at {_where(axes, coords)} the local input holds {len(a)} elements and the "
                f"output {len(b)}; they differ from local position {first} on (global offsets "
                f"{a[first:first + 4].tolist()} vs {b[first:first + 4].tolist()}): the local reshape is not the "
                "global one; regroup the factors (ops.regroup) or gather")
    return PROVEN


def check_op(mesh: Mesh, imap: IndexMap | None, inputs: tuple, outputs: tuple, budget: int = 1 << 22) -> Check:
    """The index-level check of one op call (module docstring): ``inputs`` are the input targets
    (Shardings, or numbers for constants), ``outputs`` the op's output shardings.
    ``check_op(m, index_map("mm", (a, b), {}), (a, b), (c,)).status -> 'proven'``"""
    if imap is None:
        return Check("unproven", "the op has no index map (execute.indexmap); checked numerically only")
    if imap.kind == "reshape":
        src = next(x for x in inputs if isinstance(x, Sharding))
        return check_reshape(mesh, src, outputs[0], budget)
    if imap.kind == "created":
        for k, o in enumerate(outputs):
            if o.partial or any(dim_axes(mesh, fs) for fs in o.dims):
                return _fail(f"output {k} ({o}): a creation op makes the whole tensor on every rank; its output "
                             "must be replicated (consumers slice it)")
        return PROVEN
    bad = _check_arity(imap, inputs, outputs)
    if bad:
        return bad
    if imap.kind == "resize":
        return check_resize(mesh, imap, inputs, outputs, budget)
    return _check_letters(mesh, imap, inputs, outputs)


MAX_RESIZE_CLASSES = 4096


def _held(mesh: Mesh, x: Sharding, d: int, at: dict) -> np.ndarray:
    axes = dim_axes(mesh, x.dims[d])
    rs = ranges_at(mesh, x.shape[d], tuple(x.dims[d]), tuple(at[a] for a in axes))
    return np.concatenate([np.arange(lo, hi) for lo, hi in rs] or [np.zeros(0, dtype=np.int64)]).astype(np.int64)


def check_resize(mesh: Mesh, imap: IndexMap, inputs, outputs, budget: int = 1 << 22) -> Check:
    """A slice / split / cat / slice_backward that each rank runs on its own shard
    (``ops.resize``): every other dim passes through (letters); along the cut dim, for every
    coordinate of the axes it reads, the cut's local run on the global indices the rank holds
    gives exactly the indices its output shards name. ``check_resize(m, imap, (x,), (y,)).status``"""
    from ..ops.resize import local_pad, local_slice
    from ..ops.result import at_rank

    kind, d, start, step, cuts = imap.resize
    letter = imap.outputs[0][d]
    bad = _check_letters(mesh, imap, inputs, outputs, frozenset({letter}))
    if bad.failed:
        return bad
    tensors = [x for x in inputs if isinstance(x, Sharding)]
    axes = tuple(a for a in mesh.names if any(a in dim_axes(mesh, x.dims[d]) for x in tensors + list(outputs)))
    classes = 1
    for a in axes:
        classes *= mesh.axis_size(a)
    if classes > MAX_RESIZE_CLASSES or sum(x.shape[d] for x in tensors + list(outputs)) * classes > budget:
        return Check("unproven", f"{kind}: {classes} coordinates of {','.join(axes)} exceed the budget; "
                                 "checked numerically only")
    for coords in coordinates(mesh, axes):
        at = dict(zip(axes, coords))
        rank = mesh.rank_of(tuple(at.get(a, 0) for a in mesh.names))
        held = [_held(mesh, x, d, at) for x in tensors]
        want = [_held(mesh, o, d, at) for o in outputs]
        where = _where(axes, coords)
        if kind == "cat":
            offsets = np.cumsum([0] + [x.shape[d] for x in tensors[:-1]])
            got = np.concatenate([h + off for h, off in zip(held, offsets)])
            if not np.array_equal(got, want[0]):
                return _fail(f"cat dim {d} at {where}: the local cat holds {got.tolist()[:8]}..., the output "
                             f"{outputs[0]} names {want[0].tolist()[:8]}...")
            continue
        if kind == "pad":
            local = at_rank({"local": cuts[0]}, mesh, rank)["local"]
            try:
                ids = local_pad(np.arange(1, len(held[0]) + 1), (len(want[0]),), 0, *local, np.zeros)
            except (ValueError, TypeError, ZeroDivisionError):
                return _fail(f"slice_backward dim {d} at {where}: the local placement cannot put a shard of "
                             f"{len(held[0])} into one of {len(want[0])} as {local[0]} groups")
            m = tensors[0].shape[d]
            placed = ids > 0
            ok = np.array_equal(want[0][placed], start + held[0][ids[placed].astype(np.int64) - 1]) and \
                not np.any((want[0][~placed] >= start) & (want[0][~placed] < start + m))
            if not ok:
                return _fail(f"slice_backward dim {d} at {where}: the local placement does not give the output "
                             f"{outputs[0]}")
            continue
        at_piece = 0
        for k, (c, w) in enumerate(zip(cuts, want)):
            local = at_rank({"local": c}, mesh, rank)["local"]
            try:
                pos = local_slice(np.arange(len(held[0])), 0, *local, size=len(w))
            except (ValueError, TypeError, ZeroDivisionError):
                return _fail(f"{kind} dim {d} at {where}: the local run cannot read the shard of {len(held[0])} "
                             f"as {local[0]} groups")
            first = start if kind == "slice" else at_piece
            if not np.array_equal(held[0][pos], first + step * w):
                return _fail(f"{kind} dim {d} at {where}: output {k}'s local run keeps {held[0][pos].tolist()[:8]}, "
                             f"the output {outputs[k]} names {(first + step * w).tolist()[:8]}")
            at_piece += outputs[k].shape[d]
    return PROVEN


# ------------------------------------------------------------------------------------------
# collectives
# ------------------------------------------------------------------------------------------


def _chain_ok(mesh: Mesh, pieces, src: Sharding) -> bool:
    """Do the digit boundaries of the group's pieces and the source's pieces nest on every axis?
    Then a group's choices split into independent per-dim choices (module docstring)."""
    for axis in {p.axis for p in pieces}:
        marks = {1, mesh.axis_size(axis)}
        for p in pieces:
            if p.axis == axis:
                marks |= {p.pre, p.pre * p.size}
        for fs in src.dims:
            for f in fs:
                if f.axis == axis:
                    marks |= {f.pre, f.pre * f.size}
        m = sorted(marks)
        if any(b % a for a, b in zip(m, m[1:])):
            return False
    return True


def _contains(outer: tuple, inner: tuple) -> bool:
    """Is every range of ``inner`` inside one range of ``outer`` (both merged)?"""
    return all(any(a <= lo and hi <= b for a, b in outer) for lo, hi in inner)


def _union(rss) -> tuple:
    return _merge(sorted(r for rs in rss for r in rs))


def _intersection(rss) -> tuple:
    cur = list(rss[0])
    for rs in rss[1:]:
        nxt = []
        for a0, a1 in cur:
            for b0, b1 in rs:
                lo, hi = max(a0, b0), min(a1, b1)
                if lo < hi:
                    nxt.append((lo, hi))
        cur = nxt
    return _merge(sorted(cur))


def _group_coords(mesh: Mesh, pieces, axes: tuple, coords: tuple) -> list:
    """Every coordinate tuple (of ``axes``) in the group of ``coords`` over ``pieces``."""
    outs = [list(coords)]
    for p in pieces:
        if p.axis not in axes:
            continue
        i = axes.index(p.axis)
        stride = mesh.axis_size(p.axis) // (p.pre * p.size)
        nxt = []
        for c in outs:
            base = c[i] - ((c[i] // stride) % p.size) * stride
            for g in range(p.size):
                e = list(c)
                e[i] = base + g * stride
                nxt.append(e)
        outs = nxt
    return [tuple(c) for c in outs]


def _outer(mesh: Mesh, pieces, axes: tuple):
    """Every coordinate tuple of ``axes`` whose digits of ``pieces`` are 0: one per group."""
    ranges = []
    for a in axes:
        n = mesh.axis_size(a)
        vals = range(n)
        for p in pieces:
            if p.axis == a:
                stride = n // (p.pre * p.size)
                vals = [c for c in vals if (c // stride) % p.size == 0]
        ranges.append(vals)
    return product(*ranges)


def _partial_rules(c) -> Check:
    src, dst = c.src, c.dst
    sp, dp = dict(src.partial), dict(dst.partial)
    mesh = src.mesh
    if c.reduce_op is not None:
        if len(c.axes) != 1 or c.axes[0].pre != 1 or c.axes[0].size != mesh.axis_size(c.axes[0].axis):
            return _fail(f"{c.kind.value} over {c.axes_text()}: a reduction runs over one whole mesh axis")
        a = c.axes[0].axis
        if sp.get(a) != c.reduce_op:
            return _fail(f"{c.kind.value} over {a}: the source {src} is not partial({c.reduce_op}) on {a}")
        if dp != {k: v for k, v in sp.items() if k != a}:
            return _fail(f"{c.kind.value} over {a}: {src} -> {dst} must drop exactly partial({c.reduce_op}) on {a}")
        return PROVEN
    if c.kind is CollectiveKind.LOCAL:
        if c.axes:
            return _fail(f"a local step names axes {c.axes_text()}; it runs on one rank")
        for a, op in sp.items():
            if dp.get(a) != op:
                return _fail(f"local step {src} -> {dst} drops partial({op}) on {a} without a reduction; plan an "
                             "all-reduce or reduce-scatter")
        return PROVEN
    touched = sorted({p.axis for p in c.axes} & set(sp))
    if touched:
        return _fail(f"{c.kind.value} over {c.axes_text()} mixes partial values of {','.join(touched)} as if they were "
                     "replicas; reduce them first")
    if dp != sp:
        return _fail(f"{c.kind.value} {src} -> {dst} changes the partial axes; only a reduction or a local step may")
    return PROVEN


def check_collective(c) -> Check:
    """The index-level check of one collective (module docstring), for every rank.
    ``check_collective(plan_move(a, b)[0]).status -> 'proven'``"""
    src, dst = c.src, c.dst
    if src.mesh != dst.mesh or src.shape != dst.shape:
        return _fail(f"{c.kind.value}: {src} and {dst} are not one tensor on one mesh")
    rules = _partial_rules(c)
    if rules.failed:
        return rules
    mesh = src.mesh
    local = c.kind is CollectiveKind.LOCAL
    every = c.reduce_op is not None
    if not local and not every and not _chain_ok(mesh, c.axes, src):
        return Check("unproven", f"{c.kind.value} over {c.axes_text()}: its pieces and the source's do not nest")
    for d in range(src.ndim):
        S, D = (src.shape[d], src.dims[d]), (dst.shape[d], dst.dims[d])
        s_axes = dim_axes(mesh, S[1])
        group_on = [p for p in c.axes if p.axis in s_axes]
        if S == D and (local or not group_on or every):
            continue
        axes = tuple(a for a in mesh.names if a in s_axes or a in dim_axes(mesh, D[1]))
        have_at, want_at = _reader(mesh, S[0], S[1], axes), _reader(mesh, D[0], D[1], axes)
        outer_coords = [coordinates(mesh, axes)] if local or not group_on else [_outer(mesh, group_on, axes)]
        for outer in outer_coords[0]:
            members = [outer] if local or not group_on else _group_coords(mesh, group_on, axes, outer)
            if local or not group_on:
                have = have_at(outer)
            else:
                pieces = [have_at(q) for q in members]
                have = _intersection(pieces) if every else _union(pieces)
            asked = set()  # the wanted ranges already found in ``have`` (readers return one object per key)
            for coords in members:
                want = want_at(coords)
                if id(want) in asked:
                    continue
                asked.add(id(want))
                if not _contains(have, want):
                    who = "the rank itself" if local else ("every member of its group" if every else "its group")
                    return _fail(
                        f"{c.kind.value} over {c.axes_text() or 'no axes'} ({src} -> {dst}): at "
                        f"{_where(axes, coords)} dim {d} needs {list(want)} but {who} holds only {list(have)} "
                        "there; the collective cannot produce the target — gather over the axes that hold it")
    return PROVEN


# ------------------------------------------------------------------------------------------
# wiring
# ------------------------------------------------------------------------------------------


def _chain(src: Sharding, dst: Sharding, moves: tuple) -> Check:
    if not moves:
        return _fail(f"it is {src} but is used as {dst} and no collective is planned between them; "
                     "plan_move(src, dst) gives the missing moves")
    at = src
    for k, c in enumerate(moves):
        if c.src != at:
            return _fail(f"move {k} ({c.kind.value} over {c.axes_text() or 'no axes'}) starts from {c.src}, but the "
                         f"tensor is {at} there; the chain of moves is broken")
        at = c.dst
    if at != dst:
        return _fail(f"its moves end at {at}, not at the target {dst}")
    return PROVEN


def _fits(s, shape: tuple, mesh: Mesh) -> bool:
    return isinstance(s, Sharding) and s.shape == shape and (s.mesh is mesh or s.mesh == mesh)


def check_wiring(plan, i: int, memo: dict | None = None, chains: list | None = None) -> Check:
    """Op ``i`` of ``plan``: every input reaches its target, every output its final sharding, by
    a connected chain of planned collectives; every sharding fits its tensor and the mesh.
    ``memo`` (a dict) shares the chain checks of equal moves between calls; ``chains`` (a list)
    receives ``(tensor, moves)`` for each input and output that moves, what the verifier then
    proves collective by collective. ``check_wiring(p, 0).status -> 'proven'``"""
    op, po = plan.program.ops[i], plan.ops[i]
    tensors, shardings, mesh = plan.program.tensors, plan.shardings, plan.mesh
    memo = {} if memo is None else memo

    def chain(name, src, dst, what):
        moves = plan.moves.get((name, dst), ())
        if chains is not None:
            chains.append((name, moves))
        key = (src, dst, moves)
        got = memo.get(key)
        if got is None:
            got = memo[key] = _chain(src, dst, moves)
        return got if not got.failed else _fail(f"{what} ({name}): {got.message}")

    for j, (name, tgt) in enumerate(zip(op.inputs, po.input_targets)):
        if type(name) is not str:
            continue
        src, shape = shardings.get(name), tensors[name].shape
        if not (isinstance(src, Sharding) and src.shape == shape and (src.mesh is mesh or src.mesh == mesh)):
            return _fail(f"input {j} ({name}): its sharding {src} does not fit the tensor of shape {shape} on "
                         f"mesh {mesh}")
        if tgt is not src:
            if not _fits(tgt, shape, mesh):
                return _fail(f"input {j} ({name}): its target {tgt} does not fit the tensor of shape {shape} on "
                             f"mesh {mesh}")
            if tgt != src:
                got = chain(name, src, tgt, f"input {j}")
                if got.failed:
                    return got
    if len(po.outputs) != len(op.outputs):
        return _fail(f"the op has {len(op.outputs)} outputs but {len(po.outputs)} output shardings")
    for k, (name, out) in enumerate(zip(op.outputs, po.outputs)):
        final, shape = shardings.get(name), tensors[name].shape
        for what, s in (("output sharding", out), ("final sharding", final)) if final is not out else (
                ("output sharding", out),):
            if not _fits(s, shape, mesh):
                return _fail(f"output {k} ({name}): its {what} {s} does not fit the tensor of shape {shape} on "
                             f"mesh {mesh}")
        if final is not out and final != out:
            got = chain(name, out, final, f"output {k}")
            if got.failed:
                return got
    return PROVEN


__all__ = ["Check", "PROVEN", "check_collective", "check_op", "check_reshape", "check_wiring", "flat_form",
           "flat_offsets", "partition", "same_indices"]
