"""The ragged dim of a Sharding: which components and which sources each rank holds.

A tensor with a ragged dim (``Ragged``: dim ``dim`` ragged over its component dim
``dim - 1``, per-component extents known only at run time) keeps an ordinary
:class:`Sharding` over its *expected* shape: the ragged dim's entry is the expected rows per
component, so every cost and memory figure is the expected one, and a move between two
shardings is planned and priced by ``plan_move`` like any other. What the factors mean:

- the **component dim**'s factors say which components a rank holds (experts on ``ep``:
  ``[ep*2, ...]``), exactly as for a dense dim;
- the **ragged dim**'s mesh factors say which *source* blocks of each component a rank
  holds: a ragged tensor made by routing token-sharded rows (``ops.ragged.route``) has one
  block per token shard, and ``[4, ep*2, 16]`` holds this rank's own block of every
  component; with no mesh factor on the ragged dim a rank holds every source's block.

The local value is a :class:`~shardlayout.sharding.nested.Nested` piece; ``nested_piece``
cuts a rank's piece out of a whole nested tensor, ``ragged_collective_piece`` runs a planned
collective on nested pieces (an ``all_to_all`` from sources to components is the token
dispatch of expert parallelism, its inverse the combine).

    >>> from shardlayout.mesh import Mesh
    >>> from shardlayout.sharding import Sharding
    >>> m = Mesh.parse("ep=2")
    >>> r = Ragged(dim=1, components=4, expected=4, maximum=8, total=16)
    >>> held(Sharding.parse("[4, ep*2, 3]", m), r, 1), held(Sharding.parse("[ep*2, 4, 3]", m), r, 1)
    (((0, 1, 2, 3), (1,)), ((2, 3), None))
    >>> ragged_text(Sharding.parse("[4, ep*2, 3]", m), r)
    '[4, ragged(ep*2), 3]'
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np

from ..errors import ShardMismatch
from ..mesh import group_ranks
from .core import ChunkProgram, Sharding, format_dim
from .nested import Nested, RaggedError, from_blocks


@dataclass(frozen=True)
class Ragged:
    """Dim ``dim`` of a tensor is ragged over its component dim ``dim - 1``: ``components``
    components whose row counts are known at run time. ``expected`` rows per component (the
    tensor's shape holds it: costs are expected costs), ``maximum`` rows one component can
    get (memory), ``total`` rows over all components when static (routing ``T`` tokens to
    ``k`` experts each: ``T*k``), ``counts`` what gives the extents, as text."""

    dim: int
    components: int
    expected: int
    maximum: int
    total: int | None = None
    counts: str = ""

    def __post_init__(self):
        if self.dim < 1:
            raise RaggedError(f"a ragged dim needs its component dim before it: dim {self.dim} has none; the ragged "
                              "dim comes right after its component dim (the RFC's [component, ragged, ...])")
        if self.components < 1 or self.expected < 0 or self.maximum < self.expected:
            raise RaggedError(f"ragged dim {self.dim}: components={self.components}, expected={self.expected}, "
                              f"maximum={self.maximum}; give components >= 1 and 0 <= expected <= maximum")

    def to_json(self) -> dict:
        """JSON-able form. ``Ragged.from_json(r.to_json()) == r``"""
        return {"dim": self.dim, "components": self.components, "expected": self.expected,
                "maximum": self.maximum, "total": self.total, "counts": self.counts}

    @classmethod
    def from_json(cls, d: dict) -> "Ragged":
        """The inverse of :meth:`to_json`."""
        def whole(key):
            v = d[key]
            if type(v) is not int:
                raise ValueError(f"{key} = {v!r} is not a whole number")
            return v

        try:
            if not isinstance(d, dict):
                raise TypeError("not an object")
            return cls(whole("dim"), whole("components"), whole("expected"), whole("maximum"),
                       None if d.get("total") is None else whole("total"), str(d.get("counts", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise RaggedError(f"ragged: {d!r} is not a ragged dim ({e}); give dim, components, expected, "
                              "maximum") from None

    def at_dim(self, dim: int) -> "Ragged":
        """The same ragged dim at another position (an op that moved it)."""
        return Ragged(dim, self.components, self.expected, self.maximum, self.total, self.counts)


def source_factors(s: Sharding, r: Ragged) -> tuple:
    """The mesh factors on the ragged dim: the sources a rank's piece is cut by."""
    d = s.dims[r.dim]
    if type(d) is ChunkProgram:
        raise RaggedError(f"the ragged dim {r.dim} of {s} is cut by a DTensor chunk program; a ragged dim is cut "
                          "only by its sources' mesh axes, outermost")
    return tuple(f for f in d if f.axis is not None)


def check_ragged(s: Sharding, r: Ragged, tensor: str = "tensor") -> None:
    """Raise RaggedError unless ``s`` can hold a ragged dim ``r``: the component dim cut by
    factors (evenly or as torch.chunk cuts: a rank may hold no component), the ragged dim cut
    only by mesh factors outermost (its sources).
    ``check_ragged(Sharding.parse("[4, ep*2, 3]", m), r)``"""
    if s.ndim <= r.dim:
        raise RaggedError(f"{tensor}: sharding {s} has {s.ndim} dims; its ragged dim is {r.dim}")
    if type(s.dims[r.dim - 1]) is ChunkProgram:
        raise RaggedError(f"{tensor}: the component dim {r.dim - 1} of {s} is cut by a DTensor chunk program; cut "
                          "components by mesh factors")
    fs = tuple(s.dims[r.dim])
    seen_local = False
    for f in fs:
        if f.axis is None:
            seen_local = True
        elif seen_local:
            raise RaggedError(f"{tensor}: the ragged dim {r.dim} of {s} has a mesh factor inside a local one; a "
                              "ragged dim is cut only by its sources (mesh factors outermost)")


def _digits(s: Sharding, rank: int, factors: tuple) -> int:
    """The mixed-radix number of ``rank``'s coordinates on ``factors`` (outermost first)."""
    mesh = s.mesh
    coord = mesh.coord(rank)
    v = 0
    for f in factors:
        n = mesh.axis_size(f.axis)
        c = coord[mesh.axis_index(f.axis)]
        v = v * f.size + (c // (n // (f.pre * f.size))) % f.size
    return v


def _subsequence(fs: tuple, sources: tuple, s: Sharding) -> tuple:
    """Where each factor of ``fs`` sits in ``sources`` (in order), or RaggedError."""
    at, k = [], 0
    for f in fs:
        while k < len(sources) and sources[k] != f:
            k += 1
        if k == len(sources):
            raise RaggedError(f"{s} cuts the ragged dim by {', '.join(x.axis for x in fs)}, not by the mesh axes its "
                              f"rows were routed from ({', '.join(x.axis for x in sources) or 'none'}) or part of them")
        at.append(k)
        k += 1
    return tuple(at)


def held(s: Sharding, r: Ragged, rank: int, sources: tuple = ()) -> tuple:
    """``(components, sources)``: the global component ids ``rank`` holds and the source blocks
    it holds (None: every one). ``sources``: the factors the rows were routed from (default: the
    ragged dim's own); a sharding cutting the ragged dim by some of them holds every source
    whose digits on those factors are the rank's."""
    comps = tuple(int(c) for c in s.indices(rank)[r.dim - 1])
    fs = source_factors(s, r)
    if not fs:
        return comps, None
    sources = tuple(sources) or fs
    at = _subsequence(fs, sources, s)
    mine = {k: _digits(s, rank, (f,)) for k, f in zip(at, fs)}
    ids = []
    for digits in product(*([mine[k]] if k in mine else range(f.size) for k, f in enumerate(sources))):
        v = 0
        for d, f in zip(digits, sources):
            v = v * f.size + d
        ids.append(v)
    return comps, tuple(ids)


def sources_of(s: Sharding, r: Ragged) -> int:
    """How many source blocks a sharding with sources on the ragged dim splits each component
    into (1 without)."""
    return int(np.prod([f.size for f in source_factors(s, r)], dtype=np.int64))


def routed_sources(c, src: Sharding, dst: Sharding, r: Ragged, held_sources: int) -> tuple:
    """``(source factors, number of sources)`` of a collective of a ragged tensor: the routing's
    factors the plan attached to ``c`` (``c.ragged``), else the source sharding's (or the
    target's when the source holds every source block: ``held_sources`` of them)."""
    fs = tuple(c.ragged[1]) if getattr(c, "ragged", None) else (source_factors(src, r) or source_factors(dst, r))
    n = int(np.prod([f.size for f in fs], dtype=np.int64)) if fs else held_sources
    if fs and not source_factors(src, r) and held_sources != n:
        raise RaggedError(f"{src} -> {dst}: the pieces hold {held_sources} source blocks, the target cuts them by "
                          f"{n}; a ragged dim keeps the sources it was routed from")
    return fs, n


def _dense_axes(r: Ragged, ndim: int) -> tuple:
    """The logical dims other than the component and ragged dims."""
    return tuple(d for d in range(ndim) if d not in (r.dim - 1, r.dim))


def _dense_slice(data, r: Ragged, ndim: int, picks: dict):
    """``data`` (storage: the flat dim at ``r.dim - 1``) indexed on the dense logical dims by
    ``picks`` ({logical dim: positions})."""
    for d, pos in picks.items():
        axis = d if d < r.dim - 1 else d - 1
        data = data[(slice(None),) * axis + (pos,)] if not hasattr(data, "index_select") else \
            data.index_select(axis, _torch_index(data, pos))
    return data


def _torch_index(like, pos):
    import torch

    return torch.as_tensor(np.asarray(pos, dtype=np.int64), device=like.device)


def _where(held_idx, want_idx) -> np.ndarray:
    at = {int(v): k for k, v in enumerate(held_idx)}
    try:
        return np.asarray([at[int(v)] for v in want_idx], dtype=np.int64)
    except KeyError as e:
        raise ShardMismatch(f"a nested piece does not hold dense index {e}") from None


def nested_piece(s: Sharding, r: Ragged, whole: Nested, rank: int, sources: tuple = ()) -> Nested:
    """``rank``'s piece of the whole nested tensor ``whole`` (its extents ``(sources,
    components)``: the sources as routed, by the factors ``sources``) under ``s``."""
    comps, src = held(s, r, rank, sources)
    n_src = whole.sources
    routed = tuple(sources) or source_factors(s, r)
    if src is not None and int(np.prod([f.size for f in routed], dtype=np.int64)) != n_src:
        raise RaggedError(f"{s} cuts the ragged dim by {len(routed)} mesh factor(s) of the routing but the tensor "
                          f"was routed from {n_src} source blocks; a ragged dim keeps the sources it was routed from")
    sources = src if src is not None else tuple(range(n_src))
    idx = s.indices(rank)
    picks = {d: idx[d] for d in _dense_axes(r, s.ndim) if len(idx[d]) != s.shape[d]}
    blocks = {(i, j): _dense_slice(whole.block(c, q), r, s.ndim, picks)
              for i, c in enumerate(comps) for j, q in enumerate(sources)}
    return from_blocks(blocks, len(comps), len(sources), whole.dim, whole.data, _storage(s, r, rank))


def ragged_of(s: Sharding, piece: Nested) -> Ragged:
    """The ragged dim a nested piece under ``s`` stores (from where its flat dim sits)."""
    n = s.shape[piece.dim + 1]
    return Ragged(piece.dim + 1, s.shape[piece.dim], n, n)


def ragged_collective_piece(c, rank: int, pieces: dict, group=None) -> Nested:
    """``rank``'s nested piece after collective ``c`` from the pieces of its ``group`` (the ranks
    the collective joins it with, by default ``mesh.group_ranks``; ``pieces`` maps each to its
    Nested piece under ``c.src``):
    every (component, source) block it needs is taken from a member that holds it (summed over
    the members for a reduction), then cut to its dense indices."""
    src, dst = c.src, c.dst
    group = list(group_ranks(src.mesh, rank, c.axes) if group is None else group)
    r = ragged_of(src, next(iter(pieces.values())))
    ndim = src.ndim
    fs, n_src = routed_sources(c, src, dst, r, pieces[group[0]].sources)
    comps, want_src = held(dst, r, rank, fs)
    want_src = want_src if want_src is not None else tuple(range(n_src))
    want_idx = dst.indices(rank)
    have = block_holders(src, r, fs, n_src, group)
    blocks = {}
    for (i, j), comp, so, holders in target_blocks(c, dst, r, fs, n_src, rank, have, group):
        if c.reduce_op:
            parts = []
            for q, qi, qj in holders:
                q_idx = src.indices(q)
                picks = {d: _where(q_idx[d], want_idx[d]) for d in _dense_axes(r, ndim)}
                parts.append(_dense_slice(pieces[q].block(qi, qj), r, ndim, picks))
            if len(parts) != len(group):
                raise ShardMismatch(f"{c.kind.value}: a reduction needs block ({comp}, {so}) from every member "
                                    f"of {group}")
            blocks[(i, j)] = _reduce(parts, c.reduce_op)
            continue
        cover = dense_cover(src, r, want_idx, holders)
        if not cover:  # the target holds no dense index: the rows, with empty dense dims
            q, qi, qj = holders[0]
            rows = pieces[q].block(qi, qj)
            shape = list(rows.shape)
            for d in _dense_axes(r, ndim):
                shape[d if d < r.dim - 1 else d - 1] = len(want_idx[d])
            blocks[(i, j)] = np.zeros(shape, dtype=rows.dtype)
            continue
        if len(cover) == 1 and all(len(t) == len(want_idx[d]) for d, t in cover[0][4].items()):
            q, qi, qj, qpos, _ = cover[0]
            blocks[(i, j)] = _dense_slice(pieces[q].block(qi, qj), r, ndim, qpos)
            continue
        first = pieces[cover[0][0]].block(cover[0][1], cover[0][2])
        shape = list(first.shape)
        for d in _dense_axes(r, ndim):
            shape[d if d < r.dim - 1 else d - 1] = len(want_idx[d])
        out = np.zeros(shape, dtype=first.dtype)
        for q, qi, qj, qpos, tpos in cover:
            part = _dense_slice(pieces[q].block(qi, qj), r, ndim, qpos)
            out[_box(shape, r, tpos)] = part
        blocks[(i, j)] = out
    like = pieces[group[0]]
    return from_blocks(blocks, len(comps), len(want_src), like.dim, like.data, _storage(dst, r, rank))


def block_holders(src: Sharding, r: Ragged, fs: tuple, n_src: int, group) -> dict:
    """``{(component, source): [(member, its local component, its local source)]}``: who in
    ``group`` holds each block under ``src`` (``fs``, ``n_src``: the routing's sources)."""
    have: dict = {}
    for q in group:
        qc, qs = held(src, r, q, fs)
        qs = qs if qs is not None else tuple(range(n_src))
        for i, comp in enumerate(qc):
            for j, so in enumerate(qs):
                have.setdefault((comp, so), []).append((q, i, j))
    return have


def target_blocks(c, dst: Sharding, r: Ragged, fs: tuple, n_src: int, rank: int, have: dict, group) -> list:
    """``[((i, j), component, source, holders)]``: the blocks ``rank``'s piece under ``dst``
    holds, in its storage order, each with the members holding it (``block_holders``); raises
    ShardMismatch when the group holds none of one."""
    comps, want_src = held(dst, r, rank, fs)
    want_src = want_src if want_src is not None else tuple(range(n_src))
    out = []
    for i, comp in enumerate(comps):
        for j, so in enumerate(want_src):
            holders = have.get((comp, so))
            if not holders:
                raise ShardMismatch(f"{c.kind.value} over {c.axes_text()}: rank {rank} needs component {comp}, source "
                                    f"{so} that its group {list(group)} does not hold ({c.src} -> {dst})")
            out.append(((i, j), comp, so, holders))
    return out


def dense_cover(src: Sharding, r: Ragged, want_idx: tuple, holders: list) -> list:
    """Which holders of one (component, source) block give which part of its dense dims a
    target piece wants (``want_idx``: the target's global indices per dim): ``[(member, its
    component, its source, {dim: positions in the member's piece}, {dim: positions in the
    target})]`` in member order, each part new (replicas give nothing twice). Static: every
    rank computes the same answer, so the senders of an exchange know what to send."""
    dense = _dense_axes(r, src.ndim)
    have = np.zeros([len(want_idx[d]) for d in dense], dtype=bool)
    out = []
    for q, qi, qj in holders:
        q_idx = src.indices(q)
        qpos, tpos = {}, {}
        for d in dense:
            at = {int(v): k for k, v in enumerate(q_idx[d])}
            t = [k for k, v in enumerate(want_idx[d]) if int(v) in at]
            tpos[d] = np.asarray(t, dtype=np.int64)
            qpos[d] = np.asarray([at[int(want_idx[d][k])] for k in t], dtype=np.int64)
        if any(len(tpos[d]) == 0 for d in dense):
            continue
        box = np.ix_(*[tpos[d] for d in dense]) if dense else ()
        if have[box].all():
            continue
        if have[box].any():
            raise ShardMismatch(f"the pieces of {src} overlap in part on the dense dims of a ragged block; move the "
                                "ragged tensor's dense dims whole or by whole pieces")
        have[box] = True
        out.append((q, qi, qj, qpos, tpos))
        if have.all():
            break
    if not have.all():
        raise ShardMismatch(f"the members {[h[0] for h in holders]} do not hold every dense index of a ragged block "
                            f"a target of {src} needs")
    return out


def _box(shape: list, r: Ragged, tpos: dict) -> tuple:
    """An index of the storage positions ``tpos`` ({logical dense dim: positions}), every row."""
    axes = [np.arange(n) for n in shape]
    for d, pos in tpos.items():
        axes[d if d < r.dim - 1 else d - 1] = pos
    return np.ix_(*axes)


def _storage(s: Sharding, r: Ragged, rank: int) -> tuple:
    """The storage shape of ``rank``'s piece with the flat dim's length left at 0."""
    shape = s.local_shape(rank)
    return tuple(shape[: r.dim - 1]) + (0,) + tuple(shape[r.dim + 1:])


def _reduce(parts: list, op: str):
    if op != "sum":
        raise RaggedError(f"a {op} reduction of a ragged tensor is not supported; only sums of partial values")
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def piece_rows(s: Sharding, r: Ragged) -> tuple:
    """``(expected, maximum)`` rows of the ragged dim in the largest piece a device holds under
    ``s``: the expected from the expected extents, the maximum when the routing sends every row
    it can to this piece (each of its components gets at most ``r.maximum`` rows; a source's piece
    at most its share of ``r.total``). ``piece_rows(Sharding.parse("[ep*2, 4, 3]", m), r) -> (8, 16)``"""
    cuts = int(np.prod([f.size for f in s.dims[r.dim - 1] if f.axis is not None], dtype=np.int64))
    comps = -(-s.shape[r.dim - 1] // cuts)  # torch.chunk: the first pieces are the largest
    n = sources_of(s, r)
    most = comps * r.maximum
    if r.total is not None:
        most = min(most, r.total)
    if n > 1 and r.total and r.maximum and r.total % r.maximum == 0:
        # a source piece: its tokens (the largest token shard) each give at most min(k, comps) rows
        most = min(most, -(-r.maximum // n) * min(r.total // r.maximum, comps))
    else:
        most = -(-most // n)
    return min(-(-comps * r.expected // n), most), most


def ragged_text(s: Sharding, r: Ragged) -> str:
    """The sharding's text with the ragged dim marked: ``[ep*2, ragged(4), 16]``."""
    parts = [format_dim(s, d) for d in range(s.ndim)]
    parts[r.dim] = f"ragged({parts[r.dim]})"
    text = "[" + ", ".join(parts) + "]"
    rest = str(s)
    return text + rest[rest.rindex("]") + 1:]


__all__ = ["Ragged", "RaggedError", "check_ragged", "held", "nested_piece", "ragged_collective_piece",
           "piece_rows", "ragged_of", "ragged_text", "routed_sources", "source_factors", "sources_of"]
