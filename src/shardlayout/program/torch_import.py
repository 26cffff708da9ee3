"""``from_torch(module, example_args)``: a Program from ``torch.export`` in core ATen (torch extra).

Parameters, buffers and lifted tensor constants become named inputs with their fully-qualified
module names (``layers.0.self_attn.q_proj.weight``, never export's placeholder names); user inputs
keep their argument names. Every op must have a sharding rule: otherwise ``UnsupportedOp`` names the
op, its node and the source line.
"""

from __future__ import annotations

import operator

from ..errors import UnsupportedOp
from . import Program, ProgramBuilder, ProgramError, TensorSpec

# scalar arguments of these ops are operands (add(x, 1e-6)), not parameters
_POINTWISE_SCALARS = {"add", "sub", "mul", "div", "pow", "where", "eq", "ne", "le", "lt", "ge", "gt",
                      "maximum", "minimum", "fill", "full_like", "masked_fill"}


def _jsonable(v):
    import torch

    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(v).replace("torch.", "")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def from_torch(module, example_args, decompose: bool = True) -> Program:
    """Export ``module`` with ``example_args`` and read its graph into a Program.

    ``from_torch(LlamaTorch(2), (x, cos, sin))``
    """
    import torch


    ep = torch.export.export(module, tuple(example_args))
    return from_exported(ep, decompose)


def from_exported(ep, decompose: bool = True) -> Program:
    """A Program from an ``ExportedProgram`` (e.g. ``torch.export.load("model.pt2")``)."""
    import torch

    from ..ops import canonical_op_name, registered

    known = registered()
    if decompose:
        ep = ep.run_decompositions()
    sig = ep.graph_signature
    params = dict(sig.inputs_to_parameters)
    buffers = {**dict(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {}), **dict(sig.inputs_to_buffers)}
    b = ProgramBuilder()
    names: dict = {}
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            shape = tuple(int(s) for s in val.shape)
            dtype = str(val.dtype).replace("torch.", "")
            if node.name in params:
                name, kind = params[node.name], "param"
            elif node.name in buffers:
                name, kind = buffers[node.name], "buffer"
            else:
                name, kind = node.name, "input"
            b._add(TensorSpec(name, shape, dtype, kind))
            names[node] = name
        elif node.op == "call_function":
            if node.target is operator.getitem:
                base = names[node.args[0]]
                names[node] = base[node.args[1]] if isinstance(base, tuple) else base
                continue
            target = str(node.target)
            short = canonical_op_name(target)
            if short not in known:
                where = (node.meta.get("stack_trace") or "").strip().splitlines()
                line = where[-2].strip() if len(where) >= 2 else "(no source line)"
                raise UnsupportedOp(
                    f"{target} at node {node.name!r} ({line}) has no sharding rule; declare it with "
                    f"shardlayout.register_op({short!r}, signature, rule, numpy)"
                )
            inputs, kwargs = [], {}
            schema = node.target._schema.arguments
            values = list(node.args) + [node.kwargs.get(a.name, a.default_value) for a in schema[len(node.args):]]
            for arg, v in zip(schema, values):
                if isinstance(v, torch.fx.Node):
                    inputs.append(names[v])
                elif isinstance(v, (list, tuple)) and v and all(isinstance(x, torch.fx.Node) for x in v):
                    inputs.extend(names[x] for x in v)
                elif short in _POINTWISE_SCALARS and isinstance(v, (int, float)) and not isinstance(v, bool) \
                        and arg.name in ("other", "exponent", "value", "self", "scalar"):
                    inputs.append(float(v))
                elif v is not None:
                    kwargs[arg.name] = _jsonable(v)
            val = node.meta.get("val")
            n_out = len(val) if isinstance(val, (list, tuple)) else 1
            vals = val if isinstance(val, (list, tuple)) else (val,)
            dtypes = [str(v.dtype).replace("torch.", "") if hasattr(v, "dtype") else None for v in vals]
            try:
                out = b.op(target, inputs, name=node.name, n_out=n_out, dtypes=dtypes, **kwargs)
            except Exception as e:  # noqa: BLE001 - name the node whatever the rule raised
                raise ProgramError(f"node {node.name!r} ({target}): {e}") from None
            names[node] = out
            outs = () if out is None else out if isinstance(out, tuple) else (out,)
            for o, v in zip(outs, vals):
                if v is not None and hasattr(v, "shape") and tuple(b._tensors[o].shape) != tuple(v.shape):
                    raise ProgramError(
                        f"node {node.name!r} ({target}): the rule gives shape {b._tensors[o].shape}, "
                        f"torch.export says {tuple(v.shape)}"
                    )
        elif node.op == "output":
            for o in node.args[0]:
                if isinstance(o, torch.fx.Node):
                    b.output(names[o])
    return b.build()
