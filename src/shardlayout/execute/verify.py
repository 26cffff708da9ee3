"""Verify a plan at any scale: an index-level proof for every rank, and a numeric oracle on one
representative pair per rank class — cost independent of the number of ranks.

``verify_plan(plan)`` walks the program once, in order, and for each op checks

1. its **wiring** (``proof.check_wiring``): inputs reach their targets, outputs their final
   shardings, by connected chains of planned collectives — exactly what ``walk`` executes;
2. each **distinct collective** on those chains (``proof.check_collective``), then runs it
   numerically for the representatives of its rank classes, each with its whole group;
3. each **distinct op call** — (op, params, input targets, output shardings, dtypes); the 32
   layers of a Llama share ~26 — against its index map (``proof.check_op``), then runs it
   numerically for the representatives of its rank classes (``classes.rank_classes``), each
   with the ranks it reduces partial outputs with.

Composition makes this a verification of the whole program: if every op maps correct local
pieces of its inputs to correct local pieces of its outputs, for every value, and every move
maps a correct piece to a correct piece, then by induction over the program every tensor is
its planned shard on every rank. The index-level checks prove exactly those statements for
every rank (given the op's index map); the numeric runs are the second oracle that the index
map and the numpy implementation agree (e.g. a wrong rule or a wrong kernel).

**Bounded memory.** Numeric values are never stored globally: every element is a hash of
``(seed, operand, global flat offset, partial slot)``, so a rank's piece is generated from its
global indices. The reference is the op on global inputs while they fit in ``budget``
elements; beyond that, an op with a letter map is checked on a sampled box — a few indices of
each pass-through letter (elementwise rows, matmul rows and columns), whole reduced and whole
letters — both locally and in the reference (the map says that box is closed under the op);
a view is checked from the flat offsets it keeps. An op that allows neither keeps only its
index-level proof, and the record says so in ``notes``.

**Shared work.** What two runs would compute alike is computed once, and only that: a
representative whose check reads the same coordinates as one already checked (``_rep_key``: its
group's first rank on the axes the pieces read, its own on the axes its target reads) would make
the same local runs on the same global indices and compare the same entries; within a check,
ranks whose pieces hold the same index arrays and partial slot share one local run
(``_run_key``; an empty piece is its shape), a rank holding every operand whole with the op's own
params makes the reference call itself, and the summands of a partial group holding the same
indices are drawn in one pass. A move that only places elements is not run for an empty target
piece (it has nothing to place and cannot fail).

**Full mode.** ``verify_full(plan)`` is the old oracle: every rank simulated in numpy
(``walk`` with ``NumpySimulator``), every tensor compared with the unsharded run.

    >>> from shardlayout import Mesh
    >>> from shardlayout.plan import plan
    >>> from shardlayout.program.models import llama, style_pins
    >>> prog, m = llama(layers=2), Mesh.parse("dp=256,tp=32")
    >>> v = verify_plan(plan(prog, m, style_pins(prog, m, "megatron-sp")))
    >>> v.ok, v.proven, v.checked, v.mode
    (True, True, 100, 'classes')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..caches import memo
from ..errors import ShardingError, ShardMismatch, SimulationUnsupported
from ..mesh import Mesh
from ..ops.registry import get_op
from ..ops.result import at_rank, coord_axes
from ..sharding import Sharding
from .classes import axis_group, group_ranks, rank_classes, representatives
from .indexmap import IndexMap, index_map
from .proof import Check, check_collective, check_op, check_wiring
from .simulator import collective_piece, grid

MODES = ("classes", "full")
DEFAULT_BUDGET = 1 << 22  # elements of one generated array (32 MiB in float64)
ALL_RANKS_UP_TO = 64  # an op without an index map is run on every rank of a mesh this small
MAX_GROUP = 4096  # a numeric run needing more ranks at once is skipped (the proof stands)


@dataclass(frozen=True)
class Verification:
    """What ``Plan.verify`` found. ``ok``; ``checked`` (tensors verified, in program order);
    ``first_mismatch`` (the first tensor that fails, its op, and why) and ``max_error``;
    ``mode`` ("classes" or "full"); ``proven`` (every op and collective passed the index-level
    proof for every rank); ``unproven`` (ops checked numerically only); ``ops``,
    ``collectives`` (distinct calls checked), ``classes`` (rank classes over all of them),
    ``simulated`` (local runs of the numeric oracle) and ``notes``."""

    ok: bool
    checked: int
    first_mismatch: str | None = None
    max_error: float = 0.0
    mode: str = "full"
    proven: bool = False
    unproven: tuple = ()
    ops: int = 0
    collectives: int = 0
    classes: int = 0
    simulated: int = 0
    notes: tuple = field(default=())


class VerifyError(ShardingError):
    """A verification that cannot be run as asked (an unknown mode, a bad budget)."""


# ------------------------------------------------------------------------------------------
# values: a hash of (seed, operand, global offset, partial slot)
# ------------------------------------------------------------------------------------------

_MASK = (1 << 64) - 1
_M1, _M2, _G = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def hashed(seed: int, offsets, slot=0) -> np.ndarray:
    """Floats in [-1, 1), one per global offset, a pure function of ``(seed, offset, slot)``
    (splitmix64); ``slot`` a sequence: one row per slot, drawn in one pass (row ``i`` is
    ``hashed(seed, offsets, slot[i])``). ``hashed(0, np.arange(3)).shape -> (3,)``"""
    x = np.asarray(offsets, dtype=np.uint64).reshape(-1) * _G
    if isinstance(slot, (int, np.integer)):
        x = x + np.uint64(_lane(seed, slot))
    else:
        x = x[None, :] + np.array([_lane(seed, s) for s in slot], dtype=np.uint64).reshape(-1, 1)
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return (x >> np.uint64(11)).astype(np.float64) * (2.0 ** -52) - 1.0


def _lane(seed: int, slot: int) -> int:
    """What ``hashed`` adds to every scaled offset for ``(seed, slot)``."""
    return (seed * 0x632BE59BD9B4E019 + (int(slot) + 1) * 0xD1B54A32D192ED03) & _MASK


@dataclass(frozen=True)
class Operand:
    """How the oracle draws one operand: its sharding, a seed, and a value kind (None: floats
    in [-1, 1); ``"positive"``; ``"mask"``: 0/1; ``("index", n)``: integers in [0, n))."""

    sharding: Sharding
    seed: int
    kind: object = None


def _transform(kind, v: np.ndarray) -> np.ndarray:
    if kind == "positive":
        return np.abs(v) + 0.5
    if kind == "mask":
        return (v > 0).astype(np.float64)
    if isinstance(kind, tuple) and kind[0] == "index":
        return np.floor((v + 1.0) * 0.5 * max(kind[1], 1))
    return v


def _partial_axes(s: Sharding) -> tuple:
    return tuple(a for a, _ in s.partial)


def _slot(mesh: Mesh, axes: tuple, coord: tuple) -> int:
    slot = 0
    for a in axes:
        slot = slot * mesh.axis_size(a) + coord[mesh.axis_index(a)]
    return slot


def _offsets(shape: tuple, lists) -> np.ndarray:
    if not shape:
        return np.zeros(1, dtype=np.int64)
    return np.ravel_multi_index(grid(lists), shape).reshape(-1)


def summand(op: Operand, lists, rank: int) -> np.ndarray:
    """``op``'s values at the index lists ``lists`` (one per dim) as ``rank`` holds them: for a
    partial operand, the summand of ``rank``'s slot. ``summand(op, s.indices(3), 3)`` is rank 3's piece."""
    return at_offsets(op, _offsets(op.sharding.shape, lists), rank).reshape(tuple(len(x) for x in lists))


def at_offsets(op: Operand, offsets, rank: int) -> np.ndarray:
    """``op``'s values at global flat ``offsets`` as ``rank`` holds them (flat).
    ``at_offsets(op, np.arange(4), 0).shape -> (4,)``"""
    s = op.sharding
    kind = op.kind if not s.partial else (op.kind if op.kind == "positive" else None)
    slot = _slot(s.mesh, _partial_axes(s), s.mesh.coord(rank)) if s.partial else 0
    return _transform(kind, hashed(op.seed, offsets, slot))


def summands(op: Operand, lists, ranks) -> np.ndarray:
    """``summand(op, lists, q)`` for every ``q`` of ``ranks``, stacked (one draw for all of them).
    ``summands(op, s.indices(0), (0, 1))[1]`` equals ``summand(op, s.indices(0), 1)``"""
    s = op.sharding
    kind = op.kind if not s.partial else (op.kind if op.kind == "positive" else None)
    slots = [_slot(s.mesh, _partial_axes(s), s.mesh.coord(q)) if s.partial else 0 for q in ranks]
    shape = (len(slots),) + tuple(len(x) for x in lists)
    return _transform(kind, hashed(op.seed, _offsets(s.shape, lists), slots)).reshape(shape)


_REDUCE = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min}


def global_value(op: Operand, lists, keep: dict | None = None) -> np.ndarray:
    """``op``'s global values at ``lists`` (partial slots reduced, axis by axis in mesh order);
    ``keep`` ({axis: coordinate}) fixes some partial axes instead of reducing them.
    ``global_value(op, [np.arange(n) for n in op.sharding.shape])`` is the whole tensor."""
    s = op.sharding
    mesh = s.mesh
    keep = keep or {}
    shape = tuple(len(x) for x in lists)
    if not s.partial:
        return _transform(op.kind, hashed(op.seed, _offsets(s.shape, lists))).reshape(shape)
    kind = op.kind if op.kind == "positive" else None
    axes = _partial_axes(s)
    free = [a for a in axes if a not in keep]
    sizes = tuple(mesh.axis_size(a) for a in free)
    slots = []
    for digits in np.ndindex(*sizes):
        at = dict(zip(free, digits), **keep)
        slot = 0
        for a in axes:
            slot = slot * mesh.axis_size(a) + at[a]
        slots.append(slot)
    grid = _transform(kind, hashed(op.seed, _offsets(s.shape, lists), slots)).reshape(sizes + shape)
    ops = dict(s.partial)
    for a in free:
        grid = _REDUCE[ops[a]](grid, axis=0)
    return grid


def _generated(s: Sharding) -> int:
    """Elements drawn to build ``s``'s global values: its size times its partial slots."""
    n = math.prod(s.shape)
    for a in _partial_axes(s):
        n *= s.mesh.axis_size(a)
    return n


