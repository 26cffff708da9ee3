"""Whole-program planning: every tensor's sharding, every op's strategy, every collective.

``plan(program, mesh, pins)`` walks the ops in order. Pinned tensors keep their sharding
(an op whose output is pinned chooses its strategy knowing it); every other tensor takes
what its op's rule chooses. A redistribution of one tensor to one target is done once and
shared by its consumers. ``Plan.verify()`` proves the plan at the index level for every rank
and runs one representative pair per rank class in numpy (``execute.verify``);
``Plan.verify(mode="full")`` runs every rank and compares each tensor with the unsharded run.

A symbolic program (``Program.symbols``) is planned at its example sizes; ``Plan.guards`` are the
conditions under which the same decisions hold at every size (``plan.guards``: the program's facts
and ``E % P == 0`` for each symbolic extent E sharded P ways; with ``uneven=True``, ``E >= P``
instead, sizes that do not divide being cut as torch.chunk cuts), and ``Plan.verify`` also
re-plans and verifies at other sizes drawn from them.

    >>> from shardlayout import Mesh, Sharding
    >>> from shardlayout.program import ProgramBuilder
    >>> b = ProgramBuilder(); x = b.input("x", (4, 8)); w = b.param("w", (8, 6))
    >>> b.output(b.op("mm", [x, w], name="y"))
    >>> m = Mesh.parse("tp=2")
    >>> p = plan(b.build(), m, {"w": Sharding.parse("[8, tp*3]", m)})
    >>> str(p.shardings["y"]), p.verify().ok
    ('[4, tp*3]', True)
"""

from __future__ import annotations

import json
import reprlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..caches import paused_gc, register_clearer
from ..config import settings
from ..errors import MeshError, NotRepresentable, ShardingError, ShardingSpecError, StyleConflict
from ..execute.verify import DEFAULT_BUDGET, Verification
from ..execute.verify import verify as verify_plan
from ..mesh import Mesh, as_mesh
from ..ops.registry import _SEEN, _typed, cost_key, get_op
from ..ops.result import canonical_op_name
from ..program import Program, ProgramError
from ..sharding import Sharding
from ..sharding.cost import DEFAULT_COST_MODEL, CostModel, cost
from ..sharding.move import is_local_move, plan_move
from ..sharding.ragged import source_factors


@dataclass(frozen=True)
class PlannedOp:
    """An op with its input targets, output shardings and validated params."""

    name: str
    target: str
    inputs: tuple
    input_targets: tuple
    outputs: tuple
    params: dict = field(default_factory=dict, compare=False)
    local: tuple = field(default=(), compare=False)  # the local run's own params (Propagation.local)


def _planned(name, target, inputs, input_targets, outputs, params, local) -> PlannedOp:
    """``PlannedOp(...)`` without the frozen dataclass's per-field setattr (a plan makes one per op)."""
    obj = object.__new__(PlannedOp)
    obj.__dict__.update(name=name, target=target, inputs=inputs, input_targets=input_targets, outputs=outputs,
                        params=params, local=local)
    return obj


