"""Redistribution: the collectives that turn one Sharding of a tensor into another, with costs.

A plan keeps every mesh-axis piece that sits at the same digit of the same dim in both
shardings, gathers the others (an all-to-all when the piece only moves), reduces partial axes
(a reduce-scatter when the target shards on that axis), and slices the target's new pieces
locally. Valid for strided, sub-axis and uneven shardings; every step can be run on numpy
pieces with ``run_step`` (each rank uses only its group's pieces).

    >>> from shardlayout import Mesh, Sharding
    >>> m = Mesh.parse("dp=2,tp=4")
    >>> steps = plan_redistribution(Sharding.parse("[8, 12] +sum(tp)", m), Sharding.parse("[8, tp*3]", m))
    >>> [(s.kind, s.axes) for s in steps]
    [('reduce_scatter', ('tp',))]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from ..errors import ShardingSpecError, ShardMismatch
from .core import ChunkProgram, Factor, Sharding, _fmt_factor, _product

ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
    "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16,
}


@dataclass(frozen=True)
class CostModel:
    """Alpha-beta cost per mesh axis, as DTensor's model (``_collective_utils.py``):
    ``latency + hops * hop_latency + bytes * hops / n / bandwidth``.

    Defaults: 6.6 µs base, 0.6 µs per hop, 87.7 GB/s; give per-axis overrides, e.g. a slower
    inter-host axis: ``CostModel(bandwidth={"dp": 25e9}, hop_latency={"dp": 5e-6})``.
    """

    latency: float = 6.6e-6
    hop_latency: dict = field(default_factory=dict)
    bandwidth: dict = field(default_factory=dict)
    default_hop_latency: float = 0.6e-6
    default_bandwidth: float = 87.7e9

    def seconds(self, kind: str, axis: str, group: int, nbytes: float) -> float:
        """Estimated seconds of one collective over ``group`` devices of ``axis``.

        ``CostModel().seconds("all_gather", "tp", 4, 0) -> 8.4e-06``
        """
        if group <= 1 or kind == "local":
            return 0.0
        hops = group - 1
        if kind == "all_reduce":
            hops *= 2
        lat = self.latency + hops * self.hop_latency.get(axis, self.default_hop_latency)
        bw = self.bandwidth.get(axis, self.default_bandwidth)
        return lat + nbytes * hops / group / bw

    def __hash__(self) -> int:
        return hash((self.latency, tuple(sorted(self.hop_latency.items())),
                     tuple(sorted(self.bandwidth.items())), self.default_hop_latency,
                     self.default_bandwidth))


DEFAULT_COST_MODEL = CostModel()


@dataclass(frozen=True)
class Step:
    """One collective (or local step) from ``src`` to ``dst``.

    ``kind``: all_gather, all_to_all, all_reduce, reduce_scatter, local (slice or partition).
    ``axes``: mesh axes or sub-axes (Shardy notation). ``bytes``: what the DTensor cost model
    counts for it (the gathered size for an all-gather, the input size otherwise)."""

    kind: str
    axes: tuple
    src: Sharding
    dst: Sharding
    bytes: int
    seconds: float
    group: int

    def to_json(self) -> dict:
        """JSON-able form."""
        return {"kind": self.kind, "axes": list(self.axes), "bytes": self.bytes,
                "seconds": self.seconds, "from": str(self.src), "to": str(self.dst)}


# ------------------------------------------------------------------------------------------
# digit positions of axis pieces
# ------------------------------------------------------------------------------------------


def _placed(s: Sharding) -> dict:
    """``{(axis, pre, size): (dim, outer product before it)}`` for even dims."""
    out = {}
    for d, fs in enumerate(s.dims):
        if type(fs) is ChunkProgram:
            continue
        p = 1
        for f in fs:
            if f.axis is not None:
                out[(f.axis, f.pre, f.size)] = (d, p)
            p *= f.size
    return out


def _localize(s: Sharding, keep) -> Sharding:
    """``s`` with every axis piece not accepted by ``keep(dim, factor)`` made local."""
    dims = []
    for d, fs in enumerate(s.dims):
        if type(fs) is ChunkProgram:
            dims.append(fs if keep(d, None) else [])
            continue
        dims.append([f if f.axis is None or keep(d, f) else Factor(f.size) for f in fs])
    return Sharding._trusted(s.mesh, s.shape, dims, s.partial)


def plan_redistribution(src: Sharding, dst: Sharding, cost_model: CostModel | None = None,
                        dtype: str = "float32") -> tuple:
    """The steps from ``src`` to ``dst`` (same mesh and shape), cheapest kinds first.

    Memoised (shardings and cost models are immutable): an op rule and the whole-program
    planner asking for the same move share one plan. Raises ``ShardingSpecError`` when the two
    are not shardings of the same tensor.
    """
    return _plan_redistribution(src, dst, cost_model or DEFAULT_COST_MODEL, str(dtype))


@lru_cache(maxsize=1 << 14)
def _plan_redistribution(src: Sharding, dst: Sharding, cost_model: CostModel, dtype: str) -> tuple:
    if src.mesh != dst.mesh or src.shape != dst.shape:
        raise ShardingSpecError(
            f"redistribute: {src} (shape {src.shape}, mesh {src.mesh}) and {dst} (shape "
            f"{dst.shape}, mesh {dst.mesh}) are not the same tensor on the same mesh"
        )
    cm = cost_model or DEFAULT_COST_MODEL
    itemsize = ITEMSIZE.get(str(dtype).replace("torch.", ""), 4)
    if src == dst:
        return ()
    a_place, b_place = _placed(src), _placed(dst)
    same_dims = {d for d in range(src.ndim) if src.dims[d] == dst.dims[d]}

    def kept(d, f):
        if d in same_dims:
            return True
        if f is None or not src.is_even(d) or not dst.is_even(d):
            return False
        key = (f.axis, f.pre, f.size)
        return key in b_place and b_place[key] == a_place.get(key)

    steps: list = []
    cur = src
    # 1. gather (or move) the pieces that are not at the same digit in the target
    common = _localize(src, kept)
    moved_axes = []
    lost = _lost_pieces(src, common)
    targets = _placed(dst)
    for axis, pre, size, text in lost:
        nxt = _drop_piece(cur, axis, pre, size)
        if nxt == cur:  # a DTensor chunk program already gathered with another of its axes
            continue
        moves = (axis, pre, size) in targets and (axis, pre, size) not in _placed(common)
        if moves:
            # the same piece reappears elsewhere in the target: all-to-all instead of
            # all-gather + slice
            moved_axes.append((axis, pre, size))
            nxt = _add_piece(nxt, dst, axis, pre, size)
            if nxt is None:
                moved_axes.pop()
                nxt = _drop_piece(cur, axis, pre, size)
                moves = False
        kind = "all_to_all" if moves else "all_gather"
        texts, group = (text,), size
        prog = next((fs for fs in cur.dims if type(fs) is ChunkProgram and any(st.axis == axis for st in fs)),
                    None)
        if prog is not None:  # a DTensor chunk program is gathered whole, over all its axes
            texts, group = tuple(st.axis for st in prog), _product(st.size for st in prog)
        nbytes = _product(cur.local_shape(0)) * itemsize if moves else _product(nxt.local_shape(0)) * itemsize
        steps.append(Step(kind, texts, cur, nxt, nbytes, cm.seconds(kind, axis, group, nbytes), group))
        cur = nxt
    # 2. partial axes
    dst_partial = dict(dst.partial)
    for axis, op in src.partial:
        if dst_partial.get(axis) == op:
            continue
        n = src.mesh.axis_size(axis)
        partial = tuple(p for p in cur.partial if p[0] != axis)
        nbytes = _product(cur.local_shape(0)) * itemsize
        sliced = _add_piece(Sharding._trusted(cur.mesh, cur.shape, cur.dims, partial), dst, axis, 1, n)
        if sliced is not None and op in ("sum", "avg", "max", "min"):
            steps.append(Step("reduce_scatter", (axis,), cur, sliced, nbytes,
                              cm.seconds("reduce_scatter", axis, n, nbytes), n))
            cur = sliced
        else:
            nxt = Sharding._trusted(cur.mesh, cur.shape, cur.dims, partial)
            steps.append(Step("all_reduce", (axis,), cur, nxt, nbytes,
                              cm.seconds("all_reduce", axis, n, nbytes), n))
            cur = nxt
    # 3. local: slice the target's new pieces, partition onto new partial axes
    if cur != dst:
        steps.append(Step("local", ("slice",), cur, dst, 0, 0.0, 1))
    return tuple(steps)


def _program_keys(s: Sharding) -> set:
    return {(st.axis, 1, st.size) for fs in s.dims if type(fs) is ChunkProgram for st in fs}


def _lost_pieces(src: Sharding, common: Sharding) -> list:
    out = []
    kept = set(_placed(common)) | _program_keys(common)
    for fs in src.dims:
        for f in fs:
            if f.axis is not None and (f.axis, f.pre, f.size) not in kept:
                out.append((f.axis, f.pre, f.size, _fmt_factor(Factor(f.size, f.axis, f.pre), src.mesh)))
    return out


def _drop_piece(s: Sharding, axis: str, pre: int, size: int) -> Sharding:
    dims = []
    for fs in s.dims:
        if type(fs) is ChunkProgram:
            dims.append([] if any(st.axis == axis for st in fs) else fs)
            continue
        dims.append([Factor(f.size) if (f.axis, f.pre, f.size) == (axis, pre, size) else f for f in fs])
    return Sharding._trusted(s.mesh, s.shape, dims, s.partial)


def _add_piece(cur: Sharding, dst: Sharding, axis: str, pre: int, size: int):
    """``cur`` with the target's piece ``axis:(pre)size`` sliced in at the target's digit, if
    the local digits of ``cur`` there allow it; else None."""
    where = _placed(dst).get((axis, pre, size))
    if where is None:
        return None
    d, p = where
    if type(cur.dims[d]) is ChunkProgram or not cur.is_even(d):
        return None
    out, pos, done = [], 1, False
    for f in cur.dims[d]:
        lo, hi = pos, pos * f.size
        if not done and f.axis is None and lo <= p and p * size <= hi and p % lo == 0:
            a = p // lo
            rest = f.size // a
            if f.size % a == 0 and rest % size == 0:
                out += [Factor(a), Factor(size, axis, pre), Factor(rest // size)]
                done = True
                pos = hi
                continue
        out.append(f)
        pos = hi
    if not done:
        return None
    return Sharding._trusted(cur.mesh, cur.shape, [out if i == d else fs for i, fs in enumerate(cur.dims)],
                             cur.partial)


def redistribution_cost(steps: list) -> float:
    """Total estimated seconds. ``redistribution_cost([]) -> 0``."""
    return sum(s.seconds for s in steps)


# ------------------------------------------------------------------------------------------
# running steps on numpy pieces
# ------------------------------------------------------------------------------------------

_REDUCE = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min}


def run_step(step: Step, pieces: dict) -> dict:
    """Run one step on ``{rank: piece}``: each rank assembles its new piece from the pieces
    of its group only (the ranks that differ from it on the step's mesh axis)."""
    src, dst, mesh = step.src, step.dst, step.src.mesh
    axes = {a.split(":")[0] for a in step.axes} if step.kind != "local" else set()
    axis_idx = [mesh.axis_index(a) for a in axes]
    src_partial, dst_partial = dict(src.partial), dict(dst.partial)
    out = {}
    for r in mesh.ranks():
        c = mesh.coord(r)
        group = [q for q in mesh.ranks()
                 if all(mesh.coord(q)[i] == c[i] for i in range(mesh.ndim) if i not in axis_idx)]
        reduce_op = None
        for a in axes:
            if a in src_partial and a not in dst_partial:
                reduce_op = src_partial[a]
        if reduce_op:
            stacked = []
            for q in group:
                buf = np.zeros(src.shape, dtype=np.result_type(pieces[q].dtype, np.float64))
                buf[np.ix_(*src.indices(q))] = pieces[q]
                stacked.append(buf)
            full = _REDUCE[reduce_op](np.stack(stacked), axis=0)
            have = np.zeros(src.shape, dtype=bool)
            for q in group:
                have[np.ix_(*src.indices(q))] = True
        else:
            full = np.zeros(src.shape, dtype=np.result_type(pieces[r].dtype, np.float64))
            have = np.zeros(src.shape, dtype=bool)
            for q in (group if step.kind != "local" else [r]):
                full[np.ix_(*src.indices(q))] = pieces[q]
                have[np.ix_(*src.indices(q))] = True
        idx = np.ix_(*dst.indices(r))
        if not have[idx].all():
            raise ShardMismatch(
                f"{step.kind} {step.axes}: rank {r} needs elements its group does not hold "
                f"({src} -> {dst}); the plan is invalid"
            )
        piece = full[idx]
        for a, op in dst.partial:
            if a not in src_partial and op == "sum":
                piece = piece / mesh.axis_size(a)
        out[r] = piece
    return out


def run_plan(steps: list, pieces: dict) -> dict:
    """Run every step in order. ``run_plan([], pieces) is pieces``."""
    for st in steps:
        pieces = run_step(st, pieces)
    return pieces
