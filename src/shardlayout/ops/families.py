"""Op families: pointwise (with broadcasting), matmul/einsum, reductions, softmax, norms,
select, index ops, scans and sorts, attention, MoE, creation ops. Each op is declared
once with ``register_op``: its signature, its sharding rule (mostly a factor map searched by
``strategy``), and its numpy implementation, side by side.

    >>> from shardlayout import Mesh, Sharding, propagate
    >>> m = Mesh.parse("dp=2,tp=4")
    >>> x, w = Sharding.parse("[dp*4, 12]", m), Sharding.parse("[tp*4, 12]", m)
    >>> str(propagate("linear", [x, w]).outputs[0])
    '[dp*4, tp*4]'
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..errors import OpError
from ..sharding import Sharding
from ..sharding.core import ChunkProgram, _product
from ..sharding.cost import DEFAULT_COST_MODEL
from ..sharding.factors import _fmt_factor
from .registry import register_op
from .result import Propagation
from .strategy import (
    FactorMap,
    choose,
    factor_map_result,
    factor_rule,
    fmt_option,
    input_moves,
    move_collectives,
)

LETTERS = "abcdefghijklmnopqrstuvwxyz"

_erf = np.vectorize(math.erf)



MATMULS = {"mm": 0, "bmm": 0, "matmul": 0, "linear": 0, "addmm": 1, "baddbmm": 1}
"""Matmul-like ops and the input whose last dim is contracted."""

# ------------------------------------------------------------------------------------------
# pointwise
# ------------------------------------------------------------------------------------------

def _pointwise_map(name: str, inputs: list, linear: str | None) -> FactorMap:
    """Broadcasting factor map: inputs aligned on their last dims."""
    tensors = [s for s in inputs if s is not None]
    rank = max(s.ndim for s in tensors)
    out = LETTERS[:rank]
    ins = tuple("" if s is None else out[rank - s.ndim:] for s in inputs)
    if linear == "sum" and any(s is None for s in inputs):
        linear = None  # partial + a constant would add the constant once per rank
    if linear == "first" and inputs[0] is None:
        linear = None
    return FactorMap(ins, out, linear=linear, broadcast=frozenset(out))


_FLOAT_TYPES = ("float", "bfloat", "complex", "half", "double")


def _linearity(name: str, params: dict):
    """How partial inputs pass through ``name`` with these params: a rounding division or a
    cast to an integer or boolean type is not linear."""
    if name == "div" and params.get("rounding_mode") is not None:
        return None
    dt = params.get("dtype")
    if name == "_to_copy" and dt is not None and not str(dt).replace("torch.", "").startswith(_FLOAT_TYPES):
        return None
    return _LINEARITY.get(name)


def pointwise_map(name: str, inputs: list, params=None) -> FactorMap:
    """The factor map of a registered pointwise op on ``inputs`` (None for constants)."""
    return _pointwise_map(name, inputs, _linearity(name, params or {}))


_LINEARITY: dict = {}


def pointwise_ops() -> frozenset:
    """Names of every op declared with ``pointwise`` (``"add" in pointwise_ops() -> True``)."""
    return frozenset(_LINEARITY)


def _check_pointwise(name, inputs, params):
    if not any(isinstance(s, Sharding) for s in inputs):
        raise OpError(f"op {name}: needs at least one tensor input (got only constants {list(inputs)})")


def pointwise(name: str, signature: str, fn, linear: str | None = None, aliases=()) -> None:
    """Declare a pointwise op: every dim may be sharded as the inputs are; ``linear`` says how
    partial inputs pass (``"sum"``, ``"multi"``, ``"first"``)."""
    for n in (name, *aliases):
        _LINEARITY[n] = linear
    rule = factor_rule(lambda nm, ins, params: _pointwise_map(nm, ins, _linearity(nm, params)))
    register_op(name, signature, rule, fn, check=_check_pointwise, aliases=aliases)


def _f(x):
    return np.asarray(x, dtype=float)


def _np_cast(a, dtype=None):
    """``_to_copy``'s value change: to an integer type truncates toward zero, to bool tests != 0."""
    dt = str(dtype or "float").replace("torch.", "")
    if dt == "bool":
        return (_f(a) != 0) * 1.0
    if not dt.startswith(_FLOAT_TYPES):
        return np.trunc(_f(a))
    return np.array(a, dtype=float)


_UNARY = {
    "rsqrt": lambda a: 1 / np.sqrt(a), "sqrt": np.sqrt, "exp": np.exp, "log": np.log, "abs": np.abs,
    "sigmoid": lambda a: 1 / (1 + np.exp(-a)), "silu": lambda a: a / (1 + np.exp(-a)),
    "relu": lambda a: np.maximum(a, 0), "tanh": np.tanh, "cos": np.cos, "sin": np.sin, "erf": _erf,
    "reciprocal": lambda a: 1 / a, "sign": np.sign, "floor": np.floor, "ceil": np.ceil,
    "logical_not": lambda a: (a == 0).astype(float), "log1p": np.log1p, "expm1": np.expm1, "log2": np.log2,
    "exp2": np.exp2, "log10": np.log10, "trunc": np.trunc, "tan": np.tan, "atan": np.arctan, "asin": np.arcsin,
    "acos": np.arccos, "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh,
    "atanh": np.arctanh, "isnan": lambda a: np.isnan(a) * 1.0, "isinf": lambda a: np.isinf(a) * 1.0,
}
for _n, _fn in _UNARY.items():
    pointwise(_n, "x", (lambda g: lambda a: g(_f(a)))(_fn))
pointwise("bitwise_not", "x", lambda a: np.invert(a) if np.asarray(a).dtype.kind in "iub" else (_f(a) == 0) * 1.0)
pointwise("neg", "x", lambda a: -_f(a), linear="sum")
pointwise("detach", "x", lambda a: a, linear="sum")
pointwise("_to_copy", "x ; dtype: dtype? = None, layout: ignored = None, device: ignored = None, "
          "pin_memory: ignored = None, non_blocking: ignored = False, memory_format: ignored = None",
          lambda a, dtype=None, **_: _np_cast(a, dtype), linear="sum")
pointwise("gelu", "x ; approximate: str = 'none'",
          lambda a, approximate="none": a * 0.5 * (1 + _erf(_f(a) / np.sqrt(2))) if approximate == "none"
          else 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3))))
pointwise("round", "x ; decimals: int = 0", lambda a, decimals=0: np.round(a, decimals))
pointwise("add", "x|scalar, y|scalar ; alpha: scalar = 1", lambda a, b, alpha=1: _f(a) + alpha * _f(b), linear="sum")
pointwise("sub", "x|scalar, y|scalar ; alpha: scalar = 1", lambda a, b, alpha=1: _f(a) - alpha * _f(b), linear="sum")
pointwise("mul", "x|scalar, y|scalar", lambda a, b: _f(a) * _f(b), linear="multi")
pointwise("div", "x|scalar, y|scalar ; rounding_mode: str? = None",
          lambda a, b, rounding_mode=None: {None: np.divide, "floor": np.floor_divide,
                                            "trunc": lambda u, v: np.trunc(u / v)}[rounding_mode](_f(a), _f(b)),
          linear="first")
pointwise("pow", "x|scalar, exponent|scalar", lambda a, b: _f(a) ** _f(b))
for _n, _fn in {"eq": np.equal, "ne": np.not_equal, "le": np.less_equal, "lt": np.less,
                "ge": np.greater_equal, "gt": np.greater}.items():
    pointwise(_n, "x|scalar, y|scalar", (lambda g: lambda a, b: g(a, b).astype(float))(_fn))
pointwise("logical_and", "x, y", lambda a, b: ((a != 0) & (b != 0)).astype(float))
pointwise("logical_or", "x, y", lambda a, b: ((a != 0) | (b != 0)).astype(float))
pointwise("logical_xor", "x, y", lambda a, b: ((a != 0) ^ (b != 0)).astype(float))
for _n, _fn in {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor}.items():
    pointwise(_n, "x|scalar, y|scalar",
              (lambda g: lambda a, b: g(np.asarray(a).astype(np.int64), np.asarray(b).astype(np.int64)))(_fn))
pointwise("maximum", "x, y", lambda a, b: np.maximum(a, b), linear="max")
pointwise("minimum", "x, y", lambda a, b: np.minimum(a, b), linear="min")
pointwise("clamp", "x ; min: scalar? = None, max: scalar? = None", lambda a, min=None, max=None: np.clip(a, min, max))
pointwise("where", "cond, x|scalar, y|scalar", lambda c, a, b: np.where(np.asarray(c) != 0, a, b))
pointwise("masked_fill", "x, mask, value|scalar", lambda a, m, v: np.where(np.asarray(m) != 0, v, a))
pointwise("fill", "x, value|scalar", lambda a, v: np.full(np.shape(a), float(v)))
_LIKE = ("dtype: dtype? = None, layout: ignored = None, device: ignored = None, pin_memory: ignored = None, "
         "memory_format: ignored = None")
pointwise("full_like", "x ; fill_value: scalar, " + _LIKE, lambda a, fill_value, **_: np.full(np.shape(a),
                                                                                            float(fill_value)))
pointwise("zeros_like", "x ; " + _LIKE, lambda a, **_: np.zeros(np.shape(a)))
pointwise("ones_like", "x ; " + _LIKE, lambda a, **_: np.ones(np.shape(a)))
pointwise("empty_like", "x ; " + _LIKE, lambda a, **_: np.zeros(np.shape(a)))

