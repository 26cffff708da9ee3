"""Executing a plan: one walk over the program, one seam for where it runs.

An :class:`Executor` runs an op on local values (``op``) and one planned
:class:`~shardlayout.sharding.collective.Collective` (``collective``); what a "local value"
is belongs to the executor. ``walk(plan, executor, inputs)`` is the only loop that executes
a plan: per op, every input is moved by its planned collectives, the op runs, and each output
is moved to its final sharding. The numpy simulator of every rank (:class:`NumpySimulator`)
is one executor; a torch.distributed rank is another. Nothing here reads display text: the
executor gets the typed records.

    >>> import numpy as np
    >>> from shardlayout import Mesh, Sharding
    >>> from shardlayout.plan import plan
    >>> from shardlayout.program import ProgramBuilder
    >>> b = ProgramBuilder(); x = b.input("x", (4, 8)); w = b.param("w", (8, 6))
    >>> b.output(b.op("mm", [x, w], name="y"))
    >>> m = Mesh.parse("tp=2"); p = plan(b.build(), m, {"w": Sharding.parse("[tp*4, 6]", m)})
    >>> sim = NumpySimulator(m)
    >>> xs = {"x": np.ones((4, 8)), "w": np.ones((8, 6))}
    >>> values = dict(walk(p, sim, {n: p.shardings[n].shard(v) for n, v in xs.items()}))
    >>> float(p.shardings["y"].unshard(values["y"]).sum())
    192.0
"""

from __future__ import annotations

from typing import Protocol

from .simulator import NumpySimulator, run_collective, run_moves


class Executor(Protocol):
    """Where a plan runs. ``op(opdef, inputs, params, outputs)`` runs one op on local values
    (inputs already moved to the op's targets; ``outputs`` are the output shardings) and
    returns one local value per output; ``collective(c, value)`` runs one collective;
    ``use(reduction, value)`` sees a value once before the consumers that read it through one
    gradient reduction (``reduction``: a key of ``plan.backward.gradient_reductions``; a training
    executor holds ``readers``, its ``reduction_at``, and sums their partial gradients there). An
    executor without ``readers`` (the simulator) is never asked.
    ``ranks``: the ranks whose pieces it holds; ``chunk`` / ``join`` take a stream chunk of a
    value and put chunks back together (``execute.stream``)."""

    ranks: tuple

    def op(self, opdef, inputs: list, params: dict, outputs: tuple) -> list: ...

    def collective(self, c, value): ...

    def use(self, reduction: tuple, value): ...

    def chunk(self, value, dim: int, positions: dict): ...

    def join(self, parts: list, dim: int, positions: list, shapes: dict): ...


def walk(plan, executor: Executor, inputs: dict, streams=()):
    """Execute ``plan`` with ``executor``; yields ``(tensor name, local value)`` for every tensor
    an op produces, in program order (a tensor whose own move a segment runs chunk by chunk: when
    that segment has run), each already in its planned sharding. ``inputs`` maps
    every program input to its local value in its planned sharding. ``streams``: segments
    (``execute.stream.segments``) run chunk by chunk — the same values, the work in stream order."""
    from ..ops.registry import get_op
    from .stream import run_segment

    opdefs = {op.target: get_op(op.target) for op in plan.program.ops}
    values = dict(inputs)
    moved: dict = {}  # (tensor, target) -> value: one move serves every consumer, as planned
    through = getattr(executor, "readers", None) or {}  # (op, input) -> its gradient reduction
    summed: dict = {}  # reduction -> value: one gradient sum serves all its readers

    def fetch(name, tgt, reader=None):
        if (name, tgt) not in moved:
            v = values[name]
            for c in plan.moves.get((name, tgt), ()) if tgt != plan.shardings[name] else ():
                v = executor.collective(c, v)
            moved[(name, tgt)] = v
        key = through.get(reader)
        if key is None:
            return moved[(name, tgt)]
        if key not in summed:
            summed[key] = executor.use(key, moved[(name, tgt)])
        return summed[key]

    def run(i: int) -> list:
        op, po = plan.program.ops[i], plan.ops[i]
        local = [fetch(name, tgt, (i, k)) if isinstance(name, str) else name
                 for k, (name, tgt) in enumerate(zip(op.inputs, po.input_targets))]
        params = {**po.params, **dict(po.local)} if po.local else po.params
        return executor.op(opdefs[op.target], local, params, po.outputs)

    def store(i: int, outs) -> list:
        done = []
        for name, s, v in zip(plan.program.ops[i].outputs, plan.ops[i].outputs, outs):
            final = plan.shardings[name]
            if final != s and (name, final) in moved:  # a segment's chunked output move
                v = moved.pop((name, final))
            elif final != s and name in deferred:  # moved by a segment chunk by chunk, when it runs
                values[name] = v
                continue
            else:
                for c in plan.moves.get((name, final), ()) if final != s else ():
                    v = executor.collective(c, v)
            values[name] = v
            done.append((name, v))
        return done

    in_segment = {i: seg for seg in streams for i in seg.ops}
    # the producers' own output moves a segment runs chunk by chunk: yielded once it has run
    deferred = {seg.before[0] for seg in streams if seg.before is not None and seg.before[1] == plan.shardings[
        seg.before[0]]}
    made: dict = {}
    ahead: dict = {}  # op index -> its outputs, made ahead of a segment that reads them (its prelude)
    for i, op in enumerate(plan.program.ops):
        if i in ahead:
            yield from ahead.pop(i)
            continue
        seg = in_segment.get(i)
        if seg is not None:
            if i == seg.first:
                for j in seg.prelude:
                    ahead[j] = store(j, run(j))
                got, done = run_segment(plan, seg, executor, fetch, opdefs)
                made.update(got)
                for (name, tgt), v in done.items():
                    moved[(name, tgt)] = v
                    if name in deferred and tgt == plan.shardings[name]:
                        values[name] = v
                        yield name, v
            outs = [made.pop(name) for name in op.outputs]
        else:
            outs = run(i)
        yield from store(i, outs)


__all__ = ["Executor", "NumpySimulator", "run_collective", "run_moves", "walk"]
