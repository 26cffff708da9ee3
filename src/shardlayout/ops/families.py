"""Op families as factor maps: pointwise (with broadcasting), matmul/einsum, reductions, softmax.

    >>> from shardlayout import Mesh, Sharding, propagate
    >>> m = Mesh.parse("dp=2,tp=4")
    >>> x, w = Sharding.parse("[dp*4, 12]", m), Sharding.parse("[tp*4, 12]", m)
    >>> str(propagate("linear", [x, w]).outputs[0])
    '[dp*4, tp*4]'
"""

from __future__ import annotations

from ..errors import ShardingSpecError
from ..propagation import Propagation, Redistribution
from ..sharding import Sharding
from .registry import register
from .strategy import FactorMap, choose

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _result(name: str, inputs: tuple, fm: FactorMap, out_shapes=None, cost_model=None, dtype="float32",
            n_out: int = 1) -> Propagation:
    st = choose(fm, list(inputs), out_shapes, cost_model, dtype)
    reds = tuple(
        Redistribution(i, s.kind, s.axes, s.bytes, s.seconds, f"input {i}")
        for i, s in st.redistributions
    )
    notes = tuple(f"{c.axis}: {fmt_option(c.option)}" for c in st.choices)
    alts = tuple((c.axis, c.option, c.cost) for c in st.alternatives)
    targets = tuple(t if t is not None else s for s, t in zip(inputs, st.input_targets))
    outs = st.outputs * n_out if n_out > 1 else st.outputs
    return Propagation(name, tuple(inputs), targets, outs, reds, notes, alts)


def fmt_option(opt) -> str:
    """``fmt_option(("S", "k")) -> "shard index 'k'"``."""
    if opt[0] == "R":
        return "replicate"
    if opt[0] == "S":
        return f"shard index {opt[1]!r}"
    return f"keep partial({opt[1]})"


def _tensors(inputs) -> list:
    return [s if isinstance(s, Sharding) else None for s in inputs]


# ------------------------------------------------------------------------------------------
# pointwise
# ------------------------------------------------------------------------------------------

SUM_LINEAR = ("add", "sub", "neg", "clone", "_to_copy", "alias", "contiguous", "detach")
MULTI_LINEAR = ("mul", "div")
NONLINEAR = ("rsqrt", "sqrt", "sigmoid", "silu", "relu", "gelu", "exp", "log", "tanh", "pow",
             "where", "eq", "ne", "le", "lt", "ge", "gt", "logical_and", "logical_or", "logical_not",
             "abs", "cos", "sin", "reciprocal", "full_like", "zeros_like", "ones_like", "scalar_tensor",
             "maximum", "minimum", "clamp", "masked_fill", "bitwise_not")


def pointwise_map(name: str, inputs: list) -> FactorMap:
    """Broadcasting factor map: inputs aligned on their last dims."""
    tensors = [s for s in inputs if s is not None]
    if not tensors:
        raise ShardingSpecError(f"{name}: needs at least one tensor input")
    rank = max(s.ndim for s in tensors)
    out = LETTERS[:rank]
    ins = tuple("" if s is None else out[rank - s.ndim:] for s in inputs)
    linear = "sum" if name in SUM_LINEAR else "multi" if name in MULTI_LINEAR else None
    if name == "div":  # only the numerator may be partial
        linear = "multi" if inputs[0] is not None else None
    if name in ("sub",):
        linear = "sum"
    return FactorMap(ins, out, linear=linear)


@register(*SUM_LINEAR, *MULTI_LINEAR, *NONLINEAR)
def pointwise_rule(name, inputs, cost_model=None, dtype="float32", **_):
    """Pointwise ops: every dim may be sharded as the inputs are; linear ops keep partials."""
    ins = _tensors(inputs)
    fm = pointwise_map(name, ins)
    if name == "div" and ins[1] is not None and any(a for a, _ in ins[1].partial):
        fm = FactorMap(fm.inputs, fm.output, linear=None)
    return _result(name, tuple(inputs), fm, None, cost_model, dtype)


# ------------------------------------------------------------------------------------------
# matmul family and einsum
# ------------------------------------------------------------------------------------------


def parse_einsum(equation: str, n: int) -> FactorMap:
    """``parse_einsum("mk,kn->mn", 2)``; contracted indices reduce with sum."""
    eq = equation.replace(" ", "")
    if "->" not in eq or "." in eq:
        raise ShardingSpecError(f"einsum: {equation!r} needs an explicit '->' output and no '...'")
    lhs, out = eq.split("->")
    ins = tuple(lhs.split(","))
    if len(ins) != n:
        raise ShardingSpecError(f"einsum: {equation!r} names {len(ins)} operands, {n} given")
    return FactorMap(ins, out, linear="multi")


@register("mm")
def mm_rule(name, inputs, cost_model=None, dtype="float32", **_):
    fm = FactorMap(("mk", "kn"), "mn", linear="multi")
    return _result(name, tuple(inputs), fm, None, cost_model, dtype)


@register("bmm")
def bmm_rule(name, inputs, cost_model=None, dtype="float32", **_):
    return _result(name, tuple(inputs), FactorMap(("bmk", "bkn"), "bmn", linear="multi"), None, cost_model,
                   dtype)