@dataclass
class Plan:
    """Shardings of every tensor, strategies of every op, every collective and the totals.

    ``collectives``: the communicating :class:`Collective` records, each attributed to its
    tensor and op; ``moves``: ``{(tensor, target sharding): collectives incl. local slices}``,
    what executors run; ``cost_model`` prices them."""

    program: Program
    mesh: Mesh
    shardings: dict
    ops: list
    collectives: list
    plan_seconds: float
    moves: dict = field(default_factory=dict, repr=False)
    cost_model: CostModel = field(default=DEFAULT_COST_MODEL, repr=False)
    verified: bool | None = None
    matched: list | None = field(default=None, repr=False)  # blocks a style / TP plan found: [{block, kind, tensors}]
    guards: tuple = ()  # a symbolic program's: the Guards under which the decisions hold at every size
    uneven: bool = False  # sizes that do not divide follow torch.chunk (E >= P guards, not E % P == 0)
    options: dict | None = field(default=None, repr=False)  # what plan() was given: to plan again at other sizes
    verified_at: tuple = ()  # the bindings verify() checked, the example first: ((symbol, value), ...) each
    flop_rate: float | None = None  # FLOP/s of one device for compute estimates (streams; None: the default)
    ring: bool = False  # ring-style streams among the stream choices (planned and simulated; not run on torch yet)

    def __getattr__(self, name: str):
        # the plan of a repeated program holds the compressed plan; the full records are made
        # the first time something reads them (plan.repeat.expand_plan)
        rep = self.__dict__.get("_repeated") if name in ("shardings", "ops", "collectives", "moves") else None
        if rep is None:
            raise AttributeError(f"'Plan' object has no attribute {name!r}")
        from .repeat import expand_plan

        with paused_gc():  # thousands of small records, no cycles
            self.__dict__.update(expand_plan(*rep, self.program))
        return self.__dict__[name]

    @property
    def repeated(self):
        """``(compressed plan, Repeat)`` when the plan was made from a repeated program's compressed
        form (``plan.repeat``), else None."""
        return self.__dict__.get("_repeated")

    @property
    def total_seconds(self) -> float:
        """Estimated seconds of all collectives (``sharding.cost.cost``)."""
        return cost(self.collectives, self.cost_model)

    @property
    def cost(self) -> float:
        """The same as ``total_seconds``: the price of every collective the plan emits."""
        return self.total_seconds

    def seconds(self, c) -> float:
        """Estimated seconds of one collective under this plan's cost model."""
        return self.cost_model.seconds(c)

    @property
    def total_bytes(self) -> int:
        """Bytes all collectives count."""
        return sum(c.bytes for c in self.collectives)

    def counts(self) -> dict:
        """``{(kind, axes): n}``. ``{("all_reduce", ("tp",)): 4}`` for megatron on 2 layers."""
        out: dict = {}
        for c in self.collectives:
            key = (c.kind.value, tuple(p.text(self.mesh) for p in c.axes))
            out[key] = out.get(key, 0) + 1
        return out

    def to_json(self, include_timing: bool = True) -> str:
        """Deterministic JSON (``include_timing=False`` drops ``plan_seconds`` for byte-identical output)."""
        data = {
            "mesh": str(self.mesh),
            "tensors": {n: str(s) for n, s in sorted(self.shardings.items())},
            "ops": [{"name": o.name, "target": o.target, "inputs": [str(s) for s in o.input_targets],
                     "outputs": [str(s) for s in o.outputs]} for o in self.ops],
            "collectives": [c.to_json(self.cost_model) for c in self.collectives],
            "total_seconds": self.total_seconds,
            "total_bytes": self.total_bytes,
            "verified": self.verified,
        }
        if include_timing:
            data["plan_seconds"] = self.plan_seconds
        if self.matched is not None:
            data["matched"] = self.matched
        from .stream import stream_plan

        data["streams"] = stream_plan(self).to_json()
        data.update(self._symbolic_json())
        data["ragged"] = self.ragged_rows()
        return json.dumps(data, indent=1, sort_keys=True)

    def stream_choices(self, flop_rate: float | None = None, ring: bool | None = None) -> tuple:
        """The stream overlaps this plan runs (``plan.stream.stream_plan``: each a move and the
        matmuls it feeds or is fed by, cut into chunks), at ``flop_rate`` (default: the plan's);
        ``ring``: with ring-style streams too (default: the plan's ``ring``, False unless set)."""
        from .stream import stream_choices

        return stream_choices(self, flop_rate, ring)

    def ragged_sources(self, tensor: str) -> tuple:
        """The mesh factors the rows of ragged ``tensor`` were routed from (its routing's token
        shards; () when routed whole)."""
        r = self.program.tensors[tensor].ragged
        for op, po in zip(self.program.ops, self.ops):
            mine = self.program.tensors[op.outputs[0]].ragged if op.outputs else None
            if canonical_op_name(op.target) == "route" and mine.counts == r.counts:
                return source_factors(po.outputs[0], mine)
        return ()

    def ragged_rows(self) -> dict:
        """Per tensor with a ragged dim: its ragged dim (``Ragged.to_json``) and the rows of it in
        the largest piece a device holds, expected and at most (``sharding.ragged.piece_rows``)."""
        from ..sharding.ragged import piece_rows, ragged_text

        out = {}
        for n, t in sorted(self.program.tensors.items()):
            if t.ragged is not None:
                exp, most = piece_rows(self.shardings[n], t.ragged)
                out[n] = {**t.ragged.to_json(), "sharding": ragged_text(self.shardings[n], t.ragged),
                          "expected_rows_per_device": exp, "max_rows_per_device": most}
        return out

    def _symbolic_json(self) -> dict:
        """``guards`` (text), ``symbols`` ({name: example}), ``shapes`` (every tensor: ints, and each
        symbolic extent as its expression text) and, once verified, ``verified_at``."""
        from ..program.symbols import shape_text

        prog = self.program
        out = {"guards": [str(g) for g in self.guards], "symbols": dict(prog.symbols),
               "shapes": {n: shape_text(prog.sym_shape(n)) for n in sorted(prog.tensors)}}
        if self.verified_at:
            out["verified_at"] = [dict(b) for b in self.verified_at]
        return out

    def _exported(self, convert) -> dict:
        out = {}
        for name in self.program.inputs():
            t = self.program.tensors[name]
            if t.kind not in ("param", "buffer"):
                continue
            try:
                out[name] = {"shape": list(t.shape), **convert(self.shardings[name])}
            except NotRepresentable as e:
                out[name] = {"shape": list(t.shape), "not_representable": str(e)}
        return out

    def to_dtensor(self) -> dict:
        """Per parameter and buffer: DTensor placements in DTensor's own reprs, one per mesh dim
        (``{"placements": ["Shard(dim=0)", "Replicate()"]}``), or ``{"not_representable": why}``
        when DTensor cannot say it (never approximated)."""
        from ..sharding.placements import dtensor_repr, parse_placement

        return self._exported(lambda s: {"placements": [dtensor_repr(parse_placement(p, s.ndim))
                                                        for p in s.to_placements()]})

    def to_partition_specs(self) -> dict:
        """Per parameter and buffer: a JAX PartitionSpec as JSON (a list per dim of None, an axis
        name, or a list of names; sub-axes in Shardy's ``"tp:(1)2"``), or ``{"not_representable": why}``."""
        def spec(s):
            return {"partition_spec": [list(e) if isinstance(e, tuple) else e for e in s.to_partition_spec()]}

        return self._exported(spec)

    def summary_json(self) -> str:
        """What a user sets up and pays for: the shardings of inputs, parameters and outputs, and the
        collectives (kind, axes, bytes), sorted. Equal for a builder model and its torch.export twin,
        whose graphs differ in how ops decompose."""
        prog = self.program
        data = {
            "mesh": str(self.mesh),
            "inputs": {n: str(self.shardings[n]) for n in sorted(prog.inputs())},
            "outputs": [str(self.shardings[n]) for n in prog.outputs],
            "collectives": sorted([c.kind.value, c.axes_text(), c.bytes] for c in self.collectives),
            "total_seconds": round(self.total_seconds, 12),
        }
        return json.dumps(data, indent=1, sort_keys=True)

    def verify(self, seed: int = 0, rtol: float = 1e-6, atol: float = 1e-6, mode: str = "classes",
               budget: int = DEFAULT_BUDGET, sizes=None) -> Verification:
        """Verify the plan (``execute.verify``). ``mode="classes"`` (default): an index-level proof
        for every rank plus a numeric run of one representative pair per rank class, with the
        ranks each reduces or gathers with — its cost does not grow with the mesh; ``mode="full"``:
        every rank simulated in numpy and every tensor compared with the unsharded run. The
        first tensor that fails is reported; ``budget`` bounds any generated array (elements).

        A symbolic program's plan is also verified at other sizes: ``sizes`` (bindings, e.g.
        ``[{"batch": 8}]``; default: two drawn from ``guards``, see ``plan.guards``), where the
        program is planned again with the same options, must make the same decisions and verify;
        the result (``SizedVerification``) lists the ``bindings`` verified. The plan of a repeated
        program (``plan.repeat``) is verified on its compressed form."""
        rep = self.repeated
        v = verify_plan(self if rep is None else rep[0], mode, seed, rtol, atol, budget)
        if rep is not None:  # the middle instances are instance 3's decisions renamed (plan.repeat.stable)
            v = replace(v, notes=v.notes + (
                f"repeated block {rep[1].prefix!r}: verified on the compressed program (instances 0-3 and the last "
                f"of {rep[1].count}); the other {len(rep[1].middle)} are instance 3's decisions renamed, each reading "
                "what instance 3 reads",))
        if self.program.symbols:
            from .guards import verify_sizes

            v = verify_sizes(self, v, sizes, seed=seed, rtol=rtol, atol=atol, mode=mode, budget=budget)
            self.verified_at = v.bindings
        self.verified = v.ok
        return v

    def _producer(self, tensor: str) -> str:
        return next((op.name for op in self.program.ops if tensor in op.outputs), "?")


