"""``propagate(op, inputs, **params) -> Propagation``: the one entry point of every op rule.

    >>> from shardlayout import Mesh, Sharding, propagate
    >>> s = Sharding.parse("[dp*4, tp*3]", Mesh.parse("dp=2,tp=4"))
    >>> p = propagate("view", [s], shape=(16, 6))
    >>> str(p.outputs[0]), p.needs_communication
    ('[dp*4*tp:(1)2, tp:(2)2*3]', False)
"""

from __future__ import annotations

from .ops.registry import _REGISTRY, get_op
from .ops.result import Propagation, canonical_op_name
from .sharding import Sharding
from .sharding.cost import DEFAULT_COST_MODEL, CostModel


def propagate(op: str, inputs, *, out_pins=None, cost_model: CostModel | None = None,
              tensor_dtype: str = "float32", **params) -> Propagation:
    """Shardings through one op: outputs, input targets, collectives, cost.

    ``op`` is a short name (``"view"``) or an aten overload (``"aten.view.default"``);
    ``params`` are named as torch names them (``shape=``, ``dims=``, ``dim0=`` ...) and are
    checked against the op's signature first. ``out_pins`` (one Sharding or None per output)
    makes the search price moving each output to its pin; ``cost_model`` and ``tensor_dtype``
    (the element type of the inputs, one name or one per input) price the collectives; ``mesh=``
    gives creation ops their mesh; ``subaxes=`` overrides the setting for views.
    """
    if isinstance(inputs, Sharding):
        inputs = [inputs]
    opdef = (_REGISTRY.get(op) if type(op) is str else None) or get_op(op)  # a short name is a key as it is
    return opdef.resolve(tuple(inputs), params, out_pins, cost_model or DEFAULT_COST_MODEL,
                         tuple(map(str, tensor_dtype)) if isinstance(tensor_dtype, (tuple, list))
                         else str(tensor_dtype))[0]


__all__ = ["Propagation", "canonical_op_name", "propagate"]