@register("einsum")
def einsum_rule(name, inputs, equation=None, cost_model=None, dtype="float32", **_):
    return _result(name, tuple(inputs), parse_einsum(equation, len(inputs)), None, cost_model, dtype)


@register("matmul")
def matmul_rule(name, inputs, cost_model=None, dtype="float32", **_):
    a, b = inputs
    if a.ndim == 1 or b.ndim == 1:
        la = "k" if a.ndim == 1 else LETTERS[: a.ndim - 2] + "mk"
        lb = "k" if b.ndim == 1 else LETTERS[: b.ndim - 2] + "kn"
        out = (la[:-1] if a.ndim > 1 else "") + ("n" if b.ndim > 1 else "")
        out = (LETTERS[: b.ndim - 2] if a.ndim == 1 and b.ndim > 2 else "") + out if a.ndim == 1 else out
        return _result(name, tuple(inputs), FactorMap((la, lb), out, linear="multi"), None, cost_model, dtype)
    batch = max(a.ndim, b.ndim) - 2
    bl = LETTERS[:batch]
    la = bl[batch - (a.ndim - 2):] + "mk"
    lb = bl[batch - (b.ndim - 2):] + "kn"
    return _result(name, tuple(inputs), FactorMap((la, lb), bl + "mn", linear="multi"), None, cost_model,
                   dtype)


@register("linear")
def linear_rule(name, inputs, cost_model=None, dtype="float32", **_):
    """``linear(x, w, b=None)``: ``...k, nk (, n) -> ...n``."""
    x = inputs[0]
    bias = inputs[2] if len(inputs) > 2 else None
    lead = LETTERS[: x.ndim - 1]
    ins = (lead + "k", "nk") + (("n",) if bias is not None else ())
    fm = FactorMap(ins, lead + "n", linear="multi" if bias is None else None)
    return _result(name, tuple(inputs[: len(ins)]), fm, None, cost_model, dtype)


@register("addmm")
def addmm_rule(name, inputs, cost_model=None, dtype="float32", **_):
    """``addmm(bias, a, b)``: ``bias + a @ b``; bias broadcast over rows."""
    bias = inputs[0]
    lb = "mn"[2 - bias.ndim:]
    fm = FactorMap((lb, "mk", "kn"), "mn", linear=None)
    return _result(name, tuple(inputs), fm, None, cost_model, dtype)


# ------------------------------------------------------------------------------------------
# reductions and softmax
# ------------------------------------------------------------------------------------------

REDUCE_OP = {"sum": "sum", "mean": "avg", "amax": "max", "max": "max", "amin": "min", "min": "min",
             "any": "max", "all": "min"}


def reduction_map(name: str, s: Sharding, dim, keepdim: bool) -> tuple:
    if dim is None or dim == [] or dim == ():
        dims = list(range(s.ndim))
    else:
        dims = [d % s.ndim for d in ([dim] if isinstance(dim, int) else dim)]
    ins = LETTERS[: s.ndim]
    out, shape = "", []
    for d in range(s.ndim):
        if d in dims:
            if keepdim:
                out += LETTERS[s.ndim + d].upper()
                shape.append(1)
        else:
            out += ins[d]
            shape.append(s.shape[d])
    linear = "sum" if name in ("sum", "mean") else None
    return FactorMap((ins,), out, reduce=REDUCE_OP[name], linear=linear), tuple(shape)


@register("sum", "mean", "amax", "amin", "any", "all")
def reduction_rule(name, inputs, dim=None, keepdim=False, cost_model=None, dtype="float32", **_):
    """Reductions over ``dim``: a sharded reduced dim gives a partial output (sum, avg, max, min)."""
    s = inputs[0]
    fm, shape = reduction_map(name, s, dim, keepdim)
    return _result(name, (s,), fm, [shape], cost_model, dtype)


@register("_softmax", "softmax", "_log_softmax", "log_softmax")
def softmax_rule(name, inputs, dim=-1, cost_model=None, dtype="float32", **_):
    """Softmax needs whole rows along ``dim``: that dim is never sharded (gathered if it is)."""
    s = inputs[0]
    letters = LETTERS[: s.ndim]
    fm = FactorMap((letters,), letters, whole=frozenset(letters[dim % s.ndim]))
    return _result(name, (s,), fm, None, cost_model, dtype)


# ------------------------------------------------------------------------------------------
# data-dependent output sizes
# ------------------------------------------------------------------------------------------


@register("nonzero", "masked_select", "unique", "_unique2", "argwhere")
def data_dependent_rule(name, inputs, out_shape=None, cost_model=None, dtype="float32", **_):
    """Ops whose output size depends on the data: every rank needs the whole input, and the
    output (replicated) has the shape the caller names with ``out_shape=``."""
    s = inputs[0]
    if out_shape is None:
        raise ShardingSpecError(
            f"{name}: its output size depends on the values of the input, which sharding "
            f"propagation does not see; pass out_shape=(...) (e.g. the bound torch.export "
            f"records) to plan it — the input {s} is then gathered and the output replicated"
        )
    target = Sharding(s.mesh, s.shape)
    from .view import gathers

    return Propagation(name, (s,), (target,), (Sharding(s.mesh, tuple(out_shape)),),
                       gathers(s, target, 0, dtype), (f"{name}: data-dependent output size",))