def plan(program: Program, mesh: Mesh, pins: dict | None = None, cost_model: CostModel | None = None,
         backward: bool = True, style: str | None = None, uneven: bool = False, keep=(), **auto) -> Plan:
    """Plan ``program`` on ``mesh``; ``pins`` maps tensor names to Shardings (or their text).

    A forward pass chooses every op's strategy; then a backward pass gives each still
    unconstrained tensor (unpinned inputs, creation ops, intermediates) the sharding all its
    consumers slice it to, when that costs nothing, and the forward pass runs again with those
    inferred pins (nvFuser's propagation order: forward, then backward for what is left).
    ``style``: a built-in style's pins under ``pins``, or ``"auto"``: the minimum-step-time plan
    within ``memory_per_device`` (``plan.auto.auto_plan``; ``auto`` takes its options).
    A symbolic program is planned at its example sizes and the plan gets its ``guards``
    (``plan.guards``); ``uneven=True``: no divisibility guards (``E >= P`` instead), sizes that do
    not divide are claimed too, with torch.chunk's uneven shards. ``keep``: pinned tensors no
    collective may move (a style's promise, ``StylePins.kept``; ``style=`` keeps its own): an op
    takes its cheapest strategy that reads them where they are, or ``StyleConflict`` names it.
    ``plan(prog, Mesh.parse("tp=2"), {"w": "[8, tp*3]"}).shardings["y"] -> [4, tp*3]``
    """
    if not isinstance(program, Program):
        raise ProgramError(f"plan: program must be a Program, got {type(program).__name__}; build one with "
                           "ProgramBuilder, Program.from_json(text) or shardlayout.program.from_torch")
    mesh = as_mesh(mesh, "plan")
    user = pin_shardings(program, mesh, pins)
    keep = _check_keep(keep, user)
    p = None
    if program.repeated is not None and style is None and not auto and not program.symbols:
        from .repeat import plan_repeated

        p = plan_repeated(program, mesh, user, cost_model, backward, keep)
    if p is None:
        p = _plan(program, mesh, user, cost_model, backward, style, auto, keep=keep)
        _check_ragged_plan(p)
    p.uneven = bool(uneven)
    kept = keep or (p.options or {}).get("keep", frozenset())  # style=...: what the style's plan kept
    p.options = {"pins": user, "cost_model": cost_model, "backward": backward, "style": style, "auto": dict(auto),
                 "keep": kept}
    if program.symbols:
        from .guards import plan_guards

        p.guards = plan_guards(p, p.uneven)
    return p