def _full(shape) -> list:
    return [np.arange(n) for n in shape]


def _reduce_members(outs: dict, members: tuple, mesh: Mesh, partial: tuple):
    """Reduce ``{rank: array}`` over ``members`` (the ranks varying ``partial`` axes), axis by
    axis in mesh order."""
    axes = [a for a, _ in partial]
    first = outs[members[0]]
    if not axes:
        return first
    grid = np.zeros(tuple(mesh.axis_size(a) for a in axes) + np.shape(first))
    for q in members:
        c = mesh.coord(q)
        grid[tuple(c[mesh.axis_index(a)] for a in axes)] = outs[q]
    for _, op in partial:
        grid = _REDUCE[op](grid, axis=0)
    return grid


# ------------------------------------------------------------------------------------------
# numeric oracle of one op call and one collective
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """The numeric outcome of one op call or collective: ``status`` ("ok", "failed", "skipped"),
    ``message``, ``max_error``, ``classes``, ``simulated`` (local runs)."""

    status: str
    message: str = ""
    max_error: float = 0.0
    classes: int = 0
    simulated: int = 0


def _operands(inputs: tuple, dtypes: tuple, imap: IndexMap | None, seed: int) -> list:
    out = []
    for i, x in enumerate(inputs):
        if not isinstance(x, Sharding):
            out.append(None)
            continue
        kind = imap.values[i] if imap is not None and i < len(imap.values) else None
        if kind is None and i < len(dtypes) and dtypes[i] == "bool":
            kind = "mask"
        out.append(Operand(x, seed * 1_000_003 + i, kind))
    return out


def _close(got, want, rtol, atol) -> tuple:
    kind = complex if np.iscomplexobj(got) or np.iscomplexobj(want) else float  # complex RoPE: both parts
    got, want = np.asarray(got, dtype=kind), np.asarray(want, dtype=kind)
    if got.shape != want.shape:
        return False, float("inf")
    if (got == want).all():
        return True, 0.0  # equal everywhere (infinities included): the test below passes too
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(got - want)  # np.isclose's test where every difference is finite; else np.allclose below
        if (d <= atol + rtol * np.abs(want)).all() and np.isfinite(d).all():
            return True, 0.0
    if not np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
        diff = np.abs(got - want)
        return False, float(np.nanmax(diff)) if diff.size and not np.all(np.isnan(diff)) else float("nan")
    return True, 0.0


