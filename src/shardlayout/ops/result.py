"""``Propagation``: what an op rule returns; ``canonical_op_name``.

    >>> canonical_op_name("aten.view.default")
    'view'
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..sharding.cost import DEFAULT_COST_MODEL, CostModel, cost


@dataclass(frozen=True)
class Propagation:
    """The result of propagating shardings through one op.

    ``input_targets``: what each input is moved to before the op runs (equal to the input
    when nothing moves); ``outputs``: the outputs' shardings; ``collectives``: every
    :class:`~shardlayout.sharding.collective.Collective` that moves data (``tensor`` says
    "input i", or "output k" for a move to a pinned output sharding), exactly what
    ``plan_move`` emits; ``candidates``: every strategy the search priced (factor-map rules),
    each with its own collectives and cost."""

    op: str
    inputs: tuple
    input_targets: tuple
    outputs: tuple
    collectives: tuple = field(default=())
    notes: tuple = field(default=())
    candidates: tuple = field(default=())
    cost_model: CostModel = field(default=DEFAULT_COST_MODEL, repr=False)

    @property
    def cost(self) -> float:
        """Estimated seconds of all collectives, priced by ``sharding.cost.cost``."""
        return cost(self.collectives, self.cost_model)

    @property
    def needs_communication(self) -> bool:
        """True when any data moves between devices."""
        return bool(self.collectives)

    def to_json(self) -> dict:
        """JSON-able form of the result."""
        cm = self.cost_model
        return {
            "op": self.op,
            "inputs": [str(s) for s in self.inputs],
            "input_targets": [str(s) for s in self.input_targets],
            "outputs": [str(s) for s in self.outputs],
            "collectives": [c.to_json(cm) for c in self.collectives],
            "cost_seconds": self.cost,
            "communication": self.needs_communication,
            "notes": list(self.notes),
            "candidates": [
                {"strategy": [{"axis": a, "option": list(o)} for a, o in c.choices],
                 "input_targets": [None if t is None else str(t) for t in c.input_targets],
                 "outputs": [str(o) for o in c.outputs],
                 "collectives": [x.to_json(cm) for x in c.collectives],
                 "cost_seconds": c.cost}
                for c in self.candidates
            ],
        }


def canonical_op_name(op: str) -> str:
    """``"aten.view.default" -> "view"``; ``"aten::reshape" -> "reshape"``; ``"t" -> "t"``."""
    name = str(op)
    for prefix in ("torch.ops.aten.", "aten::", "aten."):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    return name.split(".")[0]


__all__ = ["Propagation", "canonical_op_name"]