def _check_keep(keep, pins: dict) -> frozenset:
    if isinstance(keep, str) or not all(isinstance(n, str) for n in keep):
        raise ShardingSpecError(f"plan: keep must be tensor names, got {keep!r}; e.g. keep={{'w1'}}")
    loose = sorted(set(keep) - set(pins))
    if loose:
        verb = "is" if len(loose) == 1 else "are"
        raise ShardingSpecError(f"plan: keep names {', '.join(map(repr, loose[:5]))}, which {verb} not pinned; a "
                                "tensor kept in place needs a pin saying where")
    return frozenset(keep)


def kept_views(program: Program, keep) -> frozenset:
    """``keep`` and the views made of kept tensors, transitively (a transposed expert weight is still
    the expert weight): what no collective may move once every view is made where its kept input
    is, as ``plan(..., keep=)`` holds them. ``kept_views(prog, ()) -> frozenset()``"""
    from ..program.blocks import VIEWS

    out = set(keep)
    if out:
        for op in program.ops:
            if (len(op.outputs) == 1 and op.inputs and type(op.inputs[0]) is str and op.inputs[0] in out
                    and canonical_op_name(op.target) in VIEWS):
                out.add(op.outputs[0])
    return frozenset(out)


def _moves_kept(op, args, targets, keep) -> list:
    """The kept inputs a strategy moves with a collective."""
    return [i for i, a, t in zip(op.inputs, args, targets) if type(i) is str and i in keep and type(a) is Sharding
            and t is not a and t != a and not is_local_move(a, t)]


def _ragged_fits(op, targets, outputs, tensors, routed: dict) -> bool:
    """Do an op's input targets and outputs cut every ragged dim only by its rows' sources?"""
    from ..sharding.nested import RaggedError
    from ..sharding.ragged import check_ragged

    for name, s in list(zip(op.inputs, targets)) + list(zip(op.outputs, outputs)):
        r = tensors[name].ragged if isinstance(name, str) else None
        if r is None or not isinstance(s, Sharding):
            continue
        try:
            check_ragged(s, r, name)
        except RaggedError:
            return False
        if not _is_subsequence(source_factors(s, r), routed.get(r.counts, ())):
            return False
    return True


def _fitting_candidate(p, op, args, tensors, routed: dict, keep):
    """The cheapest of the rule's priced strategies that cuts no ragged dim by an axis its rows did
    not come from (a factor-map rule does not know which dims are ragged) and moves no kept input
    with a collective. None fitting: ``StyleConflict`` when a kept input would move, else ``p``
    (``_check_ragged_plan`` then names the problem)."""
    def targets_of(c):
        return tuple(a if t is None else t for t, a in zip(c.input_targets, args))

    good = [c for c in p.candidates if not (keep and _moves_kept(op, args, targets_of(c), keep))
            and (not routed or _ragged_fits(op, targets_of(c), c.outputs, tensors, routed))]
    if not good:
        names = _moves_kept(op, args, p.input_targets, keep) if keep else []
        if not names:
            return p
        got = ", ".join(dict.fromkeys(f"{n} {a}" for n, a in zip(op.inputs, args) if n in names))
        them = "it" if len(names) == 1 else "them"
        raise StyleConflict(f"op {op.name} ({op.target}) cannot read {got} where the style keeps {them}: every "
                            f"strategy of the op moves {them} with a collective. Pin {them} differently (--pin), or "
                            "shard the op's other inputs to match")
    c = min(good, key=lambda c: c.cost)
    return replace(p, input_targets=targets_of(c), outputs=tuple(c.outputs), collectives=c.collectives,
                   local=c.local, notes=p.notes + (f"strategy {c.describe()}: the cheapest that keeps routed rows "
                                                   "whole and kept weights in place",))


