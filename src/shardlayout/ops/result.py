"""``Propagation``: what an op rule returns; ``canonical_op_name``.

    >>> canonical_op_name("aten.view.default")
    'view'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ..caches import register_clearer
from ..sharding.cost import DEFAULT_COST_MODEL, CostModel, cost


class Deferred(Sequence):
    """A tuple made when first read: ``make()`` runs once, on the first access. A search's
    candidates (a plan reads only the winner; ``explain`` reads them all) and a view's move
    (DTensor's rule names the target; its redistribution is planned when it runs) are made
    so. Compares and hashes as the tuple it holds. ``list(Deferred(lambda: (1, 2)))`` -> ``[1, 2]``"""

    __slots__ = ("_make", "_items")

    def __init__(self, make):
        self._make, self._items = make, None

    def _all(self) -> tuple:
        if self._items is None:
            self._items, self._make = tuple(self._make()), None
        return self._items

    def __getitem__(self, i):
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self):
        return iter(self._all())

    def __eq__(self, other) -> bool:
        return self._all() == (tuple(other) if isinstance(other, (tuple, Deferred)) else other)

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return f"Deferred({len(self)})"


@dataclass(frozen=True)
class Propagation:
    """The result of propagating shardings through one op.

    ``input_targets``: what each input is moved to before the op runs (equal to the input
    when nothing moves); ``outputs``: the outputs' shardings; ``collectives``: every
    :class:`~shardlayout.sharding.collective.Collective` that moves data (``tensor`` says
    "input i", or "output k" for a move to a pinned output sharding), exactly what
    ``plan_move`` emits; ``candidates``: every strategy the search priced (factor-map rules),
    each with its own collectives and cost; ``local``: params of the op's local run that differ
    from the global call, as ``(name, value)`` pairs (a comm-free cut of a sharded dim slices
    whole groups of each rank's shard: ``ops.resize``)."""

    op: str
    inputs: tuple
    input_targets: tuple
    outputs: tuple
    collectives: tuple = field(default=())
    notes: tuple = field(default=())
    candidates: tuple = field(default=())
    cost_model: CostModel = field(default=DEFAULT_COST_MODEL, repr=False)
    local: tuple = field(default=())

    @classmethod
    def _trusted(cls, op: str, inputs: tuple, input_targets: tuple, outputs: tuple, collectives=(),
                 cost_model: CostModel = DEFAULT_COST_MODEL) -> "Propagation":
        """Internal fast constructor (a rule's hot path): the same record as
        ``Propagation(op, inputs, input_targets, outputs, collectives, cost_model=cost_model)``, its
        fields set at once. ``Propagation._trusted("view", (s,), (s,), (out,))``"""
        p = _Fields()  # a plain object: its __dict__ set in one store, then made a Propagation
        d = _TRUSTED.copy()  # the fields in order, the defaults in (cheaper than a dict literal of nine)
        d["op"] = op
        d["inputs"] = inputs
        d["input_targets"] = input_targets
        d["outputs"] = outputs
        d["collectives"] = collectives
        d["cost_model"] = cost_model
        p.__dict__ = d
        if cls is Propagation:
            p.__class__ = cls
            return p
        q = object.__new__(cls)  # a subclass may lay itself out otherwise
        q.__dict__.update(p.__dict__)
        return q

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
            **({"local": {k: repr(v) for k, v in self.local}} if self.local else {}),
            "candidates": [
                {"strategy": [{"axis": a, "option": list(o)} for a, o in c.choices],
                 "input_targets": [None if t is None else str(t) for t in c.input_targets],
                 "outputs": [str(o) for o in c.outputs],
                 "collectives": [x.to_json(cm) for x in c.collectives],
                 "cost_seconds": c.cost}
                for c in self.candidates
            ],
        }


class _Fields:
    """A Propagation's fields without the frozen dataclass's guard: ``Propagation._trusted`` sets
    them in one store, then makes the object a Propagation (``__class__`` assignment)."""


# ``Propagation._trusted``'s field dict, copied per result: every field, in declaration order
_TRUSTED = {"op": "", "inputs": (), "input_targets": (), "outputs": (), "collectives": (), "notes": (),
            "candidates": (), "cost_model": DEFAULT_COST_MODEL, "local": ()}


class ByCoord(NamedTuple):
    """A local param that depends on the rank: ``values[c]`` where ``c`` is the rank's coordinate
    on the mesh-axis piece ``(axis, pre, size)`` (a whole axis when ``pre == 1`` and ``size`` is
    the axis size). ``ByCoord("tp", 1, 2, (3, 0))``: 3 on tp's first rank, 0 on the other."""

    axis: str
    pre: int
    size: int
    values: tuple


def at_rank(params: dict, mesh, rank: int) -> dict:
    """``params`` with every :class:`ByCoord` (also inside tuples) replaced by its value on
    ``rank``: what an executor runs there. ``at_rank({"k": 1}, mesh, 0) -> {"k": 1}``"""

    def one(v):
        if type(v) is ByCoord:
            n = mesh.axis_size(v.axis)
            c = mesh.coord(rank)[mesh.axis_index(v.axis)]
            return v.values[(c // (n // (v.pre * v.size))) % v.size]
        if type(v) is tuple:
            return tuple(one(x) for x in v)
        return v

    local = params.get("local")
    return params if local is None else {**params, "local": one(local)}


def coord_axes(params: dict) -> frozenset:
    """The mesh axes :func:`at_rank` reads in ``params``: two ranks with the same coordinates on
    them run with the same params. ``coord_axes({"local": (ByCoord("tp", 1, 2, (3, 0)), 1)}) -> {'tp'}``"""

    def one(v):
        if type(v) is ByCoord:
            return frozenset((v.axis,))
        if type(v) is tuple:
            return frozenset().union(*map(one, v))
        return frozenset()

    return one(params.get("local"))


def canonical_op_name(op: str) -> str:
    """``"aten.view.default" -> "view"``; ``"aten::reshape" -> "reshape"``; ``"t" -> "t"``."""
    got = _NAMES.get(op) if type(op) is str else None
    if got is not None:
        return got
    name = str(op)
    for prefix in ("torch.ops.aten.", "aten::", "aten."):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    name = name.split(".")[0]
    if type(op) is str and len(_NAMES) < 4096:  # op names are few: a bounded table, never cleared
        _NAMES[op] = name
    return name


_NAMES: dict = {}
register_clearer("shardlayout.ops.result._NAMES", _NAMES.clear, _NAMES.__len__)


__all__ = ["ByCoord", "Propagation", "at_rank", "canonical_op_name", "coord_axes"]
