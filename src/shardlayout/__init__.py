"""shardlayout: plan, verify and run tensor shardings as CuTe layouts.

    >>> from shardlayout import Mesh, Sharding
    >>> str(Sharding.from_placements(Mesh.parse("dp=2,tp=4"), (8, 12), ["S(0)", "S(1)"]))
    '[dp*4, tp*3]'
"""

from .errors import (
    LayoutError,
    MeshError,
    NotRepresentable,
    ShardingError,
    ShardingSpecError,
    ShardMismatch,
    UnsupportedOp,
)
from .layout import Layout
from .mesh import Mesh
from .propagation import Propagation, Redistribution, propagate
from .sharding import Factor, Sharding

__version__ = "0.1.0"

__all__ = [
    "Factor",
    "Propagation",
    "Redistribution",
    "propagate",
    "Layout",
    "LayoutError",
    "Mesh",
    "MeshError",
    "NotRepresentable",
    "Sharding",
    "ShardingError",
    "ShardingSpecError",
    "ShardMismatch",
    "UnsupportedOp",
    "__version__",
]