# ------------------------------------------------------------------------------------------
# matmul family and einsum
# ------------------------------------------------------------------------------------------


def parse_einsum(equation: str, n: int) -> FactorMap:
    """``parse_einsum("mk,kn->mn", 2)``; contracted indices reduce with sum."""
    eq = str(equation).replace(" ", "")
    if "->" not in eq or "." in eq:
        raise OpError(f"einsum: {equation!r} needs an explicit '->' output and no '...'")
    lhs, out = eq.split("->")
    ins = tuple(lhs.split(","))
    if len(ins) != n:
        raise OpError(f"einsum: {equation!r} names {len(ins)} operands, {n} given")
    for term in ins + (out,):
        if not term.isalpha() or len(set(term)) != len(term):
            raise OpError(f"einsum: {equation!r}: term {term!r} must be distinct letters (no repeats, no '...')")
    missing = set(out) - set("".join(ins))
    if missing:
        raise OpError(f"einsum: {equation!r}: output letters {sorted(missing)} appear in no operand")
    return FactorMap(ins, out, linear="multi")


def _check_ranks(name, inputs, params, want):
    for k, (x, r) in enumerate(zip(inputs, want)):
        if isinstance(x, Sharding) and r is not None and x.ndim not in ((r,) if isinstance(r, int) else r):
            raise OpError(f"op {name}: input {k} has {x.ndim} dims (shape {x.shape}); expects {r}")


def _check_einsum(name, inputs, params):
    fm = parse_einsum(params["equation"], len(inputs))
    for k, (x, t) in enumerate(zip(inputs, fm.inputs)):
        if x.ndim != len(t):
            raise OpError(f"einsum: operand {k} has {x.ndim} dims (shape {x.shape}), term {t!r} names {len(t)}")


register_op("mm", "a, b ; out_dtype: dtype? = None", factor_rule(lambda n, i, p: FactorMap(("mk", "kn"), "mn",
                                                                                             linear="multi")),
            lambda a, b, **_: a @ b, check=lambda n, i, p: _check_ranks(n, i, p, (2, 2)))
register_op("bmm", "a, b ; out_dtype: dtype? = None",
            factor_rule(lambda n, i, p: FactorMap(("bmk", "bkn"), "bmn", linear="multi")),
            lambda a, b, **_: a @ b, check=lambda n, i, p: _check_ranks(n, i, p, (3, 3)))
register_op("einsum", "*operands ; equation: str, path: any = None",
            factor_rule(lambda n, i, p: parse_einsum(p["equation"], len(i))),
            lambda *xs, equation, path=None: np.einsum(equation, *xs), check=_check_einsum)


def _matmul_map(name, inputs, params) -> FactorMap:
    a, b = inputs
    if a.ndim == 1 or b.ndim == 1:
        la = "k" if a.ndim == 1 else LETTERS[: a.ndim - 2] + "mk"
        lb = "k" if b.ndim == 1 else LETTERS[: b.ndim - 2] + "kn"
        out = (la[:-1] if a.ndim > 1 else "") + ("n" if b.ndim > 1 else "")
        out = (LETTERS[: b.ndim - 2] if a.ndim == 1 and b.ndim > 2 else "") + out if a.ndim == 1 else out
        batch = frozenset(LETTERS[: max(a.ndim, b.ndim)]) - set("mkn")
        return FactorMap((la, lb), out, linear="multi", broadcast=batch)
    batch = max(a.ndim, b.ndim) - 2
    bl = LETTERS[:batch]
    return FactorMap((bl[batch - (a.ndim - 2):] + "mk", bl[batch - (b.ndim - 2):] + "kn"), bl + "mn",
                     linear="multi", broadcast=frozenset(bl))


register_op("matmul", "a, b", factor_rule(_matmul_map), lambda a, b: np.matmul(a, b),
            check=lambda n, i, p: _check_ranks(n, i, p, (range(1, 9), range(1, 9))))


def bias_once(name: str, inputs, fm: FactorMap, bias: int, out_shapes=None, cost_model=None,
              tensor_dtype="float32", out_pins=()):
    """The strategy search of ``fm`` for an op that adds a bias (input ``bias``) to a
    multilinear product (``addmm``, ``linear``, ``convolution``). A partial(sum) product plus a
    replicated bias would add the bias once per rank; instead, wherever the product comes out
    partial(sum), the bias is made partial(sum) on the same axes — kept on one rank of each group,
    zero on the others (a free local step) — so the sum over the group is exact and the
    contraction may be sharded: a row-parallel Linear with a bias costs no more than one
    without. (Under partial(avg) the replicated bias is already exact; a partial max/min is
    refused.)

    ``bias_once("addmm", [c, a, b], FactorMap(("n", "mk", "kn"), "mn", linear="multi"), 0)``
    """
    ins = [s if isinstance(s, Sharding) else None for s in inputs]
    cm = cost_model or DEFAULT_COST_MODEL
    st = choose(fm, ins, out_shapes, cm, tensor_dtype, out_pins,
                retarget=lambda targets, outputs: _bias_target(targets, outputs[0], bias))
    c = st.chosen
    targets = tuple(s if t is None or t == s else t for s, t in zip(inputs, c.input_targets))  # unmoved: itself
    notes = tuple(f"{a}: {fmt_option(o)}" for a, o in c.choices)
    return Propagation(name, tuple(inputs), targets, c.outputs, c.collectives, notes, st.candidates, cm)


def _bias_target(targets: tuple, out: Sharding, bias: int):
    """``targets`` with the bias partial(sum) wherever ``out`` is (None: a max/min partial); where
    only the bias is partial on an axis (the product's operands do not use it), the first operand is
    made partial there too (kept on one rank, zero on the others: free), or the product would be
    counted once per rank."""
    b = targets[bias]
    if b is None or not out.partial:
        return targets
    if any(op not in ("sum", "avg") for _, op in out.partial):
        return None
    order = {n: i for i, n in enumerate(b.mesh.names)}

    def with_partial(s: Sharding, more: list) -> Sharding:
        partial = tuple(sorted(list(s.partial) + more, key=lambda p: order[p[0]]))
        return Sharding._trusted(s.mesh, s.shape, s.dims, partial)

    def uses(s, axis) -> bool:
        return s is not None and (any(a == axis for a, _ in s.partial) or
                                  any(f.axis == axis for fs in s.dims for f in fs))

    targets = list(targets)
    product = [k for k, s in enumerate(targets) if k != bias and s is not None]
    for axis, op in out.partial:
        if op == "sum" and product and not any(uses(targets[k], axis) for k in product):
            targets[product[0]] = with_partial(targets[product[0]], [(axis, "sum")])
    have = dict(b.partial)
    want = [(a, op) for a, op in out.partial if op == "sum" and a not in have]
    if want:
        targets[bias] = with_partial(b, want)
    return tuple(targets)


def _linear_rule(name, inputs, cost_model=None, tensor_dtype="float32", out_pins=(), **_):
    """``linear(x, w, b=None)``: ``...k, nk (, n) -> ...n``; k contracts (partial), the bias
    is added once (``bias_once``)."""
    x = inputs[0]
    lead = LETTERS[: x.ndim - 1]
    has_bias = len(inputs) > 2 and isinstance(inputs[2], Sharding)
    ins = (lead + "k", "nk") + (("n",) if has_bias else ())
    fm = FactorMap(ins, lead + "n", linear="multi")
    args = (cost_model, tensor_dtype, out_pins)
    if not has_bias:
        return factor_map_result(name, tuple(inputs[:2]), fm, None, *args)
    return bias_once(name, inputs, fm, 2, None, *args)


register_op("linear", "x, w, bias?", _linear_rule,
            lambda x, w, b=None: x @ w.T + (0 if b is None else b),
            check=lambda n, i, p: _check_ranks(n, i, p, (range(1, 9), 2, 1)))


def _addmm_rule(name, inputs, cost_model=None, tensor_dtype="float32", out_pins=(), **_):
    """``addmm(bias, a, b)``: ``bias + a @ b``, ``mk,kn->mn`` with the bias (``n`` or ``mn``,
    broadcast) added once: a row-parallel product stays partial and the bias joins it on one
    rank (``bias_once``)."""
    bias = inputs[0]
    fm = FactorMap(("mn"[2 - bias.ndim:], "mk", "kn"), "mn", linear="multi", broadcast=frozenset("mn"))
    return bias_once(name, inputs, fm, 0, None, cost_model, tensor_dtype, out_pins)


register_op("addmm", "bias, a, b ; beta: scalar = 1, alpha: scalar = 1, out_dtype: dtype? = None",
            _addmm_rule, lambda c, a, b, beta=1, alpha=1, **_: beta * c + alpha * (a @ b),
            check=lambda n, i, p: _check_ranks(n, i, p, ((1, 2), 2, 2)))

# ------------------------------------------------------------------------------------------
# convolution: batch and output channels shard, input channels contract (partial), space whole
# ------------------------------------------------------------------------------------------


