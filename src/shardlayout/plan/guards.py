"""The guards of a plan of a symbolic program, and its verification at other sizes.

A plan is made at the program's example sizes. Its decisions — which mesh axes shard which dim,
in which order, which axes hold partial sums, which collectives run on which axes — hold at other
sizes under conditions, its **guards** (``plan_guards``): the program's own facts (ranges,
asserts, specialisations) and, for every tensor dim whose symbolic extent E is sharded on
mesh-axis factors of total size P (in a tensor's sharding or in a target an op redistributes it
to), ``E % P == 0``, so every shard has the same size. With ``uneven=True`` no divisibility guard
is added: at sizes that do not divide, shards follow ``torch.chunk`` (ceil-sized chunks, the
trailing ranks short or empty), as DTensor's ``Shard`` does, and the plan claims its decisions
for those sizes too, as long as ``E >= P`` (that guard replaces the divisibility one: a smaller
extent is not cut P ways at all, e.g. an extent of 1 loses its mesh axis, and the plan's
decisions change there). A dim whose example extent is already uneven gets no divisibility guard:
the plan was made for uneven chunks there.

Guards are conditions, not a proof: ``verify_sizes`` re-plans the program at other bindings
drawn from the guards (``FactBase.sample``; with ``uneven``, at least one that does not divide
when there is one), checks that the plan makes the same decisions (``decisions``) and verifies
each of those plans.

    >>> from shardlayout import Mesh
    >>> from shardlayout.plan import plan
    >>> from shardlayout.program import ProgramBuilder
    >>> b = ProgramBuilder(symbols={"batch": 4})
    >>> x = b.input("x", ("batch", 8)); w = b.param("w", (8, 2)); b.output(b.op("mm", [x, w], name="y"))
    >>> m = Mesh.parse("dp=2")
    >>> p = plan(b.build(), m, {"x": "[dp*2, 8]"})
    >>> [str(g) for g in p.guards], p.verify().ok
    (['batch % 2 == 0'], True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ..errors import NotRepresentable, ShardingError
from ..execute.verify import DEFAULT_BUDGET, Verification
from ..execute.verify import verify as verify_plan
from ..program.symbols import bindings_text
from ..sharding import Sharding
from ..symbolic import FactBase, Guard, is_symbolic


class GuardError(ShardingError):
    """A plan that cannot be carried to other sizes (a pin no size-independent notation says)."""


@dataclass(frozen=True)
class SizedVerification(Verification):
    """A ``Verification`` of a symbolic program's plan, with the ``bindings`` it was verified at
    (tuples of ``(symbol, value)``, the example first) and, when it failed at other sizes, the
    ``reason``: "decisions" (the plan differs there), "error" (it cannot be made there) or
    "mismatch" (it does not verify there)."""

    bindings: tuple = ()
    reason: str = ""

    def bindings_text(self) -> str:
        """``'batch=4, seq=16 (example); batch=8, seq=12'``."""
        parts = [bindings_text(dict(b)) for b in self.bindings]
        if parts:
            parts[0] += " (example)"
        return "; ".join(parts)


# ------------------------------------------------------------------------------------------
# guards
# ------------------------------------------------------------------------------------------


def _mesh_size(dim) -> int:
    """Total size of the mesh-axis factors (or DTensor steps) of one dim."""
    return math.prod(f.size for f in dim if getattr(f, "axis", None) is not None)


def _sharded(plan):
    """``(tensor, Sharding)`` of every tensor's sharding and every target an op reads it as."""
    for name, s in plan.shardings.items():
        yield name, s
    for po in plan.ops:
        for i, t in zip(po.inputs, po.input_targets):
            if isinstance(i, str) and isinstance(t, Sharding):
                yield i, t
    prog_ops = plan.program.ops
    if len(prog_ops) == len(plan.ops):
        for op, po in zip(prog_ops, plan.ops):
            for o, s in zip(op.outputs, po.outputs):
                if isinstance(s, Sharding):
                    yield o, s


def divisibility_guards(plan) -> tuple:
    """``E % P == 0`` for every symbolic extent E sharded on mesh factors of total size P whose
    example divides: ``divisibility_guards(p) -> (Guard.parse('batch % 2 == 0'),)``."""
    prog = plan.program
    example = prog.example
    out = {}
    for name, s in _sharded(plan):
        shape = prog.sym_shape(name)
        if len(shape) != len(s.dims):
            continue
        for e, dim in zip(shape, s.dims):
            if not is_symbolic(e):
                continue
            p = _mesh_size(dim)
            if p > 1 and e.evaluate(example) % p == 0:
                g = Guard.divisible(e, p)
                out.setdefault(str(g), g)
    return tuple(out[k] for k in sorted(out))


