"""``Collective``: the one record of a data movement between two shardings of a tensor.

Every plan, report, JSON, cost and executor reads this record; nothing parses its display
text back. A collective acts on a group of devices: the ranks that differ only in the mesh
axes (or sub-axes) it names. ``kind`` is a :class:`CollectiveKind`; ``axes`` are typed
:class:`AxisPiece` values (``tp`` whole is ``AxisPiece("tp", 4)``, Shardy's ``tp:(2)2`` is
``AxisPiece("tp", 2, pre=2)``); ``dims`` the tensor dims it gathers from / scatters to;
``bytes`` what the cost model counts (DTensor's convention: the gathered local size for an
all-gather, the local input size otherwise); ``src`` and ``dst`` the shardings before and
after, which is all an executor needs to run it — with, for a ragged tensor, ``ragged``: its
ragged dim and the source factors it was routed from (its split sizes come from the routing
counts at run time, ``sharding.ragged``).

    >>> from shardlayout import Mesh, Sharding
    >>> m = Mesh.parse("dp=2,tp=4")
    >>> c = Collective(CollectiveKind.ALL_GATHER, (AxisPiece("tp", 4),), (1,), 192,
    ...                Sharding.parse("[dp*4, tp*3]", m), Sharding.parse("[dp*4, 12]", m))
    >>> c.kind == "all_gather", c.group_size, c.axes_text()
    (True, 4, 'tp')
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from .core import Sharding


class CollectiveKind(str, Enum):
    """What a collective does. A ``str`` enum: ``CollectiveKind.ALL_GATHER == "all_gather"``."""

    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_REDUCE = "all_reduce"
    ALL_TO_ALL = "all_to_all"
    PERMUTE = "permute"  # send/recv between ranks of a group
    LOCAL = "local"  # a local slice (or partition onto partial axes): no communication

    def __str__(self) -> str:
        return self.value

    @property
    def communicates(self) -> bool:
        """False only for a local step. ``CollectiveKind.LOCAL.communicates -> False``."""
        return self is not CollectiveKind.LOCAL


class AxisPiece(NamedTuple):
    """A mesh axis or a piece of one: ``AxisPiece("tp", 2, pre=2)`` is Shardy's ``tp:(2)2``."""

    axis: str
    size: int
    pre: int = 1

    def text(self, mesh) -> str:
        """``tp`` for the whole axis, ``tp:(2)2`` for a piece. ``AxisPiece("tp", 4).text(m)``."""
        if self.pre == 1 and self.size == mesh.axis_size(self.axis):
            return self.axis
        return f"{self.axis}:({self.pre}){self.size}"


@dataclass(frozen=True)
class Collective:
    """One collective (or local step) from ``src`` to ``dst``; see the module docstring.

    ``tensor`` and ``op`` say whose data moves for which op once a plan attributes it
    (an input index inside ``propagate``, a tensor name inside a ``Plan``)."""

    kind: CollectiveKind
    axes: tuple
    dims: tuple
    bytes: int
    src: Sharding
    dst: Sharding
    reduce_op: str | None = None
    tensor: object = None
    op: str | None = None
    ragged: tuple | None = None  # (ragged dim, the routing's source factors) when the tensor is ragged

    @property
    def group_size(self) -> int:
        """Devices in each group: the product of the axis pieces' sizes (1 for a local step)."""
        n = 1
        for p in self.axes:
            n *= p.size
        return n

    def axes_text(self) -> str:
        """The axes as text, e.g. ``'tp'`` or ``'dp,tp:(1)2'`` ('' for a local step)."""
        return ",".join(p.text(self.src.mesh) for p in self.axes)

    def attributed(self, tensor, op: str | None = None) -> "Collective":
        """The same collective, saying whose data moves: ``c.attributed("x", "mm_1")``."""
        out = object.__new__(Collective)  # a copy with two fields changed (``replace`` re-runs __init__)
        out.__dict__.update(self.__dict__)
        out.__dict__["tensor"], out.__dict__["op"] = tensor, op
        return out

    def with_bytes(self, n: int) -> "Collective":
        """The same collective moving ``n`` bytes (a stream chunk's share): ``c.with_bytes(c.bytes // 4)``."""
        out = object.__new__(Collective)
        out.__dict__.update(self.__dict__)
        out.__dict__["bytes"] = n
        return out

    def to_json(self, cost_model=None) -> dict:
        """JSON-able form; with a cost model, its estimated ``seconds`` too."""
        out = {
            "kind": self.kind.value,
            "axes": [{"axis": p.axis, "size": p.size, "pre": p.pre} for p in self.axes],
            "axes_text": self.axes_text(),
            "group_size": self.group_size,
            "dims": list(self.dims),
            "bytes": self.bytes,
            "from": str(self.src),
            "to": str(self.dst),
        }
        if self.reduce_op is not None:
            out["reduce_op"] = self.reduce_op
        if self.tensor is not None:
            out["tensor"] = self.tensor
        if self.op is not None:
            out["op"] = self.op
        if self.ragged is not None:
            out["ragged"] = {"dim": self.ragged[0], "sources": [f"{f.axis}:({f.pre}){f.size}" if f.pre != 1 else
                                                                  f.axis for f in self.ragged[1]]}
        if cost_model is not None:
            out["seconds"] = cost_model.seconds(self)
        return out


__all__ = ["AxisPiece", "Collective", "CollectiveKind"]