def conv_params(nsp: int, stride=1, padding=0, dilation=1, **_) -> tuple:
    """``(stride, padding, dilation)`` as tuples of ``nsp`` ints (an int applies to every
    spatial dim). ``conv_params(2, 1, (1, 0)) -> ((1, 1), (1, 0), (1, 1))``"""
    def one(v, what):
        vals = (v,) * nsp if isinstance(v, int) and not isinstance(v, bool) else tuple(v)
        if len(vals) == 1 and nsp > 1:
            vals = vals * nsp
        if len(vals) != nsp or any(not isinstance(x, int) or isinstance(x, bool) for x in vals):
            raise OpError(f"convolution: {what} {v!r} must be an int or {nsp} ints (one per spatial dim)")
        return vals

    if isinstance(padding, str):
        raise OpError(f"convolution: padding={padding!r} (a string) is not supported; give the padding in ints")
    return one(stride, "stride"), one(padding, "padding"), one(dilation, "dilation")


def conv_out_shape(x: tuple, w: tuple, stride, padding, dilation) -> tuple:
    """The output shape ``(N, O, *space)`` of a convolution. ``conv_out_shape((2, 3, 8), (4, 3, 3), (1,), (0,), (1,))
    -> (2, 4, 6)``"""
    space = tuple((n + 2 * p - d * (k - 1) - 1) // s + 1
                  for n, k, s, p, d in zip(x[2:], w[2:], stride, padding, dilation))
    return (x[0], w[0]) + space


def _conv_rule(name, inputs, cost_model=None, tensor_dtype="float32", out_pins=(), groups=1, **params):
    """``x [n, c, *space], w [o, c/groups, *kernel] (, bias [o]) -> [n, o, *space']``: n and o
    shard freely, c contracts (sharded c gives a partial(sum) output; the bias is added once,
    ``bias_once``), space and kernel stay whole (no halo exchange). With groups > 1 the channels
    stay whole."""
    x, w = inputs[0], inputs[1]
    nsp = x.ndim - 2
    stride, padding, dilation = conv_params(nsp, **params)
    out = conv_out_shape(x.shape, w.shape, stride, padding, dilation)
    sp, ker, osp = "".join("STUVW"[:nsp]), "".join("KLMNP"[:nsp]), "".join("EFGHJ"[:nsp])
    whole = set(sp + ker + osp) | ({"c", "o"} if groups != 1 else set())
    has_bias = len(inputs) > 2 and isinstance(inputs[2], Sharding)
    ins = ("nc" + sp, "oc" + ker) + (("o",) if has_bias else ())
    fm = FactorMap(ins, "no" + osp, linear="multi", whole=frozenset(whole))
    args = ([out], cost_model, tensor_dtype, out_pins)
    if not has_bias:
        return factor_map_result(name, tuple(inputs), fm, *args)
    return bias_once(name, inputs, fm, 2, *args)


def _np_conv(x, w, b=None, stride=1, padding=0, dilation=1, transposed=False, output_padding=0, groups=1):
    """An N-d convolution (cross-correlation, as torch) in numpy: one einsum per kernel offset."""
    x, w = np.asarray(x, dtype=float), np.asarray(w, dtype=float)
    nsp = x.ndim - 2
    st, pd, dl = conv_params(nsp, stride, padding, dilation)
    x = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pd])
    n, c, o = x.shape[0], x.shape[1], w.shape[0]
    cg, og = c // groups, o // groups
    space = [(x.shape[2 + i] - dl[i] * (w.shape[2 + i] - 1) - 1) // st[i] + 1 for i in range(nsp)]
    out = np.zeros((n, o, *space))
    for k in np.ndindex(*w.shape[2:]):
        cut = tuple(slice(k[i] * dl[i], k[i] * dl[i] + st[i] * (space[i] - 1) + 1, st[i]) for i in range(nsp))
        patch = x[(slice(None), slice(None)) + cut]
        for g in range(groups):
            wk = w[(slice(g * og, (g + 1) * og), slice(None)) + k]
            out[:, g * og:(g + 1) * og] += np.einsum("nc...,oc->no...", patch[:, g * cg:(g + 1) * cg], wk)
    if b is not None:
        out = out + np.asarray(b).reshape((1, o) + (1,) * nsp)
    return out


def _check_conv(name, inputs, params):
    x, w = inputs[0], inputs[1]
    if x.ndim < 3 or w.ndim != x.ndim:
        raise OpError(f"op {name}: input {x.shape} and weight {w.shape} must both be [n, c, *space] / "
                      f"[o, c/groups, *kernel] with 1 to 3 spatial dims")
    if params.get("transposed"):
        raise OpError(f"op {name}: transposed convolution is not supported yet; use a regular convolution")
    g = params.get("groups", 1)
    if x.shape[1] != w.shape[1] * g or w.shape[0] % g:
        raise OpError(f"op {name}: input channels {x.shape[1]} != weight's {w.shape[1]} x groups {g}")
    if len(inputs) > 2 and isinstance(inputs[2], Sharding) and inputs[2].shape != (w.shape[0],):
        raise OpError(f"op {name}: bias of shape {inputs[2].shape}; expects ({w.shape[0]},)")
    stride, padding, dilation = conv_params(x.ndim - 2, **{k: params[k] for k in ("stride", "padding", "dilation")
                                                           if k in params})
    if any(n < 1 for n in conv_out_shape(x.shape, w.shape, stride, padding, dilation)):
        raise OpError(f"op {name}: the kernel {w.shape[2:]} does not fit the input {x.shape[2:]} (padding {padding})")


register_op("convolution", "x, weight, bias? ; stride: any = 1, padding: any = 0, dilation: any = 1, "
            "transposed: bool = False, output_padding: any = 0, groups: int[1..] = 1",
            _conv_rule, _np_conv, check=_check_conv)
for _n in ("conv1d", "conv2d", "conv3d"):
    register_op(_n, "x, weight, bias? ; stride: any = 1, padding: any = 0, dilation: any = 1, groups: int[1..] = 1",
                _conv_rule, _np_conv, check=_check_conv)

# ------------------------------------------------------------------------------------------
# reductions and softmax
# ------------------------------------------------------------------------------------------

REDUCE_OP = {"sum": "sum", "mean": "avg", "amax": "max", "amin": "min", "any": "max", "all": "min"}


def reduction_map(name: str, s: Sharding, dim, keepdim: bool) -> tuple:
    """``(FactorMap, out_shape)`` of a reduction over ``dim`` (a dim, dims, or None: all)."""
    dims = list(range(s.ndim)) if dim is None or dim == () else ([dim] if isinstance(dim, int) else list(dim))
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
    linear = {"sum": "sum", "mean": "sum", "amax": "max", "any": "max", "amin": "min", "all": "min"}[name]
    # the average of unequal chunks' means is not the mean, and max/min/any/all of an empty
    # chunk has no value: a reduced dim may be sharded only evenly
    even = frozenset() if name == "sum" else frozenset(ins[d] for d in dims)
    return FactorMap((ins,), out, reduce=REDUCE_OP[name], linear=linear, even=even), tuple(shape)


def _reduction(name, inputs, params):
    fm, shape = reduction_map(name, inputs[0], params.get("dim"), params.get("keepdim", False))
    return fm, [shape]


def _np_reduce(fn):
    def run(x, dim=None, keepdim=False, **_):
        axis = None if dim is None or dim == () else (dim if isinstance(dim, int) else tuple(dim))
        return np.asarray(fn(x, axis=axis, keepdims=keepdim), dtype=float)

    return run


for _n, _fn in {"sum": np.sum, "mean": np.mean, "amax": np.max, "amin": np.min,
                "any": lambda a, **k: np.any(a != 0, **k), "all": lambda a, **k: np.all(a != 0, **k)}.items():
    register_op(_n, "x ; dim: dims? = None, keepdim: bool = False, dtype: dtype? = None",
                factor_rule(_reduction), _np_reduce(_fn))


def _softmax_map(name, inputs, params) -> FactorMap:
    """Softmax needs whole rows along ``dim``: that dim is never sharded (gathered if it is)."""
    letters = LETTERS[: inputs[0].ndim]
    return FactorMap((letters,), letters, whole=frozenset(letters[params["dim"]]))


def _np_softmax(x, dim=-1, **_):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def _np_log_softmax(x, dim=-1, **_):
    m = x.max(axis=dim, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=dim, keepdims=True))


register_op("_softmax", "x ; dim: dim, half_to_float: bool = False", factor_rule(_softmax_map), _np_softmax)
register_op("softmax", "x ; dim: dim = -1, dtype: dtype? = None", factor_rule(_softmax_map), _np_softmax)
register_op("_log_softmax", "x ; dim: dim, half_to_float: bool = False", factor_rule(_softmax_map), _np_log_softmax)
register_op("log_softmax", "x ; dim: dim = -1, dtype: dtype? = None", factor_rule(_softmax_map), _np_log_softmax)


def _softmax_backward_map(name, inputs, params) -> FactorMap:
    """``(grad_output, output, dim)``: the softmax dim is whole in both."""
    lx = LETTERS[: inputs[0].ndim]
    return FactorMap((lx, lx), lx, whole=frozenset(lx[params["dim"]]))


register_op("_softmax_backward_data", "grad, y ; dim: dim, input_dtype: dtype? = None",
            factor_rule(_softmax_backward_map),
            lambda g, y, dim, **_: y * (g - (g * y).sum(axis=dim, keepdims=True)))
register_op("_log_softmax_backward_data", "grad, y ; dim: dim, input_dtype: dtype? = None",
            factor_rule(_softmax_backward_map),
            lambda g, y, dim, **_: g - np.exp(y) * g.sum(axis=dim, keepdims=True))

# ------------------------------------------------------------------------------------------
# data-dependent output sizes
# ------------------------------------------------------------------------------------------


