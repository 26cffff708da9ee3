"""Ops on torch tensors: every registered op runs as its own aten op, bound by torch's schema.

Our op names and params are torch's (``propagate`` validated them), so one generic binding
runs them all: the op's tensor inputs fill the schema's tensor arguments in order, params fill
the rest by name. View-like ops reshape to the shape they must produce on this rank (a local
shape, not the global one the params name).

    >>> import torch  # doctest: +SKIP
    >>> from shardlayout.ops import get_op  # doctest: +SKIP
    >>> torch_op(get_op("mm"), [torch.ones(2, 3), torch.ones(3, 4)], {}, [(2, 4)])[0].sum()  # doctest: +SKIP
    tensor(24.)
"""

from __future__ import annotations

from ..errors import SimulationUnsupported
from ..ops.registry import PLANNING_PARAMS

_DTYPE_PARAMS = ("dtype", "out_dtype", "input_dtype")


def _torch_dtype(torch, v):
    if v is None or not isinstance(v, str):
        return v
    dt = getattr(torch, v.replace("torch.", ""), None)
    if not isinstance(dt, torch.dtype):
        raise SimulationUnsupported(f"dtype {v!r} is not a torch dtype")
    return dt


def _is_tensor_arg(t: str) -> bool:
    return t in ("Tensor", "Optional[Tensor]")


def _bind(schema, inputs: list, kw: dict):
    """Positional args for ``schema`` from our inputs (tensors / numbers, in order) and params,
    or None when the schema does not fit."""
    rest, used, out = list(inputs), set(), []
    args = list(schema.arguments)
    for k, a in enumerate(args):
        t = str(a.type)
        if a.name in kw:
            out.append((a, kw[a.name]))
            used.add(a.name)
        elif t in ("List[Tensor]", "List[Optional[Tensor]]"):
            later = sum(1 for b in args[k + 1:] if _is_tensor_arg(str(b.type)) and not b.has_default_value())
            take = len(rest) - later
            if take < 1:
                return None
            out.append((a, rest[:take]))
            rest = rest[take:]
        elif _is_tensor_arg(t) or (t in ("number", "Scalar") and rest and not hasattr(rest[0], "shape")):
            if rest:
                out.append((a, rest.pop(0)))
            elif t.startswith("Optional") or a.has_default_value():
                continue
            else:
                return None
        elif a.has_default_value() or a.kwarg_only:
            continue
        else:
            return None
    if rest or used != set(kw):
        return None
    return out


def torch_op(opdef, args: list, params: dict, out_shapes: list) -> list:
    """Run ``opdef`` on torch tensors; returns one tensor per output."""
    import torch

    kw = {k: v for k, v in params.items()
          if k not in PLANNING_PARAMS and opdef.signature.param(k).type not in ("ignored", "mesh")
          and not (v is None and opdef.signature.param(k).default is None)}
    for k in _DTYPE_PARAMS:
        if k in kw:
            kw[k] = _torch_dtype(torch, kw[k])
    if opdef.not_simulated:
        raise SimulationUnsupported(f"op {opdef.name} cannot run here: {opdef.not_simulated}")
    if opdef.shape_driven:
        x = args[0]
        if opdef.name == "expand":
            return [x.expand(*out_shapes[0]).contiguous()]
        return [x.reshape(*out_shapes[0])]
    if opdef.name in ("_assert_tensor_metadata", "_assert_async", "_assert_scalar", "sym_constrain_range_for_size"):
        return []
    if opdef.name in ("arange", "full", "zeros", "ones", "scalar_tensor") and kw.get("dtype") is None:
        kw["dtype"] = torch.get_default_dtype()  # the run's element type
    packet = getattr(torch.ops.aten, opdef.name, None)
    if packet is None:
        raise SimulationUnsupported(f"op {opdef.name} has no aten op to run it on torch")
    tensors_only = [torch.as_tensor(a, dtype=torch.get_default_dtype()) if isinstance(a, (int, float)) else a
                    for a in args]  # e.g. gt(3.0, x): a number first binds as a 0-d tensor
    tries = [(name, list(args)) for name in sorted(packet.overloads(), key=lambda n: (n != "default", n))
             if not name.endswith("out")]
    tries += [(name, tensors_only) for name, _ in tries]
    for name, call_args in tries:
        ov = getattr(packet, name)
        bound = _bind(ov._schema, call_args, kw)
        if bound is None:
            continue
        names = [a.name for a in ov._schema.arguments]
        pos, kwo = [], {}
        for a, v in bound:  # positional while no argument was skipped, keywords after
            if not a.kwarg_only and not kwo and names.index(a.name) == len(pos):
                pos.append(v)
            else:
                kwo[a.name] = v
        out = ov(*pos, **kwo)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        return [o if isinstance(o, torch.Tensor) else torch.as_tensor(o) for o in outs][: max(len(out_shapes), 1)]
    raise SimulationUnsupported(
        f"op {opdef.name}: no overload of aten.{opdef.name} takes {len(args)} input(s) and params {sorted(kw)}"
    )


__all__ = ["torch_op"]