def extent_guards(plan) -> tuple:
    """``E >= P`` for every symbolic extent E sharded on mesh factors of total size P (the
    condition of an uneven plan; ``E >= e`` when the example's extent e is below P, so the
    example always holds): ``extent_guards(p) -> (Guard.parse('batch >= 2'),)``."""
    prog = plan.program
    out = {}
    for name, s in _sharded(plan):
        shape = prog.sym_shape(name)
        if len(shape) == len(s.dims):
            for e, dim in zip(shape, s.dims):
                p = _mesh_size(dim)
                lo = min(p, e.evaluate(prog.example)) if is_symbolic(e) else 1
                if p > 1 and lo > 1:  # as sharded as at the example (never a guard it fails)
                    g = Guard.range(e, lo, None)
                    out.setdefault(str(g), g)
    return tuple(out[k] for k in sorted(out))


RESIZES = ("slice", "narrow", "split", "split_with_sizes", "chunk", "cat", "concat", "concatenate",
           "slice_backward")


def resize_guards(plan) -> tuple:
    """``E == example`` for the symbolic extents along the cut dim of every slice / split / cat
    that runs on each rank's own shard (``ops.resize``): whether the cut falls on the shards
    depends on the sizes, so the plan claims it at the example's only (specialised, and said).
    ``resize_guards(p) -> (Guard.parse('seq == 16'),)``"""
    prog = plan.program
    out = {}
    for op, po in zip(prog.ops, plan.ops):
        base = po.target.split("::")[-1].replace("aten.", "").split(".")[0]
        if base not in RESIZES:
            continue
        d = dict(op.params).get("dim", 0)
        tensors = [(i, t) for i, t in zip(op.inputs, po.input_targets) if isinstance(i, str)] + \
            list(zip(op.outputs, po.outputs))
        for _, s in tensors:
            if not isinstance(s, Sharding) or not s.ndim:
                continue
            dd = d % s.ndim
            if not any(getattr(f, "axis", None) is not None for f in s.dims[dd]):
                continue
            for other, _ in tensors:
                e = prog.sym_shape(other)[dd] if len(prog.sym_shape(other)) > dd else None
                if is_symbolic(e):
                    g = Guard.eq(e, e.evaluate(prog.example))
                    out.setdefault(str(g), g)
            break
    return tuple(out[k] for k in sorted(out))


def plan_guards(plan, uneven: bool = False) -> tuple:
    """The guards under which ``plan``'s decisions hold at every size: the program's facts plus
    the divisibility guards (``uneven``: the ``E >= P`` guards instead) and the sizes a slice / cat
    on local shards is specialised to (``resize_guards``), without those the others
    imply, in text order. ``plan_guards(p) -> (Guard.parse('batch % 2 == 0'), Guard.parse('seq % 4 == 0'))``"""
    prog = plan.program
    if not prog.symbols:
        return ()
    need = (extent_guards(plan) if uneven else divisibility_guards(plan)) + resize_guards(plan)
    return FactBase().minimal(tuple(prog.facts) + need)


# ------------------------------------------------------------------------------------------
# decisions
# ------------------------------------------------------------------------------------------


def _dim_axes(dim) -> tuple:
    return tuple((f.axis, f.pre, f.size) for f in dim if getattr(f, "axis", None) is not None)


def sharding_decision(s: Sharding) -> tuple:
    """What a sharding decides, sizes aside: per dim its mesh factors in order, and its partial axes.
    ``sharding_decision(Sharding.parse("[dp*4, 8]", m)) -> ((('dp', 1, 2),), ()), ())``"""
    return tuple(_dim_axes(d) for d in s.dims), tuple(s.partial)


def decisions(plan) -> tuple:
    """The plan's decisions, independent of sizes: ``(tensors, collectives)`` with, per tensor in
    program order, ``(name, sharding_decision)``, and per collective in order ``(op, tensor, kind,
    axes)``. Two plans of the same program at other sizes agree when these are equal:
    ``decisions(plan(prog, m, pins)) == decisions(plan(prog.at({"batch": 8}), m, carried_pins))``."""
    tensors = tuple((n, sharding_decision(plan.shardings[n])) for n in plan.program.tensors if n in plan.shardings)
    moves = tuple((c.op, c.tensor, c.kind.value, c.axes_text()) for c in plan.collectives)
    return tensors, moves


def first_difference(a, b, pa, pb) -> str:
    """What differs first between decisions ``a`` (of plan ``pa``) and ``b`` (of ``pb``), as text:
    ``"tensor 'flat' is [12, 16] there and [dp*2*tp*4, 16] at the example"``."""
    for (name, da), (_, db) in zip(a[0], b[0]):
        if da != db:
            return f"tensor {name!r} is {pb.shardings[name]} there and {pa.shardings[name]} at the example"
    for ca, cb in zip(a[1], b[1]):
        if ca != cb:
            return f"op {cb[0]} emits {cb[2]} on {cb[3]} for {cb[1]!r} there, {ca[2]} on {ca[3]} for {ca[1]!r} " \
                   "at the example"
    return f"{len(b[1])} collectives there, {len(a[1])} at the example"


# ------------------------------------------------------------------------------------------
# verification at other sizes
# ------------------------------------------------------------------------------------------