def _is_subsequence(fs: tuple, of: tuple) -> bool:
    it = iter(of)
    return all(any(f == g for g in it) for f in fs)


def _check_ragged_plan(p: "Plan") -> None:
    """Every sharding a ragged tensor takes cuts its ragged dim only by the sources it was routed
    from (or not at all): a ragged dim cannot be cut evenly like a dense one (its rows per
    expert are known only at run time). Raises RaggedError naming the tensor and the fix."""
    from ..sharding.nested import RaggedError
    from ..sharding.ragged import check_ragged, source_factors

    prog = p.program
    if not any(t.ragged is not None for t in prog.tensors.values()):
        return
    sources = {}
    for op, po in zip(prog.ops, p.ops):
        if canonical_op_name(op.target) == "route":
            r = prog.tensors[op.outputs[0]].ragged
            sources[r.counts] = source_factors(po.outputs[0], r)
    seen = [(o, s, po.name) for po in p.ops for o, s in zip(po.inputs, po.input_targets) if isinstance(o, str)]
    seen += [(o, s, po.name) for op, po in zip(prog.ops, p.ops) for o, s in zip(op.outputs, po.outputs)]
    seen += [(n, s, None) for n, s in p.shardings.items()]
    for name, s, opname in seen:
        r = prog.tensors[name].ragged
        if r is None or not isinstance(s, Sharding):
            continue
        check_ragged(s, r, name)
        got, want = source_factors(s, r), sources.get(r.counts, ())
        if got and not _is_subsequence(got, want):
            where = f" (op {opname}'s strategy)" if opname else ""
            raise RaggedError(f"tensor {name}: the plan cuts its ragged dim {r.dim} by "
                              f"{', '.join(f.axis for f in got)}{where}, but its rows come from the token shards on "
                              f"{', '.join(f.axis for f in want) or 'no axis'}; routed rows cannot be cut evenly "
                              "(their counts are known at run time only), and tensor parallelism over routed tokens "
                              "is not supported yet: shard the tokens on that axis too, or pin the tensor with its "
                              "ragged dim whole")


def _plan(program: Program, mesh: Mesh, user: dict, cost_model, backward: bool, style, auto: dict,
          weigh=None, keep: frozenset = frozenset()) -> Plan:
    """``plan`` itself, without guards: ``user`` pins are Shardings; ``weigh``: a plan's total
    where plans are compared (default ``Plan.total_seconds``; ``plan.repeat`` counts the
    instances a compressed program leaves out)."""
    if style is not None or auto:
        from .auto import plan_style

        return plan_style(program, mesh, style, user, cost_model, **auto)
    t0 = time.perf_counter()
    cm = cost_model or DEFAULT_COST_MODEL
    weigh = weigh or (lambda p: p.total_seconds)
    _check_pins(program, user)
    inferred: dict = {}
    with paused_gc():
        for _ in range(8 if backward else 1):
            wanted: dict | None = {} if backward else None
            p = _forward(program, mesh, {**inferred, **user}, cm, wanted, keep)
            if not backward:
                break
            new = _infer_backward(program, p, set(user) | set(inferred), wanted)
            if not new:
                break
            inferred.update(new)
        for _ in range(4 if backward else 0):
            hoisted = _hoist_moves(program, p, set(user) | set(inferred), cm)
            if not hoisted:
                break
            q = _forward(program, mesh, {**inferred, **hoisted, **user}, cm, None, keep)
            if weigh(q) >= weigh(p):
                break
            inferred.update(hoisted)
            p = q
    p.plan_seconds = time.perf_counter() - t0
    return p


