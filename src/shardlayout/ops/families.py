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
             "maximum", "minimum", "clamp", "masked_fill", "bitwise_not", "empty_like", "fill",
             "new_zeros", "new_ones", "new_empty", "new_full", "sign", "erf", "floor", "ceil", "round")


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
    if linear == "sum" and any(s is None for s in inputs):
        linear = None  # partial + a constant would add the constant once per rank
    return FactorMap(ins, out, linear=linear)


@register(*SUM_LINEAR, *MULTI_LINEAR, *NONLINEAR)
def pointwise_rule(name, inputs, cost_model=None, dtype="float32", **_):
    """Pointwise ops: every dim may be sharded as the inputs are; linear ops keep partials."""
    ins = _tensors(inputs)
    fm = pointwise_map(name, ins)
    if name == "div" and ins[1] is not None and any(a for a, _ in ins[1].partial):
        fm = FactorMap(fm.inputs, fm.output, linear=None)
    return _result(name, tuple(ins), fm, None, cost_model, dtype)


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
    # with a bias, a partial product plus a replicated bias would add the bias n times: k stays whole
    fm = FactorMap(ins, lead + "n", linear="multi" if bias is None else None,
                   whole=frozenset("k" if bias is not None else ""))
    return _result(name, tuple(inputs[: len(ins)]), fm, None, cost_model, dtype)


@register("addmm")
def addmm_rule(name, inputs, cost_model=None, dtype="float32", **_):
    """``addmm(bias, a, b)``: ``bias + a @ b``; bias broadcast over rows."""
    bias = inputs[0]
    lb = "mn"[2 - bias.ndim:]
    # bias + partial(a @ b) would add the bias once per rank: the contraction stays whole
    fm = FactorMap((lb, "mk", "kn"), "mn", linear=None, whole=frozenset("k"))
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
    whole = frozenset()
    if name != "sum":
        # the average of unequal chunks' means is not the mean, and max/min/any/all of an empty
        # chunk has no value (torch raises): shard a reduced dim only where every assignment of
        # the mesh cuts it evenly
        whole = frozenset(ins[d] for d in dims if s.shape[d] % s.mesh.size)
    return FactorMap((ins,), out, reduce=REDUCE_OP[name], whole=whole, linear=linear), tuple(shape)


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


# ------------------------------------------------------------------------------------------
# ops that need a dim whole: norms, cat/split/slice/select, index ops, scans, sort, attention
# ------------------------------------------------------------------------------------------


def _norm_dims(s: Sharding, dims) -> list:
    if dims is None:
        return []
    if isinstance(dims, int):
        dims = [dims]
    return [d % s.ndim for d in dims]


def _whole(name, inputs, letters_in, letters_out, whole, out_shapes=None, cost_model=None, dtype="float32",
           n_out=1, linear=None, reduce="sum"):
    fm = FactorMap(tuple(letters_in), letters_out, reduce=reduce, whole=frozenset(whole), linear=linear)
    return _result(name, tuple(inputs), fm, out_shapes, cost_model, dtype, n_out)


@register("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm")
def norm_rule(name, inputs, normalized_shape=None, cost_model=None, dtype="float32", **_):
    """``(x, normalized_shape, weight=None, bias=None)``: the normalized (last) dims stay whole;
    weight and bias cover them. native_layer_norm also returns mean and rstd (keepdim)."""
    x = inputs[0]
    k = len(normalized_shape) if normalized_shape is not None else 1
    lx = LETTERS[: x.ndim]
    norm = lx[x.ndim - k:]
    params = [s for s in inputs[1:] if isinstance(s, Sharding)]
    ins = [lx] + [norm[len(norm) - p.ndim:] for p in params]
    out = _whole(name, [x] + params, ins, lx, norm, None, cost_model, dtype)
    if name != "native_layer_norm":
        return out
    stat_shape = x.shape[: x.ndim - k] + (1,) * k
    stats = Sharding(x.mesh, stat_shape, [list(f) for f in out.outputs[0].dims[: x.ndim - k]] + [[]] * k)
    return Propagation(name, out.inputs, out.input_targets, (out.outputs[0], stats, stats),
                       out.redistributions, out.notes, out.alternatives)