def carry(s: Sharding, shape: tuple, name: str = "") -> Sharding:
    """The same sharding of a tensor of another shape (DTensor placements, else a JAX
    PartitionSpec, carry it): ``carry(Sharding.parse("[dp*4]", m), (6,)) -> [dp*3]``."""
    shape = tuple(shape)
    if s.shape == shape:
        return s
    try:
        return Sharding.from_placements(s.mesh, shape, s.to_placements())
    except NotRepresentable:
        pass  # no DTensor placements for it: a PartitionSpec may still carry it
    try:
        return Sharding.from_partition_spec(s.mesh, shape, s.to_partition_spec()).with_partial(dict(s.partial))
    except NotRepresentable:
        raise GuardError(f"pin {name!r}: {s} says nothing DTensor placements or a PartitionSpec can carry to shape "
                         f"{shape}; verify at the example only (sizes=[]) or pin it in those terms") from None


def replan(plan, program):
    """``plan`` made again, with the same options, for ``program`` (the same program at other
    sizes): its pins carried to the new shapes (a plan not made by ``plan()`` pins every tensor).
    ``replan(p, p.program.at({"batch": 8})).shardings["x"] -> [dp*4, tp*4, 16]``"""
    from . import _plan

    opts = plan.options
    if opts is None:
        pins = {n: carry(s, program.tensors[n].shape, n) for n, s in plan.shardings.items()}
        return _plan(program, plan.mesh, pins, plan.cost_model, True, None, {})
    pins = {n: carry(s, program.tensors[n].shape, n) for n, s in opts["pins"].items()}
    return _plan(program, plan.mesh, pins, opts["cost_model"], opts["backward"], opts["style"], opts["auto"])


def sample_bindings(plan, k: int = 2, seed: int = 0) -> list:
    """``k`` bindings other than the example, drawn from the plan's guards (each symbol up to 2x,
    else 4x, 8x its example); with ``plan.uneven``, those violating a divisibility guard first, so
    that one does not divide when one can. ``sample_bindings(p) -> [{'batch': 8}, {'batch': 2}]``"""
    prog = plan.program
    example = prog.example
    names = sorted(example)
    base = FactBase(tuple(plan.guards))
    divs = divisibility_guards(plan) if plan.uneven else ()
    out: list = []
    for widen in (2, 4, 8):
        caps = tuple(Guard.range(n, None, max(2, widen * example[n])) for n in names)
        try:
            pool = FactBase(base.guards + caps).sample(8 * k + 8, seed, 1, max(2, widen * max(example.values())),
                                                     symbols=names)
        except ShardingError:
            continue
        pool = [b for b in pool if b != example]
        if divs:
            pool.sort(key=lambda b: all(g.holds(b) for g in divs))  # those that do not divide first (stable)
        for b in pool:
            if b not in out:
                out.append(b)
        if len(out) >= k:
            break
    return out[:k]


def verify_sizes(plan, v: Verification, sizes=None, **how) -> SizedVerification:
    """``v`` (the plan verified at the example) extended to other sizes: at each binding of
    ``sizes`` (default: ``sample_bindings``), the program at those sizes is planned again with the
    same options; it must make the same ``decisions`` and verify. The first failure is reported
    with both bindings. ``verify_sizes(p, verify_plan(p), [{"batch": 8}]).bindings_text()``
    ``-> 'batch=4, seq=16 (example); batch=8, seq=16'``"""
    prog = plan.program
    example = prog.example
    seen = [tuple(sorted(example.items()))]
    out = _sized(v, seen)
    if not v.ok:
        return out
    todo = sample_bindings(plan, 2, how.get("seed", 0)) if sizes is None else [dict(b) for b in sizes]
    mine = decisions(plan)
    for b in todo:
        full = {**example, **b}
        here = bindings_text(full)
        try:
            other = replan(plan, prog.at(b))
        except ShardingError as e:
            return _sized(v, seen, f"at {here}: {e}", "error")
        theirs = decisions(other)
        if theirs != mine:
            return _sized(v, seen, f"the plan's decisions differ at {here} from the example "
                                   f"{bindings_text(example)}: {first_difference(mine, theirs, plan, other)}; the "
                                   "guards do not cover these sizes (add a fact, or pin the tensor)", "decisions")
        w = verify_plan(other, how.get("mode", "classes"), how.get("seed", 0), how.get("rtol", 1e-6),
                        how.get("atol", 1e-6), how.get("budget", DEFAULT_BUDGET))
        seen.append(tuple(sorted(full.items())))
        if not w.ok:
            return _sized(w, seen, f"at {here}: {w.first_mismatch}", "mismatch")
    return _sized(v, seen)


def _sized(v: Verification, bindings: list, failure: str | None = None, reason: str = "") -> SizedVerification:
    data = {f.name: getattr(v, f.name) for f in fields(Verification)}
    if failure is not None:
        data.update(ok=False, first_mismatch=failure)
    return SizedVerification(**data, bindings=tuple(bindings), reason=reason)


__all__ = [
    "GuardError",
    "SizedVerification",
    "carry",
    "decisions",
    "divisibility_guards",
    "extent_guards",
    "plan_guards",
    "replan",
    "sample_bindings",
    "sharding_decision",
    "verify_sizes",
]
