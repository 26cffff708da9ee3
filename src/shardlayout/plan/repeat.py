"""Planning a program of repeated blocks (``ProgramBuilder.repeat``) from its compressed form.

The planner runs on the compressed program (instances 0, 1, 2, 3 and the last), with the cost
of every middle instance counted where it compares whole plans (``plan._plan``'s ``weigh``).
When instances 2 and 3 come out the same (:func:`stable`: their ops' strategies, their
tensors' shardings, their collectives and moves, renamed) the plan of the full program is the
compressed one with instance 3's decisions renamed for every middle instance: a middle
instance reads what instance 3 reads (the outputs of an instance decided like instance 2),
and what it makes is read as instance 3's is. :func:`expand_plan` makes those
records the first time something reads them; until then a plan costs what planning five
instances costs, whatever the depth. Otherwise (an instance pinned apart from the rest, a
decision that drifts with depth) ``plan`` plans the whole program.

    >>> from shardlayout import Mesh
    >>> from shardlayout.program.models import llama, style_pins
    >>> from shardlayout.plan import plan
    >>> prog = llama(layers=12); mesh = Mesh.parse("tp=2")
    >>> p = plan(prog, mesh, style_pins(prog, mesh, "megatron"))
    >>> p.repeated is not None, len(p.ops), str(p.shardings["layers.7.wq"])
    (True, 600, '[16, tp*8]')
"""

from __future__ import annotations

import time

from ..program.repeat import local, to_instance
from ..sharding.cost import DEFAULT_COST_MODEL, cost


def plan_repeated(program, mesh, user: dict, cost_model, backward: bool, keep: frozenset = frozenset()):
    """The lazily expanded Plan of a repeated program, or None when the compressed plan does
    not show one decision for every middle instance (the caller plans the whole program)."""
    from . import Plan, _plan

    t0 = time.perf_counter()
    cp, rep = program.repeated
    template = local(rep, 3, user)
    kept, middle = {}, 0
    for name, s in user.items():  # a middle instance's pins must be instance 3's, renamed
        at = rep.instance_of(name)
        if at is not None and 4 <= at[0] < rep.count - 1:
            t = template.get(at[1])
            if t is None or (t is not s and t != s):
                return None
            middle += 1
        else:
            kept[name] = s
    if middle != len(template) * len(rep.middle):
        return None
    cm = cost_model or DEFAULT_COST_MODEL
    extra = len(rep.middle)
    names3 = frozenset(rep.name(3, r[4]) for r in rep.ops)

    def weigh(p) -> float:  # the full program's total: every middle instance costs what instance 3 does
        return p.total_seconds + extra * cost([c for c in p.collectives if c.op in names3], cm)

    cpl = _plan(cp, mesh, kept, cost_model, backward, None, {}, weigh, keep & frozenset(kept))
    if not stable(cpl, rep):
        return None
    p = object.__new__(Plan)
    p.__dict__.update(program=program, mesh=mesh, plan_seconds=0.0, cost_model=cm, verified=None, matched=None,
                      guards=(), uneven=False, options=None, verified_at=(), flop_rate=None, _repeated=(cpl, rep))
    p.plan_seconds = time.perf_counter() - t0
    return p


def _instance(cpl, rep, k: int) -> tuple:
    """Instance ``k``'s (``k`` in 1..3) decisions named as instance 3's: its planned ops (with
    params and local params), its tensors' shardings, its ops' collectives, the moves of its tensors."""
    from . import _planned

    n, f = len(rep.ops), to_instance(rep, 3, k)
    start = rep.op_at - (4 - k) * n
    ops = tuple((_planned(f(o.name), o.target, tuple(map(f, o.inputs)), o.input_targets, o.outputs, o.params,
                          o.local), o.params, o.local) for o in cpl.ops[start:start + n])
    names = {o.name for o in cpl.ops[start:start + n]}
    colls = tuple(c.attributed(f(c.tensor), f(c.op)) for c in cpl.collectives if c.op in names)
    head = f"{rep.prefix}.{k}."
    moves = {(f(t), dst): chain for (t, dst), chain in cpl.moves.items() if type(t) is str and t.startswith(head)}
    return ops, local(rep, 3, {f(n): s for n, s in cpl.shardings.items() if type(n) is str and n.startswith(head)}), \
        colls, moves