def _ranks_to_run(mesh: Mesh, shardings: tuple, everything: bool) -> tuple:
    classes = rank_classes(mesh, shardings)
    if everything:
        return classes, tuple(mesh.ranks())
    return classes, representatives(classes)


def _letter_boxes(imap: IndexMap, inputs: tuple, outputs: tuple, rank: int, sample: int, budget: int):
    """``{letter: positions}`` sampling the pass-through letters of ``rank``'s local pieces (the
    same positions in every operand carrying them): ``sample`` evenly spread positions each,
    fewer until every operand's box in the global reference (sampled letters at those indices,
    the others whole) fits in ``budget // 16`` elements; None when the map cannot restrict."""
    if imap is None or imap.kind != "letters":
        return None
    out_letters = set("".join(imap.outputs))
    local: dict = {}
    operands = [(x, lt) for x, lt in list(zip(outputs, imap.outputs)) + list(zip(inputs, imap.inputs))
                if lt is not None and isinstance(x, Sharding)]
    for x, lt in operands:
        shape = x.local_shape(rank)
        for d, L in enumerate(lt):
            if L not in local and L in out_letters and L not in imap.whole and x.shape[d] > 1:
                local[L] = shape[d]
    count = {L: min(n, sample) for L, n in local.items()}

    def biggest():
        return max((int(np.prod([count[L] if L in count else x.shape[d] for d, L in enumerate(lt)] or [1]))
                    for x, lt in operands), default=0)

    while biggest() > max(budget // 16, 1):
        L = max(count, key=lambda k: count[k], default=None)
        if L is None or count[L] <= 1:
            return None
        count[L] = max(1, count[L] // 2)
    return {L: np.unique(np.linspace(0, n - 1, count[L]).astype(np.int64)) if n else np.zeros(0, dtype=np.int64)
            for L, n in local.items()}


def _restrict(lists, letters, box) -> list:
    return [lst[box[L]] if L in box and len(lst) > 1 else lst for lst, L in zip(lists, letters)]


def run_op(opdef, params: dict, inputs: tuple, outputs: tuple, dtypes: tuple, imap: IndexMap | None,
           seed: int = 0, rtol: float = 1e-6, atol: float = 1e-6, budget: int = DEFAULT_BUDGET,
           sample: int = 8, local_params: tuple = ()) -> Run:
    """Run one op call numerically for the representatives of its rank classes (every rank of a
    small mesh when the op has no index map) and compare with the op on the global values.
    ``local_params``: the rule's params of the local run (``Propagation.local``), resolved per rank.
    ``run_op(get_op("mm"), {}, (a, b), (c,), ("float32",) * 2, index_map("mm", (a, b), {})).status``"""
    if opdef.numpy is None:
        return Run("skipped", f"op {opdef.name} cannot be simulated: {opdef.not_simulated or 'no numpy'}")
    tensors = [x for x in inputs if isinstance(x, Sharding)] + list(outputs)
    if not tensors:
        return Run("ok")
    mesh = tensors[0].mesh
    classes, reps = _ranks_to_run(mesh, tuple(tensors), imap is None and mesh.size <= ALL_RANKS_UP_TO)
    ops = _operands(inputs, dtypes, imap, seed)
    partial = tuple(a for a in mesh.names if any(a in dict(o.partial) for o in outputs))
    members_of = {r: axis_group(mesh, r, partial) for r in reps}
    if max((len(m) for m in members_of.values()), default=1) > MAX_GROUP:
        return Run("skipped", f"a partial output spans more than {MAX_GROUP} ranks", classes=len(classes))
    small = max(_generated(x) for x in tensors) <= budget
    if not small and (imap is None or imap.kind != "letters"):
        if imap is not None and imap.kind == "reshape":
            return _run_reshape(inputs, outputs, ops, reps, rtol, atol, budget, len(classes))
        return Run("skipped", f"op {opdef.name}: global operands exceed the budget of {budget} elements and "
                              "its index map cannot restrict them", classes=len(classes))
    ref = None
    whole: dict = {}  # operand position -> its global values, when drawn (a local piece is cut from them)
    if small:
        args = [global_value(o, _full(o.sharding.shape)) if o is not None else x for o, x in zip(ops, inputs)]
        whole = {i: a for i, (o, a) in enumerate(zip(ops, args)) if o is not None and not o.sharding.partial}
        ref = opdef.run_numpy(args, params, [o.shape for o in outputs])
        for k, (r_, o) in enumerate(zip(ref, outputs)):
            if tuple(np.shape(r_)) != o.shape:
                return Run("failed", f"the op's numpy implementation gives output {k} the shape {np.shape(r_)}, the "
                                     f"program says {o.shape}", classes=len(classes))
    worst, runs = 0.0, 0
    local: dict = {}  # what a local run reads (_run_key) -> its outputs: equal readings run once
    full = frozenset(i for i, (o, x) in enumerate(zip(ops, inputs))
                     if o is not None and not x.partial and not _sharded_axes(x))  # whole on every rank
    whole_out = {k for k, o in enumerate(outputs) if not o.partial and not _sharded_axes(o)}
    if small and not local_params and len(full) == sum(o is not None for o in ops):
        local[_whole_key(ops, outputs)] = ref  # a rank holding every operand whole makes the reference call
    reads = _axes_read(mesh, tensors, coord_axes(dict(local_params)) if local_params else ())
    own = _axes_read(mesh, list(outputs) + ([] if small else tensors), set(partial) - set.intersection(
        *(set(_partial_axes(o)) for o in outputs)) if outputs else (), partial=False)
    compared: set = set()  # _rep_key: what a representative's check reads; equal readings, equal verdicts
    hold: list = []  # the index arrays keyed by identity, kept alive while keys are compared
    for r in reps:
        seen = _rep_key(mesh, members_of[r][0], r, reads, own)
        if seen in compared:
            continue  # the same local runs, reduced the same way, against the same reference entries
        compared.add(seen)
        box = None if small else _letter_boxes(imap, inputs, outputs, r, sample, budget)
        if box is None and not small:
            return Run("skipped", "no sampled box of the op fits the budget", classes=len(classes), simulated=runs)
        tag = _box_key(box)
        outs_of, todo = {}, {}
        for q in members_of[r]:
            here = at_rank({**params, **dict(local_params)}, mesh, q) if local_params else params
            key = _run_key(ops, inputs, outputs, q, here.get("local") if local_params else None, tag, full, hold)
            outs_of[q] = key
            if key not in local and key not in todo:
                todo[key] = (q, here)
        drawn = _drawn(ops, inputs, imap, [q for q, _ in todo.values()], box, whole, budget)
        for key, (q, here) in todo.items():
            outs = _local_run(opdef, here, ops, inputs, outputs, imap, q, box, whole, drawn)
            if isinstance(outs, str):
                return Run("failed", outs, classes=len(classes), simulated=runs)
            local[key] = outs
            runs += 1
        outs_of = {q: local[key] for q, key in outs_of.items()}
        for k, o in enumerate(outputs):
            if outs_of[r] is ref and k in whole_out:
                continue  # the reference call's output, compared with all of itself: equal
            group = axis_group(mesh, r, _partial_axes(o))
            got = _reduce_members({q: outs_of[q][k] for q in group}, group, mesh, o.partial)
            lists = list(o.indices(r))
            if small:
                want = ref[k][grid(lists)] if lists else ref[k]
            else:
                want = _boxed_reference(opdef, params, ops, inputs, outputs, imap,
                                        _restrict(lists, imap.outputs[k], box), k, box, budget)
                if want is None:
                    return Run("skipped", "the sampled reference exceeds the budget", classes=len(classes),
                               simulated=runs)
            ok, err = _close(got, want, rtol, atol)
            worst = max(worst, err)
            if not ok:
                return Run("failed", f"rank {r}: output {k} differs from the op on the global values "
                                     f"(max error {err:.3g}; sharding {o})", err, len(classes), runs)
    return Run("ok", "", worst, len(classes), runs)


def _axes_read(mesh: Mesh, shardings, extra=(), partial: bool = True) -> tuple:
    """The mesh axes (mesh order) the pieces of ``shardings`` depend on: those their dims read and,
    with ``partial``, their partial axes (a summand's slot); plus ``extra``.
    ``_axes_read(m, (Sharding.parse("[dp*4, 12] +sum(tp)", m),)) -> ('dp', 'tp')``"""
    used = set(extra)
    for s in shardings:
        used |= _sharded_axes(s)
        if partial:
            used.update(_partial_axes(s))
    return tuple(a for a in mesh.names if a in used)


@memo(1 << 14)
def _sharded_axes(s: Sharding) -> frozenset:
    """The mesh axes the dims of ``s`` read (its pieces differ along them, nowhere else).
    ``_sharded_axes(Sharding.parse("[dp*4, 12] +sum(tp)", m)) -> frozenset({'dp'})``"""
    return frozenset(f.axis for fs in s.dims for f in fs if f.axis is not None)


def _rep_key(mesh: Mesh, base: int, rank: int, reads: tuple, own: tuple) -> tuple:
    """What a representative's numeric check depends on, as coordinates: its group's (``base``,
    the group's first rank; the members vary only the group's digits from it) on the axes the
    pieces read, and its own on the axes its target pieces read. Two representatives with equal
    keys run the same local programs on the same global indices and compare the same entries: the
    second run would repeat the first, value for value. ``_rep_key(m, 0, 0, ("tp",), ()) -> ((0,), ())``"""
    b, c = mesh.coord(base), mesh.coord(rank)
    return tuple(b[mesh.axis_index(a)] for a in reads), tuple(c[mesh.axis_index(a)] for a in own)


def _same(arrays, hold: list) -> tuple:
    """A key of index arrays by identity: the shard memo (``sharding.shards.local_indices``) hands
    ranks with the same digits the same read-only array (and every empty piece one empty array),
    so equal keys mean equal contents; unequal keys may still be equal contents, then the work is
    only done twice. ``hold`` keeps the arrays alive while keys are compared (an id is reused only
    once its object is freed). ``_same((a, b), []) == _same((a, b), [])``"""
    hold.append(arrays)
    return tuple(map(id, arrays))


def _box_key(box) -> tuple | None:
    """A sampled box (``_letter_boxes``) as a hashable value; None for no box."""
    return None if box is None else tuple((L, x.tobytes()) for L, x in sorted(box.items()))


def _slot_of(s: Sharding, q: int):
    """The partial slot ``q``'s summand of ``s`` is drawn from; None when ``s`` is not partial."""
    return _slot(s.mesh, _partial_axes(s), s.mesh.coord(q)) if s.partial else None


def _run_key(ops, inputs, outputs, q: int, local, box_tag, full: frozenset, hold: list) -> tuple:
    """Everything rank ``q``'s local run reads (``_local_run``), as a key: per operand what its
    piece holds (``_piece_key``; ``"whole"`` for the positions in ``full``, held whole by every
    rank), per output its piece's shape, the rank's resolved ``local`` param and the sampled box.
    Two ranks with equal keys run the same op on the same arrays: one run stands for both.
    ``local`` unhashable: keyed by the rank."""
    try:
        hash(local)
    except TypeError:
        local = ("rank", q)
    return (tuple(None if o is None else "whole" if i in full else _piece_key(x, q, hold)
                  for i, (o, x) in enumerate(zip(ops, inputs))),
            tuple(tuple(map(len, o.indices(q))) for o in outputs), local, box_tag)


def _whole_key(ops, outputs) -> tuple:
    """The ``_run_key`` of a rank holding every operand and output whole, with the op's own params:
    its local run is the reference call (the op on the global values) itself."""
    return tuple(None if o is None else "whole" for o in ops), tuple(o.shape for o in outputs), None, None


def _piece_key(x: Sharding, q: int, hold: list) -> tuple:
    """What rank ``q``'s piece of operand ``x`` holds, as a key: its index arrays (``_same``) and
    partial slot, or, when a dim is empty, its shape alone (an empty array has no values)."""
    held = x.indices(q)
    if any(len(h) == 0 for h in held):
        return "empty", tuple(len(h) for h in held)
    return _same(held, hold), _slot_of(x, q)


def _drawn(ops, inputs, imap, members, box, whole: dict, budget: int) -> dict:
    """``{(operand position, rank): values}``: the summands of the operands ``members``' local runs
    draw (not cut from ``whole``), one draw per piece for every member holding it (the members of
    a partial group hold the same indices with different slots), at most ``budget`` elements a draw."""
    out: dict = {}
    for i, (o, x) in enumerate(zip(ops, inputs)):
        if o is None or i in whole:
            continue
        lt = imap.inputs[i] if imap is not None else None
        alike: dict = {}
        for q in members:
            held = x.indices(q)
            alike.setdefault(tuple(map(id, held)), (held, []))[1].append(q)
        for held, qs in alike.values():
            lists = _restrict(list(held), lt, box) if box is not None and lt is not None else list(held)
            step = max(1, budget // max(1, math.prod(len(h) for h in lists)))
            for j in range(0, len(qs), step):
                out.update(((i, q), v) for q, v in zip(qs[j:j + step], summands(o, lists, qs[j:j + step])))
    return out


def _local_run(opdef, params, ops, inputs, outputs, imap, q: int, box, whole=None, drawn=None):
    """Rank ``q``'s local outputs (restricted to ``box`` when given), or a message saying why the
    local op cannot make the pieces its outputs name. ``whole``: operand position -> its global
    values already drawn (not partial): the piece is cut from them instead of drawn again;
    ``drawn``: ``{(operand position, rank): piece}`` drawn already (``_drawn``)."""
    no_map = [None] * max(len(inputs), len(outputs))
    args, shapes = [], []
    for i, (o, x, lt) in enumerate(zip(ops, inputs, imap.inputs if imap is not None else no_map)):
        if o is None:
            args.append(x)
            continue
        lists = list(x.indices(q))
        lists = _restrict(lists, lt, box) if box is not None and lt is not None else lists
        if whole and i in whole:
            g = whole[i]
            args.append(g[grid(lists)] if lists else g)
        elif drawn and (i, q) in drawn:
            args.append(drawn[(i, q)])
        else:
            args.append(summand(o, lists, q))
    for o, lt in zip(outputs, imap.outputs if imap is not None else no_map):
        lists = list(o.indices(q))
        lists = _restrict(lists, lt, box) if box is not None and lt is not None else lists
        shapes.append(tuple(len(x) for x in lists))
    try:
        outs = opdef.run_numpy(args, params, shapes)
    except (ValueError, IndexError) as e:
        return f"rank {q}: the local op fails on its pieces ({type(e).__name__}: {e})"
    for k, (got, want) in enumerate(zip(outs, shapes)):
        if tuple(np.shape(got)) != want:
            return (f"rank {q}: the local op makes output {k} of shape {np.shape(got)}, but {outputs[k]} names a "
                    f"piece of shape {want} there")
    return outs


def _boxed_reference(opdef, params, ops, inputs, outputs, imap, out_lists, k, box, budget):
    """The op on the global values restricted to the sampled box (pass-through letters at the
    sampled global indices, every other letter whole)."""
    letter_lists: dict = {}
    for L, lst in zip(imap.outputs[k], out_lists):
        letter_lists[L] = lst
    args = []
    for o, x, lt in zip(ops, inputs, imap.inputs):
        if o is None:
            args.append(x)
            continue
        lists = [letter_lists[L] if L in letter_lists and L in box and x.shape[d] > 1 else np.arange(x.shape[d])
                 for d, L in enumerate(lt)]
        if np.prod([len(x_) for x_ in lists]) > budget:
            return None
        args.append(global_value(o, lists))
    shapes = []
    for o, lt in zip(outputs, imap.outputs):
        shapes.append(tuple(len(letter_lists[L]) if L in letter_lists and L in box and o.shape[d] > 1 else o.shape[d]
                            for d, L in enumerate(lt)))
    return opdef.run_numpy(args, params, shapes)[k]


def _run_reshape(inputs, outputs, ops, reps, rtol, atol, budget, n_classes) -> Run:
    """A view beyond the budget: each representative's local reshape against the values at the
    output's global flat offsets (a view keeps them)."""
    src_op = next(o for o in ops if o is not None)
    out = outputs[0]
    worst = 0.0
    for r in reps:
        lists = list(src_op.sharding.indices(r))
        if np.prod([len(x) for x in lists]) > budget:
            return Run("skipped", "a local piece exceeds the budget", classes=n_classes)
        piece = summand(src_op, lists, r).reshape(out.local_shape(r))
        want = at_offsets(src_op, _offsets(out.shape, list(out.indices(r))), r)  # a view keeps flat offsets
        ok, err = _close(piece.reshape(-1), np.asarray(want).reshape(-1), rtol, atol)
        worst = max(worst, err)
        if not ok:
            return Run("failed", f"rank {r}: the local view does not hold the values at its global offsets", err,
                       n_classes)
    return Run("ok", "", worst, n_classes, len(reps))


def _sampled(lists, limit: int) -> list:
    """Per dim, evenly spread entries of ``lists`` (all of them while their product fits ``limit``).
    ``_sampled([np.arange(10)], 3) -> [array([0, 4, 9])]``"""
    lists = [np.asarray(x) for x in lists]
    count = [len(x) for x in lists]
    while math.prod(count) > limit and max(count, default=1) > 1:
        k = count.index(max(count))
        count[k] = max(1, count[k] // 2)
    return [x[np.unique(np.linspace(0, len(x) - 1, n).astype(np.int64))] if len(x) and n < len(x) else x
            for x, n in zip(lists, count)]


def expected_after(c, rank: int, src: Operand, want=None) -> np.ndarray:
    """What ``rank`` must hold after collective ``c`` (at ``want``, per-dim global indices; by
    default its whole target piece) when its group held ``src``'s summands: the removed partial
    axes reduced, new partial(sum) axes divided. ``expected_after(c, 0, Operand(c.src, 1))``"""
    dst, mesh = c.dst, c.dst.mesh
    coord = mesh.coord(rank)
    keep = {a: coord[mesh.axis_index(a)] for a, _ in dst.partial if a in dict(c.src.partial)}
    v = global_value(src, list(dst.indices(rank)) if want is None else list(want), keep)
    for a, op in dst.partial:
        if a not in dict(c.src.partial) and op == "sum":
            v = v / mesh.axis_size(a)
    return v


def run_collective_classes(c, seed: int = 0, rtol: float = 1e-6, atol: float = 1e-6,
                           budget: int = DEFAULT_BUDGET) -> Run:
    """Run one collective for the representatives of its rank classes, each with its whole group,
    and compare with the target's values. ``run_collective_classes(plan_move(a, b)[0]).status``"""
    mesh = c.src.mesh
    classes, reps = _ranks_to_run(mesh, (c.src, c.dst), False)
    src = Operand(c.src, seed)
    worst, runs = 0.0, 0
    made: dict = {}  # a member's held arrays and partial slot -> its piece, shared by every group holding it
    compared: set = set()  # _rep_key: what a representative's run reads; equal readings, equal verdicts
    same: set = set()  # the same by content: its members' held arrays and slots, its wanted entries
    hold: list = []  # the index arrays keyed by identity (_same), kept alive while keys are compared
    reads = _axes_read(mesh, (c.src, c.dst))
    own = _axes_read(mesh, (c.dst,))  # the target piece and the partial slots it keeps
    for r in reps:
        group = group_ranks(mesh, r, c.axes)
        if len(group) > MAX_GROUP:
            return Run("skipped", f"a group of {len(group)} ranks", classes=len(classes))
        cheap = _rep_key(mesh, group[0], r, reads, own)
        if cheap in compared:
            continue  # the same member pieces put together into the same entries of the same target
        compared.add(cheap)
        full = list(c.dst.indices(r))
        if c.reduce_op is None and any(len(w) == 0 for w in full):
            continue  # an empty target piece: a move that only places elements gives it nothing, it cannot fail
        want = _sampled(full, max(budget // (16 * len(group)), 1))
        whole = all(len(w) == len(f) for w, f in zip(want, full))
        held = {q: c.src.indices(q) for q in group}
        if not whole:
            held = {q: [x[np.isin(x, w)] for x, w in zip(h, want)] for q, h in held.items()}
        keys = {q: (_same(held[q], hold), _slot_of(c.src, q) if c.src.partial else None) for q in group}
        coord = mesh.coord(r)
        seen = (tuple(keys[q] for q in group), _same(want, hold),
                tuple(coord[mesh.axis_index(a)] for a, _ in c.dst.partial))
        if seen in same:
            continue
        same.add(seen)
        todo = list({keys[q]: q for q in group if keys[q] not in made}.values())
        if todo and not c.src.partial and c.src.shape:  # every member's piece cut from one draw of their union
            union = [np.unique(np.concatenate([held[q][d] for q in todo])) for d in range(len(c.src.shape))]
            values = global_value(src, union)
            for q in todo:
                at = [np.searchsorted(u, x) for u, x in zip(union, held[q])]
                made[keys[q]] = values[grid(at)]
        alike: dict = {}  # partial members holding the same indices: their summands drawn at once
        for q in todo:
            if keys[q] not in made:
                alike.setdefault(keys[q][0], []).append(q)
        for qs in alike.values():
            made.update(zip((keys[q] for q in qs), summands(src, held[qs[0]], qs)))
        try:
            got = collective_piece(c, r, {q: made[keys[q]] for q in group}, want, held)
        except ShardingError as e:
            return Run("failed", f"rank {r}: {e}", classes=len(classes), simulated=runs)
        runs += 1
        ok, err = _close(got, expected_after(c, r, src, want), rtol, atol)
        worst = max(worst, err)
        if not ok:
            return Run("failed", f"rank {r}: {c.kind.value} over {c.axes_text() or 'no axes'} ({c.src} -> {c.dst}) "
                                 f"gives other values than the target names (max error {err:.3g})", err,
                       len(classes), runs)
    return Run("ok", "", worst, len(classes), runs)


# ------------------------------------------------------------------------------------------
# the walk
# ------------------------------------------------------------------------------------------


def verify_plan(plan, seed: int = 0, rtol: float = 1e-6, atol: float = 1e-6, budget: int = DEFAULT_BUDGET,
                numeric: bool = True, proof: bool = True) -> Verification:
    """The scalable verification (module docstring). ``numeric=False`` keeps the index-level
    proof only, ``proof=False`` the numeric oracle only (with the wiring): each is a complete
    check on its own, so tests can show what each catches. ``verify_plan(p).ok``"""
    if not isinstance(budget, int) or budget < 1:
        raise VerifyError(f"verify: budget must be a positive number of elements, got {budget!r}")
    prog, mesh = plan.program, plan.mesh
    check_proof = proof
    op_done: dict = {}
    coll_done: dict = {}
    unproven, notes = [], []
    stats = {"classes": 0, "simulated": 0, "error": 0.0}
    checked = 0
    wiring: dict = {}
    tensors = prog.tensors

    def fail(i, tensor, message, err=0.0):
        return Verification(False, checked, f"{tensor} (op {prog.ops[i].name}): {message}", err, "classes", False,
                            tuple(unproven), len(op_done), len(coll_done), stats["classes"], stats["simulated"],
                            tuple(notes))

    def account(run: Run, what: str):
        stats["classes"] += run.classes
        stats["simulated"] += run.simulated
        stats["error"] = max(stats["error"], run.max_error)
        if run.status == "skipped":
            notes.append(f"{what}: numeric check skipped ({run.message})")

    ragged = {n for n, t in tensors.items() if t.ragged is not None}
    ragged_ops = []
    for i, (op, po) in enumerate(zip(prog.ops, plan.ops)):
        first_out = op.outputs[0] if op.outputs else op.name
        moved: list = []
        w = check_wiring(plan, i, wiring, moved)
        if w.failed:
            return fail(i, first_out, w.message)
        if ragged and ragged & (set(op.outputs) | {n for n in op.inputs if isinstance(n, str)}):
            ragged_ops.append(i)  # data-dependent rows: checked below, by simulating the whole plan
            checked += len(op.outputs)
            continue
        for tensor, chain in moved:
            for c in chain:
                key = c.attributed(None, None)
                if key not in coll_done:
                    proof = check_collective(key) if check_proof else Check("unproven", "not asked")
                    run = run_collective_classes(key, seed, rtol, atol, budget) if numeric and not proof.failed \
                        else Run("ok")
                    coll_done[key] = (proof, run)
                    if proof.status == "unproven":
                        unproven.append(f"{c.kind.value} {c.src} -> {c.dst}")
                    account(run, f"{c.kind.value} {c.src} -> {c.dst}")
                proof, run = coll_done[key]
                if proof.failed:
                    return fail(i, tensor, proof.message)
                if run.status == "failed":
                    return fail(i, tensor, run.message, run.max_error)
        dtypes = tuple([tensors[n].dtype if isinstance(n, str) else type(n).__name__ for n in op.inputs])
        key = (po.target, op.params, po.input_targets, po.outputs, dtypes)  # bound params follow from these
        try:
            done = op_done.get(key)
        except TypeError:  # params built by hand with a list in them: keyed by their text
            key = (po.target, repr(op.params), po.input_targets, po.outputs, dtypes)
            done = op_done.get(key)
        if done is None:
            opdef = get_op(po.target)
            try:
                imap = index_map(po.target, po.input_targets, {**po.params, **dict(po.local)}, len(po.outputs))
            except (ShardingError, ValueError, IndexError, KeyError, TypeError):
                imap = None
            proof = check_op(mesh, imap, po.input_targets, po.outputs, budget) if check_proof else \
                Check("unproven", "not asked")
            if proof.status == "unproven":
                unproven.append(f"{po.target} ({op.name}): {proof.message}")
            run = Run("ok")
            if numeric and not proof.failed:
                run = run_op(opdef, po.params, po.input_targets, po.outputs, dtypes, imap,
                             seed + len(op_done), rtol, atol, budget, local_params=po.local)
                if run.status == "skipped" and opdef.numpy is None and proof.status != "proven":
                    raise SimulationUnsupported(
                        f"op {op.name} ({po.target}) has no index map and cannot be simulated: "
                        f"{opdef.not_simulated or 'no numpy implementation'}")
                account(run, f"{po.target} ({op.name})")
            done = op_done[key] = (proof, run)
        proof, run = done
        if proof.failed:
            return fail(i, first_out, proof.message)
        if run.status == "failed":
            return fail(i, first_out, run.message, run.max_error)
        checked += len(op.outputs)
    if ragged_ops:
        seeds = _ragged_seeds(plan, seed, budget)
        for s in seeds:
            full = verify_full(plan, s, rtol, atol)
            if not full.ok:
                return replace(full, mode="classes", notes=tuple(notes) + (f"ragged: simulated with seed {s}",))
        unproven.extend(f"{prog.ops[i].target} ({prog.ops[i].name}): rows per expert depend on the routing; "
                        "checked by simulation" for i in ragged_ops)
        notes.append(f"ragged: {len(ragged_ops)} ops on ragged tensors checked by simulating the whole plan on "
                     f"every rank with real routing (seeds {', '.join(map(str, seeds))}), every tensor compared "
                     "block by block")
    streamed = _check_streams(plan, check_collective, seed, rtol, atol, budget)
    if isinstance(streamed, Verification):
        return replace(streamed, notes=tuple(notes) + streamed.notes)
    notes.extend(streamed)
    return Verification(True, checked, None, stats["error"], "classes", not unproven, tuple(unproven), len(op_done),
                        len(coll_done), stats["classes"], stats["simulated"], tuple(notes))


def _check_streams(plan, check_collective, seed: int, rtol: float, atol: float, budget: int):
    """The plan's stream overlaps (``execute.stream``), as ``shardlayout run`` executes them: each
    chunk's move proven like any collective, and — while the largest tensor fits the budget — the
    whole plan simulated on every rank with the streams run chunk by chunk (``verify_full``).
    Returns notes, or the failed Verification."""
    from .stream import chunk_moves, segments

    streams, _ = segments(plan)
    if not streams:
        return []
    for seg in streams:
        for c in chunk_moves(plan, seg):
            proof = check_collective(c.attributed(None, None))
            if proof.failed:
                name = (seg.before or seg.after)[0]
                return Verification(False, 0, f"{name} (stream chunk of {c.kind.value} {c.src} -> {c.dst}): "
                                    f"{proof.message}", mode="classes")
    what = ", ".join(f"{(s.before or s.after)[0]} x{s.k}" for s in streams)
    largest = max((int(np.prod(t.shape)) for t in plan.program.tensors.values()), default=1)
    if largest * plan.mesh.size > budget:
        return [f"streams: {len(streams)} overlap(s) run chunk by chunk ({what}): each chunk's move proven; "
                "too large to simulate whole (--verify=full does)"]
    full = verify_full(plan, seed, rtol, atol)
    if not full.ok:
        return replace(full, mode="classes")
    return [f"streams: {len(streams)} overlap(s) run chunk by chunk ({what}): each chunk's move proven, and the "
            "whole plan simulated on every rank with them equals the unsharded run"]


def _ragged_seeds(plan, seed: int, budget: int) -> tuple:
    """Seeds of the whole-plan simulations of a plan with ragged tensors: three routings while
    the largest tensor fits the budget, else one."""
    largest = max((int(np.prod(t.shape)) for t in plan.program.tensors.values()), default=1)
    return (seed, seed + 1, seed + 2) if largest * 3 <= budget else (seed,)


def reference_run(plan, inputs: dict, run=None, xp=np) -> dict:
    """Every tensor of ``plan``'s program computed unsharded from ``inputs`` (numpy by default;
    ``run(opdef, args, params, shapes)`` and ``xp`` for another array module). Ragged tensors
    are nested values routed from the sources the plan routes from (``ops.ragged``)."""
    from ..ops.ragged import RAGGED_OPS, reference_params, run_nested
    from ..sharding.nested import Nested

    run = run or (lambda opdef, args, params, shapes: opdef.run_numpy(args, params, shapes))
    prog = plan.program
    ref = dict(inputs)
    blocks: dict = {}  # a routing's counts -> its token blocks (the sources), for its unroute
    for op, po in zip(prog.ops, plan.ops):
        args = [ref[i] if isinstance(i, str) else i for i in op.inputs]
        opdef = get_op(op.target)
        shapes = [prog.tensors[o].shape for o in op.outputs]
        if opdef.name in RAGGED_OPS or any(isinstance(a, Nested) for a in args):
            params = reference_params(po)
            if opdef.name == "route":
                blocks[prog.tensors[op.outputs[0]].ragged.counts] = params.get("sources")
            elif opdef.name == "unroute":
                params = {**params, "sources": blocks.get(prog.tensors[op.inputs[0]].ragged.counts)}
            outs = run_nested(opdef, args, params, shapes, run, xp)
        else:
            outs = run(opdef, args, po.params, shapes)
        ref.update(zip(op.outputs, outs))
    return ref


def _nested_mismatch(plan, name: str, got: dict, want, rtol, atol) -> str | None:
    """Where rank pieces of a ragged tensor differ from its planned pieces of ``want``, or None."""
    from ..sharding.ragged import nested_piece

    s, r = plan.shardings[name], plan.program.tensors[name].ragged
    for rank in plan.mesh.ranks():
        if s.partial:
            return None  # compared once reduced, where the plan reduces it
        exp = nested_piece(s, r, want, rank, plan.ragged_sources(name))
        g = got[rank]
        if not np.array_equal(g.extents, exp.extents):
            return f"rank {rank} holds extents {g.extents.tolist()}, the plan names {exp.extents.tolist()}"
        if not np.allclose(np.asarray(g.data), np.asarray(exp.data), rtol=rtol, atol=atol, equal_nan=True):
            return f"rank {rank}'s rows differ by {float(np.max(np.abs(np.asarray(g.data) - exp.data))):.3g}"
    return None


def full_input(prog, name: str, rng) -> np.ndarray:
    """A random global value of program input ``name`` for the whole-plan simulation: floats, or
    for integer ids the integers a consumer can look up (an embedding's rows; else 0 and 1), for a
    boolean mask 0/1, for a uniform draw (kind ``rand``) values in [0, 1).
    ``full_input(prog, "input_ids", np.random.default_rng(0))``"""
    t = prog.tensors[name]
    shape = tuple(t.shape)
    if t.dtype == "bool":
        return rng.integers(0, 2, shape).astype(np.float64)
    if t.kind == "rand":  # a uniform draw (dropout's: compared with p)
        return rng.random(shape)
    if not t.dtype.startswith("int") and not t.dtype.startswith("uint"):
        return rng.standard_normal(shape) if shape else np.asarray(rng.standard_normal())
    rows = [prog.tensors[op.inputs[0]].shape[0] for op in prog.ops
            if "embedding" in op.target and len(op.inputs) > 1 and op.inputs[1] == name
            and isinstance(op.inputs[0], str)]
    return rng.integers(0, min(rows) if rows else 2, shape).astype(np.float64)


def verify_full(plan, seed: int = 0, rtol: float = 1e-6, atol: float = 1e-6) -> Verification:
    """Every rank simulated in numpy (``walk`` with ``NumpySimulator``), every tensor compared
    with the unsharded run; the first that differs is reported. Ragged tensors are compared
    block by block (each rank's components and sources, ``sharding.ragged.nested_piece``).
    ``verify_full(p).ok``"""
    from . import NumpySimulator, walk

    rng = np.random.default_rng(seed)
    prog = plan.program
    inputs = {name: full_input(prog, name, rng) for name in prog.inputs()}
    ref = reference_run(plan, inputs)
    pieces = {n: plan.shardings[n].shard(ref[n]) for n in prog.inputs()}
    checked = 0
    producer = {o: op.name for op in prog.ops for o in op.outputs}
    sim = NumpySimulator(plan.mesh)
    from .stream import segments

    streams, _ = segments(plan)  # what `shardlayout run` executes: the stream overlaps chunk by chunk
    notes = (f"streams: {len(streams)} overlap(s) simulated chunk by chunk "
             f"({', '.join(f'{(s.before or s.after)[0]} x{s.k}' for s in streams)})",) if streams else ()
    try:
        for name, got in walk(plan, sim, pieces, streams):
            final = plan.shardings[name]
            if prog.tensors[name].ragged is not None:
                bad = _nested_mismatch(plan, name, got, ref[name], rtol, atol)
                if bad is not None:
                    return Verification(False, checked, f"{name} (op {producer.get(name, '?')}, sharding {final}): "
                                        f"{bad}", mode="full")
                checked += 1
                continue
            try:
                whole = final.unshard(got, tolerance=1e-6)
            except ShardingError as e:
                return Verification(False, checked, f"{name} (op {producer.get(name, '?')}): {e}", mode="full")
            checked += 1
            if not np.allclose(whole, ref[name], rtol=rtol, atol=atol, equal_nan=True):
                err = float(np.nanmax(np.abs(whole - ref[name]))) if whole.size else 0.0
                return Verification(False, checked, f"{name} (op {producer.get(name, '?')}, sharding {final})", err,
                                    mode="full")
    except SimulationUnsupported:
        raise
    except (ValueError, IndexError) as e:  # a collective missing data, a local op on a piece it cannot take
        if isinstance(e, ShardingError) and not isinstance(e, ShardMismatch):
            raise
        return Verification(False, checked, f"after {checked} tensors: {type(e).__name__}: {e}", mode="full",
                            notes=notes)
    return Verification(True, checked, mode="full", notes=notes)


def verify(plan, mode: str = "classes", seed: int = 0, rtol: float = 1e-6, atol: float = 1e-6,
           budget: int = DEFAULT_BUDGET) -> Verification:
    """``mode="classes"``: :func:`verify_plan`; ``mode="full"``: :func:`verify_full`.
    ``verify(p, "full").mode -> 'full'``"""
    if mode not in MODES:
        raise VerifyError(f"verify: mode {mode!r} is not one of {', '.join(MODES)}; 'classes' proves every rank "
                          "and simulates one pair per rank class, 'full' simulates every rank")
    if mode == "full":
        return verify_full(plan, seed, rtol, atol)
    return verify_plan(plan, seed, rtol, atol, budget)


__all__ = ["DEFAULT_BUDGET", "MODES", "Operand", "Run", "Verification", "VerifyError", "expected_after",
           "global_value", "hashed", "run_collective_classes", "run_op", "summand", "summands", "verify", "verify_full",
           "verify_plan"]
