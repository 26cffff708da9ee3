"""Stream overlap: a collective feeding (or fed by) a matmul, cut into k chunks computed one
after another, so each chunk's collective runs while the matmul works on another.

A **stream** is a parallel type of its own (nvFuser's ``Stream``): a dim cut into ``k`` chunks
computed in turn on every rank — it adds no ranks and moves no data, it only orders the work.
It is a factor of the Sharding (``Sharding.stream``, text ``~k``); a choice puts it right after
the dim's mesh-axis factors: ``[1, tp*~8*64, 4096]`` is every rank's 512 rows in 8 chunks of 64,
chunk ``j`` of every rank moved together (``Sharding.with_stream``, ``chunk_layout``); a dim
without mesh-axis factors is cut outermost, ``[~4*1024, 4096] +sum(tp)``. A choice's dim and
chunk count are read off its sharding. ``run_streamed_move`` runs a move chunk by chunk on the
numpy simulator.

Where it pays: a matmul whose input is gathered along a dim the matmul passes through (Megatron
-SP's all_gather of the sequence before the column-parallel projections: collective matmul /
async TP), or whose partial output is reduced (or reduce-scattered) along such a dim (the
row-parallel projection's all_reduce / reduce_scatter). Cut along that dim, chunk ``i``'s
collective overlaps chunk ``i-1``'s matmul: a two-stage pipeline of ``k`` chunks takes

    T(k) = a + (k - 1) * max(a, m) + m        a = one chunk's collective, m = one chunk's matmul

(``a`` from the same cost model at ``bytes / k``: each chunk pays the latency again), against
``A + M`` serially (``k = 1``). For every such pair the smallest ``T(k)`` over
``k`` in ``CHUNKS`` dividing the dim is chosen (ties: fewer chunks) when it saves at least
``MIN_SAVING`` of the pair's time; each collective and each
matmul overlaps at most once (the largest saving first). ``stream_plan(plan)`` returns the
choices and both estimates; ``plan`` prints them beside each other.

    >>> from shardlayout import Mesh
    >>> from shardlayout.plan import plan
    >>> from shardlayout.program.models import llama, style_pins
    >>> prog, m = llama(layers=1, dim=4096, seq=4096, batch=1, heads=32), Mesh.parse("tp=8")
    >>> sp = stream_plan(plan(prog, m, style_pins(prog, m, "megatron-sp")))
    >>> sp.overlapped_seconds < sp.serial_seconds, all(c.chunks > 1 for c in sp.choices)
    (True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..execute.stream import _letters, _through, chunk_layout, chunk_sharding, ring_sharding
from ..ops.families import MATMULS
from ..sharding import Sharding
from ..sharding.core import format_dim
from .estimate import check_flop_rate, compute_seconds, op_flops

CHUNKS = (2, 4, 8, 16)
"""The stream chunk counts tried (1: no stream)."""

MIN_SAVING = 0.01
"""A stream is chosen only when it saves at least this share of its pair's serial time (chunking
has costs the model does not price: kernel launches, smaller matmuls)."""


@dataclass(frozen=True)
class StreamChoice:
    """One overlap: the matmuls ``ops`` and the collectives of ``tensor``'s move ``side`` them
    (``"before"``: they feed them; ``"after"``: they take the output), the tensor run in stream
    chunks as ``sharding`` says (its ``Sharding.stream``: gathered, or partial before its
    reduction, with the dim and the chunk count), with the serial and the pipelined seconds."""

    ops: tuple
    tensor: str
    side: str
    sharding: Sharding
    collective_seconds: float
    compute_seconds: float
    serial: float
    overlapped: float
    chunk_seconds: float = 0.0  # one chunk's collectives
    kinds: tuple = ()  # the collective kinds of the move, e.g. ("all_gather",)

    @property
    def dim(self) -> int:
        """The dim the stream cuts (``sharding.stream``)."""
        return self.sharding.stream[0]

    @property
    def chunks(self) -> int:
        """How many stream chunks (``sharding.stream``)."""
        return self.sharding.stream[2]

    @property
    def style(self) -> str:
        """``"ring"`` when the stream runs over the gathered mesh axis (``Sharding.stream_axis``:
        chunk ``j`` is rank ``j``'s shard, moved by ``k - 1`` neighbour steps), else ``"chunks"``
        (``k`` chunks of every rank's shard, each chunk's collective over every rank)."""
        return "ring" if self.sharding.stream_axis is not None else "chunks"

    @property
    def text(self) -> str:
        """The chunked tensor in our notation. ``StreamChoice(...).text -> '[~4*16, 64]'``"""
        return str(self.sharding)

    def to_json(self) -> dict:
        """JSON-able form."""
        return {"ops": list(self.ops), "kinds": list(self.kinds), "tensor": self.tensor, "side": self.side,
                "dim": self.dim, "chunks": self.chunks, "style": self.style,
                "sharding": self.text, "collective_seconds": self.collective_seconds,
                "compute_seconds": self.compute_seconds, "chunk_collective_seconds": self.chunk_seconds,
                "serial_seconds": self.serial,
                "overlapped_seconds": self.overlapped}


@dataclass(frozen=True)
class StreamPlan:
    """The overlaps chosen for a plan and the forward step estimates without and with them:
    ``serial_seconds`` = every collective + every op's compute; ``overlapped_seconds`` = that
    minus each choice's saving."""

    choices: tuple
    serial_seconds: float
    overlapped_seconds: float

    def to_json(self) -> dict:
        """JSON-able form."""
        return {"serial_seconds": self.serial_seconds, "overlapped_seconds": self.overlapped_seconds,
                "choices": [c.to_json() for c in self.choices]}


def stream_text(s: Sharding, dim: int, k: int) -> str:
    """``s`` with dim ``dim`` in ``k`` stream chunks, as text (``Sharding.with_stream``); a dim no
    stream can cut that way is shown whole inside ``~k*(...)``.
    ``stream_text(Sharding.parse("[tp*512, 32]", m), 0, 8) -> '[tp*~8*64, 32]'``"""
    from ..errors import ShardingSpecError

    try:
        return str(s.with_stream(dim, k))
    except ShardingSpecError:
        parts = [f"~{k}*({format_dim(s, d)})" if d == dim else format_dim(s, d) for d in range(s.ndim)]
        return "[" + ", ".join(parts) + "]" + "".join(f" +{op}({a})" for a, op in s.partial)


def run_streamed_move(src: Sharding, dst: Sharding, dim: int, k: int, pieces: dict) -> dict:
    """Move ``{rank: piece}`` from ``src`` to ``dst`` as ``k`` stream chunks along ``dim``, in
    order, each by ``plan_move`` between the chunks' shardings on the numpy simulator: what a
    streamed plan runs. The chunks follow the side that cuts ``dim`` on mesh axes (``with_stream``
    there; the other side holds the same chunks). Equal to the whole move on every rank
    (``tests/plan/test_stream.py``). ``run_streamed_move(src, dst, 0, 4, src.shard(x))``"""
    import numpy as np

    from ..errors import ShardingSpecError
    from ..execute.simulator import run_moves
    from ..execute.stream import chunk_positions_global, local_positions
    from ..sharding.move import plan_move

    if any(f.axis is not None for f in src.dims[dim]) and any(f.axis is not None for f in dst.dims[dim]):
        raise ValueError(f"dim {dim} is cut by mesh axes in both {src} and {dst}: stream chunks of one are not "
                         "chunks of the other; stream a move that gathers or scatters that dim")
    sharded = src if any(f.axis is not None for f in src.dims[dim]) else dst
    if chunk_layout(sharded.dims[dim], sharded.shape[dim], k) is None:
        raise ValueError(f"dim {dim} of {sharded} has no local factor after its mesh axes divisible by {k}")
    outer = sharded.with_stream(dim, k).stream[1]
    try:
        chunks = chunk_positions_global(src.with_stream(dim, k, outer))
    except ShardingSpecError as e:
        raise ValueError(f"{src} cannot run in the stream chunks of {sharded}: {e}") from None
    n = sharded.shape[dim] // k
    a, b = chunk_sharding(src, dim, n, k), chunk_sharding(dst, dim, n, k)
    ranks = list(src.mesh.ranks())
    out = {r: np.zeros(dst.local_shape(r), dtype=np.result_type(pieces[r], np.float64)) for r in ranks}
    for want in chunks:
        part = {r: np.take(pieces[r], local_positions(src, dim, want, r), axis=dim) for r in ranks}
        got = run_moves(plan_move(a, b), part)
        for r in ranks:
            idx = [slice(None)] * out[r].ndim
            idx[dim] = local_positions(dst, dim, want, r)
            out[r][tuple(idx)] = got[r]
    return out


def run_ring_move(src: Sharding, dst: Sharding, pieces: dict) -> dict:
    """Move ``{rank: piece}`` from ``src`` (a ring stream: ``Sharding.stream_axis``) to ``dst`` (the
    same stream, that dim gathered) as the ring runs it on the numpy simulator: each rank starts
    with its own shard (chunk ``j`` = rank ``j``'s), and each of ``plan_move``'s ``k - 1`` steps
    passes the chunk every rank got last to the next rank of its ring; every chunk a rank holds
    is put at its global positions. Equal to the whole all_gather on every rank
    (``tests/plan/test_stream.py``). ``run_ring_move(ring, gathered, ring.shard(x))``"""
    import numpy as np

    from ..errors import ShardingSpecError
    from ..execute.simulator import group_of, ring_previous, run_collective
    from ..execute.stream import chunk_positions_global, local_positions
    from ..sharding.move import plan_move

    steps = plan_move(src, dst)
    if src.stream_axis is None or not steps or any(c.kind.value != "permute" for c in steps):
        raise ShardingSpecError(f"run_ring_move: {src} -> {dst} is no ring all-gather; give a ring stream "
                                "(e.g. '[~tp*64]') and the same stream gathered ('[~8*64]')")
    dim, ranks = src.stream[0], list(src.mesh.ranks())
    chunks = chunk_positions_global(src)
    axes = steps[0].axes
    out = {r: np.zeros(dst.local_shape(r), dtype=np.result_type(pieces[r], np.float64)) for r in ranks}
    held, owner = dict(pieces), {r: r for r in ranks}
    for s in range(len(steps) + 1):
        if s:
            held = run_collective(steps[s - 1], held)
            owner = {r: owner[ring_previous(src.mesh, r, axes)] for r in ranks}
        for r in ranks:
            j = group_of(src.mesh, owner[r], axes).index(owner[r])  # the chunk of the shard r holds: its owner's
            idx = [slice(None)] * out[r].ndim
            idx[dim] = local_positions(dst, dim, chunks[j], r)
            out[r][tuple(idx)] = held[r]
    return out


def pipelined(a: float, m: float, k: int) -> float:
    """Seconds of a two-stage pipeline of ``k`` chunks, ``a`` then ``m`` each (or ``m`` then ``a``).
    ``pipelined(1.0, 1.0, 4) -> 5.0``"""
    return a + (k - 1) * max(a, m) + m


def ring_pipelined(a: float, m: float, n: int) -> float:
    """Seconds of a ring pipeline of ``n`` chunks (``n`` ranks): chunk 0 is this rank's own shard
    and computes at once; each of the ``n - 1`` steps (``a``: one shard to the neighbour) overlaps
    the previous chunk's matmul (``m``). ``ring_pipelined(1.0, 1.0, 4) -> 4.0``"""
    return m + (n - 1) * max(a, m)


def _ring_time(src: Sharding, tgt: Sharding, cs: list, d: int, comp: float, cm, dtype: str):
    """``(seconds, ring sharding, one step's seconds)`` of the ring pipeline of the gather ``cs``
    feeding matmuls of ``comp`` seconds (``ring_pipelined``, the steps priced as ``plan_move``
    plans them), or None when no ring streams it."""
    from ..sharding.move import plan_move

    ring = ring_sharding(src, tgt, cs, d)
    if ring is None:
        return None
    steps = plan_move(ring, tgt.with_stream(d, ring.stream[2], ring.stream[1]), dtype, cm)
    if not steps or any(c.kind.value != "permute" for c in steps):
        return None
    a = cm.seconds(steps[0])
    return ring_pipelined(a, comp / ring.stream[2], ring.stream[2]), ring, a


def _downstream(facts, ops_of, tensor: str, d: int, target, hops: int = 6):
    """``(op index, input position, dim)`` of the matmuls ``tensor``'s dim ``d`` reaches through
    views and pointwise ops (one hop per op): only the consumers that read it at ``target`` (the
    move's result), and after that ones that read each result as it is (no other move).
    ``facts``: what is read of the plan (:class:`PlanFacts`)."""
    prog = facts.program
    stack, seen = [(tensor, d, 0)], set()
    while stack:
        name, dim, n = stack.pop()
        want = target if n == 0 else AS_IS
        for i, pos, mm, out, got in _edges(prog, ops_of, name, dim):
            if not facts.reads(i, pos, want):
                continue
            if mm:
                yield i, pos, dim
                continue
            if n >= hops or out is None or (i, dim) in seen:
                continue
            seen.add((i, dim))
            if got is not None:
                stack.append((out, got, n + 1))


def _edges(prog, ops_of, name: str, dim: int) -> tuple:
    """The consumers of ``name`` as ``_downstream`` walks them, read off the program once per
    tensor and dim (the auto search asks per combination of strategies): ``(op index, input
    position, is a matmul, its one output or None, where dim ``dim`` lands in it or None)``; a
    pointwise op passes a chunk of any operand (HF's RMSNorm: ``weight * x``), another op of its
    first."""
    memo = prog.__dict__.setdefault("_stream_edges", {})
    key = (name, dim)
    got = memo.get(key)
    if got is None:
        from ..ops.families import pointwise_ops
        from ..ops.result import canonical_op_name

        out = []
        for i in ops_of.get(name, ()):
            op = prog.ops[i]
            pos = op.inputs.index(name)
            base = canonical_op_name(op.target)
            if base in MATMULS:
                out.append((i, pos, True, None, None))
                continue
            if len(op.outputs) != 1:
                out.append((i, pos, False, None, None))
                continue
            land = _through(op, dim, prog.tensors[name].shape, prog.tensors[op.outputs[0]].shape)
            ok = land is not None and (pos == 0 or base in pointwise_ops())
            out.append((i, pos, False, op.outputs[0], land if ok else None))
        got = memo[key] = tuple(out)
    return got


def _upstream(prog, producer, tensor: str, d: int, hops: int = 6):
    """``(op index, output position, dim)`` of the matmul whose output reaches ``tensor``'s dim
    ``d`` through views and pointwise ops (the program's structure alone), or None."""
    from ..ops.result import canonical_op_name

    for _ in range(hops + 1):
        i = producer.get(tensor)
        if i is None:
            return None
        op = prog.ops[i]
        if canonical_op_name(op.target) in MATMULS:
            return i, op.outputs.index(tensor), d
        src = next((x for x in op.inputs if isinstance(x, str)), None)
        if src is None or len(op.outputs) != 1:
            return None
        back = next((k for k in range(len(prog.tensors[src].shape))
                     if _through(op, k, prog.tensors[src].shape, prog.tensors[tensor].shape) == d), None)
        if back is None:
            return None
        tensor, d = src, back
    return None


def _candidates(plan, rate: float, ring: bool = True):
    """Every (saving, StreamChoice) the plan allows: one per communicating move at most
    (:func:`move_candidate`), in the order of ``plan.moves`` by tensor name."""
    from . import _producers_users

    producer, ops_of = _producers_users(plan.program)  # the planner's, once per program
    facts = PlanFacts(plan, rate)
    for (name, tgt), moves in _in_order(plan.moves):
        got = move_candidate(facts, producer, ops_of, name, _source(plan, producer, name, tgt), tgt, moves, ring)
        if got is not None:
            yield got


AS_IS = "as-is"
"""What :meth:`PlanFacts.reads` is asked for a tensor read where it is (no move of its own)."""


class PlanFacts:
    """What the stream search reads of a plan: whether op ``i`` reads its input ``pos`` at a
    sharding (or ``AS_IS``), a matmul's index letters and its compute (inference-rated seconds
    at ``rate``). The auto search answers the same questions for every combination of op
    strategies (``plan.overlap``), so both price streams with one function."""

    def __init__(self, plan, rate: float):
        self.plan, self.rate = plan, rate
        self.program, self.cost_model = plan.program, plan.cost_model

    def reads(self, i: int, pos: int, want) -> bool:
        """Does op ``i`` read input ``pos`` at ``want`` (``AS_IS``: at the tensor's own sharding)?"""
        po = self.plan.ops[i]
        got = po.input_targets[pos]
        return got == (self.plan.shardings[self.program.ops[i].inputs[pos]] if want is AS_IS else want)

    def letters(self, i: int):
        """``(input letters, output letters)`` of matmul ``i`` as planned, or None."""
        po = self.plan.ops[i]
        return _letters(self.program.ops[i].target, po.params, po.input_targets, po.outputs)

    def compute(self, i: int) -> float:
        """Forward (inference-rated) seconds of op ``i`` as planned."""
        po = self.plan.ops[i]
        return compute_seconds(op_flops(self.program.ops[i].target, po.params, po.input_targets, po.outputs),
                               "inference", self.rate)


def move_candidate(facts, producer: dict, ops_of: dict, name: str, src: Sharding, tgt: Sharding, moves,
                   ring: bool = False):
    """``(saving, StreamChoice)`` of the move of ``name`` from ``src`` to ``tgt`` (``moves``: its
    collectives) and the matmuls it feeds (through views and pointwise ops: their compute adds
    up, one pipeline) or the matmul whose output it reduces, cut along the dim the move gathers
    or scatters (an all_reduce: the outermost dim that works) when the matmuls pass that dim
    through; None when no stream saves ``MIN_SAVING``. With ``ring``, a gather of one mesh-axis
    factor is also priced as a ring (``_ring_time``), chosen when strictly faster than every
    chunk count. ``facts`` answers what depends on the ops' strategies (:class:`PlanFacts`)."""
    prog, cm = facts.program, facts.cost_model
    cs = [c for c in moves if c.kind.communicates]
    if not cs:
        return None
    dims = {d for c in cs for d in c.dims}
    reduces = all(c.kind.value == "all_reduce" for c in cs)
    if reduces:
        dims = [d for d in range(src.ndim) if src.shape[d] > 1]
    elif len(dims) != 1:
        return None  # one dim to cut along
    gathers = all(c.kind.value in ("all_gather", "all_to_all") for c in cs)
    whole = sum(cm.seconds(c) for c in cs)
    for d in sorted(dims):
        if any(f.axis is not None for f in src.dims[d]) and any(f.axis is not None for f in tgt.dims[d]):
            continue  # both sides cut along d: a stream chunk of one is not a chunk of the other
        if gathers:  # the gathered input of matmuls: collective matmul
            sites = sorted({i for i, pos, dd in _downstream(facts, ops_of, name, d, tgt)
                            if _passes(facts, i, pos, dd, True)})
            side = "before"
        else:  # a reduction of a matmul's partial output
            up = _upstream(prog, producer, name, d)
            sites = [up[0]] if up is not None and _passes(facts, up[0], up[1], up[2], False) else []
            side = "after"
        # shown (and chunked after) the side whose dim d is sharded
        shown = tgt if any(f.axis is not None for f in tgt.dims[d]) and not any(
            f.axis is not None for f in src.dims[d]) else src
        comp = math.fsum(facts.compute(i) for i in sites)
        if not sites or comp <= 0:
            continue
        best = None
        for k in CHUNKS:
            if chunk_layout(shown.dims[d], shown.shape[d], k) is None:
                continue
            a = sum(cm.seconds(c.with_bytes(math.ceil(c.bytes / k))) for c in cs)
            t = pipelined(a, comp / k, k)
            if best is None or t < best[0] - 1e-15:
                best = (t, k, a)
        streamed = shown.with_stream(d, best[1]) if best is not None else None
        rt = _ring_time(src, tgt, cs, d, comp, cm, prog.tensors[name].dtype) if ring and gathers else None
        if rt is not None and (best is None or rt[0] < best[0] - 1e-15):
            best, streamed = (rt[0], rt[1].stream[2], rt[2]), rt[1]
        if best is None or best[0] > (whole + comp) * (1 - MIN_SAVING):
            continue
        names = tuple(prog.ops[i].name for i in sites)
        return (whole + comp - best[0], StreamChoice(names, name, side, streamed, whole, comp, whole + comp,
                                                     best[0], best[2], tuple(sorted({c.kind.value for c in cs}))))
    return None


def _in_order(moves: dict) -> list:
    """The moves by tensor name, one tensor's targets by their text (a text only where a tensor
    moves to more than one target). ``_in_order({}) -> []``"""
    items = sorted(moves.items(), key=lambda kv: kv[0][0])
    out, k = [], 0
    while k < len(items):
        j = k + 1
        while j < len(items) and items[j][0][0] == items[k][0][0]:
            j += 1
        out.extend(items[k:j] if j == k + 1 else sorted(items[k:j], key=lambda kv: str(kv[0][1])))
        k = j
    return out


def _source(plan, producer: dict, name: str, target) -> Sharding:
    """Where the move of ``name`` to ``target`` starts: the tensor's sharding, or — for the move
    of an op's output to its pinned sharding — what the op made."""
    if target == plan.shardings[name] and name in producer:
        i = producer[name]
        return plan.ops[i].outputs[plan.program.ops[i].outputs.index(name)]
    return plan.shardings[name]


def _passes(facts, i: int, pos: int, d: int, is_input: bool) -> bool:
    """Does matmul ``i`` pass dim ``d`` of its input (or output) ``pos`` through (not contracted)?"""
    got = facts.letters(i)
    if got is None:
        return False
    ins, outs = got
    if is_input:
        return ins[pos] is not None and d < len(ins[pos]) and ins[pos][d] in outs[0]
    return d < len(outs[pos]) and any(x is not None and outs[pos][d] in x for x in ins)


def stream_plan(plan, flop_rate: float | None = None, ring: bool | None = None) -> StreamPlan:
    """The stream overlaps of ``plan`` (module docstring) and its forward step time without and
    with them; ``ring`` (default: the plan's ``ring``, False unless set) adds ring-style streams.
    ``stream_plan(p).overlapped_seconds <= stream_plan(p).serial_seconds``"""
    rate = check_flop_rate(flop_rate if flop_rate is not None else getattr(plan, "flop_rate", None))
    prog, cm = plan.program, plan.cost_model
    comm = math.fsum(cm.seconds(c) for moves in plan.moves.values() for c in moves if c.kind.communicates)
    comp = math.fsum(compute_seconds(op_flops(op.target, po.params, po.input_targets, po.outputs), "inference", rate)
                     for op, po in zip(prog.ops, plan.ops))
    chosen = _chosen(plan, rate, _ring(plan, ring))
    serial = comm + comp
    return StreamPlan(tuple(c for _, c in chosen), serial, serial - math.fsum(s for s, _ in chosen))


def _ring(plan, ring: bool | None) -> bool:
    """Whether ring-style streams are candidates: ``ring`` when given, else the plan's setting."""
    return bool(getattr(plan, "ring", False)) if ring is None else bool(ring)


def stream_choices(plan, flop_rate: float | None = None, ring: bool | None = None) -> tuple:
    """``stream_plan(plan, flop_rate, ring).choices`` without the step-time totals (what executors
    and the verifier need). ``stream_choices(p) == stream_plan(p).choices``"""
    rate = check_flop_rate(flop_rate if flop_rate is not None else getattr(plan, "flop_rate", None))
    return tuple(c for _, c in _chosen(plan, rate, _ring(plan, ring)))


def _chosen(plan, rate: float, ring: bool = True) -> list:
    """``[(saving, StreamChoice)]`` in program order: the largest savings first, each op and each
    move's side in one overlap at most. Made once per plan, rate and cost model (kept on the plan:
    ``plan``, ``verify`` and ``run`` all read them)."""
    made = plan.__dict__.setdefault("_stream_chosen", {})
    key = (rate, plan.cost_model, ring)
    if key not in made:
        made[key] = _choose(plan, rate, ring)
    return list(made[key])


def _choose(plan, rate: float, ring: bool = True) -> list:
    chosen, used = [], set()
    for saving, c in sorted(_candidates(plan, rate, ring), key=lambda x: (-x[0], x[1].ops, x[1].tensor, x[1].dim)):
        if used & set(c.ops) or (c.tensor, c.side) in used:
            continue
        used |= set(c.ops) | {(c.tensor, c.side)}
        chosen.append((saving, c))
    order = {op.name: i for i, op in enumerate(plan.program.ops)} if len(chosen) > 1 else {}
    chosen.sort(key=lambda x: (order.get(x[1].ops[0], 0), x[1].tensor))
    return chosen


__all__ = ["CHUNKS", "MIN_SAVING", "StreamChoice", "StreamPlan", "chunk_layout", "pipelined", "ring_pipelined",
           "ring_sharding", "run_ring_move", "run_streamed_move", "stream_choices", "stream_plan", "stream_text"]
