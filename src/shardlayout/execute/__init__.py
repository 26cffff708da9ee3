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
    ``use(tensor, target, value)`` sees a value once before its consumers under that target
    (identity for the simulator; where a training run reduces the consumers' gradients)."""

    def op(self, opdef, inputs: list, params: dict, outputs: tuple) -> list: ...

    def collective(self, c, value): ...

    def use(self, tensor: str, target, value): ...


def walk(plan, executor: Executor, inputs: dict):
    """Execute ``plan`` with ``executor``; yields ``(tensor name, local value)`` for every tensor
    an op produces, in program order, each already in its planned sharding. ``inputs`` maps
    every program input to its local value in its planned sharding."""
    from ..ops.registry import get_op

    opdefs = {op.target: get_op(op.target) for op in plan.program.ops}
    values = dict(inputs)
    moved: dict = {}  # (tensor, target) -> value: one move serves every consumer, as planned
    for op, po in zip(plan.program.ops, plan.ops):
        local = []
        for name, tgt in zip(op.inputs, po.input_targets):
            if not isinstance(name, str):
                local.append(name)
                continue
            if (name, tgt) not in moved:
                v = values[name]
                for c in plan.moves.get((name, tgt), ()) if tgt != plan.shardings[name] else ():
                    v = executor.collective(c, v)
                moved[(name, tgt)] = executor.use(name, tgt, v)
            local.append(moved[(name, tgt)])
        params = {**po.params, **dict(po.local)} if po.local else po.params
        outs = executor.op(opdefs[op.target], local, params, po.outputs)
        for name, s, v in zip(op.outputs, po.outputs, outs):
            final = plan.shardings[name]
            for c in plan.moves.get((name, final), ()) if final != s else ():
                v = executor.collective(c, v)
            values[name] = v
            yield name, v


__all__ = ["Executor", "NumpySimulator", "run_collective", "run_moves", "walk"]
