"""The one error hierarchy of shardlayout.

Every error says what was given, what was expected, and what to do. Catch
:class:`ShardingError` to catch them all.

    >>> issubclass(LayoutError, ShardingError)
    True
"""

from __future__ import annotations


class ShardingError(ValueError):
    """Base of every shardlayout error (a ``ValueError``, so bad input reads as bad input)."""


class LayoutError(ShardingError):
    """An inadmissible input to the CuTe layout algebra (``shardlayout.layout``)."""


class MeshError(ShardingError):
    """A malformed mesh, or a mesh axis that does not exist."""


class ShardingSpecError(ShardingError):
    """A malformed or inconsistent sharding (factors, partial axes, text form, placements)."""


class NotRepresentable(ShardingError):
    """A sharding that a target notation (DTensor placements, a JAX PartitionSpec) cannot express."""


class ShardMismatch(ShardingError):
    """Local pieces that do not fit a sharding (wrong shapes, replicas that disagree)."""


class UnsupportedOp(ShardingError):
    """An op with no sharding rule."""


class OpError(ShardingSpecError):
    """A call of an op that does not fit its signature (tensors, params, dims, shapes)."""


class RunError(ShardingError):
    """A distributed run that could not start or finish (a rank died, a timeout, an op that
    cannot be differentiated)."""


class CheckpointError(ShardingError):
    """A checkpoint or weights file that cannot be loaded into this model (another model, a missing
    or damaged file), named with the tensor or file."""


class SimulationUnsupported(ShardingError):
    """An op the numpy simulator cannot run (random, undefined or data-dependent values)."""


class UnmatchedStyle(ShardingError):
    """A style or TP plan that matches nothing in the model (a pattern naming no module, a
    style finding none of the blocks it shards)."""


class StyleConflict(ShardingError):
    """A plan that would move a weight its style keeps in place (Megatron's column and row weights,
    EP's experts) with a collective: the error names the op, the weight, its pin and the fix."""


class SearchTooLarge(ShardingError):
    """An op's exhaustive strategy search would price more candidates than the bound allows
    (a mesh with many axes): the error names the op, the mesh and the count."""


class SymbolError(ShardingError):
    """A malformed or unusable symbolic extent (``shardlayout.symbolic``): bad expression text, an
    unbound symbol, a guard that cannot be satisfied."""


class DomainError(ShardingError):
    """An IterDomain transform, loop domain or ID-graph step that is malformed or has no exact
    meaning (``shardlayout.domain``): a bad split factor or position, a loop domain that no
    ``Sharding`` expresses, a reshape whose sharding cannot be carried over."""
