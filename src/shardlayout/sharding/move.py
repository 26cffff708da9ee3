"""``plan_move``: the only function that turns one sharding of a tensor into another.

It returns the :class:`Collective` records that do it, in order; the strategy search prices
its candidates by calling it, so what is priced is exactly what a plan emits and runs.

The plan keeps every mesh-axis piece that sits at the same digit of the same dim in both
shardings, gathers the others (an all-to-all when the piece only moves to another digit),
reduces partial axes (a reduce-scatter when the target shards on that axis, else an
all-reduce), and slices the target's new pieces locally (a ``local`` step, which also
partitions values onto new partial axes). Valid for strided, sub-axis and uneven shardings
and DTensor chunk programs; every plan is checked by running it on every rank
(``shardlayout.execute``).

    >>> from shardlayout import Mesh, Sharding
    >>> m = Mesh.parse("dp=2,tp=4")
    >>> [(c.kind.value, c.axes_text()) for c in plan_move(Sharding.parse("[8, 12] +sum(tp)", m),
    ...                                                    Sharding.parse("[8, tp*3]", m))]
    [('reduce_scatter', 'tp')]
"""

from __future__ import annotations

import reprlib

from ..caches import memo
from ..errors import ShardingSpecError
from .collective import AxisPiece, Collective, CollectiveKind
from .core import Sharding
from .cost import DEFAULT_COST_MODEL, CostModel, cost, itemsize
from .factors import ChunkProgram, Factor, _product


