"""Running a plan's stream choices: a collective and the matmuls it feeds (or is fed by), chunk by chunk.

A :class:`~shardlayout.plan.stream.StreamChoice` says: cut dim ``d`` of ``tensor`` into ``k``
stream chunks and run its move and the matmuls on the far side of it one chunk at a time.
:func:`segments` turns each choice into a :class:`Segment` — the ops that run per chunk (the
views and pointwise ops between the move and the matmuls, and the matmuls), the dim of every
tensor of it that the chunks cut, and the global positions along that dim of each chunk (chunk
``j`` is the ``j``-th part of every rank's shard: ``chunk_layout``) — and
:func:`run_segment` runs one on any executor: per chunk, this rank's positions of the chunk are
taken from each input (``executor.chunk``), the move runs as ``plan_move`` between the chunk's
shardings (its collective is the whole move's cut ``k`` ways), the ops run on the chunk, and at
the end every tensor's chunks are put back in place (``executor.join``). The result is the whole
run's, element for element: rows are independent through the views, pointwise ops and the
matmuls' pass-through dims the choice follows. A path the chunks cannot follow exactly (a view
mixing the cut dim with another in a way that is not a cut of it) is not a segment: it runs
whole (``segments`` says which in ``skipped``).

    >>> from shardlayout import Mesh
    >>> from shardlayout.plan import plan
    >>> from shardlayout.program.models import llama, style_pins
    >>> prog, m = llama(layers=1, dim=4096, seq=4096, batch=1, heads=32), Mesh.parse("tp=8")
    >>> segs, skipped = segments(plan(prog, m, style_pins(prog, m, "megatron-sp")))
    >>> [(s.k, s.before is not None) for s in segs], skipped
    ([(8, True), (4, False)], ())
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..caches import memo
from ..ops.families import MATMULS
from ..ops.result import canonical_op_name
from ..sharding import Factor, Sharding
from ..sharding.move import plan_move

MAX_GROUP = 1 << 22  # elements of a view's merged dims a chunk's positions are carried through


@dataclass(frozen=True)
class Segment:
    """Ops ``ops`` (indices, program order) run chunk by chunk, ``k`` chunks: ``dims`` maps every
    tensor the chunks cut (inputs taken per chunk, the outputs, the moved tensor) to its dim,
    ``positions`` to ``k`` arrays of global positions along it; ``before``: the move ``(tensor,
    target)`` run per chunk ahead of the ops (a gather feeding matmuls), ``after``: the one run
    after them (the reduction of a matmul's partial output). ``order``: for a ring (the choice's
    ``style``), ``{rank: chunk index at each step}`` — rank ``r`` starts with its own shard and
    gets rank ``r - s``'s at step ``s``; None: every rank runs chunk ``j`` at step ``j``.
    ``prelude``: ops after the first that the segment reads and that need nothing made from it
    on (a weight's transpose, as torch.export places it next to its matmul): run whole, ahead of
    the segment (``walk``)."""

    ops: tuple
    k: int
    dims: dict
    positions: dict
    before: tuple | None = None
    after: tuple | None = None
    order: dict | None = None
    prelude: tuple = ()

    @property
    def first(self) -> int:
        """The op the segment runs at (its first)."""
        return self.ops[0]

    def at(self, name: str, j: int, rank: int):
        """The global positions along its chunk dim of ``name``'s part that ``rank`` runs at step
        ``j`` (chunk ``j``, or the ring's chunk of that step). ``seg.at("x", 0, 0)``"""
        return self.positions[name][j if self.order is None else self.order[rank][j]]


def chunk_layout(fs, n: int, k: int) -> tuple | None:
    """``(pre, post)``: the dim's factors ``fs`` (of ``n``) read as ``pre + [~k] + post`` — the
    stream cuts the local factor right after the last mesh-axis factor, so chunk ``j`` is the
    ``j``-th part of every rank's shard (every rank takes part in every chunk's collective); a
    dim without mesh-axis factors is cut outermost. None when that factor is not local, not
    divisible by ``k``, or the dim is uneven.
    ``chunk_layout((Factor(8, "tp"), Factor(512)), 4096, 8) -> ((Factor(8, 'tp'),), (Factor(64),))``"""
    fs = tuple(fs) or (Factor(n),)
    if math.prod(f.size for f in fs) != n:
        return None
    last = max((i for i, f in enumerate(fs) if f.axis is not None), default=-1)
    if last + 1 >= len(fs) or fs[last + 1].axis is not None or fs[last + 1].size % k:
        return None
    inner = fs[last + 1].size // k
    return fs[: last + 1], ((Factor(inner),) if inner > 1 else ()) + fs[last + 2:]


def _letters(op_name: str, params: dict, targets, outputs) -> tuple | None:
    """``(input letters, output letters)`` of a matmul-like op (its index map), or None."""
    from .indexmap import index_map

    try:
        imap = index_map(op_name, tuple(targets), params, len(outputs))
    except Exception:  # noqa: BLE001 - an op without a map simply does not stream
        return None
    if imap is None or imap.kind != "letters":
        return None
    return imap.inputs, imap.outputs


def _group_dim(src: tuple, dst: tuple, d: int) -> int | None:
    """The dim of a row-major reshape ``src -> dst`` holding dim ``d``'s outermost part (the
    merged dim, or the first of the dims it splits into, by ``_groups``); None when it cannot be
    told, or ``d`` has size 1 (no chunk cuts it)."""
    groups = _groups(tuple(src), tuple(dst)) if src[d] > 1 else None
    gj = next((gj for gi, gj in groups or () if d in gi), ())
    return next((k for k in gj if dst[k] > 1), gj[0]) if gj else None


def _through(op, d: int, in_shape: tuple, out_shape: tuple) -> int | None:
    """Where dim ``d`` of a view's or a pointwise op's (first) input lands in its output
    (memoised per target, params, dim and shapes: a model's layers ask the same)."""
    try:
        return _through_of(op.target, op.params, d, tuple(in_shape), tuple(out_shape))
    except TypeError:  # params built by hand with a list in them: computed every time
        return _through_of.__wrapped__(op.target, op.params, d, tuple(in_shape), tuple(out_shape))


@memo(1 << 14)
def _through_of(target: str, params: tuple, d: int, in_shape: tuple, out_shape: tuple) -> int | None:
    from ..program import Op
    from ..program.blocks import VIEWS, short, track_dims

    op = Op(target, (), params, ())
    base = short(op)
    if base in ("permute", "transpose", "t", "expand"):
        got = track_dims(op, tuple(range(len(in_shape))), in_shape, out_shape)
        return None if got is None or d not in got else got.index(d)
    if base in VIEWS:
        return d if in_shape == out_shape else _group_dim(in_shape, out_shape, d)
    lead = len(out_shape) - len(in_shape)
    return d + lead if lead >= 0 and out_shape[d + lead] == in_shape[d] else None


def chunk_positions_global(s: Sharding) -> tuple:
    """The global positions along the stream's dim of each of the ``k`` stream chunks of ``s``
    (``Sharding.stream`` ``(dim, outer, k)``: chunk ``j`` is the ``j``-th part of each of the dim's
    ``outer`` blocks), ascending.
    ``chunk_positions_global(Sharding.parse("[tp*~2*2]", Mesh.parse("tp=2")))[1].tolist() -> [2, 3, 6, 7]``"""
    dim, outer, k = s.stream
    inner = s.shape[dim] // (outer * k)
    base = np.arange(outer, dtype=np.int64)[:, None] * (k * inner) + np.arange(inner, dtype=np.int64)[None, :]
    return tuple((base + j * inner).reshape(-1) for j in range(k))


def _groups(a: tuple, b: tuple) -> list | None:
    """The dims of a row-major reshape ``a -> b`` in groups ``[(a dims, b dims)]`` of equal size."""
    out, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        gi, gj, x, y = [], [], 1, 1
        while True:
            if x == y and (gi or gj) and (x > 1 or (i >= len(a) or a[i] != 1) and (j >= len(b) or b[j] != 1)):
                break
            if (x <= y or j >= len(b)) and i < len(a):
                x *= a[i]
                gi.append(i)
                i += 1
            elif j < len(b):
                y *= b[j]
                gj.append(j)
                j += 1
            else:
                return None
        out.append((tuple(gi), tuple(gj)))
    return out


def carry_view(pos: tuple, a: tuple, da: int, b: tuple) -> tuple | None:
    """``(dim of b, positions per chunk)`` of chunks cutting dim ``da`` of shape ``a`` (at
    ``pos``) after a row-major reshape to ``b``, when every chunk is a cut of one dim of ``b``;
    None otherwise. ``carry_view(([0, 1], [2, 3]), (1, 4, 3), 1, (4, 3))`` -> ``(0, ...)``"""
    groups = _groups(tuple(a), tuple(b))
    if groups is None:
        return None
    gi, gj = next(((gi, gj) for gi, gj in groups if da in gi), ((), ()))
    if not gj:
        return None
    size = math.prod(a[d] for d in gi)
    if size > MAX_GROUP:
        return None
    out, dim = [], None
    order = sorted(range(len(gj)), key=lambda x: b[gj[x]] <= 1)  # dims of size > 1 first
    for p in pos:
        mask = np.zeros(tuple(a[d] for d in gi), dtype=bool)
        idx = [slice(None)] * len(gi)
        idx[gi.index(da)] = np.asarray(p, dtype=np.int64)
        mask[tuple(idx)] = True
        m = mask.reshape(tuple(b[d] for d in gj))
        found = None
        for k in order:  # the chunk must be {some positions along one dim} x everything else
            other = tuple(x for x in range(len(gj)) if x != k)
            sel = np.nonzero(m.any(axis=other) if other else m)[0]
            slab = np.take(m, sel, axis=k)
            if slab.all() and int(m.sum()) == slab.size:
                found = (k, sel)
                break
        if found is None or (dim is not None and found[0] != dim):
            return None
        dim = found[0]
        out.append(found[1].astype(np.int64))
    return gj[dim], tuple(out)


def _op_carry(plan, i: int, pos_in: int, d: int, positions: tuple):
    """Where chunks cutting dim ``d`` of op ``i``'s input ``pos_in`` land in its output: ``(dim,
    positions)``, or None when the op is not one a chunk passes through exactly (views, permutes,
    pointwise ops, matmuls along a pass-through dim)."""
    from ..program.blocks import VIEWS, short, track_dims

    prog = plan.program
    op = prog.ops[i]
    if len(op.outputs) != 1:  # makes nothing (an assertion) or several tensors
        return None
    name = prog.ops[i].inputs[pos_in]
    a, b = prog.tensors[name].shape, prog.tensors[op.outputs[0]].shape
    base = short(op)
    if canonical_op_name(op.target) in MATMULS:
        got = _letters(op.target, plan.ops[i].params, plan.ops[i].input_targets, plan.ops[i].outputs)
        if got is None or got[0][pos_in] is None or got[0][pos_in][d] not in got[1][0]:
            return None
        return got[1][0].index(got[0][pos_in][d]), positions
    if base in ("permute", "transpose", "t"):
        dims = track_dims(op, tuple(range(len(a))), a, b)
        return None if dims is None or d not in dims else (dims.index(d), positions)
    if base in VIEWS and base not in ("expand",):
        return carry_view(positions, a, d, b) if a != b else (d, positions)
    from ..ops.families import pointwise_ops

    if canonical_op_name(op.target) not in pointwise_ops():
        return None  # a pointwise op passes a chunk of any operand (HF's RMSNorm: weight * x)
    got = _through(op, d, a, b)
    return None if got is None else (got, positions)


def _other_dim(plan, i: int, k_in: int, out_dim: int) -> int | None:
    """The dim of op ``i``'s input ``k_in`` (not the chunked one) that the chunk cuts too: the
    same index letter of a matmul, the broadcast-aligned full-size dim of a pointwise op; None
    when that input has no such dim (a weight, a broadcast size-1 dim)."""

    prog = plan.program
    op = prog.ops[i]
    name = op.inputs[k_in]
    if not isinstance(name, str):
        return None
    shape, out = prog.tensors[name].shape, prog.tensors[op.outputs[0]].shape
    if canonical_op_name(op.target) in MATMULS:
        got = _letters(op.target, plan.ops[i].params, plan.ops[i].input_targets, plan.ops[i].outputs)
        letter = got[1][0][out_dim]
        lt = got[0][k_in]
        return None if lt is None or letter not in lt or shape[lt.index(letter)] == 1 else lt.index(letter)
    d = out_dim - (len(out) - len(shape))
    return d if 0 <= d < len(shape) and shape[d] == out[out_dim] and shape[d] > 1 else None


def segments(plan, flop_rate: float | None = None, chunks: int | None = None, ring: bool | None = None) -> tuple:
    """``(segments, skipped)``: a :class:`Segment` per stream choice of ``plan`` (``stream_plan``
    at ``flop_rate``) whose path the chunks follow exactly, and the choices (tensor names) that
    run whole instead. ``chunks``: run every choice in that many chunks instead of the planned
    number (a benchmark's sweep; a choice whose dim does not cut so is skipped). ``ring``: with
    ring-style streams (default: the plan's ``ring``)."""
    from dataclasses import replace

    from ..errors import ShardingSpecError

    out, skipped = [], []
    for choice in plan.stream_choices(flop_rate, ring=ring):
        if chunks is not None:
            try:
                base = choice.sharding.without_stream()
                choice = replace(choice, sharding=base.with_stream(choice.dim, int(chunks)))
            except ShardingSpecError:  # the dim does not cut in that many chunks: it runs whole
                skipped.append(choice.tensor)
                continue
        seg = _segment(plan, choice)
        (out.append(seg) if seg is not None else skipped.append(choice.tensor))
    used: set = set()
    final = []
    for seg in out:  # an op runs in one segment only (or ahead of one)
        if used & (set(seg.ops) | set(seg.prelude)):
            skipped.append((seg.before or seg.after)[0])
            continue
        used |= set(seg.ops) | set(seg.prelude)
        final.append(seg)
    return tuple(final), tuple(skipped)


def _moves_of(plan, name: str) -> list:
    return [tgt for (n, tgt), cs in sorted(plan.moves.items(), key=lambda kv: str(kv[0][1]))
            if n == name and any(c.kind.communicates for c in cs)]


def ring_order(s: Sharding) -> dict:
    """``{rank: chunk index at each step}`` of a ring stream ``s`` (``Sharding.stream_axis``): rank
    ``r`` at coordinate ``c`` on the ring axis runs chunks ``c, c - 1, ...`` (mod ``k``): its own
    shard first, then each one its ring brings.
    ``ring_order(Sharding.parse("[~tp*4]", "tp=2")) -> {0: (0, 1), 1: (1, 0)}``"""
    from ..sharding.collective import AxisPiece
    from .simulator import group_of

    ax, k = s.stream_axis, s.stream[2]
    piece = (AxisPiece(ax.axis, ax.size, ax.pre),)
    out = {}
    for r in s.mesh.ranks():
        c = group_of(s.mesh, r, piece).index(r)
        out[r] = tuple((c - j) % k for j in range(k))
    return out


def _segment(plan, choice) -> Segment | None:
    from dataclasses import replace

    prog = plan.program
    index = {op.name: i for i, op in enumerate(prog.ops)}
    sites = {index[n] for n in choice.ops}
    base = chunk_positions_global(choice.sharding)
    ops_of: dict = {}
    for i, op in enumerate(prog.ops):
        for x in op.inputs:
            if isinstance(x, str):
                ops_of.setdefault(x, []).append(i)
    producer = {o: i for i, op in enumerate(prog.ops) for o in op.outputs}
    dims, positions = {choice.tensor: choice.dim}, {choice.tensor: base}
    if choice.side == "before":
        for tgt in _moves_of(plan, choice.tensor):
            got = _forward(plan, ops_of, choice.tensor, tgt, sites, dims, positions)
            if got is None or (tgt == plan.shardings[choice.tensor] and not _deferrable(plan, ops_of, producer,
                                                                                       choice.tensor, got)):
                continue
            seg = _finish(plan, got, choice.chunks, dims, positions, before=(choice.tensor, tgt))
            return seg if seg is None or choice.style != "ring" else replace(seg, order=ring_order(choice.sharding))
        return None
    chain = _backward(plan, producer, choice.tensor, sites, dims, positions)
    if chain is None:
        return None
    tgts = _moves_of(plan, choice.tensor)
    if len(tgts) != 1:
        return None
    return _finish(plan, chain, choice.chunks, dims, positions, after=(choice.tensor, tgts[0]))


def _deferrable(plan, ops_of, producer: dict, x: str, ops: list) -> bool:
    """Can the producer's own move of ``x`` to its final sharding (an output move) run inside a
    segment starting at ``ops[0]``: nothing reads ``x`` between its producer and there but ops
    that make nothing (torch.export's ``_assert_tensor_metadata``)?"""
    prog = plan.program
    made = producer.get(x)
    return made is not None and all(
        not (made < i < ops[0]) or not prog.ops[i].outputs for i in ops_of.get(x, ()) if i not in ops)


def source_sharding(plan, seg: Segment) -> Sharding:
    """The sharding the segment's chunked move starts from: the moved tensor's where the walk holds
    it at that sharding, else (a reduction after the ops, or the producer's own output move run
    chunk by chunk) the sharding its op makes it in."""
    name, tgt = seg.before or seg.after
    if seg.before is not None and tgt != plan.shardings[name]:
        return plan.shardings[name]
    return _made_sharding(plan, name)


def _forward(plan, ops_of, x: str, tgt, sites: set, dims: dict, positions: dict):
    """The ops from the move of ``x`` at ``tgt`` to the matmuls ``sites``, with every tensor's
    chunk dim and positions filled in; None when a path the chunks take is not exact."""

    prog = plan.program
    found, reach = set(), {}
    stack = [(x, 0)]
    while stack:
        name, hops = stack.pop()
        want = tgt if name == x else plan.shardings[name]
        for i in ops_of.get(name, ()):
            op = prog.ops[i]
            pos = op.inputs.index(name)
            if plan.ops[i].input_targets[pos] != want or i in reach or hops > 6:
                continue
            is_mm = canonical_op_name(op.target) in MATMULS
            got = _op_carry(plan, i, pos, dims[name], positions[name])
            if got is None:
                continue
            reach[i] = (name, op.outputs[0], got)
            if is_mm:
                if i in sites:
                    found.add(i)
                continue
            stack.append((op.outputs[0], hops + 1))
            dims.setdefault(op.outputs[0], got[0])
            positions.setdefault(op.outputs[0], got[1])
    if found != sites:
        return None
    keep = set(found)  # only the ops on a path to a site
    changed = True
    while changed:
        changed = False
        for i, (_, out, _) in reach.items():
            if i not in keep and any(reach[j][0] == out for j in keep if j in reach):
                keep.add(i)
                changed = True
    for i in keep:
        _, out, (d, pos) = reach[i]
        dims[out], positions[out] = d, pos
    return sorted(keep)


def _backward(plan, producer, y: str, sites: set, dims: dict, positions: dict):
    """The ops from the matmul in ``sites`` to ``y`` (whose reduction runs per chunk), with
    their chunk dims and positions (found backwards through the views); None when not exact."""
    from ..program.blocks import VIEWS, short

    prog = plan.program
    chain, name = [], y
    for _ in range(8):
        i = producer.get(name)
        if i is None:
            return None
        op = prog.ops[i]
        chain.append(i)
        if canonical_op_name(op.target) in MATMULS:
            break
        src = op.inputs[0] if op.inputs and isinstance(op.inputs[0], str) else None
        if src is None or len(op.outputs) != 1:
            return None
        a, b = prog.tensors[src].shape, prog.tensors[name].shape
        back = next((k for k in range(len(a)) if _through(op, k, a, b) == dims[name]), None)
        if back is None:
            return None
        if short(op) in VIEWS and short(op) not in ("permute", "transpose", "t", "expand") and a != b:
            got = carry_view(positions[name], b, dims[name], a)
            if got is None or got[0] != back:
                return None
            pos = got[1]
        elif _op_carry(plan, i, 0, back, positions[name]) is None:
            return None
        else:
            pos = positions[name]
        dims[src], positions[src] = back, pos
        name = src
    else:
        return None
    if chain[-1] not in sites:
        return None
    chain.reverse()
    mm = chain[0]  # the matmul's chunked input: the operand carrying the output's chunked letter
    out = prog.ops[mm].outputs[0]
    for k_in, x in enumerate(prog.ops[mm].inputs):
        d = _other_dim(plan, mm, k_in, dims[out])
        if d is not None:
            dims.setdefault(x, d)
            positions.setdefault(x, positions[out])
    return chain


def _finish(plan, ops: list, k: int, dims: dict, positions: dict, before=None, after=None) -> Segment | None:
    """The segment, with the other inputs the chunks cut (a pointwise operand of the chunked
    size, a batched matmul's other operand) added; None when an input the chunks cut is used at
    a sharding the segment does not know."""
    prog = plan.program
    for i in ops:
        op = prog.ops[i]
        out = op.outputs[0]
        if out not in dims or len(op.outputs) != 1:
            return None
        if plan.ops[i].outputs[0] != plan.shardings[out] and (after is None or out != after[0]):
            return None  # made at one sharding, moved whole to another: not a chunk of one op's run
        for k_in, x in enumerate(op.inputs):
            if not isinstance(x, str) or x in dims:
                continue
            d = _other_dim(plan, i, k_in, dims[out])
            if d is not None:
                dims[x], positions[x] = d, positions[out]
    inside = {o for i in ops for o in prog.ops[i].outputs}
    made_at = {o: i for i, op in enumerate(prog.ops) for o in op.outputs}
    first, prelude = min(ops), set()
    for i in ops:  # everything else the segment reads exists when it runs (at its first op), or is
        for x in prog.ops[i].inputs:  # made ahead of it from what does (its prelude)
            if isinstance(x, str) and x not in inside and made_at.get(x, -1) > first \
                    and not _ahead(prog, made_at, made_at[x], first, set(ops), prelude):
                return None
    return Segment(tuple(ops), k, dict(dims), dict(positions), before, after, prelude=tuple(sorted(prelude)))


def _ahead(prog, made_at: dict, j: int, first: int, ops: set, prelude: set, depth: int = 4) -> bool:
    """Can op ``j`` (after ``first``, not in the segment) run ahead of the segment: does it read
    only what exists at ``first`` or what such ops make? Adds it (and those) to ``prelude``."""
    if j in prelude:
        return True
    if j in ops or depth == 0 or len(prog.ops[j].outputs) != 1:
        return False
    for x in prog.ops[j].inputs:
        if isinstance(x, str) and made_at.get(x, -1) >= first \
                and not _ahead(prog, made_at, made_at[x], first, ops, prelude, depth - 1):
            return False
    prelude.add(j)
    return True


def local_positions(s: Sharding, dim: int, want: np.ndarray, rank: int) -> np.ndarray:
    """Where the global positions ``want`` along ``dim`` sit in ``rank``'s piece of ``s``, in
    ``want``'s order (positions the rank does not hold are left out)."""
    held = np.asarray(s.indices(rank)[dim], dtype=np.int64)
    order = np.argsort(held, kind="stable")
    at = np.searchsorted(held[order], want)
    at = np.clip(at, 0, len(held) - 1)
    ok = held[order][at] == want if len(held) else np.zeros(len(want), dtype=bool)
    return order[at[ok]]


def chunk_sharding(s: Sharding, dim: int, n: int, k: int) -> Sharding:
    """The sharding of one stream chunk (``n`` positions) of a tensor sharded ``s``: the dim
    whole when ``s`` holds it whole, else its ``chunk_layout``."""
    shape = s.shape[:dim] + (n,) + s.shape[dim + 1:]
    if not any(f.axis is not None for f in s.dims[dim]):
        fs = []
    else:
        lay = chunk_layout(s.dims[dim], s.shape[dim], k)
        fs = list(lay[0] + lay[1])
    return Sharding(s.mesh, shape, list(s.dims[:dim]) + [fs] + list(s.dims[dim + 1:]), s.partial)


def run_segment(plan, seg: Segment, executor, fetch, opdefs: dict) -> tuple:
    """Run ``seg`` chunk by chunk with ``executor`` (module docstring).
    ``fetch(name, target, (op index, input position))`` gives the local value of an input the
    segment does not make, moved to ``target`` as the walk moves it (and through that reader's
    gradient reduction). Returns ``(made, moved)``: the local value of every tensor the segment's ops make,
    and of its chunked move's result ``{(tensor, target): value}`` — each equal to the whole run's."""
    prog = plan.program
    ranks = executor.ranks  # the ranks whose pieces this executor holds
    made = {o: [] for i in seg.ops for o in prog.ops[i].outputs}
    moved_parts: list = []
    inside = {o for i in seg.ops for o in prog.ops[i].outputs}

    def pick(value, s, name, j):
        d = seg.dims[name]
        return executor.chunk(value, d, {r: local_positions(s, d, seg.at(name, j, r), r) for r in ranks})

    cs = chunk_moves(plan, seg)  # every chunk moves alike (the chunks are equal cuts)

    def move(v):
        """A chunk's move, issued: a function that waits for it and gives its result. A move of
        one communicating collective is started without waiting where the executor can
        (``executor.start``: torch's ``async_op``); the pipeline waits for it one chunk later."""
        for c in cs[:-1]:
            v = executor.collective(c, v)
        if cs and hasattr(executor, "start"):
            return executor.start(cs[-1], v)
        for c in cs[-1:]:
            v = executor.collective(c, v)
        return lambda: v

    through = getattr(executor, "readers", None) or {}  # (op, input) -> its gradient reduction (training)
    unsummed, summed_whole = ring_backward(plan, seg, through)
    whole = {}
    for i in seg.ops:  # inputs from outside the segment, moved whole as the walk moves them
        for k, (name, tgt) in enumerate(zip(prog.ops[i].inputs, plan.ops[i].input_targets)):
            if isinstance(name, str) and name not in inside and (name, tgt) != seg.before:
                whole[(i, k)] = fetch(name, tgt, (i, k))
                if (i, k) in summed_whole:
                    whole[(i, k)] = executor.use(summed_whole[(i, k)], whole[(i, k)])
    summed: dict = {}  # (reduction, chunk) -> the chunk summed once for all its readers, as the walk does

    def read(i: int, k: int, value, j: int):
        key = through.get((i, k))
        if key is None:
            return value
        if (key, j) not in summed:
            summed[(key, j)] = executor.use(key, value)
        return summed[(key, j)]

    pending: dict = {}  # chunk -> its issued move (the pipeline: chunk j + 1 moves while chunk j computes)
    if seg.before is not None:
        x_name = seg.before[0]
        x_src = source_sharding(plan, seg)
        source = fetch(x_name, x_src)

        def issue(j):
            if seg.order is None:
                pending[j] = move(pick(source, x_src, x_name, j))
            elif j == 0:  # a ring: each rank's own shard first, no move
                own = pick(source, x_src, x_name, 0)
                pending[0] = lambda: own
            else:  # then each step passes on what came last
                pending[j] = move(moved_parts[-1])

        issue(0)
    for j in range(seg.k):
        local: dict = {}
        if seg.before is not None:
            local[seg.before] = pending.pop(j)()
            moved_parts.append(local[seg.before])
            if j + 1 < seg.k:
                issue(j + 1)
        for i in seg.ops:
            op, po = prog.ops[i], plan.ops[i]
            args = []
            for k, (name, tgt) in enumerate(zip(op.inputs, po.input_targets)):
                if not isinstance(name, str):
                    args.append(name)
                elif (name, tgt) in local and (i, k) in unsummed:  # a ring's: summed by its backward
                    args.append(local[(name, tgt)])
                elif (name, tgt) in local:
                    args.append(read(i, k, local[(name, tgt)], j))
                else:
                    full = whole[(i, k)]
                    args.append(pick(full, tgt, name, j) if name in seg.dims else full)
            outs = tuple(chunk_sharding(s, seg.dims[o], len(seg.positions[o][j]), seg.k)
                         for o, s in zip(op.outputs, po.outputs))
            params = {**po.params, **dict(po.local)} if po.local else po.params
            for o, v in zip(op.outputs, executor.op(opdefs[op.target], args, params, outs)):
                local[(o, plan.shardings[o])] = v
                made[o].append(v)
        if seg.after is not None:
            pending[j] = move(made[seg.after[0]][-1])  # waited for after the last chunk
    if seg.after is not None:
        moved_parts = [pending.pop(j)() for j in range(seg.k)]
    out = {}
    for i in seg.ops:
        for o, s in zip(prog.ops[i].outputs, plan.ops[i].outputs):
            out[o] = _join(executor, made[o], s, seg, o, ranks)
    key = seg.before or seg.after
    return out, {key: _join(executor, moved_parts, key[1], seg, key[0], ranks)}


def ring_sharding(src: Sharding, tgt: Sharding, moves, d: int) -> Sharding | None:
    """``src`` as a ring stream along dim ``d`` (``Sharding.stream_axis``: its chunks are the blocks
    of the one mesh-axis factor the move ``moves`` to ``tgt`` all-gathers, chunk ``j`` rank ``j``'s
    shard), or None when the move is not one all_gather of a mesh-axis factor of ``d`` or is no
    ring by nvFuser's rule: the gathered consumer runs on Stream the very split the producer runs
    on that axis (``domain.ring_of`` decides it on the two loop domains).
    ``ring_sharding(Sharding.parse("[tp*64]", m), Sharding.parse("[512]", m), moves, 0) -> [~tp*64]``"""
    from ..domain import loop_domain_of, ring_of
    from ..errors import DomainError, ShardingSpecError

    if len(moves) != 1 or moves[0].kind.value != "all_gather" or moves[0].dims != (d,) or len(moves[0].axes) != 1:
        return None
    piece = moves[0].axes[0]
    fs = src.dims[d]
    at = next((i for i, f in enumerate(fs) if (f.axis, f.size, f.pre) == (piece.axis, piece.size, piece.pre)), None)
    if at is None:
        return None
    try:  # the consumer: the gathered target, its dim cut on Stream where the producer's device split is
        gathered = tgt.with_stream(d, piece.size, math.prod(f.size for f in fs[:at]))
        if gathered.stream_axis is not None:
            return None
        return ring_of(loop_domain_of(src, "producer"), loop_domain_of(gathered, "consumer"), src.mesh)
    except (ShardingSpecError, DomainError):
        return None


def chunk_moves(plan, seg: Segment) -> tuple:
    """The collectives one chunk of ``seg``'s move runs (its whole move's, on a ``k``-th of the
    data): what a streamed run executes ``seg.k`` times instead of the planned move — for a ring,
    one of its ``k - 1`` steps (``sharding.move.ring_steps``)."""
    name, tgt = seg.before or seg.after
    src = source_sharding(plan, seg)
    if seg.order is not None:
        cs = tuple(c for c in plan.moves[(name, tgt)] if c.kind.communicates)
        ring = ring_sharding(src, tgt, cs, seg.dims[name])
        dtype = plan.program.tensors[name].dtype
        return plan_move(ring, tgt.with_stream(ring.stream[0], ring.stream[2], ring.stream[1]), dtype,
                         plan.cost_model)[:1]
    n = len(seg.positions[name][0])
    a, b = chunk_sharding(src, seg.dims[name], n, seg.k), chunk_sharding(tgt, seg.dims[name], n, seg.k)
    return plan_move(a, b, plan.program.tensors[name].dtype, plan.cost_model)


def chunked_reads(plan, seg: Segment) -> set:
    """The ``(op index, input position)`` readers of ``seg`` that read a chunk (the moved tensor,
    or a tensor the segment makes, in its final sharding) — as ``run_segment`` feeds them; the
    segment's other readers get the whole value, chunked after the walk moved it."""
    prog = plan.program
    inside = {(o, plan.shardings[o]) for i in seg.ops for o in prog.ops[i].outputs}
    if seg.before is not None:
        inside.add(seg.before)
    return {(i, k) for i in seg.ops
            for k, (name, tgt) in enumerate(zip(prog.ops[i].inputs, plan.ops[i].input_targets))
            if isinstance(name, str) and (name, tgt) in inside}


def ring_backward(plan, seg: Segment, readers: dict) -> tuple:
    """How training runs through a ring segment (``seg.order``): ``(unsummed, summed_whole)``.

    Chunk ``j`` of a ring is a different shard on every rank, so a chunk's gradient cannot be
    summed over the ring axis chunk by chunk. Instead the chunk readers' partial gradients stay
    partial (``unsummed``: ``(op index, input position)`` readers of ``readers``, the walk's
    gradient reductions, skipped): the ring's backward, each step's reverse send, adds every
    rank's partial gradient of a shard at its owner — a ring reduce-scatter. The ops between the
    ring's chunk and those readers then see partial gradients, so each replicated tensor they read
    whole gets its sum over the ring axis (``summed_whole``: reader -> reduction key, what
    ``executor.use`` takes). Empty for a segment that is not a ring or without ``readers``.
    Raises RunError where that is not exact: a reduction over other axes than the ring's, or such
    an op reading another tensor chunk by chunk."""
    from ..errors import RunError

    if seg.order is None or seg.before is None or not readers:
        return set(), {}
    prog = plan.program
    axes = chunk_moves(plan, seg)[0].axes
    inside = {o for i in seg.ops for o in prog.ops[i].outputs}
    unsummed = {r for r in chunked_reads(plan, seg) if r in readers}
    for r in sorted(unsummed):
        if {p.axis for p in readers[r][2]} != {p.axis for p in axes}:
            raise RunError(f"training through the ring stream of {seg.before[0]!r}: its reader "
                           f"{prog.ops[r[0]].name!r} sums its gradient over {readers[r][2]}, not the ring's {axes}; "
                           "plan without --ring")
    reaching = {prog.ops[i].inputs[k] for i, k in unsummed}  # tensors whose gradient stays partial
    summed_whole = {}
    for i in reversed(seg.ops):
        op = prog.ops[i]
        if not reaching & set(op.outputs):
            continue
        for k, (name, tgt) in enumerate(zip(op.inputs, plan.ops[i].input_targets)):
            if not isinstance(name, str) or (name, tgt) == seg.before:
                continue
            if name in inside:
                reaching.add(name)
            elif name in seg.dims:
                raise RunError(f"training through the ring stream of {seg.before[0]!r}: {op.name!r} reads "
                               f"{name!r} chunk by chunk, whose gradient the ring cannot sum; plan without --ring")
            elif {p.axis for p in axes} & (set(tgt.axes_used()) | {a for a, _ in tgt.partial}):
                raise RunError(f"training through the ring stream of {seg.before[0]!r}: {op.name!r} reads {name!r} "
                               f"at {tgt}, not replicated over the ring's axis; plan without --ring")
            else:
                summed_whole[(i, k)] = (name, tgt, tuple(axes))
    return unsummed, summed_whole


def _made_sharding(plan, name: str) -> Sharding:
    for op, po in zip(plan.program.ops, plan.ops):
        if name in op.outputs:
            return po.outputs[op.outputs.index(name)]
    return plan.shardings[name]


def _join(executor, parts: list, s: Sharding, seg: Segment, name: str, ranks: tuple):
    d = seg.dims[name]
    pos = [{r: local_positions(s, d, seg.at(name, j, r), r) for r in ranks} for j in range(seg.k)]
    return executor.join(parts, d, pos, {r: s.local_shape(r) for r in ranks})


__all__ = ["Segment", "carry_view", "chunk_moves", "chunk_positions_global", "chunk_sharding", "chunked_reads",
           "local_positions", "ring_backward", "ring_order", "ring_sharding", "run_segment", "segments",
           "source_sharding"]
