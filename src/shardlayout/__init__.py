"""shardlayout: plan, verify and run tensor shardings as CuTe layouts.

    >>> from shardlayout import Mesh, Sharding
    >>> str(Sharding.from_placements(Mesh.parse("dp=2,tp=4"), (8, 12), ["S(0)", "S(1)"]))
    '[dp*4, tp*3]'
"""

from .errors import (
    LayoutError,
    MeshError,
    NotRepresentable,
    OpError,
    SearchTooLarge,
    ShardingError,
    ShardingSpecError,
    ShardMismatch,
    UnmatchedStyle,
    UnsupportedOp,
)
from .layout import Layout
from .mesh import Mesh
from .ops import register_op
from .propagation import Propagation, propagate
from .sharding import Factor, Sharding
from .sharding.collective import AxisPiece, Collective, CollectiveKind
from .sharding.cost import CostModel, cost
from .sharding.move import plan_move

__version__ = "0.1.0"


def __getattr__(name: str):
    """``parallelize`` and ``ParallelModule`` need torch: imported on first use (the core does not)."""
    if name in ("parallelize", "ParallelModule", "ParallelizeError"):
        from .run import parallel

        return getattr(parallel, name)
    if name == "load_safetensors":
        from .run.weights import load_safetensors

        return load_safetensors
    raise AttributeError(f"module 'shardlayout' has no attribute {name!r}")


__all__ = [
    "AxisPiece",
    "Collective",
    "CollectiveKind",
    "CostModel",
    "Factor",
    "OpError",
    "ParallelModule",
    "ParallelizeError",
    "Propagation",
    "cost",
    "load_safetensors",
    "parallelize",
    "plan_move",
    "propagate",
    "register_op",
    "Layout",
    "LayoutError",
    "Mesh",
    "MeshError",
    "NotRepresentable",
    "Sharding",
    "ShardingError",
    "ShardingSpecError",
    "ShardMismatch",
    "SearchTooLarge",
    "UnmatchedStyle",
    "UnsupportedOp",
    "__version__",
]