def _hoist_moves(program: Program, p: "Plan", pinned: set, cm: CostModel) -> dict:
    """Pins that move a value earlier: where a tensor moves for its consumer and it was made by
    a chain of shape-keeping row-wise ops (casts, activations, products with what already has the
    target sharding), the cheapest tensor of the chain to move instead — a bf16 expert output
    moved before its cast to float32 costs half; GPT-OSS's expert rows moved back before their
    routing weights scale them, the weights then never move. The chain stops below an op with an
    operand made where the chain runs (an expert's bias, sharded like the rows): above it, that
    operand would move too. Tried by ``_plan``, kept only when the whole
    plan is cheaper."""
    from ..ops.ragged import ROWWISE

    if not any(any(c.kind.communicates for c in chain) for chain in p.moves.values()):
        return {}
    made_by, users = _producers_users(program)
    ops = program.ops

    def producer_of(t):
        k = made_by.get(t)
        return None if k is None else ops[k]

    moved_for = {}  # op name -> the inputs it moves (communicating)
    for c in p.collectives:
        moved_for.setdefault(c.op, set()).add(c.tensor)
    out = {}
    for (name, tgt), chain in p.moves.items():
        if not any(c.kind.communicates for c in chain) or name in pinned or tgt.partial:
            continue
        op = producer_of(name)
        if op is None or canonical_op_name(op.target) not in ROWWISE or len(op.outputs) != 1:
            continue  # nothing to hoist above
        best, best_cost = None, cost(chain, cm)
        cur, saves = name, False
        for _ in range(8):
            op = producer_of(cur)
            if op is None or canonical_op_name(op.target) not in ROWWISE or len(op.outputs) != 1:
                break
            ups = [i for i in op.inputs if isinstance(i, str) and program.tensors[i].shape == tgt.shape]
            if len(ups) != 1 or len(users.get(ups[0], ())) != 1 or ups[0] in pinned:
                break
            if any(i != ups[0] and i not in moved_for.get(op.name, ()) and
                   (p.shardings[i].axes_used() or p.shardings[i].partial) for i in op.inputs if isinstance(i, str)):
                break  # an operand made where the chain runs (an expert's bias): above this op it would move
            # an operand moved only for this op (scores to the experts' side) need not move if the op runs there
            saves = saves or bool(moved_for.get(op.name, set()) - {ups[0]})
            cur = ups[0]
            src = p.shardings[cur]
            if src.partial:
                break
            there = Sharding(tgt.mesh, tgt.shape, list(tgt.dims), ())
            c = cost(plan_move(src, there, program.tensors[cur].dtype, cm), cm)
            if c < best_cost or (saves and c == best_cost):
                best, best_cost = (cur, there), c
        if best is not None:
            out[best[0]] = best[1]
    return out


def _producers_users(program: Program) -> tuple:
    """``({tensor: index of the op making it}, {tensor: [index of the op reading it, per read]})`` (runtime
    asserts, which read no values, not listed); once per Program, shared by the planner and the
    stream search."""
    _op_table(program)  # made with the op table
    return program.__dict__["_producers_users"]


def pin_shardings(program: Program, mesh: Mesh, pins, where: str = "plan") -> dict:
    """``{tensor name: Sharding}`` of ``pins`` (a dict of Shardings or their text), each pin a
    Sharding on ``mesh``; anything else a ShardingSpecError naming the pin and what it got.
    ``pin_shardings(prog, Mesh.parse("tp=2"), {"w": "[8, tp*3]"})["w"].shape -> (8, 6)``"""
    if pins is None:
        return {}
    if not isinstance(pins, Mapping):
        raise ShardingSpecError(f"{where}: pins must be a dict of tensor name -> Sharding (or its text), got "
                                f"{type(pins).__name__}; e.g. {{'x': '[dp*4, 12]'}}")
    out = {}
    for k, v in pins.items():
        if type(v) is not Sharding:
            if not isinstance(k, str):
                raise ShardingSpecError(f"{where}: pin key {reprlib.repr(k)} ({type(k).__name__}) is not a tensor "
                                        "name; key each pin by its tensor's name (a str)")
            if isinstance(v, str):
                try:
                    v = Sharding.parse(v, mesh)
                except ShardingError as e:
                    raise _renamed(e, f"pin {k!r}: {e}") from None
            elif not isinstance(v, Sharding):
                t = program.tensors.get(k)
                eg = f"'{Sharding(mesh, t.shape)}'" if t is not None else "'[dp*4, 12]'"
                raise ShardingSpecError(f"{where}: pin {k!r} is {reprlib.repr(v)} ({type(v).__name__}), not a "
                                        f"sharding; give a Sharding or its text, e.g. {{{k!r}: {eg}}}")
        if v.mesh != mesh:
            raise MeshError(f"{where}: pin {k!r} ({v}) is on mesh {v.mesh}, the plan is on mesh {mesh}; make the pin "
                            "on the plan's mesh (or pass its text)")
        if v.stream:
            raise ShardingSpecError(f"{where}: pin {k!r} ({v}) has a stream factor ~{v.stream[2]}; a pin places a "
                                    f"tensor and the plan chooses its streams: pin {v.without_stream()}")
        out[k] = v
    return out


def _renamed(e: ShardingError, message: str) -> ShardingError:
    """``e``'s class with another message (a ShardingSpecError when that class needs more)."""
    try:
        return type(e)(message)
    except TypeError:
        return ShardingSpecError(message)


def _check_pins(program: Program, pins: dict) -> None:
    for name, s in pins.items():
        if name not in program.tensors:
            raise ShardingError(f"pin {name!r}: the program has no such tensor")
        if s.shape != program.tensors[name].shape:
            raise ShardingError(
                f"pin {name!r}: sharding {s} has shape {s.shape}, the tensor has {program.tensors[name].shape}"
            )


def _infer_backward(program: Program, p: "Plan", pinned: set, wanted: dict | None = None) -> dict:
    """Unpinned tensors whose consumers all slice them (for free) to one sharding. ``wanted``:
    tensor -> the one target its consumers want (None: more than one), as ``_forward`` collects it."""
    if wanted is None:
        wanted = {}
        for po in p.ops:
            _want(wanted, po.inputs, po.input_targets)
    out = {}
    for name, tgt in wanted.items():
        if tgt is None or name in pinned:
            continue
        cur = p.shardings[name]
        if tgt is not cur and tgt != cur and not tgt.partial and not any(
                c.kind.communicates for c in p.moves.get((name, tgt), ())):
            out[name] = tgt
    return out


