"""The one cost model: prices a tuple of :class:`Collective` records (alpha-beta per mesh axis).

Exactly DTensor's formulas (``torch/distributed/tensor/_collective_utils.py``), in seconds:

    all_gather, reduce_scatter   latency + (n-1) * hop_latency + bytes * (n-1)/n / bandwidth
    all_reduce                   the same with 2*(n-1) hops
    all_to_all                   the all_gather formula on the local bytes + a 1 µs penalty
                                 (DTensor's ``allgather_cost(...) + 1.0``; set
                                 ``all_to_all_penalty=0`` for the plain alpha-beta price)
    permute                      latency + hop_latency + bytes / bandwidth (one ring step: every
                                 rank sends ``bytes`` to its neighbour; a ring all-gather's k - 1
                                 steps pay the all_gather's hops and bytes, and k - 1 latencies)
    local                        0

with DTensor's defaults: latency 6.6 µs, 0.6 µs per hop, bandwidth 87.7 GiB/s (DTensor's
``bytes_gb`` is ``bytes / 2**30``). ``n`` is the group size (a sub-axis group is smaller than
its axis); a collective over several axes uses the slowest of their bandwidths and hop
latencies.

    >>> from shardlayout import Mesh, Sharding
    >>> from shardlayout.sharding.move import plan_move
    >>> m = Mesh.parse("dp=2,tp=4")
    >>> moves = plan_move(Sharding.parse("[dp*4, tp*3]", m), Sharding.parse("[dp*4, 12]", m))
    >>> round(cost(moves) * 1e6, 4)   # 6.6 + 3*0.6 µs + 192 B * 3/4 / 87.7 GiB/s
    8.4015
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ShardingSpecError
from .collective import CollectiveKind

GiB = 2**30

ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
    "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16,
    # the rest of torch's element types
    "uint16": 2, "uint32": 4, "uint64": 8, "complex32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
}


def itemsize(dtype) -> int:
    """Bytes per element of a dtype name (``torch.`` prefix allowed); an unknown one is refused.

    ``itemsize("torch.bfloat16") -> 2``
    """
    size = ITEMSIZE.get(str(dtype).replace("torch.", ""))
    if size is None:
        raise ShardingSpecError(f"dtype {dtype!r} is not one of {', '.join(ITEMSIZE)}")
    return size


def _check_positive(what: str, value, zero: bool = False) -> float:
    """A finite number > 0 (>= 0 with ``zero``): a latency or bandwidth of 0 or below is no machine."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < 0 or (value == 0 and not zero)):
        raise ShardingSpecError(f"CostModel: {what} = {value!r} must be a finite number {'>=' if zero else '>'} 0")
    return float(value)


def _frozen_map(what: str, m) -> tuple:
    if not isinstance(m, (dict, tuple, list, type(None))):
        raise ShardingSpecError(f"CostModel: {what} = {m!r} must map mesh axis names to numbers, e.g. {{'dp': 25e9}}")
    try:
        items = sorted(dict(m or {}).items())
    except (TypeError, ValueError):
        raise ShardingSpecError(f"CostModel: {what} = {m!r} must map mesh axis names to numbers, "
                                "e.g. {'dp': 25e9}") from None
    for k, _ in items:
        if not isinstance(k, str):
            raise ShardingSpecError(f"CostModel: {what} key {k!r} is not a mesh axis name")
    return tuple((k, _check_positive(f"{what}[{k!r}]", v)) for k, v in items)


@dataclass(frozen=True)
class CostModel:
    """Alpha-beta cost per mesh axis (seconds, bytes per second). Per-axis overrides, e.g. a
    slower inter-host axis: ``CostModel(bandwidth={"dp": 25e9}, hop_latency={"dp": 5e-6})``."""

    latency: float = 6.6e-6
    hop_latency: tuple = field(default=())
    bandwidth: tuple = field(default=())
    default_hop_latency: float = 0.6e-6
    default_bandwidth: float = 87.7 * GiB
    all_to_all_penalty: float = 1e-6

    def __post_init__(self):
        sa = object.__setattr__
        sa(self, "hop_latency", _frozen_map("hop_latency", self.hop_latency))
        sa(self, "bandwidth", _frozen_map("bandwidth", self.bandwidth))
        for name in ("latency", "default_hop_latency", "default_bandwidth", "all_to_all_penalty"):
            sa(self, name, _check_positive(name, getattr(self, name), zero=name == "all_to_all_penalty"))
        sa(self, "_hash", hash((self.latency, self.hop_latency, self.bandwidth, self.default_hop_latency,
                                self.default_bandwidth, self.all_to_all_penalty)))

    def __hash__(self) -> int:  # computed once: a CostModel is part of every memo key
        return self._hash

    def axis_bandwidth(self, axis: str) -> float:
        """Bytes per second on ``axis``. ``CostModel().axis_bandwidth("tp") -> 94166581657.6``."""
        return dict(self.bandwidth).get(axis, self.default_bandwidth)

    def axis_hop_latency(self, axis: str) -> float:
        """Seconds per hop on ``axis``. ``CostModel().axis_hop_latency("tp") -> 6e-07``."""
        return dict(self.hop_latency).get(axis, self.default_hop_latency)

    def seconds(self, c) -> float:
        """Estimated seconds of one :class:`Collective` (0 for a local step or a group of 1)."""
        n = c.group_size
        if not c.kind.communicates or n <= 1:
            return 0.0
        axes = {p.axis for p in c.axes}
        bw = min(self.axis_bandwidth(a) for a in axes)
        hop = max(self.axis_hop_latency(a) for a in axes)
        if c.kind is CollectiveKind.PERMUTE:
            return self.latency + hop + c.bytes / bw
        hops = 2 * (n - 1) if c.kind is CollectiveKind.ALL_REDUCE else n - 1
        t = self.latency + hops * hop + c.bytes * hops / n / bw
        if c.kind is CollectiveKind.ALL_TO_ALL:
            t += self.all_to_all_penalty
        return t


DEFAULT_COST_MODEL = CostModel()


def cost(collectives, cost_model: CostModel | None = None) -> float:
    """Total estimated seconds of collectives (an exactly rounded sum: independent of order).

    ``cost(()) -> 0.0``
    """
    cm = cost_model or DEFAULT_COST_MODEL
    return math.fsum(cm.seconds(c) for c in collectives)


__all__ = ["CostModel", "DEFAULT_COST_MODEL", "GiB", "ITEMSIZE", "cost", "itemsize"]