def stable(cpl, rep) -> bool:
    """Did instances 2 and 3 get the same decisions (renamed)?"""
    return _instance(cpl, rep, 2) == _instance(cpl, rep, 3)


def expand_plan(cpl, rep, program) -> dict:
    """The full plan's ``shardings``, ``ops``, ``collectives`` and ``moves``: the compressed
    plan's, with instance 3's renamed for every middle instance and the last instance reading
    instance ``count - 2`` (names taken from the full program's ops, made by ``program.repeat``)."""
    from . import _planned

    n, at = len(rep.ops), rep.op_at
    copied, full_ops = cpl.ops, program.ops
    template = copied[at - n:at]
    ops = list(copied[:at])
    for k in rep.middle:
        base = at + (k - 4) * n
        ops.extend([_planned(op.name, o.target, op.inputs, o.input_targets, o.outputs, o.params, o.local)
                    for op, o in zip(full_ops[base:base + n], template)])
    base = at + len(rep.middle) * n  # the last instance: its reads of instance 3 are of instance count - 2
    ops.extend(_planned(o.name, o.target, op.inputs, o.input_targets, o.outputs, o.params, o.local)
               for op, o in zip(full_ops[base:base + n], copied[at:at + n]))
    ops.extend(copied[at + n:])

    position = {o.name: j for j, o in enumerate(template)}
    before = {o.name for o in copied[:at]}
    of_last = {o.name: j for j, o in enumerate(copied[at:at + n])}
    colls = [c for c in cpl.collectives if c.op in before]
    moved = []  # a template collective: (op index in the block, where its tensor is in the op, the collective)
    for c in cpl.collectives:
        j = position.get(c.op)
        if j is not None:
            o = template[j]
            where = (0, o.inputs.index(c.tensor)) if c.tensor in o.inputs else (1, _outputs(o, rep, j).index(c.tensor))
            moved.append((j, where, c))
    for k in rep.middle:
        base = at + (k - 4) * n
        for j, (side, i), c in moved:
            op = full_ops[base + j]
            colls.append(c.attributed((op.inputs if side == 0 else op.outputs)[i], op.name))
    base = at + len(rep.middle) * n
    for c in cpl.collectives:
        j = of_last.get(c.op)
        if j is not None:
            o, op = copied[at + j], full_ops[base + j]
            colls.append(c.attributed(op.inputs[o.inputs.index(c.tensor)] if c.tensor in o.inputs else c.tensor,
                                      c.op))
    colls.extend(c for c in cpl.collectives if c.op not in before and c.op not in of_last)

    head3 = f"{rep.prefix}.3."
    ours = [(t[len(head3):], dst, chain) for (t, dst), chain in cpl.moves.items()
            if type(t) is str and t.startswith(head3)]
    moves = dict(cpl.moves)
    for k in rep.middle:
        here = f"{rep.prefix}.{k}."
        moves.update(((here + t, dst), chain) for t, dst, chain in ours)

    sh = cpl.shardings
    by_suffix = local(rep, 3, sh)
    cut = len(f"{rep.prefix}.")
    shardings = {}
    for name in program.inputs():
        s = sh.get(name)
        shardings[name] = s if s is not None else by_suffix[name[cut:].partition(".")[2]]
    for op in full_ops[:at]:
        for t in op.outputs:
            shardings[t] = sh[t]
    made = [[by_suffix[t[len(head3):]] for t in _outputs(o, rep, j)] for j, o in enumerate(template)]
    for k in rep.middle:
        base = at + (k - 4) * n
        for j in range(n):
            shardings.update(zip(full_ops[base + j].outputs, made[j]))
    for op in full_ops[at + len(rep.middle) * n:]:
        for t in op.outputs:
            shardings[t] = sh[t]
    return {"shardings": shardings, "ops": ops, "collectives": colls, "moves": moves}


def _outputs(o, rep, j: int) -> tuple:
    """The output names of instance 3's ``j``-th op."""
    return tuple(f"{rep.prefix}.3.{s}" for s in rep.ops[j][3])


__all__ = ["expand_plan", "plan_repeated", "stable"]