_NONE = object()


def _want(wanted: dict, names: tuple, targets: tuple) -> None:
    """Record the targets an op's consumers want of its input tensors (``_infer_backward``)."""
    for i, tgt in zip(names, targets):
        if type(i) is str and type(tgt) is Sharding:
            got = wanted.get(i, _NONE)
            if got is _NONE:
                wanted[i] = tgt
            elif got is not None and got is not tgt and got != tgt:
                wanted[i] = None


def _op_table(program: Program) -> tuple:
    """Per op, what does not depend on the mesh or the pins: the OpDef, params as a dict and as
    a memo key, the operand dtypes, and its kind (``_PLAIN``; ``_CREATION``: no tensor input and
    a mesh param; ``_UNROUTE`` of a ragged tensor; ``_ROUTE`` to a ragged tensor). Computed once
    per Program (programs are immutable); the part shared by ops of one target and params (a
    model's layers) once per process. Also the program's inputs."""
    table = program.__dict__.get("_op_table")
    if table is None:
        tensors, rows, known, interned = program.tensors, [], _ROWS.get, _DTYPES.setdefault
        producer: dict = {}
        users: dict = {}
        for k, op in enumerate(program.ops):
            ins, outs = op.inputs, op.outputs
            try:
                row = known((op.target, op.params)) or _op_row(op.target, op.params)
            except TypeError:  # params built by hand with a list in them: not shared
                row = _op_row(op.target, op.params, memo=False)
            opdef, kw, typed, has_mesh = row
            dts, n_tensors = [], 0
            for i in ins:
                if type(i) is str:
                    dts.append(tensors[i].dtype)
                    n_tensors += 1
                    if outs:  # a runtime assert reads no values
                        readers = users.get(i)
                        if readers is None:
                            users[i] = [k]
                        else:  # an op reading a tensor twice is listed twice
                            readers.append(k)
                else:
                    dts.append("float32")
            for o in outs:
                producer[o] = k
                dts.append(tensors[o].dtype)
            dtypes = tuple(dts)
            dtypes = interned(dtypes, dtypes)  # one object per signature: memo probes compare by identity
            kind = _PLAIN
            if has_mesh and not n_tensors:  # no tensor input
                kind, typed = _CREATION, None
            elif n_tensors == len(ins) and typed is not None:
                kind = _PLAIN_TENSORS
            if kind != _CREATION and opdef.name in ("route", "unroute"):
                first = tensors[ins[0]] if ins and type(ins[0]) is str else None
                if opdef.name == "unroute" and first is not None and first.ragged is not None:
                    kind = _UNROUTE
                elif outs and tensors[outs[0]].ragged is not None and opdef.name == "route":
                    kind = _ROUTE
            rows.append((op, opdef, kw, typed, dtypes or "float32", kind))
        table = (tuple(rows), tuple(n for n in tensors if n not in producer))
        object.__setattr__(program, "_op_table", table)
        object.__setattr__(program, "_producers_users", (producer, users))
    return table


_PLAIN, _CREATION, _UNROUTE, _ROUTE, _PLAIN_TENSORS = 0, 1, 2, 3, 4  # _PLAIN_TENSORS: tensor inputs only


def _op_row(target: str, params: tuple, memo: bool = True) -> tuple:
    """``(OpDef, params dict, params memo key or None, has a mesh param)`` of an op's target and
    params (``memo``: shared by every op of that target and params)."""
    opdef = get_op(target)
    kw = {k: v for k, v in params}
    typed = _typed(kw)
    try:
        hash(typed)
    except TypeError:  # an unhashable param (a list of lists): resolved and validated every time
        typed = None
    row = (opdef, kw, typed, opdef.signature.param("mesh") is not None)
    if memo:
        if len(_ROWS) >= 1 << 14:
            _ROWS.clear()
        _ROWS[(target, params)] = row
    return row


_ROWS: dict = {}
register_clearer("shardlayout.plan._ROWS", _ROWS.clear, _ROWS.__len__)
_DTYPES: dict = {}  # interned operand-dtype tuples (a handful per process)
register_clearer("shardlayout.plan._DTYPES", _DTYPES.clear, _DTYPES.__len__)


