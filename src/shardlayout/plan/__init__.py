"""Whole-program planning: every tensor's sharding, every op's strategy, every collective.

``plan(program, mesh, pins)`` walks the ops in order. Pinned tensors keep their sharding
(an op whose output is pinned chooses its strategy knowing it); every other tensor takes
what its op's rule chooses. A redistribution of one tensor to one target is done once and
shared by its consumers. ``Plan.verify()`` runs the program on every rank in numpy (the
planned collectives included) and compares each tensor with the unsharded run.

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
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import ShardingError
from ..mesh import Mesh
from ..program import Program
from ..propagation import propagate
from ..sharding import Sharding
from ..sharding.redistribute import DEFAULT_COST_MODEL, CostModel, plan_redistribution, run_plan


@dataclass(frozen=True)
class Collective:
    """One collective of a plan: which tensor moves for which op, how, and what it costs."""

    kind: str
    axes: tuple
    bytes: int
    seconds: float
    tensor: str
    op: str
    src: str
    dst: str

    def to_json(self) -> dict:
        """JSON-able form."""
        return {"kind": self.kind, "axes": list(self.axes), "bytes": self.bytes, "seconds": self.seconds,
                "tensor": self.tensor, "op": self.op, "from": self.src, "to": self.dst}


@dataclass(frozen=True)
class PlannedOp:
    """An op with its input targets and output shardings."""

    name: str
    target: str
    inputs: tuple
    input_targets: tuple
    outputs: tuple


@dataclass
class Verification:
    """Result of ``Plan.verify``: ``ok``, and the first tensor that differs (if any)."""

    ok: bool
    checked: int
    first_mismatch: str | None = None
    max_error: float = 0.0


@dataclass
class Plan:
    """Shardings of every tensor, strategies of every op, every collective and the totals."""

    program: Program
    mesh: Mesh
    shardings: dict
    ops: list
    collectives: list
    plan_seconds: float
    steps: dict = field(default_factory=dict, repr=False)  # (tensor, target) -> redistribution steps
    verified: bool | None = None

    @property
    def total_seconds(self) -> float:
        """Estimated seconds of all collectives."""
        return sum(c.seconds for c in self.collectives)

    @property
    def total_bytes(self) -> int:
        """Bytes all collectives count."""
        return sum(c.bytes for c in self.collectives)

    def counts(self) -> dict:
        """``{(kind, axes): n}``. ``{("all_reduce", ("tp",)): 4}`` for megatron on 2 layers."""
        out: dict = {}
        for c in self.collectives:
            out[(c.kind, c.axes)] = out.get((c.kind, c.axes), 0) + 1
        return out

    def to_json(self, include_timing: bool = True) -> str:
        """Deterministic JSON (``include_timing=False`` drops ``plan_seconds`` for byte-identical output)."""
        data = {
            "mesh": str(self.mesh),
            "tensors": {n: str(s) for n, s in sorted(self.shardings.items())},
            "ops": [{"name": o.name, "target": o.target, "inputs": [str(s) for s in o.input_targets],
                     "outputs": [str(s) for s in o.outputs]} for o in self.ops],
            "collectives": [c.to_json() for c in self.collectives],
            "total_seconds": self.total_seconds,
            "total_bytes": self.total_bytes,
            "verified": self.verified,
        }
        if include_timing:
            data["plan_seconds"] = self.plan_seconds
        return json.dumps(data, indent=1, sort_keys=True)

    def summary_json(self) -> str:
        """What a user sets up and pays for: the shardings of inputs, parameters and outputs, and the
        collectives (kind, axes, bytes), sorted. Equal for a builder model and its torch.export twin,
        whose graphs differ in how ops decompose."""
        prog = self.program
        data = {
            "mesh": str(self.mesh),
            "inputs": {n: str(self.shardings[n]) for n in sorted(prog.inputs())},
            "outputs": [str(self.shardings[n]) for n in prog.outputs],
            "collectives": sorted([c.kind, list(c.axes), c.bytes] for c in self.collectives),
            "total_seconds": round(self.total_seconds, 12),
        }
        return json.dumps(data, indent=1, sort_keys=True)

    def verify(self, seed: int = 0, rtol: float = 1e-6, atol: float = 1e-6) -> Verification:
        """Run the program on every rank (numpy) and compare every tensor with the unsharded run."""
        from .execute import run_op

        rng = np.random.default_rng(seed)
        prog = self.program
        ref, pieces = {}, {}
        for name in prog.inputs():
            t = prog.tensors[name]
            ref[name] = rng.standard_normal(t.shape) if t.shape else np.asarray(rng.standard_normal())
            pieces[name] = self.shardings[name].shard(ref[name])
        checked = 0
        for op, po in zip(prog.ops, self.ops):
            kw = op.kwargs()
            args = [ref[i] if isinstance(i, str) else i for i in op.inputs]
            outs = run_op(op.target, args, kw, [prog.tensors[o].shape for o in op.outputs])
            for o, v in zip(op.outputs, outs):
                ref[o] = v
            local_in = []
            for i, tgt in zip(op.inputs, po.input_targets):
                if not isinstance(i, str):
                    local_in.append(i)
                    continue
                cur = self.shardings[i]
                local_in.append(pieces[i] if cur == tgt else run_plan(self.steps[(i, tgt)], pieces[i]))
            per_rank = {}
            for r in self.mesh.ranks():
                a = [x[r] if isinstance(x, dict) else x for x in local_in]
                per_rank[r] = run_op(op.target, a, kw, [s.local_shape(r) for s in po.outputs])
            for k, (o, s) in enumerate(zip(op.outputs, po.outputs)):
                got = {r: np.asarray(per_rank[r][k]) for r in self.mesh.ranks()}
                final = self.shardings[o]
                if final != s:
                    got = run_plan(self.steps[(o, final)], got)
                pieces[o] = got
                try:
                    whole = final.unshard(got, tolerance=1e-6)
                except ShardingError as e:
                    self.verified = False
                    return Verification(False, checked, f"{o} (op {op.name}): {e}")
                err = float(np.max(np.abs(whole - ref[o]))) if whole.size else 0.0
                checked += 1
                if not np.allclose(whole, ref[o], rtol=rtol, atol=atol):
                    self.verified = False
                    return Verification(False, checked, f"{o} (op {op.name}, sharding {final})", err)
        self.verified = True
        return Verification(True, checked)


def plan(program: Program, mesh: Mesh, pins: dict | None = None, cost_model: CostModel | None = None,
         backward: bool = True) -> Plan:
    """Plan ``program`` on ``mesh``; ``pins`` maps tensor names to Shardings (or their text).

    A forward pass chooses every op's strategy; then a backward pass gives each still
    unconstrained tensor (unpinned inputs, creation ops, intermediates) the sharding all its
    consumers slice it to, when that costs nothing, and the forward pass runs again with those
    inferred pins (nvFuser's propagation order: forward, then backward for what is left).
    """
    t0 = time.perf_counter()
    cm = cost_model or DEFAULT_COST_MODEL
    user = {k: (Sharding.parse(v, mesh) if isinstance(v, str) else v) for k, v in (pins or {}).items()}
    _check_pins(program, user)
    inferred: dict = {}
    for _ in range(8 if backward else 1):
        p = _forward(program, mesh, {**inferred, **user}, cm)
        if not backward:
            break
        new = _infer_backward(program, p, set(user) | set(inferred))
        if not new:
            break
        inferred.update(new)
    p.plan_seconds = time.perf_counter() - t0
    return p


def _check_pins(program: Program, pins: dict) -> None:
    for name, s in pins.items():
        if name not in program.tensors:
            raise ShardingError(f"pin {name!r}: the program has no such tensor")
        if s.shape != program.tensors[name].shape:
            raise ShardingError(
                f"pin {name!r}: sharding {s} has shape {s.shape}, the tensor has {program.tensors[name].shape}"
            )


def _infer_backward(program: Program, p: "Plan", pinned: set) -> dict:
    """Unpinned tensors whose consumers all slice them (for free) to one sharding."""
    wanted: dict = {}
    for po in reversed(p.ops):
        for i, tgt in zip(po.inputs, po.input_targets):
            if isinstance(i, str) and isinstance(tgt, Sharding):
                wanted.setdefault(i, set()).add(tgt)
    out = {}
    for name, targets in wanted.items():
        if name in pinned or len(targets) != 1:
            continue
        (tgt,) = targets
        cur = p.shardings[name]
        if tgt != cur and all(st.kind == "local" for st in p.steps.get((name, tgt), [])) and not tgt.partial:
            out[name] = tgt
    return out


def _forward(program: Program, mesh: Mesh, pins: dict, cm: CostModel) -> "Plan":
    t0 = time.perf_counter()
    shard: dict = {}
    for name in program.inputs():
        shard[name] = pins.get(name) or Sharding(mesh, program.tensors[name].shape)
    steps: dict = {}
    collectives: list = []
    planned: list = []

    def move(tensor, src, dst, opname):
        key = (tensor, dst)
        if key in steps:
            return
        st = plan_redistribution(src, dst, cm, program.tensors[tensor].dtype)
        steps[key] = st
        for x in st:
            if x.kind != "local":
                collectives.append(Collective(x.kind, x.axes, x.bytes, x.seconds, tensor, opname,
                                              str(x.src), str(x.dst)))

    for op in program.ops:
        args = [shard[i] if isinstance(i, str) else i for i in op.inputs]
        out_pins = [pins.get(o) for o in op.outputs]
        kw = op.kwargs()
        if not any(isinstance(a, Sharding) for a in args):
            kw["mesh"] = mesh  # creation ops: replicated (consumers slice them for free)
        try:
            p = propagate(op.target, args, out_pins=out_pins, cost_model=cm, **kw)
        except ShardingError as e:
            raise type(e)(f"op {op.name} ({op.target}): {e}") from None
        targets = []
        aligned = len(p.input_targets) == len(args)
        it = iter(p.input_targets if aligned else [t for t in p.input_targets])
        for i, a in zip(op.inputs, args):
            tgt = next(it) if aligned else None
            if isinstance(a, Sharding):
                tgt = tgt if aligned else next(it)
                if tgt != a:
                    move(i, a, tgt, op.name)
                targets.append(tgt)
            else:
                targets.append(a)
        for o, s in zip(op.outputs, p.outputs):
            final = pins.get(o, s)
            if final != s:
                move(o, s, final, op.name)
            shard[o] = final
        planned.append(PlannedOp(op.name, op.target, tuple(op.inputs), tuple(targets), tuple(p.outputs)))
    return Plan(program, mesh, shard, planned, collectives, time.perf_counter() - t0, steps)


__all__ = ["Collective", "Plan", "PlannedOp", "Verification", "plan"]