@register("cat", "concat", "concatenate")
def cat_rule(name, inputs, dim=0, cost_model=None, dtype="float32", **_):
    """The cat dim is gathered (whole) in every input; other dims shard freely."""
    ins = [s for s in inputs if isinstance(s, Sharding)]
    ref = ins[0]
    d = dim % ref.ndim
    lx = LETTERS[: ref.ndim]
    letters = [lx[:d] + f"{LETTERS[20 + i].upper()}" + lx[d + 1:] for i in range(len(ins))]
    out_letters = lx[:d] + "Z" + lx[d + 1:]
    shape = list(ref.shape)
    shape[d] = sum(s.shape[d] for s in ins)
    whole = {l[d] for l in letters} | {"Z"}
    return _whole(name, ins, letters, out_letters, whole, [tuple(shape)], cost_model, dtype)


@register("split_with_sizes", "split", "chunk", "unbind")
def split_rule(name, inputs, split_sizes=None, split_size=None, chunks=None, dim=0, cost_model=None,
               dtype="float32", **_):
    """The split dim is whole; one output per piece, other dims as the input."""
    s = inputs[0]
    d = dim % s.ndim
    n = s.shape[d]
    if name == "unbind":
        sizes = [1] * n
    elif split_sizes is not None:
        sizes = list(split_sizes)
    elif chunks is not None:
        c = -(-n // chunks)
        sizes = [min(c, n - i) for i in range(0, n, c)]
    else:
        step = split_size or n
        sizes = [min(step, n - i) for i in range(0, n, step)]
    if sum(sizes) != n:
        raise ShardingSpecError(f"{name}: sizes {sizes} do not add up to dim {d} of size {n}")
    lx = LETTERS[: s.ndim]
    outs = []
    base = _whole(name, [s], [lx], lx, {lx[d]}, None, cost_model, dtype)
    o = base.outputs[0]
    for k in sizes:
        if name == "unbind":
            dims = list(o.dims[:d]) + list(o.dims[d + 1:])
            outs.append(Sharding(s.mesh, s.shape[:d] + s.shape[d + 1:], dims, o.partial))
        else:
            shape = s.shape[:d] + (k,) + s.shape[d + 1:]
            outs.append(Sharding(s.mesh, shape, list(o.dims[:d]) + [[]] + list(o.dims[d + 1:]), o.partial))
    return Propagation(name, base.inputs, base.input_targets, tuple(outs), base.redistributions, base.notes,
                       base.alternatives)


@register("slice", "narrow", "select", "cumsum", "cumprod", "flip", "roll")
def along_dim_rule(name, inputs, dim=0, start=None, end=None, step=1, length=None, index=None,
                   cost_model=None, dtype="float32", **_):
    """Ops reading a whole dim (slice/narrow/select/scans): that dim is gathered, others free."""
    s = inputs[0]
    d = dim % s.ndim if isinstance(dim, int) else dim[0] % s.ndim
    lx = LETTERS[: s.ndim]
    n = s.shape[d]
    if name in ("slice", "narrow"):
        a = 0 if start is None else (start + n if start < 0 else start)
        if name == "narrow":
            b = a + length
        else:
            b = n if end is None else min(n, end + n if end < 0 else end)
        size = max(0, -(-(b - a) // (step or 1)))
        shape = s.shape[:d] + (size,) + s.shape[d + 1:]
        out = lx[:d] + "Z" + lx[d + 1:]
        return _whole(name, [s], [lx], out, {lx[d], "Z"}, [shape], cost_model, dtype)
    if name == "select":
        shape = s.shape[:d] + s.shape[d + 1:]
        return _whole(name, [s], [lx], lx[:d] + lx[d + 1:], {lx[d]}, [shape], cost_model, dtype)
    linear = "sum" if name in ("cumsum", "flip", "roll") else None
    return _whole(name, [s], [lx], lx, {lx[d]}, None, cost_model, dtype, linear=linear)


@register("sort", "argsort", "topk")
def sort_rule(name, inputs, dim=-1, k=None, cost_model=None, dtype="float32", **_):
    """Sorting needs the whole dim; topk's output dim has size k. sort/topk return (values, indices)."""
    s = inputs[0]
    d = dim % s.ndim
    lx = LETTERS[: s.ndim]
    shape = s.shape if name != "topk" else s.shape[:d] + (k,) + s.shape[d + 1:]
    n_out = 1 if name == "argsort" else 2
    return _whole(name, [s], [lx], lx, {lx[d]}, [shape], cost_model, dtype, n_out=n_out)


@register("index_select", "gather", "scatter", "scatter_add", "index_add", "embedding")
def index_rule(name, inputs, dim=0, cost_model=None, dtype="float32", **_):
    """Indexed dims are whole in the indexed tensor; the index tensor's dims shard freely.

    embedding(weight, indices): vocab rows whole, the embedding dim free (tp on hidden).
    """
    if name == "embedding":
        w, idx = inputs[0], inputs[1]
        li = LETTERS[: idx.ndim]
        return _whole(name, [w, idx], ["VD", li], li + "D", {"V"}, [idx.shape + (w.shape[1],)], cost_model,
                      dtype)
    s = inputs[0]
    d = dim % s.ndim
    lx = LETTERS[: s.ndim]
    if name == "index_select":
        idx = inputs[1]
        out = lx[:d] + "Z" + lx[d + 1:]
        shape = s.shape[:d] + (idx.shape[0],) + s.shape[d + 1:]
        return _whole(name, [s, idx], [lx, "Z"], out, {lx[d]}, [shape], cost_model, dtype)
    if name == "gather":
        idx = inputs[1]
        # out[i][j] = x[i][idx[i][j]] (dim=1): the gathered dim of x is whole; idx's follow out
        lidx = lx[:d] + "Z" + lx[d + 1:]
        return _whole(name, [s, idx], [lx, lidx], lidx, {lx[d]}, [idx.shape], cost_model, dtype)
    # scatter / scatter_add (self, dim, index, src): index and src line up with self on the
    # other dims where their sizes agree (those shard together); the scatter dim is whole
    others = [x for x in inputs[1:] if isinstance(x, Sharding)]
    if name in ("scatter", "scatter_add") and all(o.ndim == s.ndim for o in others):
        letters = [lx]
        whole = {lx[d]}
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
        return _whole(name, [s] + others, letters, lx, whole, None, cost_model, dtype)
    if name == "index_add" and len(others) == 2 and others[0].ndim == 1 and others[1].ndim == s.ndim:
        # src lines up with self on the other dims; the added-into dim and the index stay whole
        lsrc = lx[:d] + "Z" + lx[d + 1:]
        return _whole(name, [s] + others, [lx, "Z", lsrc], lx, {lx[d], "Z"}, None, cost_model, dtype)
    # anything else: only self's other dims shard
    letters = [lx] + [LETTERS[: o.ndim].upper() for o in others]
    whole = set(lx[d]) | {ch for lt in letters[1:] for ch in lt}
    return _whole(name, [s] + others, letters, lx, whole, None, cost_model, dtype)


@register("one_hot")
def one_hot_rule(name, inputs, num_classes=None, cost_model=None, dtype="float32", **_):
    s = inputs[0]
    if num_classes is None or num_classes < 1:
        raise ShardingSpecError("one_hot: give num_classes= (the class count is data-dependent otherwise)")
    lx = LETTERS[: s.ndim]
    return _whole(name, [s], [lx], lx + "Z", {"Z"}, [s.shape + (num_classes,)], cost_model, dtype)


@register("histc", "bincount")
def histc_rule(name, inputs, bins=100, cost_model=None, dtype="float32", **_):
    """Counting is linear: a sharded input gives a partial(sum) histogram."""
    s = inputs[0]
    lx = LETTERS[: s.ndim]
    return _whole(name, [s], [lx], "Z", {"Z"}, [(bins,)], cost_model, dtype)


@register("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
          "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu")
def sdpa_rule(name, inputs, is_causal=False, cost_model=None, dtype="float32", **_):
    """q [b,h,s,d], k [b,h,t,d], v [b,h,t,e] -> [b,h,s,e]. Batch and heads shard freely; the
    query sequence shards exactly (each rank attends its queries to all keys) unless causal
    (the local mask would use local positions); keys/values sequence and d stay whole."""
    q, k, v = inputs[0], inputs[1], inputs[2]
    whole = {"t", "d"} | ({"s"} if is_causal else set())
    out_shape = q.shape[:-1] + (v.shape[-1],)
    p = _whole(name, [q, k, v], ["bhsd", "bhtd", "bhte"], "bhse", whole, [out_shape], cost_model, dtype)
    if name == "scaled_dot_product_attention":
        return p
    o = p.outputs[0]  # the fused kernels also return the log-sum-exp [b, h, s]
    lse = Sharding(o.mesh, o.shape[:-1], list(o.dims[:-1]), o.partial)
    return Propagation(name, p.inputs, p.input_targets, (o, lse), p.redistributions, p.notes, p.alternatives)


@register("_scaled_dot_product_flash_attention_for_cpu_backward",
          "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward")
def sdpa_backward_rule(name, inputs, cost_model=None, dtype="float32", **_):
    """``(grad_out, q, k, v, out, logsumexp, ...)`` -> (grad_q, grad_k, grad_v): batch and heads
    shard freely; sequences and head dims stay whole (sharded queries would make grad_k and
    grad_v partial sums, which the planner does not pick yet)."""
    g, q, k, v, out, lse = inputs[:6]
    letters = ["bhse", "bhsd", "bhtd", "bhte", "bhse", "bhs"]
    p = _whole(name, [g, q, k, v, out, lse], letters, "bhsd", {"s", "t", "d", "e"}, [q.shape], cost_model,
               dtype)
    gq = p.outputs[0]
    bh = [list(fs) for fs in gq.dims[:2]]
    gk = Sharding(gq.mesh, k.shape, bh + [[], []], gq.partial)
    gv = Sharding(gq.mesh, v.shape, bh + [[], []], gq.partial)
    return Propagation(name, p.inputs, p.input_targets, (gq, gk, gv), p.redistributions, p.notes,
                       p.alternatives)


@register("slice_backward")
def slice_backward_rule(name, inputs, input_sizes=None, dim=0, cost_model=None, dtype="float32", **_):
    """Scatter a slice's gradient into zeros of ``input_sizes``: that dim whole, others free."""
    g = inputs[0]
    d = dim % g.ndim
    lx = LETTERS[: g.ndim]
    out = lx[:d] + "Z" + lx[d + 1:]
    return _whole(name, [g], [lx], out, {lx[d], "Z"}, [tuple(input_sizes)], cost_model, dtype, linear="sum")


@register("_assert_tensor_metadata", "_assert_async", "_assert_scalar", "sym_constrain_range_for_size")
def assert_rule(name, inputs, **_):
    """Runtime checks: no data, no outputs, no communication."""
    ins = tuple(s for s in inputs if isinstance(s, Sharding))
    return Propagation(name, ins, ins, ())


@register("_grouped_mm")
def grouped_mm_rule(name, inputs, cost_model=None, dtype="float32", **_):
    """MoE experts: a [tokens, k] @ b [groups, k, n] with offs [groups] (token ranges per group).
    k contracts (partial sum), n shards freely; tokens and groups stay whole (dispatching tokens
    to sharded experts is an all-to-all the planner adds at the layer level)."""
    a, b = inputs[0], inputs[1]
    offs = inputs[2] if len(inputs) > 2 and isinstance(inputs[2], Sharding) else None
    ins = [a, b] + ([offs] if offs is not None else [])
    letters = ["tk", "gkn"] + (["g"] if offs is not None else [])
    return _whole(name, ins, letters, "tn", {"t", "g"}, [(a.shape[0], b.shape[2])], cost_model, dtype,
                  linear="multi")


# ------------------------------------------------------------------------------------------
# creation ops: no tensor inputs; replicated unless a consumer says otherwise (issue 6)
# ------------------------------------------------------------------------------------------


@register("arange", "full", "zeros", "ones", "empty", "scalar_tensor", "rand", "randn")
def creation_rule(name, inputs, mesh=None, size=None, shape=None, end=None, start=0, step=1, **_):
    """Creation ops make a replicated tensor on ``mesh=``; the whole-program pass shards them
    from their consumers."""
    if mesh is None:
        raise ShardingSpecError(f"{name}: a creation op has no input to take the mesh from; pass mesh=")
    if name == "arange":
        n = max(0, -(-((end if end is not None else 0) - start) // step))
        out_shape = (n,)
    elif name == "scalar_tensor":
        out_shape = ()
    else:
        out_shape = tuple(size if size is not None else shape or ())
    return Propagation(name, (), (), (Sharding(mesh, out_shape),))


@register("_softmax_backward_data", "_log_softmax_backward_data")
def softmax_backward_rule(name, inputs, dim=-1, cost_model=None, dtype="float32", **_):
    """``(grad_output, output, dim)``: the softmax dim is whole in both."""
    g = inputs[0]
    lx = LETTERS[: g.ndim]
    return _whole(name, inputs[:2], [lx, lx], lx, {lx[dim % g.ndim]}, None, cost_model, dtype)


@register("native_layer_norm_backward")
def layer_norm_backward_rule(name, inputs, normalized_shape=None, cost_model=None, dtype="float32", **_):
    """``(grad_out, input, normalized_shape, mean, rstd, weight, bias)`` -> (grad_input,
    grad_weight, grad_bias): normalized dims whole; grad_weight/bias sum over the other dims,
    so sharding those gives partial(sum) parameter gradients."""
    g, x = inputs[0], inputs[1]
    k = len(normalized_shape) if normalized_shape is not None else 1
    lx = LETTERS[: x.ndim]
    norm = lx[x.ndim - k:]
    base = _whole(name, [g, x], [lx, lx], lx, norm, None, cost_model, dtype)
    gi = base.outputs[0]
    reduce_axes = [(f.axis, "sum") for fs in gi.dims[: x.ndim - k] for f in fs if f.axis]
    reduce_axes += list(gi.partial)
    order = {n: i for i, n in enumerate(x.mesh.names)}
    pshape = x.shape[x.ndim - k:]
    gw = Sharding(x.mesh, pshape, [[] for _ in pshape], sorted(set(reduce_axes), key=lambda p: order[p[0]]))
    return Propagation(name, base.inputs, base.input_targets, (gi, gw, gw), base.redistributions,
                       base.notes, base.alternatives)


@register("index", "_index_put_impl", "index_put")
def advanced_index_rule(name, inputs, cost_model=None, dtype="float32", **_):
    """``x[idx]`` (one index tensor on dim 0): like index_select; index_put keeps x's shape and
    needs the indexed dim whole in x and everything whole in the values it writes."""
    x, idx = inputs[0], inputs[1]
    lx = LETTERS[: x.ndim]
    li = LETTERS[x.ndim: x.ndim + idx.ndim].upper()
    if name == "index":
        return _whole(name, [x, idx], [lx, li], li + lx[1:], {lx[0]}, [idx.shape + x.shape[1:]], cost_model,
                      dtype)
    vals = inputs[2]
    if vals.shape == idx.shape + x.shape[1:]:
        lv = li + lx[1:]  # the written rows line up with x's other dims: those shard together
    else:
        lv = LETTERS[: vals.ndim].upper()
    whole = {lx[0]} | set(li) | (set(lv) - set(lx[1:]))
    return _whole(name, [x, idx, vals], [lx, li, lv], lx, whole, None, cost_model, dtype)