def data_dependent_rule(name, inputs, out_shape=None, cost_model=None, tensor_dtype="float32", out_pins=(), **_):
    """Ops whose output size depends on the data: every rank needs the whole input, and the
    output (replicated) has the shape the caller names with ``out_shape=``."""
    s = inputs[0]
    if out_shape is None:
        raise OpError(
            f"{name}: its output size depends on the values of the input, which sharding "
            f"propagation does not see; pass out_shape=(...) (e.g. the bound torch.export "
            f"records) to plan it — the input {s} is then gathered and the output replicated"
        )
    target = Sharding(s.mesh, s.shape)
    return Propagation(name, (s,), (target,), (Sharding(s.mesh, tuple(out_shape)),),
                       input_moves(s, target, tensor_dtype, cost_model), (f"{name}: data-dependent output size",))


for _n in ("nonzero", "masked_select", "unique", "_unique2", "argwhere"):
    register_op(_n, "x, mask? ; out_shape: ints? = None, sorted: bool = True, return_inverse: bool = False, "
                "return_counts: bool = False", data_dependent_rule,
                not_simulated="its output size depends on the data")

# ------------------------------------------------------------------------------------------
# ops that need a dim whole: norms, cat/split/slice/select, index ops, scans, sort, attention
# ------------------------------------------------------------------------------------------


def _whole(name, inputs, letters_in, letters_out, whole, out_shapes=None, cost_model=None, tensor_dtype="float32",
           out_pins=(), n_out=1, linear=None, reduce="sum"):
    fm = FactorMap(tuple(letters_in), letters_out, reduce=reduce, whole=frozenset(whole), linear=linear)
    return factor_map_result(name, tuple(inputs), fm, out_shapes, cost_model, tensor_dtype, out_pins, n_out)


def _check_normalized(name, inputs, params):
    x = inputs[0]
    ns = tuple(params["normalized_shape"])
    if not ns or x.shape[x.ndim - len(ns):] != ns:
        raise OpError(f"op {name}: normalized_shape {list(ns)} must be the last dims of the input {x.shape}")
    for k, w in enumerate(inputs[1:], 1):
        if isinstance(w, Sharding) and w.shape != ns[len(ns) - w.ndim:]:
            raise OpError(f"op {name}: weight/bias {k} has shape {w.shape}; expects {ns}")


def norm_rule(name, inputs, normalized_shape=None, cost_model=None, tensor_dtype="float32", out_pins=(), **_):
    """``(x, weight=None, bias=None; normalized_shape)``: the normalized (last) dims stay whole;
    weight and bias cover them. native_layer_norm also returns mean and rstd (keepdim)."""
    x = inputs[0]
    k = len(normalized_shape)
    lx = LETTERS[: x.ndim]
    norm = lx[x.ndim - k:]
    params = [s for s in inputs[1:] if isinstance(s, Sharding)]
    ins = [lx] + [norm[len(norm) - p.ndim:] for p in params]
    out = _whole(name, [x] + params, ins, lx, norm, None, cost_model, tensor_dtype, out_pins[:1])
    if name != "native_layer_norm":
        return out
    stat_shape = x.shape[: x.ndim - k] + (1,) * k
    stats = Sharding(x.mesh, stat_shape, list(out.outputs[0].dims[: x.ndim - k]) + [[]] * k)
    return replace(out, outputs=(out.outputs[0], stats, stats))


def _np_layer_norm(x, w=None, b=None, normalized_shape=(), eps=1e-5, **_):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mu = x.mean(axes, keepdims=True)
    r = 1 / np.sqrt(x.var(axes, keepdims=True) + eps)
    return (x - mu) * r * (1 if w is None else w) + (0 if b is None else b), mu, r


def _np_rms_norm(x, w=None, normalized_shape=(), eps=None, **_):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    y = x / np.sqrt((x * x).mean(axes, keepdims=True) + (eps if eps is not None else 1e-6))
    return y * (1 if w is None else w)


register_op("layer_norm", "x, weight?, bias? ; normalized_shape: ints, eps: float = 1e-5, cudnn_enable: ignored = True",
            norm_rule, lambda *a, **k: _np_layer_norm(*a, **k)[0], check=_check_normalized)
register_op("native_layer_norm", "x, weight?, bias? ; normalized_shape: ints, eps: float = 1e-5", norm_rule,
            _np_layer_norm, check=_check_normalized)
register_op("rms_norm", "x, weight? ; normalized_shape: ints, eps: float? = None", norm_rule, _np_rms_norm,
            check=_check_normalized, aliases=("_fused_rms_norm",))


def _np_layer_norm_backward(g, x, mean=None, rstd=None, w=None, b=None, normalized_shape=(), eps=1e-5, **_):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mu = x.mean(axes, keepdims=True)
    r = 1 / np.sqrt(x.var(axes, keepdims=True) + eps)
    xh = (x - mu) * r
    n = int(np.prod([x.shape[a] for a in axes]))
    gw = g * (1 if w is None else w)
    gi = r / n * (n * gw - gw.sum(axes, keepdims=True) - xh * (gw * xh).sum(axes, keepdims=True))
    lead = tuple(range(x.ndim - len(normalized_shape)))
    return gi, (g * xh).sum(axis=lead), g.sum(axis=lead)


def layer_norm_backward_rule(name, inputs, normalized_shape=None, cost_model=None, tensor_dtype="float32",
                             out_pins=(), **_):
    """``(grad_out, input, mean, rstd, weight, bias)`` -> (grad_input, grad_weight, grad_bias):
    normalized dims whole; grad_weight/bias sum over the other dims, so sharding those gives
    partial(sum) parameter gradients."""
    g, x = inputs[0], inputs[1]
    k = len(normalized_shape)
    lx = LETTERS[: x.ndim]
    base = _whole(name, [g, x], [lx, lx], lx, lx[x.ndim - k:], None, cost_model, tensor_dtype, out_pins[:1])
    gi = base.outputs[0]
    reduce_axes = [(f.axis, "sum") for fs in gi.dims[: x.ndim - k] for f in fs if f.axis] + list(gi.partial)
    order = {n: i for i, n in enumerate(x.mesh.names)}
    pshape = x.shape[x.ndim - k:]
    gw = Sharding(x.mesh, pshape, [[] for _ in pshape], sorted(set(reduce_axes), key=lambda p: order[p[0]]))
    return replace(base, inputs=tuple(inputs), input_targets=base.input_targets + tuple(inputs[2:]),
                   outputs=(gi, gw, gw))


register_op("native_layer_norm_backward",
            "grad, x, mean?, rstd?, weight?, bias? ; normalized_shape: ints, output_mask: any = None, "
            "eps: float = 1e-5",
            layer_norm_backward_rule, _np_layer_norm_backward)


def _along_dim_rule(name, inputs, dim=0, cost_model=None,
                    tensor_dtype="float32", out_pins=(), **_):
    """Ops reading a whole dim (select, scans): that dim is gathered, others free."""
    s = inputs[0]
    d = dim if isinstance(dim, int) else dim[0]
    lx = LETTERS[: s.ndim]
    if name == "select":
        return _whole(name, [s], [lx], lx[:d] + lx[d + 1:], {lx[d]}, [s.shape[:d] + s.shape[d + 1:]], cost_model,
                      tensor_dtype, out_pins)
    dims = [dim] if isinstance(dim, int) else list(dim)
    linear = "sum" if name in ("cumsum", "flip", "roll") else None
    return _whole(name, [s], [lx], lx, {lx[k] for k in dims}, None, cost_model, tensor_dtype, out_pins,
                  linear=linear)


def _check_index(name, inputs, params):
    n = inputs[0].shape[params["dim"]]
    if name == "select" and not -n <= params["index"] < n:
        raise OpError(f"op select: index {params['index']} is out of range for dim {params['dim']} of size {n}")


register_op("select", "x ; dim: dim, index: int", _along_dim_rule, lambda a, dim, index: np.take(a, index, axis=dim),
            check=_check_index)
register_op("cumsum", "x ; dim: dim, dtype: dtype? = None", _along_dim_rule,
            lambda a, dim, **_: np.cumsum(a, axis=dim))
register_op("cumprod", "x ; dim: dim, dtype: dtype? = None", _along_dim_rule,
            lambda a, dim, **_: np.cumprod(a, axis=dim))


def _flip_roll_rule(name, inputs, dims=(), cost_model=None, tensor_dtype="float32", out_pins=(), **_):
    """flip/roll read their ``dims`` whole (roll without dims: every dim)."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    return _along_dim_rule(name, inputs, dim=dims or tuple(range(inputs[0].ndim)), cost_model=cost_model,
                           tensor_dtype=tensor_dtype, out_pins=out_pins)


register_op("flip", "x ; dims: dims", _flip_roll_rule, lambda a, dims: np.flip(a, axis=tuple(dims)))
register_op("roll", "x ; shifts: ints, dims: dims = ()", _flip_roll_rule,
            lambda a, shifts, dims=(): np.roll(a, shifts, axis=tuple(dims) or None))


def _sort_rule(name, inputs, dim=-1, k=None, cost_model=None, tensor_dtype="float32", out_pins=(), **_):
    """Sorting needs the whole dim; topk's output dim has size k. sort/topk return (values, indices)."""
    s = inputs[0]
    lx = LETTERS[: s.ndim]
    shape = s.shape if name != "topk" else s.shape[:dim] + (k,) + s.shape[dim + 1:]
    return _whole(name, [s], [lx], lx, {lx[dim]}, [shape], cost_model, tensor_dtype, out_pins,
                  n_out=1 if name == "argsort" else 2)


