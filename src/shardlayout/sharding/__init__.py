"""Sharding: factors per dim (local, mesh axis or sub-axis), partial axes, conversions, shards.

    >>> from shardlayout import Mesh, Sharding
    >>> s = Sharding.from_placements(Mesh.parse("dp=2,tp=4"), (8, 12), ["S(0)", "S(1)"])
    >>> str(s), s.to_placements(), s.to_partition_spec()
    ('[dp*4, tp*3]', ('S(0)', 'S(1)'), ('dp', 'tp'))
"""

from .core import Sharding
from .factors import REDUCE_OPS, Factor, parse_factor
from .placements import parse_placement

__all__ = ["Factor", "Sharding", "REDUCE_OPS", "parse_factor", "parse_placement"]
