"""The search space of ``--style auto``: a domain of shardings per tensor, and per op the exact
price of every combination of its tensors' shardings.

**Domains.** A tensor may take every sharding it has in a *seed plan*: the ordinary ``plan()``
of the program with no pins and with each built-in style's pins (user pins added to each, and a
pinned tensor's domain is its pin alone). Tensors at the same place of identical blocks
(``plan.chain``) share one domain, the union of theirs. So every built-in style's plan is a
point of the space, and so is every mix of them per tensor.

**Tables.** The auto plan is an ordinary ``plan()`` with *every* tensor pinned. With all pins
given, ``plan()`` resolves each op on its pinned inputs with its pinned outputs — one call of
``OpDef.resolve`` that depends on nothing else. So for each op and each combination of its
tensors' shardings (a :class:`Combo`) we make exactly that call and keep what ``plan()`` would
emit: the moves of its outputs to their pins and the op's compute (its own terms), the moves of
its inputs (shared by every consumer moving one tensor to one target, as ``plan()`` shares
them), and the gradient reductions its inputs need (summed per tensor and target, as
``plan.backward`` sums them). :func:`evaluate` adds those up for one assignment exactly as
``estimate(plan(program, mesh, assignment))`` does; ``tests/plan/test_auto.py`` checks the two
are the same float.

    >>> from shardlayout import Mesh
    >>> from shardlayout.program.models import llama
    >>> prog, m = llama(layers=1), Mesh.parse("tp=2")
    >>> ctx = Context.of(prog, m)
    >>> doms = domains(prog, seed_plans(prog, m, {}, ctx.cost_model))
    >>> op = prog.ops[0]; t = op_table(prog, 0, doms, ctx)
    >>> len(t.combos) == len(doms[op.inputs[0]]) * len(doms[op.outputs[0]])
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import product

from ..caches import memo
from ..errors import ShardingError
from ..mesh import Mesh
from ..sharding import Sharding
from ..sharding.cost import DEFAULT_COST_MODEL, CostModel
from ..sharding.move import is_local_move, plan_move
from .backward import op_reductions
from .estimate import (
    check_flop_rate,
    check_training,
    compute_seconds,
    grads_of,
    local_bytes,
    memory_weights,
    move_terms,
    op_flops,
    reduction_seconds,
)


@dataclass(frozen=True)
class Context:
    """What prices a combination besides the shardings: mesh, cost model, training mode, FLOP
    rate, the tensors that carry gradients, ``shared``: tensors several blocks read, which may be
    sliced locally but not moved with communication inside a block (``plan.chain``), and ``kept``:
    pinned tensors no collective may move (a style's promise, ``plan(..., keep=)``); ``streams``:
    whether stream overlaps are options of the search (``plan.overlap``)."""

    mesh: Mesh
    cost_model: CostModel
    training: str
    flop_rate: float
    grads: frozenset
    shared: frozenset = frozenset()
    kept: frozenset = frozenset()
    streams: bool = True

    @staticmethod
    def of(program, mesh: Mesh, cost_model: CostModel | None = None, training: str = "adam",
           flop_rate: float | None = None, shared: frozenset = frozenset(), kept: frozenset = frozenset(),
           streams: bool = True) -> "Context":
        """The context of ``program`` on ``mesh``. ``Context.of(prog, mesh).training -> 'adam'``"""
        check_training(training)
        grads = grads_of(program) if training != "inference" else frozenset()
        return Context(mesh, cost_model or DEFAULT_COST_MODEL, training, check_flop_rate(flop_rate), grads,
                       frozenset(shared), frozenset(kept), bool(streams))


@dataclass(frozen=True)
class Combo:
    """One combination of an op's tensors' shardings and what ``plan()`` emits for it:
    ``own`` — ``(forward, backward, compute)`` float terms of the output moves and the compute;
    ``moves`` — ``(tensor, src, dst)`` input moves; ``reductions`` — ``(tensor, target, axes)``;
    and what the stream search reads of the op (``plan.overlap``): ``targets`` (where each
    input is read), ``made`` (the outputs before their moves to their pins), ``params``."""

    shardings: tuple
    own: tuple
    moves: tuple
    reductions: tuple
    targets: tuple = field(default=(), repr=False, compare=False)
    made: tuple = field(default=(), repr=False, compare=False)
    params: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def own_seconds(self) -> float:
        """Seconds of the own terms."""
        return math.fsum(self.own[0] + self.own[1] + self.own[2])


@dataclass(frozen=True)
class OpTable:
    """Every valid :class:`Combo` of one op (``index`` into ``program.ops``) over ``tensors``
    (its distinct tensor inputs, then outputs)."""

    index: int
    tensors: tuple
    combos: tuple


class NoCandidates(ShardingError):
    """No combination of an op's tensors' shardings is valid (pins that contradict each other)."""


# ------------------------------------------------------------------------------------------
# domains
# ------------------------------------------------------------------------------------------


def seed_plans(program, mesh: Mesh, pins: dict, cost_model: CostModel | None = None, keep=frozenset()) -> tuple:
    """``((label, Plan), ...)``: the plan with only ``pins`` (``keep``: those no collective moves),
    then with each built-in style's pins (``pins`` override them); a style that does not apply to
    the program is left out.
    ``[label for label, _ in seed_plans(llama(layers=1), mesh, {})] -> ['none', 'dp', ...]``"""
    from ..program.models import STYLES, style_pins
    from . import plan

    out = [("pins" if pins else "none", plan(program, mesh, dict(pins), cost_model, keep=keep))]
    for style in STYLES:
        try:
            got = plan(program, mesh, {**style_pins(program, mesh, style), **pins}, cost_model)
        except ShardingError:
            continue
        out.append((style, got))
    return tuple(out)


def _order(s: Sharding) -> tuple:
    return (str(s), repr(s.dims), s.partial)


def domains(program, seeds, pins: dict | None = None) -> dict:
    """``{tensor: (Sharding, ...)}``: every sharding the tensor has in a seed plan (sorted by
    text), its pin alone when pinned. ``domains(prog, seed_plans(prog, mesh, {}))["x"]``"""
    pins = pins or {}
    out = {}
    for name in program.tensors:
        if name in pins:
            out[name] = (pins[name],)
            continue
        vals = {p.shardings[name] for _, p in seeds if name in p.shardings}
        out[name] = tuple(sorted(vals, key=_order))
    return out


def unify(doms: dict, groups) -> dict:
    """Domains where every group of tensors (the same place of identical blocks) shares the
    union of its members' domains. ``unify({"a": (s,), "b": (t,)}, [("a", "b")])``"""
    out = dict(doms)
    for group in groups:
        vals = {s for t in group for s in doms[t]}
        joined = tuple(sorted(vals, key=_order))
        for t in group:
            out[t] = joined
    return out


# ------------------------------------------------------------------------------------------
# tables
# ------------------------------------------------------------------------------------------


@memo(1 << 16)
def priced_move(src: Sharding, dst: Sharding, dtype: str, grad: bool, cost_model: CostModel) -> tuple:
    """``(forward, backward)`` float terms of moving one tensor from ``src`` to ``dst``
    (``plan_move``, priced by ``estimate.move_terms``). ``priced_move(a, a, "float32", True, cm) -> ((), ())``"""
    return move_terms(plan_move(src, dst, dtype, cost_model), grad, dtype, cost_model)


@memo(1 << 14)
def priced_reduction(target: Sharding, axes: frozenset, dtype: str, cost_model: CostModel) -> float:
    """Seconds of the all-reduce of a gradient at ``target`` over ``axes`` (memoised
    ``estimate.reduction_seconds``). ``priced_reduction(s, frozenset({"dp"}), "float32", cm)``"""
    return reduction_seconds(target, axes, dtype, cost_model)


def op_table(program, index: int, doms: dict, ctx: Context) -> OpTable:
    """Every combination of op ``index``'s tensors' shardings, resolved exactly as ``plan()``
    resolves the op with all its tensors pinned; combinations the rule refuses are left out.
    ``op_table(prog, 0, doms, Context.of(prog, mesh)).combos``"""
    from . import _CREATION, _op_table

    op, opdef, kw, typed, dtypes, kind = _op_table(program)[0][index]
    creation = kind == _CREATION
    tensors = tuple(dict.fromkeys([i for i in op.inputs if type(i) is str] + list(op.outputs)))
    tspec = program.tensors
    cm = ctx.cost_model
    combos = []
    for values in product(*(doms[t] for t in tensors)):
        got = _combo(op, opdef, kw, typed, dtypes, creation, dict(zip(tensors, values)), tspec, ctx, cm)
        if got is not None:
            combos.append(Combo(values, *got))
    if not combos:
        raise NoCandidates(f"op {op.name} ({op.target}): no combination of its tensors' shardings is valid; "
                           "relax the pins on its inputs or outputs")
    return OpTable(index, tensors, tuple(combos))


def renamed_table(table: OpTable, rename: dict, shift: int) -> OpTable:
    """``table`` as the op ``shift`` places later whose tensors are ``rename``'s (names not in it
    kept): the same combinations in the same order, their moves and reductions renamed.
    ``renamed_table(t, {"layers.0.x": "layers.1.x"}, 50).index == t.index + 50``"""
    def name(t):
        return rename.get(t, t)

    combos = tuple(Combo(c.shardings, c.own, tuple((name(t), a, b) for t, a, b in c.moves),
                         tuple((name(t), d, axes) for t, d, axes in c.reductions), c.targets, c.made, c.params)
                   for c in table.combos)
    return OpTable(table.index + shift, tuple(name(t) for t in table.tensors), combos)


def twin_tables(program, segs, doms: dict, ctx: Context, table) -> tuple:
    """``(tables, twins)``: every op's table (``table(i, doms, ctx)``, op ``i``'s), where a block
    of ``segs`` (``plan.chain.Segment``) of the kind of an earlier one whose tensors have the
    same domains (and the same gradient, shared and kept roles) takes that block's tables
    renamed (:func:`renamed_table`: what ``op_table`` makes for it, without resolving every
    combination again); ``twins``: ``{block index: (earlier block index, rename)}``.
    ``twin_tables(llama(layers=4), segments(prog), doms, ctx, table)[1]``"""
    tables: list = [None] * len(program.ops)
    twins, first = {}, {}
    for k, s in enumerate(segs):
        r = first.setdefault(s.key, k)
        rep = segs[r]
        rename = dict(zip(rep.slots, s.slots))
        if rep.inp is not None:
            rename[rep.inp] = s.inp
        if r != k and _alike(rep, rename, doms, ctx):
            twins[k] = (r, rename)
            for j in range(s.hi - s.lo):
                tables[s.lo + j] = renamed_table(tables[rep.lo + j], rename, s.lo - rep.lo)
        else:
            for i in range(s.lo, s.hi):
                tables[i] = table(i, doms, ctx)
    return tuple(tables), twins


def _alike(rep, rename: dict, doms: dict, ctx: Context) -> bool:
    """Do the tensors ``rename`` maps (a block's own tensors and its input) have the same domains
    and roles as their images?"""
    for a, b in rename.items():
        if doms.get(a) != doms.get(b) or (a in ctx.grads) != (b in ctx.grads) or \
                (a in ctx.shared) != (b in ctx.shared) or (a in ctx.kept) != (b in ctx.kept):
            return False
    return True


def _combo(op, opdef, kw, typed, dtypes, creation, pin, tspec, ctx, cm):
    args = tuple(pin[i] if type(i) is str else i for i in op.inputs)
    if creation:
        kw, typed = {**kw, "mesh": ctx.mesh}, None
    try:
        p, params = opdef.resolve(args, kw, tuple(pin[o] for o in op.outputs), cm, dtypes, typed)
    except ShardingError:
        return None
    fwd, bwd = [], []
    for o, s in zip(op.outputs, p.outputs):
        if s != pin[o]:
            f, b = priced_move(s, pin[o], tspec[o].dtype, o in ctx.grads, cm)
            fwd.extend(f)
            bwd.extend(b)
    moves = []
    for i, a, tgt in zip(op.inputs, args, p.input_targets):
        if tgt is not a and type(a) is Sharding and tgt != a:
            if i in ctx.shared and priced_move(a, tgt, tspec[i].dtype, False, cm)[0]:
                return None  # a shared tensor is not moved with communication inside a block
            if i in ctx.kept and not is_local_move(a, tgt):
                return None  # nor a kept one anywhere (plan() with keep takes another strategy or refuses)
            moves.append((i, a, tgt))
    reductions = op_reductions(op.inputs, p.input_targets, p.outputs, ctx.grads) if ctx.grads else ()
    comp = compute_seconds(op_flops(op.target, params, p.input_targets, p.outputs), ctx.training, ctx.flop_rate)
    return ((tuple(fwd), tuple(bwd), (comp,)), tuple(dict.fromkeys(moves)), reductions, tuple(p.input_targets),
            tuple(p.outputs), params)


def memory_of(program, doms: dict, training: str, counted=None) -> dict:
    """``{(tensor, sharding): bytes}`` per device for every counted tensor (``estimate``'s
    accounting; ``counted``: the tensors to include, default all).
    ``memory_of(prog, doms, "adam")[("x", s)] -> 1024``"""
    weights = memory_weights(program, training)
    out = {}
    for t, vals in doms.items():
        w = weights.get(t, 0)
        if w and (counted is None or t in counted):
            for s in vals:
                out[(t, s)] = w * local_bytes(s, program.tensors[t].dtype)
    return out


# ------------------------------------------------------------------------------------------
# one assignment, priced as plan() + estimate() price it
# ------------------------------------------------------------------------------------------


def evaluate(program, tables, assignment: dict, ctx: Context, streams=()) -> tuple:
    """``(forward, backward, compute, overlap)`` float terms of the ops in ``tables`` under
    ``assignment`` (``{tensor: Sharding}``) with the stream options ``streams``
    (``plan.overlap.StreamOption``) chosen: each op's combo, input moves once per (tensor,
    target), gradient reductions once per (tensor, target, axes) (``plan.backward``), minus each
    stream's saving (``estimate.overlap_terms``).
    ``math.fsum(sum(evaluate(prog, tables, p.shardings, ctx, chosen), ())) == estimate(p).seconds``"""
    fwd, bwd, comp = [], [], []
    moves, reductions = {}, {}
    for t in tables:
        key = tuple(assignment[n] for n in t.tensors)
        combo = _lookup(t)[key]
        fwd.extend(combo.own[0])
        bwd.extend(combo.own[1])
        comp.extend(combo.own[2])
        for name, src, dst in combo.moves:
            moves.setdefault((name, dst), src)
        reductions.update(dict.fromkeys(combo.reductions))
    cm = ctx.cost_model
    for (name, dst), src in moves.items():
        f, b = priced_move(src, dst, program.tensors[name].dtype, name in ctx.grads, cm)
        fwd.extend(f)
        bwd.extend(b)
    for name, tgt, axes in reductions:
        bwd.append(priced_reduction(tgt, axes, program.tensors[name].dtype, cm))
    return tuple(fwd), tuple(bwd), tuple(comp), tuple(-o.saving for o in streams)


def _lookup(table: OpTable) -> dict:
    got = table.__dict__.get("_by_key")
    if got is None:
        got = {c.shardings: c for c in table.combos}
        object.__setattr__(table, "_by_key", got)
    return got


__all__ = ["Combo", "Context", "NoCandidates", "OpTable", "domains", "evaluate", "memory_of", "op_table",
           "priced_move", "priced_reduction", "renamed_table", "seed_plans", "twin_tables", "unify"]