def _max_min_rule(name, inputs, dim=None, keepdim=False, cost_model=None, tensor_dtype="float32", out_pins=(),
                  **_):
    """max / min / argmax / argmin. max and min without ``dim``: the whole tensor's (amax's rule,
    a partial max combines); over ``dim``: (values, indices) — argmax / argmin the indices alone
    (without ``dim``: the flat index) — with that dim whole, as an index names one of all candidates."""
    s = inputs[0]
    lattice = "amax" if name in ("max", "argmax") else "amin"
    if dim is None and name in ("max", "min"):
        fm, shape = reduction_map(lattice, s, None, False)
        return factor_map_result(name, (s,), fm, [shape], cost_model, tensor_dtype, out_pins)
    fm, shape = reduction_map(lattice, s, dim, keepdim and dim is not None)
    lx = fm.inputs[0]
    return _whole(name, [s], [lx], fm.output, set(lx) if dim is None else {lx[dim]}, [shape], cost_model,
                  tensor_dtype, out_pins, n_out=2 if name in ("max", "min") else 1)


def _np_max_min(name: str):
    value, index = (np.max, np.argmax) if name in ("max", "argmax") else (np.min, np.argmin)

    def run(a, dim=None, keepdim=False):
        a = np.asarray(a, dtype=float)
        if dim is None:
            return np.asarray(value(a)) if name in ("max", "min") else np.asarray(float(index(a)))
        i = index(a, axis=dim)
        i = (np.expand_dims(i, dim) if keepdim else i).astype(float)
        return (value(a, axis=dim, keepdims=keepdim), i) if name in ("max", "min") else i

    return run


for _n in ("max", "min", "argmax", "argmin"):
    register_op(_n, "x ; dim: dim? = None, keepdim: bool = False", _max_min_rule, _np_max_min(_n))


def _np_topk(a, k, dim=-1, largest=True, sorted=True):
    order = np.argsort(a, axis=dim, kind="stable")
    idx = np.take(np.flip(order, axis=dim) if largest else order, range(k), axis=dim)
    return np.take_along_axis(a, idx, dim), idx.astype(float)


def _np_sort(a, dim=-1, descending=False, stable=None):
    idx = np.argsort(-a if descending else a, axis=dim, kind="stable")
    return np.take_along_axis(a, idx, dim), idx.astype(float)


def _check_topk(name, inputs, params):
    n = inputs[0].shape[params["dim"]]
    if not 0 <= params["k"] <= n:
        raise OpError(f"op topk: k = {params['k']} is out of range for dim {params['dim']} of size {n}; "
                      f"give 0 <= k <= {n}")


register_op("sort", "x ; dim: dim = -1, descending: bool = False, stable: bool? = None", _sort_rule, _np_sort)
register_op("argsort", "x ; dim: dim = -1, descending: bool = False, stable: bool? = None", _sort_rule,
            lambda a, dim=-1, descending=False, stable=None: _np_sort(a, dim, descending)[1])
register_op("topk", "x ; k: int[0..], dim: dim = -1, largest: bool = True, sorted: bool = True", _sort_rule,
            _np_topk, check=_check_topk)


def _index_rule(name, inputs, dim=0, cost_model=None, tensor_dtype="float32", out_pins=(), **_):
    """Indexed dims are whole in the indexed tensor; the index tensor's dims shard freely.

    embedding(weight, indices): vocab rows whole, the embedding dim free (tp on hidden) — unless
    the table arrives vocab-parallel (``vocab_parallel``): then each rank looks up the tokens in
    its rows and writes zeros for the others, a partial sum, and nothing moves.
    """
    args = (cost_model, tensor_dtype, out_pins)
    if name == "embedding":
        w, idx = inputs[0], inputs[1]
        li = LETTERS[: idx.ndim]

        def gather(why=()):
            p = _whole(name, [w, idx], ["VD", li], li + "D", {"V"}, [idx.shape + (w.shape[1],)], *args)
            return replace(p, notes=tuple(why) + p.notes)

        got = "scale_grad_by_freq counts every token" if _.get("scale_grad_by_freq") else vocab_parallel(w, idx)
        if isinstance(got, str):
            return gather(() if got == "" else (f"vocab: {got}",))
        out, local = got
        cm = cost_model or DEFAULT_COST_MODEL
        later = _reduction_seconds(out, local[0], tensor_dtype, cm)
        table = gather()
        note = (f"vocab on {local[0].axis}: each rank looks up the tokens in its {local[1]} rows, zeros elsewhere: "
                "a partial sum, no data moves")
        if table.cost <= later:  # reducing the partial output later would move more than the table
            own = _local_candidate((w, idx), (out,), note, cm, tensor_dtype, out_pins, (("local", local),))
            return replace(table, notes=(f"vocab: a vocab-parallel lookup's partial output would cost "
                                         f"{later * 1e6:.2f} µs to reduce, the table's gather "
                                         f"{table.cost * 1e6:.2f} µs; the table is gathered",) + table.notes,
                           candidates=_with(own, table))
        return local_propagation(name, (w, idx), (out,), note, cm, tensor_dtype, out_pins, lambda: table,
                                 (("local", local),))
    s = inputs[0]
    lx = LETTERS[: s.ndim]
    d = dim
    if name == "index_select":
        idx = inputs[1]
        shape = s.shape[:d] + (idx.shape[0],) + s.shape[d + 1:]
        return _whole(name, [s, idx], [lx, "Z"], lx[:d] + "Z" + lx[d + 1:], {lx[d]}, [shape], *args)
    if name == "gather":
        idx = inputs[1]
        lidx = lx[:d] + "Z" + lx[d + 1:]  # out[i][j] = x[i][idx[i][j]] (dim=1): idx's dims follow out
        return _whole(name, [s, idx], [lx, lidx], lidx, {lx[d]}, [idx.shape], *args)
    others = [x for x in inputs[1:] if isinstance(x, Sharding)]
    if name in ("scatter", "scatter_add") and all(o.ndim == s.ndim for o in others):
        # index and src line up with self on the other dims where their sizes agree
        letters, whole = [lx], {lx[d]}
        for _ in others:
            lo = ""
            for k in range(s.ndim):
                if k != d and all(x.shape[k] == s.shape[k] for x in others):
                    lo += lx[k]
                else:
                    ch = LETTERS[k].upper() if k != d else "Z"
                    lo += ch
                    whole.add(ch)
            letters.append(lo)
        return _whole(name, [s] + others, letters, lx, whole, None, *args)
    if name == "index_add" and len(others) == 2 and others[0].ndim == 1 and others[1].ndim == s.ndim:
        lsrc = lx[:d] + "Z" + lx[d + 1:]  # src lines up with self on the other dims
        return _whole(name, [s] + others, [lx, "Z", lsrc], lx, {lx[d], "Z"}, None, *args)
    letters = [lx] + [LETTERS[: o.ndim].upper() for o in others]
    whole = set(lx[d]) | {ch for lt in letters[1:] for ch in lt}
    return _whole(name, [s] + others, letters, lx, whole, None, *args)


def vocab_parallel(w: Sharding, idx: Sharding):
    """``(output sharding, local params)`` of a vocab-parallel lookup when the table ``w`` is cut
    on its rows by one mesh-axis factor, outermost and even (Megatron's VocabParallelEmbedding,
    torchtitan's rowwise embedding), the indices not on that axis; else a reason ("" when the
    rows are not sharded at all). The local params: the rank's first row (by its coordinate on
    the axis piece) and its row count.
    ``vocab_parallel(Sharding.parse("[tp*16, 8]", m), Sharding.parse("[2, 5]", m))[0]`` -> ``[2, 5, 8] +sum(tp)``"""
    from .result import ByCoord

    fs = tuple(w.dims[0]) if type(w.dims[0]) is not ChunkProgram else None
    if fs is not None and not any(f.axis is not None for f in fs):
        return ""
    if fs is None or fs[0].axis is None or any(f.axis is not None for f in fs[1:]) or \
            _product(f.size for f in fs) != w.shape[0]:
        return "rows not cut by one mesh axis outermost and evenly; the table is gathered"
    f = fs[0]
    if f.pre != 1 or f.size != w.mesh.axis_size(f.axis):
        return (f"rows cut by the sub-axis {_fmt_factor(f, w.mesh)} (a partial sum needs a whole axis); the table is "
                "gathered")
    if idx.partial:
        return "the indices are partial (a lookup is not linear in them); the table is gathered"
    used = {g.axis for d in idx.dims if type(d) is not ChunkProgram for g in d if g.axis is not None}
    if f.axis in used or f.axis in dict(idx.partial) or f.axis in dict(w.partial) or \
            any(g.axis == f.axis for g in w.dims[1]) or w.partial:
        return f"the indices or the embedding dim also use {f.axis}; the table is gathered"
    rows = w.shape[0] // f.size
    out = Sharding(w.mesh, idx.shape + (w.shape[1],), list(idx.dims) + [list(w.dims[1])],
                   sorted(set(idx.partial) | {(f.axis, "sum")}, key=lambda p: w.mesh.names.index(p[0])))
    return out, (ByCoord(f.axis, f.pre, f.size, tuple(c * rows for c in range(f.size))), rows)