def _forward(program: Program, mesh: Mesh, pins: dict, cm: CostModel, wanted: dict | None = None,
             keep: frozenset = frozenset()) -> "Plan":
    """One forward pass: every op's strategy given ``pins``; ``wanted`` (a dict) collects what
    each tensor's consumers want of it (``_infer_backward``); ``keep``: pinned inputs no strategy
    may move with a collective (``_fitting_candidate``), and so the views made of them where they are
    (a transposed expert weight is still the expert weight)."""
    t0 = time.perf_counter()
    same: dict = {}  # equal pins become one object, so memo probes compare by identity
    pins = {k: same.setdefault(v, v) for k, v in pins.items()}
    pinned = pins.get
    table, inputs = _op_table(program)
    shard: dict = {}
    whole: dict = {}  # shape -> its replicated Sharding, one object per shape
    for name in inputs:
        s = pinned(name)
        if s is None:
            shape = program.tensors[name].shape
            s = whole.get(shape)
            if s is None:
                s = whole[shape] = Sharding(mesh, shape)
        shard[name] = s
    moves: dict = {}
    collectives: list = []
    planned: list = []
    add = planned.append
    tensors = program.tensors
    routed: dict = {}  # a routing's counts -> the source factors its rows were routed from

    def move(tensor, src, dst, opname):
        key = (tensor, dst)
        if key in moves:
            return
        moves[key] = plan_move(src, dst, tensors[tensor].dtype, cm)
        r = tensors[tensor].ragged
        if r is not None:  # the executors split its rows by the routing's sources
            moves[key] = tuple(replace(c, ragged=(r.dim, routed.get(r.counts, ()))) for c in moves[key])
        collectives.extend(c.attributed(tensor, opname) for c in moves[key] if c.kind.communicates)

    seen, subaxes, typed_key, cm_key = _SEEN.get, settings.subaxes, _typed, cost_key(cm)
    want = None if wanted is None else wanted.get
    if keep:
        from ..program.blocks import VIEWS

        keep = set(keep)
    for op, opdef, kw, typed, dtypes, kind in table:
        ins, outs = op.inputs, op.outputs
        out_pins = (pinned(outs[0]),) if len(outs) == 1 else tuple([pinned(o) for o in outs])
        if kind == _PLAIN_TENSORS:  # the fast path of OpDef.resolve: a call seen before is one probe
            args = tuple([shard[i] for i in ins])
            hit = seen((opdef, args, typed, out_pins, cm_key, dtypes, subaxes))
        else:
            args = tuple([shard[i] if type(i) is str else i for i in ins])
            hit = None
            if kind == _PLAIN and typed is not None:  # constants among the inputs: OpDef.resolve's own probe
                try:
                    hit = seen((opdef, typed_key(args), typed, out_pins, cm_key, dtypes, subaxes))
                except TypeError:  # an unhashable constant: no memo, OpDef.resolve below validates it
                    hit = None
        if hit is not None:
            p, params = hit[0], dict(hit[1])
        else:
            if kind == _CREATION:
                kw = {**kw, "mesh": mesh}  # creation ops: replicated (consumers slice them for free)
            elif kind == _UNROUTE:  # combine where routed from
                kw, typed = {**kw, "routed": routed.get(tensors[ins[0]].ragged.counts, ())}, None
            try:
                p, params = opdef.resolve(args, kw, out_pins, cm, dtypes, typed)
            except ShardingError as e:
                raise type(e)(f"op {op.name} ({op.target}): {e}") from None
        if kind == _ROUTE:
            r = tensors[outs[0]].ragged
            routed[r.counts] = source_factors(p.outputs[0], r)
        if (kind != _ROUTE and routed and not _ragged_fits(op, p.input_targets, p.outputs, tensors, routed)) or \
                (keep and _moves_kept(op, args, p.input_targets, keep)):
            p = _fitting_candidate(p, op, args, tensors, routed if kind != _ROUTE else {}, keep)
        if keep:
            if (len(outs) == 1 and ins and type(ins[0]) is str and ins[0] in keep and p.input_targets[0] == args[0]
                    and canonical_op_name(op.target) in VIEWS):
                keep.add(outs[0])
        targets, made = p.input_targets, p.outputs
        if wanted is not None:
            for i, tgt in zip(ins, targets):
                if type(tgt) is Sharding and type(i) is str:
                    got = want(i, _NONE)
                    if got is not tgt:
                        if got is _NONE:
                            wanted[i] = tgt
                        elif got is not None and got != tgt:
                            wanted[i] = None
        if targets != args:  # identical elements compare by identity: most ops move nothing
            for i, a, tgt in zip(ins, args, targets):
                if tgt is not a and type(a) is Sharding and tgt != a:
                    move(i, a, tgt, op.name)
        if len(outs) == 1 and out_pins[0] is None:
            shard[outs[0]] = made[0]
        else:
            for o, s in zip(outs, made):
                final = pinned(o, s)
                if final is not s and final != s:
                    move(o, s, final, op.name)
                shard[o] = final
        add(_planned(op.name, op.target, ins, tuple(targets), tuple(made), params, p.local))
    return Plan(program, mesh, shard, planned, collectives, time.perf_counter() - t0, moves, cm)


__all__ = ["Plan", "PlannedOp", "Verification", "kept_views", "plan"]
