"""``propagate(op, inputs, **params) -> Propagation``: the one entry point of every op rule.

    >>> from shardlayout import Mesh, Sharding, propagate
    >>> s = Sharding.parse("[dp*4, tp*3]", Mesh.parse("dp=2,tp=4"))
    >>> p = propagate("view", [s], shape=(16, 6))
    >>> str(p.outputs[0]), p.needs_communication
    ('[dp*4*tp:(1)2, tp:(2)2*3]', False)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import UnsupportedOp
from .sharding import Sharding


@dataclass(frozen=True)
class Redistribution:
    """One collective that moves (part of) input ``tensor`` before the op runs.

    ``kind`` is all_gather, reduce_scatter, all_reduce or all_to_all; ``axes`` the mesh axes
    (sub-axes in Shardy notation); ``bytes`` what the cost model counts; ``seconds`` its
    alpha-beta estimate (``sharding.redistribute.CostModel``)."""

    tensor: int
    kind: str
    axes: tuple
    bytes: int
    seconds: float
    what: str = ""

    def to_json(self) -> dict:
        """JSON-able form. ``r.to_json()["kind"] -> 'all_gather'``."""
        return {"tensor": self.tensor, "kind": self.kind, "axes": list(self.axes),
                "bytes": self.bytes, "seconds": self.seconds, "what": self.what}


@dataclass(frozen=True)
class Propagation:
    """The result of propagating shardings through one op."""

    op: str
    inputs: tuple
    input_targets: tuple
    outputs: tuple
    redistributions: tuple = field(default=())
    notes: tuple = field(default=())
    alternatives: tuple = field(default=())  # (mesh axis, option, seconds) the search weighed

    @property
    def cost(self) -> float:
        """Estimated seconds of all redistributions."""
        return sum(r.seconds for r in self.redistributions)

    @property
    def needs_communication(self) -> bool:
        """True when any input must move before the op runs."""
        return bool(self.redistributions)

    def to_json(self) -> dict:
        """JSON-able form of the result."""
        return {
            "op": self.op,
            "inputs": [str(s) for s in self.inputs],
            "input_targets": [str(s) for s in self.input_targets],
            "outputs": [str(s) for s in self.outputs],
            "redistributions": [r.to_json() for r in self.redistributions],
            "cost_seconds": self.cost,
            "communication": self.needs_communication,
            "notes": list(self.notes),
            "alternatives": [{"axis": a, "option": list(o), "seconds": c} for a, o, c in self.alternatives],
        }


def canonical_op_name(op: str) -> str:
    """``"aten.view.default" -> "view"``; ``"aten::reshape" -> "reshape"``; ``"t" -> "t"``."""
    name = str(op)
    for prefix in ("torch.ops.aten.", "aten::", "aten."):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    parts = name.split(".")
    return parts[0]


def propagate(op: str, inputs, **params) -> Propagation:
    """Shardings through one op: outputs, input targets, redistributions, cost.

    ``op`` is a short name (``"view"``) or an aten overload (``"aten.view.default"``);
    ``params`` are named as torch names them (``shape=``, ``dims=``, ``dim0=`` ...).
    """
    from .ops.registry import RULES, load_rules

    load_rules()
    if isinstance(inputs, Sharding):
        inputs = [inputs]
    inputs = tuple(inputs)
    name = canonical_op_name(op)
    rule = RULES.get(name)
    if rule is None:
        raise UnsupportedOp(
            f"no sharding rule for op {op!r} (looked up {name!r}); known: {', '.join(sorted(RULES))}. "
            "Add one in shardlayout/ops/ with @register(\"name\")"
        )
    out_pins = params.pop("out_pins", None)
    if out_pins is None:
        return rule(name, inputs, **params)
    from .ops.strategy import OUT_PINS

    token = OUT_PINS.set(tuple(out_pins))
    try:
        return rule(name, inputs, **params)
    finally:
        OUT_PINS.reset(token)