def _reduction_seconds(out: Sharding, piece, tensor_dtype: str, cm) -> float:
    """Seconds of the cheapest reduction a vocab-parallel lookup's partial output will need: a
    reduce-scatter of its largest piece (rank 0's) over the table's axis piece."""
    from ..sharding.collective import AxisPiece, Collective, CollectiveKind
    from ..sharding.cost import itemsize
    from .strategy import dtype_of

    nbytes = math.prod(out.local_shape(0)) * itemsize(dtype_of(tensor_dtype, 2))  # the output's element type
    axes = (AxisPiece(piece.axis, piece.size, piece.pre),)
    return cm.seconds(Collective(CollectiveKind.REDUCE_SCATTER, axes, (), nbytes, out, out, "sum"))


def local_propagation(name, inputs, outputs, note, cm, tensor_dtype, out_pins, fallback, local=()) -> Propagation:
    """A rule's comm-free answer (each rank runs on its own shards, ``local`` its params) — unless
    moving a pinned output costs more than ``fallback()`` (the answer that moves inputs first).
    Shared by the resize ops (``ops.resize``) and the vocab-parallel lookup."""
    moves = move_collectives(inputs, inputs, outputs, tuple(out_pins or ()) + (None,) * len(outputs), tensor_dtype,
                             cm)
    own = _local_candidate(inputs, outputs, note, cm, tensor_dtype, out_pins, local)
    alt = None
    if moves and fallback is not None:
        alt = fallback()
        if alt.cost < own.cost:  # the fallback's candidates and this answer: what keep / ragged choose among
            return replace(alt, candidates=_with(own, alt))
    p = Propagation(name, tuple(inputs), tuple(inputs), tuple(outputs), moves, (note,), (), cm, local=tuple(local))
    return replace(p, candidates=_with(own, alt)) if alt is not None else p


def _local_candidate(inputs, outputs, note, cm, tensor_dtype, out_pins, local):
    """The comm-free answer as a strategy Candidate (priced like the search's), ``local`` its params."""
    from .strategy import Candidate

    pins = tuple(out_pins or ()) + (None,) * (len(outputs) - len(out_pins or ()))
    return Candidate((("every axis", ("L", note)),), tuple(inputs), tuple(outputs), None, tuple(inputs), pins,
                     tensor_dtype, cm, tuple(local))


def _with(own, alt):
    """``own`` and the candidates of the Propagation ``alt`` (enumerated when first read)."""
    from .result import Deferred

    return Deferred(lambda: (own,) + tuple(alt.candidates if alt is not None else ()))


def local_lookup(w, i, start: int, rows: int, xp):
    """A vocab-parallel lookup on one rank: rows ``[start, start + rows)`` of the table are ``w``;
    tokens outside them give zeros (numpy or torch: ``xp`` is the module).
    ``local_lookup(np.eye(2), np.array([0, 3]), 2, 2, np)`` -> rows ``[0, 0]`` and ``[0, 1]``"""
    j = i - start
    inside = (j >= 0) & (j < rows)
    j = xp.where(inside, j, xp.zeros_like(j))
    return w[j] * inside[..., None]


def _np_embedding(w, i, local=None, **_):
    i = np.asarray(i).astype(int)
    return w[i] if local is None else local_lookup(w, i, local[0], local[1], np)


def _np_scatter(a, i, src=None, dim=0, add=False, value=None, reduce=None):
    out = np.array(a, dtype=float)
    i = np.asarray(i).astype(int)
    where = tuple(i if k == dim else np.indices(i.shape)[k] for k in range(a.ndim))
    vals = value if src is None else np.asarray(src)[tuple(slice(0, n) for n in i.shape)]
    if add:
        np.add.at(out, where, vals)
    else:
        out[where] = vals
    return out


def _np_index_add(a, i, src, dim=0, alpha=1):
    out = np.moveaxis(np.array(a, dtype=float), dim, 0)
    np.add.at(out, np.asarray(i).astype(int), alpha * np.moveaxis(src, dim, 0))
    return np.moveaxis(out, 0, dim)


def _check_indexing(name, inputs, params):
    x, idx = inputs[0], inputs[1]
    if name == "index_select" and idx.ndim != 1:
        raise OpError(f"op index_select: the index must be 1-D, got shape {idx.shape}")
    if name == "gather" and (idx.ndim != x.ndim or any(a > b for k, (a, b) in enumerate(zip(idx.shape, x.shape))
                                                       if k != params["dim"])):
        raise OpError(f"op gather: index of shape {idx.shape} must have the input's rank ({x.shape}) and no "
                      f"larger size outside dim {params['dim']}")
    if name in ("scatter", "scatter_add") and idx.ndim != x.ndim:
        raise OpError(f"op {name}: index of shape {idx.shape} must have the input's rank ({x.shape})")
    if name == "index_add" and (idx.ndim != 1 or inputs[2].ndim != x.ndim):
        raise OpError(f"op index_add: index must be 1-D and source of the input's rank; got {idx.shape}, "
                      f"{inputs[2].shape} for {x.shape}")


register_op("index_select", "x, index ; dim: dim", _index_rule,
            lambda a, i, dim: np.take(a, np.asarray(i).astype(int), axis=dim), check=_check_indexing)
register_op("gather", "x, index ; dim: dim, sparse_grad: bool = False", _index_rule,
            lambda a, i, dim, sparse_grad=False: np.take_along_axis(a, np.asarray(i).astype(int), dim),
            check=_check_indexing)
register_op("scatter", "x, index, src? ; dim: dim, value: scalar? = None, reduce: str? = None", _index_rule,
            lambda a, i, src=None, dim=0, value=None, reduce=None: _np_scatter(a, i, src, dim, False, value),
            check=_check_indexing)
register_op("scatter_add", "x, index, src ; dim: dim", _index_rule,
            lambda a, i, src, dim: _np_scatter(a, i, src, dim, True), check=_check_indexing)
register_op("index_add", "x, index, source ; dim: dim, alpha: scalar = 1", _index_rule, _np_index_add,
            check=_check_indexing)
register_op("embedding", "weight, indices ; padding_idx: int = -1, scale_grad_by_freq: bool = False, "
            "sparse: bool = False", _index_rule, _np_embedding,
            check=lambda n, i, p: _check_ranks(n, i, p, (2, None)))


def _one_hot_rule(name, inputs, num_classes=None, cost_model=None, tensor_dtype="float32", out_pins=(), **_):
    s = inputs[0]
    if num_classes is None or num_classes < 1:
        raise OpError("one_hot: give num_classes >= 1 (the class count is data-dependent otherwise)")
    lx = LETTERS[: s.ndim]
    return _whole(name, [s], [lx], lx + "Z", {"Z"}, [s.shape + (num_classes,)], cost_model, tensor_dtype, out_pins)


register_op("one_hot", "x ; num_classes: int = -1", _one_hot_rule,
            lambda a, num_classes: np.eye(num_classes)[np.asarray(a).astype(int)])


def _histc_rule(name, inputs, bins=100, min=0, max=0, cost_model=None, tensor_dtype="float32", out_pins=(),
                minlength=0, **_):
    """Counting is linear: a sharded input gives a partial(sum) histogram — when the bin range
    is given; with ``min == max`` the range is the data's own, so the input stays whole.
    ``bincount`` has ``minlength`` bins (the size torch.export gives it)."""
    if name == "bincount" and minlength:
        bins = minlength
    s = inputs[0]
    lx = LETTERS[: s.ndim]
    whole = {"Z"} | (set(lx) if min == max else set())
    return _whole(name, [s], [lx], "Z", whole, [(bins,)], cost_model, tensor_dtype, out_pins)


def _np_histc(a, bins=100, min=0, max=0):
    lo, hi = (min, max) if max > min else (float(np.min(a)), float(np.max(a)))
    return np.histogram(a, bins=bins, range=(lo, hi))[0].astype(float)


register_op("histc", "x ; bins: int[1..] = 100, min: scalar = 0, max: scalar = 0", _histc_rule, _np_histc)
register_op("bincount", "x, weights? ; minlength: int[0..] = 0, bins: int[1..] = 100", _histc_rule,
            not_simulated="its output size depends on the data")



def _repeat_interleave_rule(name, inputs, output_size=None, cost_model=None, tensor_dtype="float32", out_pins=(),
                            **_):
    """``repeat_interleave(repeats; output_size)``: index ``i`` repeated ``repeats[i]`` times (what
    ``x.repeat_interleave(repeats, dim)`` gathers ``x``'s rows by). Every output position depends on
    all the counts before it: the counts and the indices stay whole. ``output_size`` gives the
    extent (without it, it is data-dependent)."""
    if output_size is None or output_size < 1:
        raise OpError(f"op {name}: give output_size >= 1 (the sum of the repeats), got {output_size!r}; without it "
                      "the output's size depends on the data")
    s = inputs[0]
    if s.ndim != 1:
        raise OpError(f"op {name}: repeats must be 1-D, got shape {s.shape}")
    return _whole(name, [s], ["a"], "Z", {"a", "Z"}, [(output_size,)], cost_model, tensor_dtype, out_pins)


def _np_repeat_interleave(repeats, output_size=None):
    r = np.asarray(repeats)
    if np.any(r != np.round(r)) or np.any(r < 0):
        raise OpError(f"repeat_interleave: repeats must be whole counts >= 0, got {r.tolist()[:8]}")
    out = np.repeat(np.arange(len(r)), r.astype(np.int64))
    if output_size is not None and len(out) != output_size:
        raise OpError(f"repeat_interleave: the repeats sum to {len(out)}, output_size is {output_size}")
    return out