def plan_move(src: Sharding, dst: Sharding, dtype: str = "float32", cost_model=None) -> tuple:
    """The collectives from ``src`` to ``dst`` (same mesh and shape); ``()`` when equal.

    Partial axes are reduced either before the pieces move (less data to reduce) or after
    (a reduce-scatter can then land where the target wants it): both orders are planned and the
    cheaper under ``cost_model`` (default: DTensor's) is returned, so the price the search sees
    is that of the cheaper order. Memoised (shardings and cost models are immutable). Raises
    ``ShardingSpecError`` when the two are not shardings of the same tensor on the same mesh.

    Both sides in the same stream (``Sharding.stream``: ``[tp*~4*16] -> [2*~4*16]``) move chunk
    by chunk: each collective of the whole move ``k`` times, at a ``k``-th of its bytes, chunk
    after chunk — or, when the source's stream runs over the very mesh axis the move gathers (a
    ring, ``[~tp*16] -> [~2*16]``), ``ring_steps``: ``k - 1`` neighbour send/recvs of one shard.
    A stream on one side only, or different streams, orders the work and moves what the plain
    shardings move.
    """
    if type(src) is not Sharding or type(dst) is not Sharding:
        src, dst = _as_shardings(src, dst)
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise ShardingSpecError(f"plan_move: cost_model {reprlib.repr(cost_model)} is not a CostModel; pass e.g. "
                                "CostModel(bandwidth={'dp': 25e9}), or None for the default")
    size = itemsize(dtype)  # checked even when there is nothing to move
    if src.mesh != dst.mesh or src.shape != dst.shape:
        raise ShardingSpecError(
            f"redistribute: {src} (shape {src.shape}, mesh {src.mesh}) and {dst} (shape "
            f"{dst.shape}, mesh {dst.mesh}) are not the same tensor on the same mesh; "
            "plan a move only between two shardings of one tensor"
        )
    if src == dst:
        return ()
    if src.stream or dst.stream:  # a stream orders the work: only one both sides share cuts the move
        whole = plan_move(src.without_stream(), dst.without_stream(), dtype, cost_model)
        if src.stream != dst.stream:
            return whole
        ring = ring_steps(src, dst, whole)
        if ring is not None:
            return ring
        k = src.stream[2]
        return tuple(c.with_bytes(-(-c.bytes // k)) for _ in range(k) for c in whole)
    return _plan_move(src, dst, size, cost_model or DEFAULT_COST_MODEL)


def ring_steps(src: Sharding, dst: Sharding, whole: tuple) -> tuple | None:
    """The ring all-gather of ``src`` (stream over a mesh-axis factor, ``Sharding.stream_axis``)
    to ``dst`` (the same stream, that dim gathered), whose whole move is ``whole``: ``k - 1``
    steps, each a ``PERMUTE`` over the ring axis moving one shard (every rank passes the chunk it
    got last to the next rank along the axis and gets the previous rank's: after step ``s`` rank
    ``r`` holds rank ``r - s``'s shard). Priced step by step, the ring pays the all_gather's hops
    and bytes exactly and the launch latency ``k - 1`` times instead of once. None when the move
    is not one all_gather over exactly that axis factor.
    ``len(ring_steps(Sharding.parse("[~tp*16]", m), Sharding.parse("[~4*16]", m), whole)) -> 3``"""
    ax = src.stream_axis
    if ax is None or dst.stream_axis is not None or len(whole) != 1:
        return None
    (c,) = whole
    if c.kind is not CollectiveKind.ALL_GATHER or c.axes != (AxisPiece(ax.axis, ax.size, ax.pre),) \
            or c.dims != (src.stream[0],):
        return None
    shard = -(-c.bytes // ax.size)
    step = Collective(CollectiveKind.PERMUTE, c.axes, c.dims, shard, src, dst)
    return (step,) * (ax.size - 1)


def _as_shardings(src, dst) -> tuple:
    """``(src, dst)`` of ``plan_move`` as Shardings: ``dst`` may be text, read on ``src``'s mesh;
    anything else is a ShardingSpecError naming the argument."""
    if not isinstance(src, Sharding):
        raise ShardingSpecError(f"plan_move: src is {type(src).__name__} {reprlib.repr(src)}, not a Sharding; give "
                                "the source sharding, e.g. Sharding.parse('[dp*4, 12]', mesh)")
    if isinstance(dst, str):
        try:
            dst = Sharding.parse(dst, src.mesh)
        except ShardingSpecError as e:
            raise type(e)(f"plan_move: dst {dst!r} on src's mesh {src.mesh}: {e}") from None
    if not isinstance(dst, Sharding):
        raise ShardingSpecError(f"plan_move: dst is {type(dst).__name__} {reprlib.repr(dst)}, not a Sharding; give "
                                "the target sharding (or its text, read on src's mesh), e.g. '[8, tp*3]'")
    return src, dst


def is_local_move(src: Sharding, dst: Sharding) -> bool:
    """Does moving ``src`` to ``dst`` (same tensor) only slice locally — no collective? Decided
    from the factor lists; every other move emits at least one communicating collective.
    ``is_local_move(Sharding.parse("[8, 8]", m), Sharding.parse("[tp*2, 8]", m)) -> True``"""
    return src == dst or _only_local(src, dst)


def communicating(moves) -> tuple:
    """The moves that communicate (drops local slices). ``communicating(()) -> ()``."""
    return tuple(c for c in moves if c.kind.communicates)


# ------------------------------------------------------------------------------------------
# digit positions of axis pieces
# ------------------------------------------------------------------------------------------


@memo(1 << 14)
def placed(s: Sharding) -> dict:
    """``{(axis, pre, size): (dim, outer product before it)}`` for the even dims of ``s``."""
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


def _local_bytes(s: Sharding, nbytes: int) -> int:
    return _product(s.local_shape(0)) * nbytes


@memo(1 << 15)
def _plan_move(src: Sharding, dst: Sharding, item: int, cost_model) -> tuple:
    if _only_local(src, dst):  # the common case of the search (a free slice), decided without building
        return (Collective(CollectiveKind.LOCAL, (), (), 0, src, dst),)
    return _plan_general(src, dst, item, cost_model)


def _plan_general(src: Sharding, dst: Sharding, item: int, cost_model) -> tuple:
    gathered, cur = _move_pieces(src, dst, item)
    first = gathered + _reduce_partials(cur, dst, item)
    reduced = _reduce_partials(src, dst, item) if any(c.kind.communicates for c in gathered) else ()
    if reduced:
        moved, _ = _move_pieces(reduced[-1].dst, dst, item)
        second = reduced + moved
        if cost(second, cost_model) < cost(first, cost_model):
            first = second
    end = first[-1].dst if first else src
    if end != dst:  # local: slice the target's new pieces, partition onto new partial axes
        first = first + (Collective(CollectiveKind.LOCAL, (), (), 0, end, dst),)
    return first


def _only_local(src: Sharding, dst: Sharding) -> bool:
    """Does every piece of ``src`` stay at its digit in ``dst`` and every partial axis stay
    partial? Then the general path below gathers and reduces nothing and ends in one local step:
    this answers it from the factor lists alone (the same test as ``kept`` there)."""
    dst_partial = set(dst.partial)
    if any(p not in dst_partial for p in src.partial):
        return False
    a_place = b_place = None
    for d, (fa, fb) in enumerate(zip(src.dims, dst.dims)):
        if fa == fb:
            continue
        if type(fa) is ChunkProgram or not src.is_even(d) or not dst.is_even(d):
            if any(f.axis is not None for f in fa) if type(fa) is not ChunkProgram else True:
                return False
            continue
        if a_place is None:
            a_place, b_place = placed(src), placed(dst)
        for f in fa:
            if f.axis is not None:
                key = (f.axis, f.pre, f.size)
                if key not in b_place or b_place[key] != a_place.get(key):
                    return False
    return True


def _move_pieces(src: Sharding, dst: Sharding, item: int) -> tuple:
    """Gather (or all-to-all) the pieces of ``src`` not at the same digit in ``dst``:
    ``(collectives, sharding reached)``."""
    a_place, b_place = placed(src), placed(dst)
    same_dims = {d for d in range(src.ndim) if src.dims[d] == dst.dims[d]}

    def kept(d, f):
        if d in same_dims:
            return True
        if f is None or not src.is_even(d) or not dst.is_even(d):
            return False
        key = (f.axis, f.pre, f.size)
        return key in b_place and b_place[key] == a_place.get(key)

    out: list = []
    cur = src
    common = _localize(src, kept)
    common_keys = set(placed(common))
    for axis, pre, size, dim in _lost_pieces(src, common):
        nxt = _drop_piece(cur, axis, pre, size)
        if nxt == cur:  # a DTensor chunk program already gathered with another of its axes
            continue
        kind, dims = CollectiveKind.ALL_GATHER, (dim,)
        if (axis, pre, size) in b_place and (axis, pre, size) not in common_keys:
            # the same piece reappears elsewhere in the target: all-to-all, not gather + slice
            moved = _add_piece(nxt, dst, axis, pre, size)
            if moved is not None:
                kind, nxt, dims = CollectiveKind.ALL_TO_ALL, moved, (dim, b_place[(axis, pre, size)][0])
        pieces = (AxisPiece(axis, size, pre),)
        prog = next((fs for fs in cur.dims if type(fs) is ChunkProgram and any(st.axis == axis for st in fs)),
                    None)
        if prog is not None:  # a DTensor chunk program is gathered whole, over all its axes
            pieces = tuple(AxisPiece(st.axis, st.size) for st in prog)
        nbytes = _local_bytes(cur if kind is CollectiveKind.ALL_TO_ALL else nxt, item)
        out.append(Collective(kind, pieces, dims, nbytes, cur, nxt))
        cur = nxt
    return tuple(out), cur


def _reduce_partials(cur: Sharding, dst: Sharding, item: int) -> tuple:
    """Reduce the partial axes ``dst`` does not keep: a reduce-scatter where the target shards
    on that axis at a digit ``cur`` holds locally, else an all-reduce."""
    out: list = []
    b_place = placed(dst)
    dst_partial = dict(dst.partial)
    for axis, op in cur.partial:
        if dst_partial.get(axis) == op:
            continue
        n = cur.mesh.axis_size(axis)
        partial = tuple(p for p in cur.partial if p[0] != axis)
        nbytes = _local_bytes(cur, item)
        reduced = Sharding._trusted(cur.mesh, cur.shape, cur.dims, partial)
        sliced = _add_piece(reduced, dst, axis, 1, n)
        if sliced is not None:
            out.append(Collective(CollectiveKind.REDUCE_SCATTER, (AxisPiece(axis, n),),
                                  (b_place[(axis, 1, n)][0],), nbytes, cur, sliced, op))
            cur = sliced
        else:
            out.append(Collective(CollectiveKind.ALL_REDUCE, (AxisPiece(axis, n),), (), nbytes, cur, reduced, op))
            cur = reduced
    return tuple(out)


def _program_keys(s: Sharding) -> set:
    return {(st.axis, 1, st.size) for fs in s.dims if type(fs) is ChunkProgram for st in fs}


def _lost_pieces(src: Sharding, common: Sharding) -> list:
    kept = set(placed(common)) | _program_keys(common)
    return [(f.axis, f.pre, f.size, d) for d, fs in enumerate(src.dims) for f in fs
            if f.axis is not None and (f.axis, f.pre, f.size) not in kept]


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
    where = placed(dst).get((axis, pre, size))
    if where is None:
        return None
    d, p = where
    tgt = dst.dims[d]
    whole = type(cur.dims[d]) is not ChunkProgram and all(f.axis is None for f in cur.dims[d])
    if whole and type(tgt) is not ChunkProgram and tgt and tgt[0] == Factor(size, axis, pre) and \
            all(f.axis is None for f in tgt[1:]):  # a whole dim cut by the piece alone: even or torch.chunk-uneven
        return Sharding._trusted(cur.mesh, cur.shape, [tgt if i == d else fs for i, fs in enumerate(cur.dims)],
                                 cur.partial)
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


__all__ = ["communicating", "placed", "plan_move", "ring_steps"]
