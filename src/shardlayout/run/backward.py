"""Where the backward pass reduces gradients: the convention lives in ``plan.backward`` (a pure
module, importable without torch, shared with the auto-sharding step-time estimate); re-exported
here for the runner.

    >>> from shardlayout.run.backward import gradient_reductions
    >>> gradient_reductions.__module__
    'shardlayout.plan.backward'
"""

from ..plan.backward import (
                             grad_tensors,
                             gradient_reductions,
                             op_reductions,
                             reduction_at,
                             slice_completions,
                             training_pieces,
)

__all__ = ["grad_tensors", "gradient_reductions", "op_reductions", "reduction_at", "slice_completions",
           "training_pieces"]