register_op("repeat_interleave", "repeats ; output_size: int? = None", _repeat_interleave_rule,
            _np_repeat_interleave)

# ------------------------------------------------------------------------------------------
# attention
# ------------------------------------------------------------------------------------------


def sdpa_map(inputs, is_causal=False) -> FactorMap:
    """Attention's factor map: q ``bhsd``, k ``bhtd``, v ``bhte`` -> ``bhse``; an attention mask
    (``attn_mask`` / ``attn_bias``, broadcast to ``[b, h, s, t]``) rides along with the scores:
    its query rows go where the queries go, its key columns stay whole with the keys.
    ``sdpa_map([q, k, v]).output -> 'bhse'``"""
    whole = {"t", "d"} | ({"s"} if is_causal else set())
    letters = ["bhsd", "bhtd", "bhte"]
    mask = inputs[3] if len(inputs) > 3 and isinstance(inputs[3], Sharding) else None
    if mask is not None:
        letters.append("bhst"[4 - mask.ndim:])
    letters += ["" for _ in inputs[len(letters):]]
    broadcast = set("bhst") if mask is not None else set()
    if any(x.shape[i] == 1 != inputs[0].shape[i] for x in inputs[1:3] for i in (0, 1)):
        broadcast |= {"b", "h"}  # one k/v head (or batch) for all of q's: multi-query attention broadcasts it
    return FactorMap(tuple(letters), "bhse", whole=frozenset(whole), broadcast=frozenset(broadcast))


def _sdpa_rule(name, inputs, is_causal=False, cost_model=None, tensor_dtype="float32", out_pins=(), **_):
    """q [b,h,s,d], k [b,h,t,d], v [b,h,t,e] -> [b,h,s,e] (k and v may have one head, or one batch
    row, for all of q's: broadcast, as torch's math path does). Batch and heads shard freely; the
    query sequence shards exactly (each rank attends its queries to all keys) unless causal
    (the local mask would use local positions); keys/values sequence and d stay whole."""
    q, v = inputs[0], inputs[2]
    fm = sdpa_map(inputs, is_causal)
    out_shape = q.shape[:-1] + (v.shape[-1],)
    p = factor_map_result(name, tuple(inputs), fm, [out_shape], cost_model, tensor_dtype, out_pins[:1])
    if name == "scaled_dot_product_attention":
        return p
    o = p.outputs[0]  # the fused kernels also return the log-sum-exp [b, h, s]
    lse = Sharding(o.mesh, o.shape[:-1], list(o.dims[:-1]), o.partial)
    return replace(p, outputs=(o, lse))


def _np_sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None, **_):
    s = q @ np.swapaxes(k, -1, -2) * (scale if scale is not None else 1 / np.sqrt(q.shape[-1]))
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        s = np.where(m != 0, s, -np.inf) if m.dtype == bool else s + m
    if is_causal:
        s = s + np.triu(np.full(s.shape[-2:], -np.inf), 1)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def _check_sdpa(name, inputs, params):
    _check_ranks(name, inputs, params, (4, 4, 4))
    q, k, v = inputs[:3]
    fits = all(x.shape[i] in (1, q.shape[i]) for x in (k, v) for i in (0, 1)) and k.shape[:2] == v.shape[:2]
    if not fits or k.shape[2] != v.shape[2] or q.shape[3] != k.shape[3]:
        raise OpError(f"op {name}: q {q.shape}, k {k.shape}, v {v.shape} do not fit [b,h,s,d], [b,h,t,d], [b,h,t,e]")
    if params.get("dropout_p"):
        raise OpError(f"op {name}: dropout_p = {params['dropout_p']} makes values random; plan with dropout_p=0")
    if params.get("enable_gqa"):
        raise OpError(f"op {name}: enable_gqa (grouped-query attention) is not supported yet; repeat k and v "
                      "to the query heads before the call")
    if len(inputs) > 3 and isinstance(inputs[3], Sharding):
        m = inputs[3]
        want = q.shape[:2] + (q.shape[2], k.shape[2])
        if m.ndim > 4 or any(a not in (1, b) for a, b in zip(m.shape[::-1], want[::-1])):
            raise OpError(f"op {name}: attn_mask of shape {m.shape} does not broadcast to [b, h, s, t] = {want}")


_SDPA = "q, k, v ; dropout_p: float = 0.0, is_causal: bool = False, scale: float? = None"
register_op("scaled_dot_product_attention", "q, k, v, attn_mask? ; dropout_p: float = 0.0, is_causal: bool = False, "
            "scale: float? = None, enable_gqa: bool = False", _sdpa_rule, _np_sdpa, check=_check_sdpa)
register_op("_scaled_dot_product_flash_attention_for_cpu", "q, k, v, attn_mask? ; dropout_p: float = 0.0, "
            "is_causal: bool = False, scale: float? = None", _sdpa_rule,
            lambda q, k, v, attn_mask=None, **kw: (_np_sdpa(q, k, v, **kw), np.zeros(q.shape[:-1])), check=_check_sdpa)
register_op("_scaled_dot_product_flash_attention", _SDPA + ", return_debug_mask: bool = False", _sdpa_rule,
            lambda q, k, v, **kw: (_np_sdpa(q, k, v, **kw), np.zeros(q.shape[:-1])), check=_check_sdpa)
register_op("_scaled_dot_product_efficient_attention", "q, k, v, attn_bias? ; compute_log_sumexp: bool = False, "
            "dropout_p: float = 0.0, is_causal: bool = False, scale: float? = None", _sdpa_rule,
            lambda q, k, v, attn_bias=None, **kw: (_np_sdpa(q, k, v, **kw), np.zeros(q.shape[:-1])),
            check=_check_sdpa)


def _sdpa_backward_rule(name, inputs, cost_model=None, tensor_dtype="float32", out_pins=(), **_):
    """``(grad_out, q, k, v, out, logsumexp, ...)`` -> (grad_q, grad_k, grad_v): batch and heads
    shard freely; sequences and head dims stay whole."""
    g, q, k, v, out, lse = inputs[:6]
    letters = ["bhse", "bhsd", "bhtd", "bhte", "bhse", "bhs"]
    p = _whole(name, [g, q, k, v, out, lse], letters, "bhsd", {"s", "t", "d", "e"}, [q.shape], cost_model,
               tensor_dtype)
    gq = p.outputs[0]
    bh = list(gq.dims[:2])
    gk = Sharding(gq.mesh, k.shape, bh + [[], []], gq.partial)
    gv = Sharding(gq.mesh, v.shape, bh + [[], []], gq.partial)
    return replace(p, inputs=tuple(inputs), input_targets=p.input_targets + tuple(inputs[6:]), outputs=(gq, gk, gv))


_SDPA_BW = ("; dropout_p: float = 0.0, is_causal: bool = False, scale: float? = None, max_q: any = None, "
            "max_k: any = None, grad_input_mask: any = None")
_FUSED_BW = "fused attention backward kernels are simulated through the decomposed graph torch.export produces"
register_op("_scaled_dot_product_flash_attention_for_cpu_backward",
            "grad, q, k, v, out, lse, attn_mask? " + _SDPA_BW, _sdpa_backward_rule, not_simulated=_FUSED_BW)
register_op("_scaled_dot_product_flash_attention_backward",
            "grad, q, k, v, out, lse, cum_seq_q?, cum_seq_k?, philox_seed?, philox_offset? " + _SDPA_BW,
            _sdpa_backward_rule, not_simulated=_FUSED_BW)
register_op("_scaled_dot_product_efficient_attention_backward",
            "grad, q, k, v, attn_bias?, out?, lse?, philox_seed?, philox_offset? " + _SDPA_BW,
            _sdpa_backward_rule, not_simulated=_FUSED_BW)



def _assert_rule(name, inputs, cost_model=None, tensor_dtype="float32", out_pins=(), **_):
    """Runtime checks: no data, no outputs, no communication."""
    ins = tuple(s for s in inputs if isinstance(s, Sharding))
    return Propagation(name, ins, ins, ())


register_op("_assert_tensor_metadata", "x? ; size: any = None, stride: any = None, dtype: any = None, "
            "device: any = None, layout: any = None", _assert_rule, lambda *a, **k: ())
register_op("_assert_async", "x? ; assert_msg: any = None", _assert_rule, lambda *a, **k: ())
register_op("_assert_scalar", "x? ; self: any = None, assert_msg: any = None, mesh: mesh? = None", _assert_rule,
            lambda *a, **k: ())
register_op("sym_constrain_range_for_size", "x? ; size: any = None, min: any = None, max: any = None, "
            "mesh: mesh? = None", _assert_rule, lambda *a, **k: ())

# ------------------------------------------------------------------------------------------
# MoE
# ------------------------------------------------------------------------------------------


def _grouped_mm_rule(name, inputs, cost_model=None, tensor_dtype="float32", out_pins=(), **_):
    """MoE experts: a [tokens, k] @ b [groups, k, n] with offs [groups] (token ranges per group).
    k contracts (partial sum), n shards freely; tokens and groups stay whole."""
    a, b = inputs[0], inputs[1]
    offs = inputs[2] if len(inputs) > 2 and isinstance(inputs[2], Sharding) else None
    ins = [a, b] + ([offs] if offs is not None else [])
    letters = ["tk", "gkn"] + (["g"] if offs is not None else [])
    return _whole(name, ins, letters, "tn", {"t", "g"}, [(a.shape[0], b.shape[2])], cost_model, tensor_dtype,
                  out_pins, linear="multi")


