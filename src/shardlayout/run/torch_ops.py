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
from ..ops.resize import local_pad, local_slice

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


def _bind(schema, kinds: tuple, kw_keys: tuple):
    """How our inputs (``kinds``: "T" tensor or "N" number, in order) and params (``kw_keys``)
    fill ``schema``: ``[(argument, source)]`` with source ``("in", i)``, ``("list", i, j)`` or
    ``("kw", name)``; None when the schema does not fit."""
    rest, used, out = list(range(len(kinds))), set(), []
    args = list(schema.arguments)
    for k, a in enumerate(args):
        t = str(a.type)
        if a.name in kw_keys:
            out.append((a, ("kw", a.name)))
            used.add(a.name)
        elif t in ("List[Tensor]", "List[Optional[Tensor]]"):
            later = sum(1 for b in args[k + 1:] if _is_tensor_arg(str(b.type)) and not b.has_default_value())
            take = len(rest) - later
            if take < 1:
                return None
            out.append((a, ("list", rest[0], rest[take - 1] + 1)))
            rest = rest[take:]
        elif _is_tensor_arg(t) or (t in ("number", "Scalar") and rest and kinds[rest[0]] == "N"):
            if rest:
                out.append((a, ("in", rest.pop(0))))
            elif t.startswith("Optional") or a.has_default_value():
                continue
            else:
                return None
        elif a.has_default_value() or a.kwarg_only:
            continue
        else:
            return None
    if rest or used != set(kw_keys):
        return None
    return out


_RESOLVED: dict = {}
_VALUE_PARAMS: dict = {}


def _value_params(opdef) -> dict:
    """``{param: default is None}`` of the params that reach the aten op (memoised per op)."""
    hit = _VALUE_PARAMS.get(opdef.name)
    if hit is None:
        hit = _VALUE_PARAMS[opdef.name] = {p.name: p.default is None for p in opdef.signature.params
                                           if p.name not in PLANNING_PARAMS and p.type not in ("ignored", "mesh")}
    return hit


def _resolve(name: str, kinds: tuple, kw_keys: tuple):
    """The aten overload and argument layout for this call shape (memoised: a program calls the
    same op the same way again and again): ``(overload, numbers_as_tensors, positional, keyword)``."""
    key = (name, kinds, kw_keys)
    hit = _RESOLVED.get(key)
    if hit is not None:
        return hit
    import torch

    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        raise SimulationUnsupported(f"op {name} has no aten op to run it on torch")
    names = sorted((n for n in packet.overloads() if not n.endswith("out")), key=lambda n: (n != "default", n))
    # a number first (gt(3.0, x)) binds as a 0-d tensor when no overload takes it as a number
    for as_tensors, shape in ((False, kinds), (True, tuple("T" for _ in kinds))):
        for n in names:
            ov = getattr(packet, n)
            bound = _bind(ov._schema, shape, kw_keys)
            if bound is None:
                continue
            order = [a.name for a in ov._schema.arguments]
            pos, kwo = [], []
            for a, src in bound:  # positional while no argument was skipped, keywords after
                if not a.kwarg_only and not kwo and order.index(a.name) == len(pos):
                    pos.append(src)
                else:
                    kwo.append((a.name, src))
            hit = _RESOLVED[key] = (ov, as_tensors, tuple(pos), tuple(kwo))
            return hit
    raise SimulationUnsupported(
        f"op {name}: no overload of aten.{name} takes {len(kinds)} input(s) and params {list(kw_keys)}"
    )


def _value(src, args, kw):
    if src[0] == "in":
        return args[src[1]]
    if src[0] == "list":
        return list(args[src[1]: src[2]])
    return kw[src[1]]


