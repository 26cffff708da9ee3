"""``propagate(op, inputs, **params) -> Propagation``: the one entry point of every op rule.

    >>> from shardlayout import Mesh, Sharding, propagate
    >>> s = Sharding.parse("[dp*4, tp*3]", Mesh.parse("dp=2,tp=4"))
    >>> p = propagate("view", [s], shape=(16, 6))
    >>> str(p.outputs[0]), p.needs_communication
    ('[dp*4*tp:(1)2, tp:(2)2*3]', False)
"""

from __future__ import annotations

import reprlib

from .errors import OpError
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
    opdef = (_REGISTRY.get(op) if type(op) is str else None) or get_op(op)  # a short name is a key as it is
    if type(inputs) is list:  # the common call: exact type tests first
        inputs = tuple(inputs)
    elif type(inputs) is not tuple:
        if isinstance(inputs, Sharding):
            inputs = [inputs]
        elif isinstance(inputs, (str, bytes, dict)) or not hasattr(inputs, "__iter__"):
            raise OpError(f"op {opdef.name}: inputs {reprlib.repr(inputs)} are not a list; give one Sharding (or "
                          "constant) per tensor input, e.g. propagate('mm', [a, b])")
        inputs = tuple(inputs)
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise OpError(f"op {opdef.name}: cost_model {reprlib.repr(cost_model)} is not a CostModel; pass e.g. "
                      "CostModel(bandwidth={'dp': 25e9}), or None for the default")
    if type(tensor_dtype) is not str:  # the common call gives one dtype name: nothing to convert
        tensor_dtype = _dtypes(opdef, tensor_dtype, len(inputs))
    if out_pins is not None:
        out_pins = _check_out_pins(opdef, inputs, params, out_pins)
    return opdef.resolve(inputs, params, out_pins, cost_model or DEFAULT_COST_MODEL, tensor_dtype)[0]


def _dtypes(opdef, tensor_dtype, n_inputs: int):
    """``tensor_dtype`` given otherwise than as one name: a tuple of names (one for every operand,
    or one per input and then one per output), or one value read as a name."""
    if isinstance(tensor_dtype, (tuple, list)):
        if len(tensor_dtype) != 1 and len(tensor_dtype) < n_inputs:
            raise OpError(f"op {opdef.name}: tensor_dtype lists {len(tensor_dtype)} dtypes for {n_inputs} inputs; "
                          "give one dtype name for every operand, or one per input (then one per output)")
        return tuple(map(str, tensor_dtype))
    return str(tensor_dtype)


def _check_out_pins(opdef, inputs: tuple, params: dict, out_pins) -> tuple:
    """``out_pins`` as a tuple of one Sharding (or None) per output of the call, each of that output's
    shape and on the inputs' mesh; else an OpError naming the pin and the fix."""
    op = opdef.name
    if isinstance(out_pins, Sharding):
        out_pins = (out_pins,)
    if type(out_pins) is not list and type(out_pins) is not tuple:
        raise OpError(f"op {op}: out_pins {reprlib.repr(out_pins)} is not a list; give one Sharding (or None) per "
                      "output, e.g. out_pins=[Sharding.parse('[dp*4, 6]', mesh)]")
    for k, pin in enumerate(out_pins):
        if pin is not None and not isinstance(pin, Sharding):
            raise OpError(f"op {op}: out_pins[{k}] is {type(pin).__name__} {reprlib.repr(pin)}, not a Sharding; give "
                          "a Sharding (or None for an output left free)")
    opdef.bind(inputs, params)  # a bad call is named as such before its pins are checked
    shapes = [o.shape for o in opdef.resolve(inputs, params, None, DEFAULT_COST_MODEL)[0].outputs]
    if len(out_pins) != len(shapes):
        raise OpError(f"op {op}: {len(out_pins)} out_pins for {len(shapes)} output(s); give one Sharding (or None) "
                      "per output")
    mesh = next((x.mesh for x in inputs if isinstance(x, Sharding)), params.get("mesh"))
    for k, (pin, shape) in enumerate(zip(out_pins, shapes)):
        if pin is None:
            continue
        if pin.shape != tuple(shape):
            raise OpError(f"op {op}: out_pins[{k}] {pin} has shape {pin.shape}, output {k} has shape {tuple(shape)}; "
                          "pin a sharding of the output's shape")
        if mesh is not None and pin.mesh != mesh:
            raise OpError(f"op {op}: out_pins[{k}] {pin} is on mesh {pin.mesh}, the inputs on mesh {mesh}; pin the "
                          "outputs on the inputs' mesh")
    return tuple(out_pins)


__all__ = ["Propagation", "canonical_op_name", "propagate"]