def _np_grouped_mm(a, b, offs=None, **_):
    out = np.zeros((a.shape[0], b.shape[2]))
    start = 0
    for g, end in enumerate(np.asarray(offs).astype(int)):
        out[start:end] = a[start:end] @ b[g]
        start = end
    return out


register_op("_grouped_mm", "a, b, offs?, bias? ; out_dtype: dtype? = None", _grouped_mm_rule, _np_grouped_mm,
            check=lambda n, i, p: _check_ranks(n, i, p, (2, 3, 1, None)))

# ------------------------------------------------------------------------------------------
# creation ops: no tensor inputs; replicated unless a consumer says otherwise
# ------------------------------------------------------------------------------------------


def _creation_rule(name, inputs, mesh=None, size=None, end=None, start=0, step=1, cost_model=None,
                   tensor_dtype="float32", out_pins=(), **_):
    """Creation ops make a replicated tensor on ``mesh=``; the whole-program pass shards them
    from their consumers."""
    if mesh is None:
        raise OpError(f"op {name}: a creation op has no input to take the mesh from; pass mesh=")
    if name == "arange":
        if step == 0:
            raise OpError("op arange: step must not be 0")
        out_shape = (max(0, math.ceil(((end if end is not None else 0) - start) / step)),)
    elif name == "scalar_tensor":
        out_shape = ()
    else:
        out_shape = tuple(size)
    if any(n < 1 for n in out_shape):
        raise OpError(f"op {name}: output shape {out_shape} has an empty dim; shapes need sizes >= 1")
    return Propagation(name, (), (), (Sharding(mesh, out_shape),))


def _check_arange(name, inputs, params):
    """arange's bounds and step are finite numbers (NaN or infinity gives no length)."""
    for k in ("start", "end", "step"):
        v = params.get(k)
        if v is not None and not math.isfinite(v):
            raise OpError(f"op {name}: {k} = {v!r} is not a finite number; give finite start, end and step")


_CREATE = "dtype: dtype? = None, layout: ignored = None, device: ignored = None, pin_memory: ignored = None"
register_op("arange", "; end: scalar, start: scalar = 0, step: scalar = 1, mesh: mesh? = None, " + _CREATE,
            _creation_rule, lambda end, start=0, step=1, **_: np.arange(start, end, step, dtype=float),
            check=_check_arange)
register_op("full", "; size: ints, fill_value: scalar, mesh: mesh? = None, " + _CREATE, _creation_rule,
            lambda size, fill_value, **_: np.full(tuple(size), float(fill_value)))
register_op("zeros", "; size: ints, mesh: mesh? = None, " + _CREATE, _creation_rule,
            lambda size, **_: np.zeros(tuple(size)))
register_op("ones", "; size: ints, mesh: mesh? = None, " + _CREATE, _creation_rule,
            lambda size, **_: np.ones(tuple(size)))
register_op("scalar_tensor", "; s: scalar, mesh: mesh? = None, " + _CREATE, _creation_rule,
            lambda s, **_: np.asarray(float(s)))
for _n in ("empty", "rand", "randn"):
    register_op(_n, "; size: ints, mesh: mesh? = None, memory_format: ignored = None, generator: ignored = None, "
                + _CREATE, _creation_rule, not_simulated="its values are random or undefined")
register_op("empty_permuted", "; size: ints, physical_layout: ignored = None, mesh: mesh? = None, " + _CREATE,
            _creation_rule, not_simulated="its values are undefined")


def _new_rule(name, inputs, size=None, cost_model=None, tensor_dtype="float32", out_pins=(), **_):
    """``x.new_zeros(size)`` and friends: a replicated tensor on the input's mesh."""
    if any(n < 1 for n in size):
        raise OpError(f"op {name}: size {list(size)} has an empty dim; sizes must be >= 1")
    x = inputs[0]
    return Propagation(name, (x,), (x,), (Sharding(x.mesh, tuple(size)),))


_NEW = "x ; size: ints, " + _CREATE
register_op("new_zeros", _NEW, _new_rule, lambda a, size, **_: np.zeros(tuple(size)))
register_op("new_ones", _NEW, _new_rule, lambda a, size, **_: np.ones(tuple(size)))
register_op("new_full", "x ; size: ints, fill_value: scalar, " + _CREATE, _new_rule,
            lambda a, size, fill_value, **_: np.full(tuple(size), float(fill_value)))
register_op("new_empty", _NEW, _new_rule, not_simulated="its values are undefined")


def index_dims(x_ndim: int, n_index: int, indexed=None) -> tuple:
    """The dims of ``x`` that ``index``'s index tensors select (``indexed``, default the first
    ``n_index``), checked. ``index_dims(3, 2) -> (0, 1)``."""
    dims = tuple(range(n_index)) if indexed is None else tuple(int(d) for d in indexed)
    if len(dims) != n_index or len(set(dims)) != n_index or any(not 0 <= d < x_ndim for d in dims) \
            or list(dims) != sorted(dims):
        raise OpError(f"op index: {n_index} index tensor(s) for dims {list(dims)} of a {x_ndim}-D input; give one "
                      "increasing dim of the input per index tensor (params 'indexed')")
    return dims


def index_letters(x, idxs, indexed):
    """``x[i0, i1, ...]`` as letters: x's indexed dims whole, the index tensors broadcast to one
    shape whose dims replace the indexed ones (in place when those are adjacent, else in front,
    as torch and numpy place them)."""
    dims = index_dims(x.ndim, len(idxs), indexed)
    lx = LETTERS[: x.ndim]
    nb = max(i.ndim for i in idxs)
    lb = LETTERS[x.ndim: x.ndim + nb].upper()
    rest = [lx[d] for d in range(x.ndim) if d not in dims]
    if dims == tuple(range(dims[0], dims[0] + len(dims))):
        out = lx[: dims[0]] + lb + lx[dims[-1] + 1:]
    else:
        out = lb + "".join(rest)
    return dims, lx, [lb[nb - i.ndim:] for i in idxs], out, lb


def _broadcast_shape(shapes) -> tuple:
    n = max(len(s) for s in shapes)
    out = []
    for k in range(n):
        sizes = {s[len(s) - n + k] for s in shapes if len(s) - n + k >= 0} - {1}
        if len(sizes) > 1:
            raise OpError(f"op index: index tensors of shapes {[list(s) for s in shapes]} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _advanced_index_rule(name, inputs, cost_model=None, tensor_dtype="float32", out_pins=(), indexed=None, **_):
    """``x[i0, i1, ...]`` (index tensors on the dims ``indexed``, default the first ones): x's
    indexed dims stay whole, the index tensors' broadcast dims carry any sharding to the output;
    index_put keeps x's shape and needs the indexed dim whole in x and everything whole in the
    values it writes."""
    x = inputs[0]
    args = (cost_model, tensor_dtype, out_pins)
    if name == "index":
        idxs = list(inputs[1:])
        dims, lx, li, out, lb = index_letters(x, idxs, indexed)
        b = _broadcast_shape([i.shape for i in idxs])
        sizes = dict(zip(lx, x.shape)) | dict(zip(lb, b))
        fm = FactorMap(tuple([lx] + li), out, whole=frozenset(lx[d] for d in dims), broadcast=frozenset(lb),
                       linear="first")  # rows of a partial sum are the partial sums of the rows
        return factor_map_result(name, tuple(inputs), fm, [tuple(sizes[ch] for ch in out)], *args)
    idx = inputs[1]
    lx = LETTERS[: x.ndim]
    li = LETTERS[x.ndim: x.ndim + idx.ndim].upper()
    vals = inputs[2]
    lv = li + lx[1:] if vals.shape == idx.shape + x.shape[1:] else LETTERS[: vals.ndim].upper()
    whole = {lx[0]} | set(li) | (set(lv) - set(lx[1:]))
    return _whole(name, [x, idx, vals], [lx, li, lv], lx, whole, None, *args)


def _np_index_put(a, i, v, accumulate=False, unsafe=False):
    out = np.array(a, dtype=float)
    if accumulate:
        np.add.at(out, np.asarray(i).astype(int), v)
    else:
        out[np.asarray(i).astype(int)] = v
    return out


def _check_index_put(name, inputs, params):
    x, idx, vals = inputs[0], inputs[1], inputs[2]
    want = idx.shape + x.shape[1:]
    if vals.ndim > len(want) or any(a not in (1, b) for a, b in zip(vals.shape[::-1], want[::-1])):
        raise OpError(f"op {name}: values of shape {vals.shape} do not broadcast to the indexed shape {want}")


def _np_index(a, *idxs, indexed=None):
    dims = index_dims(np.ndim(a), len(idxs), indexed)
    key = [slice(None)] * np.ndim(a)
    for d, i in zip(dims, idxs):
        key[d] = np.asarray(i).astype(int)
    return np.asarray(a)[tuple(key)]


register_op("index", "*xs ; indexed: ints? = None", _advanced_index_rule, _np_index)
register_op("index_put", "x, index, values ; accumulate: bool = False", _advanced_index_rule, _np_index_put,
            check=_check_index_put)
register_op("_index_put_impl", "x, index, values ; accumulate: bool = False, unsafe: bool = False",
            _advanced_index_rule, _np_index_put, check=_check_index_put)


__all__ = ["LETTERS", "REDUCE_OP", "bias_once", "conv_out_shape", "conv_params", "parse_einsum", "pointwise",
           "pointwise_map", "pointwise_ops", "reduction_map"]