def torch_op(opdef, args: list, params: dict, out_shapes: list) -> list:
    """Run ``opdef`` on torch tensors; returns one tensor per output."""
    import torch

    keep = _value_params(opdef)
    kw = {k: v for k, v in params.items() if k in keep and not (v is None and keep[k])}
    if kw.get("keepdim") is False and "dim" not in kw:  # a whole tensor's mean / sum: aten's overload has no keepdim
        del kw["keepdim"]
    for k in _DTYPE_PARAMS:
        if k in kw:
            kw[k] = _torch_dtype(torch, kw[k])
    if opdef.not_simulated:
        raise SimulationUnsupported(f"op {opdef.name} cannot run here: {opdef.not_simulated}")
    local = params.get("local")  # a comm-free cut's local run (ops.resize): whole groups of this rank's shard
    if opdef.name in ("split", "split_with_sizes", "chunk"):  # at the local pieces' sizes (a carved split)
        if local is not None:
            return [local_slice(args[0], kw.get("dim", 0), *g, size=s[kw.get("dim", 0)])
                    for g, s in zip(local, out_shapes)]
        return list(args[0].split([s[kw.get("dim", 0)] for s in out_shapes], dim=kw.get("dim", 0)))
    if opdef.name == "embedding" and local is not None:  # vocab-parallel: this rank's rows, zeros elsewhere
        start, rows = local
        j = args[1].long() - start
        inside = (j >= 0) & (j < rows)
        pad = kw.get("padding_idx", -1)  # a global row (aten: -1 for none); its gradient stays zero
        local_pad_row = pad - start if pad is not None and pad >= 0 and start <= pad < start + rows else None
        out = torch.nn.functional.embedding(torch.where(inside, j, torch.zeros_like(j)), args[0],
                                            padding_idx=local_pad_row)
        return [out * inside.unsqueeze(-1).to(out.dtype)]
    if opdef.name in ("slice", "narrow") and local is not None:
        return [local_slice(args[0], kw["dim"], *local, size=out_shapes[0][kw["dim"]]).contiguous()]
    if opdef.name == "slice_backward":
        g = args[0]
        zeros = lambda shape: torch.zeros(shape, dtype=g.dtype)  # noqa: E731
        if local is not None:
            return [local_pad(g, out_shapes[0], kw["dim"], *local, zeros)]
        out = zeros(tuple(out_shapes[0]))
        idx = (slice(None),) * kw["dim"] + (slice(kw["start"], kw["end"], kw.get("step", 1)),)
        out[idx] = g
        return [out]
    if opdef.name == "index":  # x[i0, i1, ...] on the dims ``indexed`` (None for the dims in between)
        key = [None] * (max(params.get("indexed") or [len(args) - 2]) + 1)
        for d, i in zip(params.get("indexed") or range(len(args) - 1), args[1:]):
            key[d] = i
        return [torch.ops.aten.index.Tensor(args[0], key)]
    if opdef.shape_driven and opdef.name not in ("slice", "narrow"):
        x = args[0]
        if opdef.name == "expand":
            return [x.expand(*out_shapes[0]).contiguous()]
        return [x.reshape(*out_shapes[0])]
    if opdef.name in ("_assert_tensor_metadata", "_assert_async", "_assert_scalar", "sym_constrain_range_for_size"):
        return []
    integral = opdef.name == "arange" and all(isinstance(kw.get(k, 0), int) for k in ("start", "end", "step"))
    if opdef.name in ("arange", "full", "zeros", "ones", "scalar_tensor") and kw.get("dtype") is None \
            and not integral:  # an arange of ints is int64 (positions indexing a table), as in torch
        kw["dtype"] = torch.get_default_dtype()  # the run's element type
    kinds = tuple("T" if isinstance(a, torch.Tensor) else "N" for a in args)
    ov, as_tensors, pos, kwo = _resolve(opdef.name, kinds, tuple(sorted(kw)))
    if as_tensors:
        args = [a if isinstance(a, torch.Tensor) else torch.as_tensor(a, dtype=torch.get_default_dtype())
                for a in args]
    out = ov(*(_value(src, args, kw) for src in pos), **{n: _value(src, args, kw) for n, src in kwo})
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o if isinstance(o, torch.Tensor) else torch.as_tensor(o) for o in outs][: max(len(out_shapes), 1)]


__all__ = ["torch_op"]
