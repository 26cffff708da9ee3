"""The blocks of a model, found by the structure of its graph — never by weight names.

What a style shards is named by what the ops do, so a Hugging Face Llama (``self_attn.q_proj``),
a torchtitan one (``attention.wq``), GPT-2 (``attn.c_attn``, Conv1D weights) and the builder
models all read the same:

- **Linear**: a 2-D parameter reaching ``mm`` / ``addmm`` / ``bmm`` / ``matmul`` / ``linear`` as
  the right operand through views (torch.export gives ``permute + mm``, ``permute + expand +
  bmm`` or ``permute + addmm`` with a bias; Conv1D weights ``(in, out)`` need no permute). Which
  weight dim is contracted (``in_dim``) and which makes the output features (``out_dim``) is
  read off the views. A Linear whose features are split (``split``, ``chunk``, ``unbind``, slices
  tiling them) into equal parts before use is *fused* (``parts``: q|k|v is 3, gate|up is 2); into
  unequal ones, fused with those ``pieces`` (q|k|v of grouped-query attention).
- **attention**: an attention core — ``scaled_dot_product_attention``, or ``softmax(Q K^T) V``
  written out (a batched matmul of two activations feeding a softmax through pointwise ops and
  views, whose result is the left operand of a second one) — with the Linears whose outputs
  reach its q, k, v only through pointwise ops, views and norms of q or k (per head, or a mean
  square over all of q's features: ``_per_head``) (``first``), and the Linears that consume its
  result the same way (``last``); ``heads``: its query heads.
- **mlp**: Linears (an up projection, and a gate multiplied after an activation) whose outputs
  reach another Linear (the down projection) only through pointwise ops and views.
  "Only" is checked both ways: every tensor derived from a ``first`` Linear is consumed by
  pointwise ops, views or the block itself (so a residual stream feeding a norm never counts).
- **embedding** (``embedding`` of a parameter), **norm** (a norm op, or a 1-D parameter scaling
  an activation's last dim), **head** (a Linear outside the blocks whose output is a program
  output), **experts** (a parameter of rank >= 3 feeding a batched matmul: dim 0 is the expert).

    >>> from shardlayout.program.models import llama
    >>> [b.describe() for b in find_blocks(llama(layers=1)).blocks]  # doctest: +NORMALIZE_WHITESPACE
    ['norm layers.0: attn_norm', 'attention layers.0: wq, wk, wv -> wo', 'norm layers.0: mlp_norm',
     'mlp layers.0: w_gate, w_up -> w_down']
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..ops.result import canonical_op_name
from . import Program

VIEWS = frozenset({"view", "_unsafe_view", "view_copy", "reshape", "_reshape_alias", "alias", "clone", "contiguous",
                   "flatten", "unflatten", "squeeze", "unsqueeze", "permute", "transpose", "t", "movedim", "expand",
                   "_to_copy", "detach", "lift_fresh_copy", "view_as_complex", "view_as_real"})
"""Ops that move no value (a cast keeps the value for this purpose; so does reading pairs of reals as
complex numbers, as torchtitan's rotary embedding does)."""
PLAIN_VIEWS = frozenset({"view", "_unsafe_view", "view_copy", "reshape", "_reshape_alias", "alias", "clone",
                         "contiguous", "expand", "_to_copy", "detach"})
"""Views that keep the dim order (the block input of a projection is found through these)."""
PIECES = frozenset({"split", "split_with_sizes", "chunk", "unbind", "slice", "narrow", "select", "cat", "stack"})
SPLITS = frozenset({"split", "split_with_sizes", "chunk", "unbind"})
MATMULS = frozenset({"mm", "addmm", "bmm", "matmul", "linear"})
SOFTMAX = frozenset({"_softmax", "softmax"})
NORMS = frozenset({"native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm", "group_norm", "native_group_norm",
                   "batch_norm", "_native_batch_norm_legit_no_training"})
BATCHED = frozenset({"bmm", "einsum", "_grouped_mm", "matmul"})
KINDS = ("attention", "mlp", "embedding", "norm", "head", "experts")


def _pointwise() -> frozenset:
    from ..ops.families import pointwise_ops

    return pointwise_ops()


def short(op) -> str:
    """The short aten name of an op. ``short(Op("aten.mm.default", ...)) -> "mm"``."""
    return canonical_op_name(op.target)


@dataclass(frozen=True)
class Linear:
    """A parameter used as a Linear's weight: ``weight`` (its name), ``bias`` (or None),
    ``op`` (index of the matmul op), ``output`` (the matmul's output), ``activation`` (the
    operand it multiplies), ``in_dim`` / ``out_dim`` (the weight dims contracted and producing
    the output features), ``parts`` (equal pieces its features are split into: 1 unless fused),
    ``pieces`` (the sizes of unequal pieces, when fused so: q|k|v of grouped-query attention)."""

    weight: str
    bias: str | None
    op: int
    output: str
    activation: str
    in_dim: int
    out_dim: int
    parts: int = 1
    pieces: tuple = ()


@dataclass(frozen=True)
class Block:
    """A block a style shards: ``kind`` (one of KINDS), ``name`` (the module path its parameters
    share), ``first`` / ``last`` (Linears: column- then row-parallel under Megatron), ``inputs``
    (the activations its first Linears read, before their views), ``output`` (the residual add
    that closes it, or its last tensor), ``params`` (the parameters of a non-Linear block),
    ``heads`` (an attention block's query heads, read off its core: None when not known),
    ``runs`` (an attention block's heads fall into that many equal runs combined run with run:
    differential attention's head ``i`` with head ``i + H/2``, 2; ``head_runs``)."""

    kind: str
    name: str
    first: tuple = ()
    last: tuple = ()
    inputs: tuple = ()
    output: str | None = None
    params: tuple = ()
    heads: int | None = None
    runs: int = 1

    def tensors(self) -> tuple:
        """Every parameter of the block, in order. ``Block("norm", "n", params=("n.w",)).tensors() -> ('n.w',)``"""
        out = [n for lin in self.first + self.last for n in (lin.weight, lin.bias) if n] + list(self.params)
        return tuple(dict.fromkeys(out))

    def describe(self) -> str:
        """One line: ``"attention layers.0: q.weight, k.weight -> o.weight"``."""
        rel = lambda n: n[len(self.name) + 1:] if self.name and n.startswith(self.name + ".") else n  # noqa: E731
        if self.first or self.last:
            fused = lambda lin: f" ({lin.parts} fused)" if lin.parts > 1 else (  # noqa: E731
                f" (fused {'|'.join(map(str, lin.pieces))})" if lin.pieces else "")
            body = ", ".join(rel(lin.weight) + fused(lin) for lin in self.first)
            body += " -> " + ", ".join(rel(lin.weight) for lin in self.last) if self.last else ""
        else:
            body = ", ".join(rel(n) for n in self.params)
        return f"{self.kind} {self.name or '(root)'}: {body}"

    def to_json(self) -> dict:
        """``{"block": name, "kind": kind, "tensors": [...]}``."""
        return {"block": self.name, "kind": self.kind, "tensors": list(self.tensors())}


@dataclass(frozen=True)
class Structure:
    """What ``find_blocks`` found: every Linear, and the blocks in program order."""

    linears: tuple
    blocks: tuple

    def of_kind(self, *kinds) -> tuple:
        """The blocks of these kinds. ``s.of_kind("attention", "mlp")``."""
        return tuple(b for b in self.blocks if b.kind in kinds)

    def summary(self) -> str:
        """``"2 attention, 2 mlp, 1 embedding"`` (kinds found, in KINDS order), or ``"no blocks"``."""
        counts = [(k, sum(b.kind == k for b in self.blocks)) for k in KINDS]
        return ", ".join(f"{n} {k}" for k, n in counts if n) or "no blocks"


# ------------------------------------------------------------------------------------------
# the graph
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Graph:
    """Producers and consumers of a Program's tensors (op indices)."""

    program: Program
    producer: dict
    consumers: dict
    through: frozenset = frozenset()  # indices of the ops that only move values (``passthrough``)

    def passes(self, i: int) -> bool:
        """Does op ``i`` only move or combine values element by element (``passthrough``)?"""
        return i in self.through

    def op(self, i: int):
        return self.program.ops[i]

    def made_by(self, t: str):
        """The op producing ``t`` (None for inputs, params, buffers)."""
        i = self.producer.get(t)
        return None if i is None else self.program.ops[i]

    def users(self, t: str) -> list:
        return self.consumers.get(t, [])


def graph(program: Program) -> Graph:
    """The producer/consumer maps of ``program`` (computed once per Program)."""
    g = program.__dict__.get("_graph")
    if g is None:
        producer, consumers = {}, {}
        for i, op in enumerate(program.ops):
            for t in op.outputs:
                producer[t] = i
            for t in op.inputs:
                if isinstance(t, str):
                    lst = consumers.setdefault(t, [])
                    if i not in lst:
                        lst.append(i)
        g = Graph(program, producer, consumers,
                  frozenset(i for i, op in enumerate(program.ops) if passthrough(op) or fixed_pick(program, op,
                                                                                                     producer)))
        object.__setattr__(program, "_graph", g)
    return g


def heads_of(program: Program, lin) -> int | None:
    """How many attention heads a Linear's output features hold: the view that splits its
    features into ``(heads, head_dim)`` (within three pass-through ops of the matmul), or None
    when no such view follows. A q|k|v projection fused per kv group (torchtitan's ``wqkv``: a
    view to ``(groups, r, head_dim)``, then a split of ``r``) holds ``groups``: a column cut must
    keep whole groups. ``heads_of(prog, k_proj) -> 2`` (GQA: 2 kv heads)."""
    found = _split_view(graph(program), lin, grouped=True)
    if found is None:
        return None
    _, heads, by_groups = found
    return heads if by_groups else heads // max(lin.parts, 1)


def feature_scales(program: Program, lin) -> tuple:
    """1-D parameters that scale a Linear's output features one by one before they are split into
    heads (OLMo2's ``q_norm.weight`` of ``heads * head_dim``): a ``mul`` of the parameter and a
    tensor reached from the output through pointwise ops, views and norm statistics, its last dim
    still the features. A column cut of the Linear cuts them alike. ``feature_scales(prog, q_proj)
    -> ('model.layers.0.self_attn.q_norm.weight',)``"""
    t = program.tensors
    features = t[lin.output].shape[-1]
    g = graph(program)
    found = [p for i in _feature_users(program, lin) if short(g.op(i)) == "mul"
             for p in g.op(i).inputs if _is_param(g, p) and t[p].shape == (features,)]
    return tuple(dict.fromkeys(found))


def feature_statistics(program: Program, lin) -> tuple:
    """The statistics over all of a Linear's output features taken before they are split into heads
    (OLMo2's ``q_norm``: the mean square of ``[b, s, heads * hd]``, kept as ``[b, s, 1]``), as
    ``(input, statistic)`` pairs: reductions over the last dim alone of a tensor reached from the
    output through pointwise ops and views. A column cut makes each a partial sum over the cut
    features, all-reduced where it is made (one collective; reduce-scattered, it is gathered again
    before it scales q: two). ``feature_statistics(prog, q_proj)
    -> (('model.layers.0.self_attn.q_norm.pow', 'model.layers.0.self_attn.q_norm.mean'),)``"""
    g = graph(program)
    found = [(g.op(i).inputs[0], g.op(i).outputs[0]) for i in _feature_users(program, lin)
             if short(g.op(i)) in _HEAD_STATS and _per_head(g, i)
             and program.tensors[g.op(i).outputs[0]].shape[-1:] == (1,)]
    return tuple(dict.fromkeys(found))


def input_statistics(program: Program, lin) -> tuple:
    """The statistics over all of a Linear's input features taken in the region its activation is
    made in (BitNet's ``attn_sub_norm`` before o_proj: the mean square of the attention's
    ``[b, s, heads * hd]``, kept as ``[b, s, 1]``; ``ffn_sub_norm`` before down_proj), as ``(input,
    statistic)`` pairs: reductions over the last dim alone of a tensor that reaches the activation
    through pointwise ops and views, its last dim still the input features. A row cut makes each
    a partial sum over the cut features, all-reduced where it is made (an RMSNorm over a cut dim
    needs its whole statistic, as in any tensor-parallel BitNet). ``input_statistics(prog, o_proj)
    -> (('model.layers.0.self_attn.attn_sub_norm.pow', 'model.layers.0.self_attn.attn_sub_norm.mean'),)``"""
    g = graph(program)
    t = program.tensors
    features = t[lin.activation].shape[-1]
    found = [(g.op(i).inputs[0], g.op(i).outputs[0]) for i in _input_region(program, lin)
             if _feature_statistic(g, i) and t[g.op(i).inputs[0]].shape[-1] == features
             and t[g.op(i).outputs[0]].shape[-1:] == (1,)]
    return tuple(dict.fromkeys(found))


def input_scales(program: Program, lin) -> tuple:
    """1-D parameters that scale a Linear's input features one by one in the region its activation
    is made in (BitNet's ``attn_sub_norm.weight`` of ``heads * hd`` before o_proj), when that region
    also takes a statistic of them (``input_statistics``: a norm of the features): a row cut of the
    Linear cuts them alike. ``input_scales(prog, o_proj) -> ('model.layers.0.self_attn.attn_sub_norm.weight',)``"""
    if not input_statistics(program, lin):
        return ()
    g = graph(program)
    t = program.tensors
    features = t[lin.activation].shape[-1]
    found = [p for i in _input_region(program, lin) if short(g.op(i)) == "mul"
             for p in g.op(i).inputs if _is_param(g, p) and t[p].shape == (features,)]
    return tuple(dict.fromkeys(found))


def _input_region(program: Program, lin) -> list:
    """The indices of the ops a Linear's activation is made by, walked back from it through
    pointwise ops, views and statistics of the input features, over tensors whose last dim is the
    input features (or 1: a statistic, ``[b, s, 1]``); in op order."""
    g = graph(program)
    t = program.tensors
    features = t[lin.activation].shape[-1]
    region, seen, todo = set(), {lin.activation}, [lin.activation]
    while todo:
        i = g.producer.get(todo.pop())
        if i is None or i in region or not (g.passes(i) or _feature_statistic(g, i)):
            continue
        region.add(i)
        for x in g.op(i).inputs:
            if isinstance(x, str) and x not in seen and t[x].shape and t[x].shape[-1] in (features, 1):
                seen.add(x)
                todo.append(x)
    return sorted(region)


def _feature_users(program: Program, lin) -> list:
    """The indices of the ops reading a tensor reached from ``lin``'s output through ops that keep a block's region
    open (pointwise, views, statistics), its last dim still the output features."""
    g = graph(program)
    t = program.tensors
    features = t[lin.output].shape[-1]
    found, seen, todo = [], {lin.output}, [lin.output]
    while todo:
        x = todo.pop()
        for i in g.users(x):
            found.append(i)
            if not _passes_in_block(g, i):
                continue
            for o in g.op(i).outputs:
                if o not in seen and t[o].shape and t[o].shape[-1] == features:
                    seen.add(o)
                    todo.append(o)
    return found


def fixed_pick(program: Program, op, producer: dict) -> bool:
    """Is ``op`` an ``index`` by constant index tensors (``constant``: ``x[..., [2]]``, Falcon's k
    and v picked out of a fused q|k|v per kv group)? It moves fixed elements of ``x`` as a slice
    would, whatever their values (a model built on the meta device has none to read), so a block's
    region goes through it; an index by routed token ids (computed from the input) is no such pick."""
    if short(op) != "index" or len(op.inputs) < 2:
        return False
    return all(isinstance(x, str) and constant(program, x, producer) for x in op.inputs[1:])


def constant(program: Program, t: str, producer: dict, depth: int = 8) -> bool:
    """Is ``t`` made without reading an input or a parameter: a buffer or lifted constant, or made
    from such alone (``arange``, a ``clone`` of a lifted constant) by at most ``depth`` ops?"""
    spec = program.tensors.get(t)
    if spec is None or spec.kind in ("param", "input"):
        return False
    if spec.kind == "buffer":
        return True
    i = producer.get(t)
    if i is None or depth == 0:
        return False
    return all(constant(program, x, producer, depth - 1) for x in program.ops[i].inputs if isinstance(x, str))


def passthrough(op) -> bool:
    """Does ``op`` only move or combine values element by element (views, pieces, pointwise; rows
    routed to experts, or put back one per (token, choice): ``route``, ``unroute(pairs=True)``)?"""
    name = short(op)
    return name in VIEWS or name in PIECES or name in _pointwise() or name == "route" or \
        (name == "unroute" and bool(dict(op.params).get("pairs")) and len(op.inputs) == 2)


# ------------------------------------------------------------------------------------------
# Linears: a weight through its views to a matmul
# ------------------------------------------------------------------------------------------


def _norm_dim(d: int, n: int) -> int:
    return d + n if d < 0 else d


def _same_nonunit(a: tuple, b: tuple, dims: tuple):
    """Dims of a view from shape ``a`` to ``b`` when both have the same non-1 sizes in order."""
    na = [(i, n) for i, n in enumerate(a) if n != 1]
    nb = [(j, n) for j, n in enumerate(b) if n != 1]
    if [n for _, n in na] != [n for _, n in nb]:
        return None
    out = [None] * len(b)
    for (i, _), (j, _) in zip(na, nb):
        out[j] = dims[i]
    return tuple(out)


def track_dims(op, dims: tuple, in_shape: tuple, out_shape: tuple):
    """Where the dims of a view's input land in its output: ``dims`` names each input dim (an
    int or None), the result names each output dim; None when the view merges or splits a named
    dim. ``track_dims(Op("permute", ("w",), (("dims", (1, 0)),), ("p",)), (0, 1), (4, 8), (8, 4)) -> (1, 0)``"""
    name, kw, n = short(op), op.kwargs(), len(in_shape)
    if name == "permute":
        return tuple(dims[_norm_dim(p, n)] for p in kw["dims"])
    if name == "t":
        return tuple(reversed(dims))
    if name == "transpose":
        d0, d1 = _norm_dim(kw["dim0"], n), _norm_dim(kw["dim1"], n)
        out = list(dims)
        out[d0], out[d1] = out[d1], out[d0]
        return tuple(out)
    if name == "expand":
        lead = len(out_shape) - n
        return (None,) * lead + tuple(d if a == b else None for d, a, b in zip(dims, in_shape, out_shape[lead:]))
    if in_shape == out_shape:
        return dims
    return _same_nonunit(in_shape, out_shape, dims)


def _weight_uses(g: Graph, param: str, matmuls=MATMULS):
    """``(op index, operand position, dims)`` of each matmul (of ``matmuls``) ``param`` reaches
    through views; ``dims[k]``: the dim of ``param`` at the operand's dim ``k`` (None: none)."""
    t = g.program.tensors
    stack = [(param, tuple(range(len(t[param].shape))))]
    while stack:
        name, dims = stack.pop()
        for i in g.users(name):
            op = g.op(i)
            base = short(op)
            if base in matmuls:
                for pos, x in enumerate(op.inputs):
                    if x == name:
                        yield i, pos, dims
            elif base in VIEWS and op.inputs and op.inputs[0] == name and len(op.outputs) == 1:
                nd = track_dims(op, dims, t[name].shape, t[op.outputs[0]].shape)
                if nd is not None and any(d is not None for d in nd):
                    stack.append((op.outputs[0], nd))
            elif _of_weight_alone(g, op, name, param):
                stack.append((op.outputs[0], dims))


def _of_weight_alone(g: Graph, op, name: str, param: str) -> bool:
    """Is ``op`` an element-wise op of ``name`` (made from ``param``), of its shape, whose other
    operands are made from ``param`` alone — BitNet's ternary weight, ``round(w * s).clamp(-1, 1) / s``
    with ``s = 1 / mean(|w|)``? Still the Linear of ``param``: a function of the weight only."""
    t = g.program.tensors
    if len(op.outputs) != 1 or short(op) not in _pointwise() or t[op.outputs[0]].shape != t[name].shape:
        return False
    return all(_made_from(g, x, param) for x in op.inputs if isinstance(x, str) and x != name)


def _made_from(g: Graph, x: str, source: str, depth: int = 8) -> bool:
    """Is ``x`` computed from ``source`` alone (and constants) by at most ``depth`` ops?"""
    if x == source:
        return True
    op = g.made_by(x)
    if op is None or depth == 0:
        return False
    ins = [i for i in op.inputs if isinstance(i, str)]
    return bool(ins) and all(_made_from(g, i, source, depth - 1) for i in ins)


def _as_linear(g: Graph, param: str, i: int, pos: int, dims: tuple):
    """The Linear of ``param`` used as operand ``pos`` of matmul op ``i`` (None if not one)."""
    op = g.op(i)
    base = short(op)
    wpos = {"mm": 1, "addmm": 2, "bmm": 1, "matmul": 1, "linear": 1}[base]
    if pos != wpos:
        return None
    if base == "linear":
        n_dim, k_dim = dims[-2], dims[-1]
    else:
        k_dim, n_dim = dims[-2], dims[-1]
        if base == "bmm" and dims[0] is not None:
            return None  # a batch of weights: experts, not a Linear
    if k_dim is None or n_dim is None or k_dim == n_dim:
        return None
    act = op.inputs[1] if base == "addmm" else op.inputs[0]
    bias = None
    if base == "addmm" and _is_param(g, op.inputs[0]):
        bias = op.inputs[0]
    elif base == "linear" and len(op.inputs) > 2 and _is_param(g, op.inputs[2]):
        bias = op.inputs[2]
    out = op.outputs[0]
    if bias is None:  # mm then add(bias)
        users = g.users(out)
        if len(users) == 1 and short(g.op(users[0])) == "add":
            other = [x for x in g.op(users[0]).inputs if x != out]
            if len(other) == 1 and _is_param(g, other[0]) and len(g.program.tensors[other[0]].shape) == 1:
                bias, out = other[0], g.op(users[0]).outputs[0]
    return Linear(param, bias, i, out, act, k_dim, n_dim, *_fused_parts(g, out))


_STATISTICS = frozenset({"pow", "mean", "add", "sub", "rsqrt", "sqrt", "var", "var_mean", "reciprocal", "mul",
                         "square", "_to_copy", "sum", "div"})


def _normalized(g: Graph, t: str) -> str:
    """The tensor a decomposed norm reads: ``t = x * rsqrt(mean(x**2) + eps)`` (or ``x / sqrt(...)``,
    ``(x - mean(x)) * rsqrt(var(x) + eps)``) is walked back to ``x``, the residual stream the norm
    module receives (a sequence-parallel plan shards it there); ``t`` itself when it is no such form."""
    for _ in range(3):
        op = g.made_by(t)
        if op is None or short(op) not in ("mul", "div", "sub"):
            return t
        ins = [x for x in op.inputs if isinstance(x, str)]
        if len(ins) != 2:
            return t
        for x, r in (ins, ins[::-1]):
            if r != x and _statistic_of(g, r, x):
                t = x
                break
        else:
            return t
    return t


def _statistic_of(g: Graph, r: str, x: str, depth: int = 8) -> bool:
    """Is ``r`` computed from ``x`` alone (and constants) by a few reductions and pointwise ops?"""
    if r == x:
        return True
    op = g.made_by(r)
    if op is None or depth == 0 or short(op) not in _STATISTICS:
        return False
    ins = [i for i in op.inputs if isinstance(i, str)]
    return bool(ins) and all(_statistic_of(g, i, x, depth - 1) for i in ins)


def _is_param(g: Graph, t) -> bool:
    return isinstance(t, str) and g.program.tensors[t].kind == "param"


def _fused_parts(g: Graph, out: str) -> tuple:
    """``(parts, pieces)`` of the features (last dim) of ``out`` split before use: ``(n, ())`` for
    ``n`` equal pieces (q|k|v of multi-head attention: 3), ``(1, sizes)`` for unequal ones (q|k|v of
    grouped-query attention: ``(q heads, kv heads, kv heads) * head_dim``), ``(1, ())`` for none.
    ``_fused_parts(g, phi3_gqa_qkv.output) -> (1, (32, 16, 16))``"""
    sizes = _pieces(g, out)
    if len(sizes) < 2:
        return 1, ()
    return (len(sizes), ()) if len(set(sizes)) == 1 else (1, sizes)


def _pieces(g: Graph, out: str) -> tuple:
    """The sizes of the pieces the features (last dim) of ``out`` are split into before use (``()``:
    none). Followed through views while the features stay the outermost of a dim."""
    tensors = g.program.tensors
    name, dim = out, len(tensors[out].shape) - 1
    for _ in range(8):
        users = g.users(name)
        shape = tensors[name].shape
        if len(users) > 1:
            return _selected_pieces(g, users, dim, shape[dim])
        if not users:
            return ()
        op = g.op(users[0])
        base = short(op)
        if base in SPLITS:
            kw = op.kwargs()
            if _norm_dim(kw.get("dim", 0), len(shape)) != dim:
                return ()
            return tuple(tensors[o].shape[dim] if base != "unbind" else 1 for o in op.outputs)
        if base not in VIEWS or len(op.outputs) != 1:
            return ()
        new = track_dims(op, tuple(d if d == dim else None for d in range(len(shape))), shape,
                         tensors[op.outputs[0]].shape)
        if new is None or dim not in new:
            new_dim = _outer_of(shape, dim, tensors[op.outputs[0]].shape) if base in PLAIN_VIEWS else None
            if new_dim is None:
                return ()
            dim = new_dim
        else:
            dim = new.index(dim)
        name = op.outputs[0]
    return ()


def _selected_pieces(g: Graph, users: list, dim: int, n: int) -> tuple:
    """The sizes of the pieces, in order, when the users cut ``dim`` into them — ``select`` of every
    index, or ``slice``s tiling it (``unbind`` and ``chunk`` as core ATen writes them; Phi-3's
    ``qkv[..., :q]``, ``qkv[..., q:q + kv]``, ``qkv[..., q + kv:]``) — else ``()``."""
    cuts, picked = set(), []
    for i in users:
        op = g.op(i)
        kw, base = op.kwargs(), short(op)
        nd = len(g.program.tensors[op.inputs[0]].shape)
        if base == "index" and tuple(kw.get("indexed", ())) == (dim,) and fixed_pick(g.program, op, g.producer):
            picked.append(g.program.tensors[op.outputs[0]].shape[dim])  # Falcon-7B's k, v: x[..., [-2], :]
            continue
        if base not in ("select", "slice") or _norm_dim(kw.get("dim", 0), nd) != dim or kw.get("step", 1) != 1:
            return ()
        if base == "select":
            k = kw.get("index", 0) % n
            cuts.add((k, k + 1))
        else:
            lo, hi = kw.get("start") or 0, kw.get("end")
            hi = n if hi is None or hi > n else hi
            cuts.add((lo + n if lo < 0 else lo, hi + n if hi < 0 else hi))
    edges = sorted(cuts)
    if picked:  # constant picks (their positions unread on meta) fill what the slices leave, after them
        if not edges or edges[0][0] != 0 or any(a[1] != b[0] for a, b in zip(edges, edges[1:])) \
                or edges[-1][1] + sum(picked) != n:
            return ()
        return tuple(b - a for a, b in edges) + tuple(picked)
    tiled = edges[0][0] == 0 and edges[-1][1] == n and all(a[1] == b[0] for a, b in zip(edges, edges[1:]))
    return tuple(b - a for a, b in edges) if len(edges) > 1 and tiled else ()


def _outer_of(shape: tuple, dim: int, new: tuple):
    """The dim of a reshape to ``new`` that begins dim ``dim`` of ``shape`` (dim split into
    several), or None when the reshape merges it with others."""
    inner = 1
    for n in shape[dim + 1:]:
        inner *= n
    outer_edge = inner * shape[dim]
    acc = 1
    for j in range(len(new) - 1, -1, -1):
        acc *= new[j]
        if acc == outer_edge:
            rest = 1
            for n in new[j + 1:]:
                rest *= n
            return j if rest >= inner and rest % inner == 0 else None
        if acc > outer_edge:
            return None
    return None


def find_linears(program: Program) -> tuple:
    """Every Linear of ``program``, in op order (a weight used twice gives two)."""
    g = graph(program)
    found = []
    for name, spec in program.tensors.items():
        if spec.kind != "param" or len(spec.shape) != 2:
            continue
        for i, pos, dims in _weight_uses(g, name):
            lin = _as_linear(g, name, i, pos, dims)
            if lin is not None:
                found.append(lin)
    return tuple(sorted(found, key=lambda lin: lin.op))


# ------------------------------------------------------------------------------------------
# regions: what reaches what through pointwise ops and views only
# ------------------------------------------------------------------------------------------


_HEAD_STATS = frozenset({"mean", "sum", "amax", "var", "var_mean"})
HEAD_NORMS = frozenset({"native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm"})


def _per_head(g: Graph, i: int, wide: bool = True) -> bool:
    """Is op ``i`` a statistic of q's or k's features that a column cut keeps right: a mean, sum or max
    over the last dim only, kept, of a tensor of 3 or more dims — of each head ([b, s, heads, hd]:
    Qwen3's q_norm, local to a head) or of all heads' features ([b, s, heads * hd]: OLMo2's q_norm,
    whose partial statistic a column cut all-reduces) — or a norm op over the last dim alone of a
    tensor of 4 or more dims (Phi's per-head ``q_layernorm``)? Not ``wide``: of each head only (an
    MLP's region never holds a statistic of all features: that is the next norm, past a residual add)."""
    op = g.op(i)
    base = short(op)
    if not op.inputs or not isinstance(op.inputs[0], str):
        return False
    kw = op.kwargs()
    n = len(g.program.tensors[op.inputs[0]].shape)
    if base in HEAD_NORMS:
        return n >= 4 and len(tuple(kw.get("normalized_shape") or ())) == 1
    if base not in _HEAD_STATS:
        return False
    dims = kw.get("dim")
    dims = [dims] if isinstance(dims, int) else list(dims or ())
    return n >= (3 if wide else 4) and bool(kw.get("keepdim")) and [_norm_dim(d, n) for d in dims] == [n - 1]


def _feature_statistic(g: Graph, i: int) -> bool:
    """Is op ``i`` a mean, sum or max over the last dim alone, kept, of a tensor of 3 or more dims (the
    mean square of an RMSNorm of the features: BitNet's ``attn_sub_norm`` of the attention's
    ``[b, s, heads * hd]`` before o_proj)?"""
    return short(g.op(i)) in _HEAD_STATS and _per_head(g, i, wide=True)


def _passes_in_block(g: Graph, i: int, wide: bool = True) -> bool:
    """Op ``i`` keeps a block's region open: it moves values, is a per-head statistic (``wide``: or
    one of all of q's features, ``_per_head``), or makes nothing (a runtime check such as
    ``_assert_tensor_metadata``)."""
    return i in g.through or not g.op(i).outputs or _per_head(g, i, wide)


def _closed(g: Graph, start: str, sinks: frozenset, wide: bool = True) -> bool:
    """Is every tensor derived from ``start`` through pointwise ops and views consumed only by
    such ops or by the ``sinks`` (op indices)?"""
    seen, frontier = {start}, [start]
    while frontier:  # breadth first: a use that breaks the region is found at its depth, not after a deep walk
        nxt = []
        for t in frontier:
            for i in g.users(t):
                if i in sinks:
                    continue
                if not _passes_in_block(g, i, wide):
                    return False
                for o in g.program.ops[i].outputs:
                    if o not in seen:
                        seen.add(o)
                        nxt.append(o)
        frontier = nxt
    return True


def linears_behind(g: Graph, tensors, sinks: frozenset, by_output: dict, wide: bool = True) -> tuple:
    """Linears whose outputs reach ``tensors`` through pointwise ops and views only, each
    closed (``_closed``, ``wide`` as there) towards ``sinks``."""
    seen, stack, found = set(), list(tensors), []
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if any(i not in sinks and not _passes_in_block(g, i, wide) for i in g.users(t)):
            continue  # no linear behind t is closed: what it derives reaches t's foreign use (keeps this walk local)
        if t in by_output:
            found.append(by_output[t])
            continue
        i = g.producer.get(t)
        if i is None or not _passes_in_block(g, i, wide):
            continue
        stack.extend(x for x in g.program.ops[i].inputs if isinstance(x, str))
    found = sorted(set(found), key=lambda lin: lin.op)
    return tuple(lin for lin in found if _closed(g, lin.output, sinks, wide))


def linears_ahead(g: Graph, start: str, by_activation: dict) -> tuple:
    """Linears consuming ``start`` through pointwise ops and views only, when everything
    derived from it on the way goes to them (else ``()``)."""
    seen, stack, found = set(), [start], []
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        for i in g.users(t):
            lin = by_activation.get((i, t))
            if lin is not None:
                found.append(lin)
            elif i in g.through or not g.op(i).outputs or _feature_statistic(g, i):  # (a runtime check: nothing)
                stack.extend(g.op(i).outputs)
            else:
                return ()
    return tuple(sorted(set(found), key=lambda lin: lin.op))


def _reach(g: Graph, start: str, forward: bool, want, limit: int = 64):
    """The first op (breadth first, through pointwise ops and views) for which ``want(i, t)``
    holds, with the tensor it was reached by; ``(None, None)`` when none."""
    frontier, seen = [start], {start}
    for _ in range(limit):
        nxt = []
        for t in frontier:
            ops = g.users(t) if forward else [g.producer[t]] if t in g.producer else []
            for i in ops:
                if want(i, t):
                    return i, t
                op = g.op(i)
                if i in g.through:
                    for x in (op.outputs if forward else [x for x in op.inputs if isinstance(x, str)]):
                        if x not in seen:
                            seen.add(x)
                            nxt.append(x)
        if not nxt:
            return None, None
        frontier = nxt
    return None, None


# ------------------------------------------------------------------------------------------
# attention cores
# ------------------------------------------------------------------------------------------


def query_heads(g: Graph, core) -> int | None:
    """The query heads of an attention core: dim -3 of its q (``[batch, heads, seq, head_dim]``),
    None when q is not 4-D (heads folded into the batch of a ``bmm``)."""
    shape = g.program.tensors[core.q].shape
    return shape[-3] if len(shape) == 4 else None


@dataclass(frozen=True)
class Core:
    """An attention core: its q, k, v operands, its result, and the ops it consists of at
    its boundary (``sinks``: the SDPA op, or the two batched matmuls)."""

    q: str
    k: str
    v: str
    output: str
    sinks: frozenset


def attention_cores(g: Graph, linear_ops: frozenset) -> tuple:
    """SDPA ops, and softmax(Q K^T) V written out, in program order."""
    cores = []
    for i, op in enumerate(g.program.ops):
        base = short(op)
        if "scaled_dot_product" in base and "backward" not in base and len(op.inputs) >= 3:
            q, k, v = op.inputs[:3]
            cores.append(Core(q, k, v, op.outputs[0], frozenset({i})))
        elif base in SOFTMAX:
            core = _written_out(g, i, linear_ops)
            if core is not None:
                cores.append(core)
    return tuple(cores)


def shared_cores(cores: tuple) -> tuple:
    """The cores grouped by the query they read, in program order: differential attention calls
    SDPA twice on one q and k (two halves of v), and its two results make one output, so the two
    are one attention block. ``shared_cores((c1, c2, c3))  -> ((c1, c2), (c3,))`` (c1, c2 one q)"""
    groups: dict = {}
    for c in cores:
        groups.setdefault(c.q, []).append(c)
    return tuple(tuple(cs) for cs in groups.values())


def _one_role(g: Graph, lin: Linear, cores: tuple) -> Linear:
    """``lin`` unfused when its equal pieces all feed one operand of the cores (q, k or v): a split
    of its own heads (DiffLlama's v chunked in two halves, one for each of its two SDPA calls), not
    a fused q|k|v whose pieces go to different operands."""
    if lin.parts <= 1:
        return lin
    role = {}
    for c in cores:
        for name, x in (("v", c.v), ("k", c.k), ("q", c.q)):
            role[x] = name
    found, seen, todo = set(), set(), [lin.output]
    while todo:
        x = todo.pop()
        if x in seen:
            continue
        seen.add(x)
        if x in role:
            found.add(role[x])
            continue
        for i in g.users(x):
            if i in g.through:
                todo.extend(g.op(i).outputs)
    return replace(lin, parts=1) if len(found) == 1 else lin


def head_runs(g: Graph, first: tuple, cores: tuple, stop: frozenset) -> int:
    """Into how many equal runs an attention block splits its heads and then combines run with run
    (1: none). Differential attention (DiffLlama) chunks the heads of its result in two and
    subtracts the second half from the first (head ``i`` pairs with head ``i + H/2``)::

        out [b, s, H, 2hd] -> chunk(2, dim=heads) -> out1 - lambda * out2 -> [b, s, H/2, 2hd]

    A plain cut of the heads on tp (``[tp*H/tp]``) puts head ``i`` and head ``i + H/2`` on
    different ranks; cut as ``[2*tp*H/2tp]`` each rank holds a run of both halves, its pairs whole.
    Read by following the heads dim (of each first Linear's ``(heads, head_dim)`` view, and of each
    core's result) through views, pointwise ops and joins along other dims to a split along it into
    equal pieces that a pointwise op then reads two of (a split whose pieces go their own ways, as
    a per-head norm's, combines nothing); the least common multiple of those counts, up to ``stop``
    (the block's cores and last Linears). ``head_runs(g, first, cores, stop) -> 2``"""
    from math import lcm

    t = g.program.tensors
    starts = [(c.output, len(t[c.output].shape) - 3) for c in cores if len(t[c.output].shape) == 4]
    for lin in first:
        view = _heads_view(g, lin)
        if view is not None:
            starts.append((view, len(t[view].shape) - 2))
    runs, seen, todo = 1, set(), list(starts)
    while todo:
        x, dim = todo.pop()
        if (x, dim) in seen:
            continue
        seen.add((x, dim))
        for i in g.users(x):
            if i in stop:
                continue
            got = _along(g, i, x, dim)
            if isinstance(got, int):
                runs = lcm(runs, got)
            else:
                todo.extend(got)
    return runs


def _heads_view(g: Graph, lin) -> str | None:
    """The view that splits ``lin``'s output features into ``(heads, head_dim)`` (within three
    pass-through ops, as ``heads_of`` finds it), or None."""
    found = _split_view(g, lin, grouped=False)
    return None if found is None else found[0]


def _split_view(g: Graph, lin, grouped: bool) -> tuple | None:
    """``(view output, heads, by groups)`` of the first view (within three pass-through ops of
    ``lin``'s output) that splits its features into ``(heads, head_dim)``, or, when ``grouped`` and
    ``lin`` is not fused, into ``(groups, r, head_dim)`` (``by groups``: torchtitan's ``wqkv``); None
    when there is none."""
    t = g.program.tensors
    features = t[lin.output].shape[-1]
    todo, seen = [(lin.output, 0)], set()
    while todo:
        x, depth = todo.pop()
        for i in g.users(x):
            if i in seen or depth >= 3:
                continue
            seen.add(i)
            op = g.op(i)
            out = t[op.outputs[0]].shape if op.outputs else ()
            src = t[x].shape
            if short(op) in VIEWS and len(out) == len(src) + 1 and src[-1] == features \
                    and out[-2] * out[-1] == features and out[:-2] == src[:-1]:
                return op.outputs[0], out[-2], False
            if grouped and lin.parts <= 1 and short(op) in VIEWS and len(out) == len(src) + 2 and \
                    src[-1] == features and out[-3] * out[-2] * out[-1] == features and out[:-3] == src[:-1] \
                    and out[-2] > 1:
                return op.outputs[0], out[-3], True  # (groups, r, head_dim): each group's q heads, k and v
            if g.passes(i):
                todo.extend((o, depth + 1) for o in op.outputs)
    return None


def _along(g: Graph, i: int, x: str, dim: int):
    """Op ``i`` reading ``x`` whose dim ``dim`` is the heads: the count of equal pieces when it
    splits that dim and a pointwise op reads two of them (``head_runs``), else where the heads
    dim goes on: ``[(output, its heads dim), ...]`` (``[]``: lost, or the op is no pass-through)."""
    op = g.op(i)
    base, kw, t = short(op), op.kwargs(), g.program.tensors
    n = len(t[x].shape)
    if op.inputs[0] == x and base in SPLITS:
        if _norm_dim(kw.get("dim", 0), n) != dim:
            return [(o, dim) for o in op.outputs]
        sizes = {t[o].shape[dim] for o in op.outputs}
        return len(op.outputs) if len(sizes) == 1 and len(op.outputs) > 1 and _combined(g, op.outputs) else []
    if base in ("cat", "stack") or base in ("slice", "narrow", "select"):
        cut = _norm_dim(kw.get("dim", 0), n)
        return [(op.outputs[0], dim)] if base in ("cat", "slice", "narrow") and cut != dim else []
    if base in VIEWS and op.inputs[0] == x and len(op.outputs) == 1:
        marks = tuple(0 if d == dim else None for d in range(n))
        new = track_dims(op, marks, t[x].shape, t[op.outputs[0]].shape)
        return [(op.outputs[0], new.index(0))] if new is not None and 0 in new else []
    if base in _pointwise() and len(op.outputs) == 1:
        out = len(t[op.outputs[0]].shape)
        return [(op.outputs[0], dim + out - n)] if out >= n else []
    return []


def _combined(g: Graph, pieces, depth: int = 4) -> bool:
    """Does a pointwise op read (through at most ``depth`` views and pointwise ops) two of ``pieces``?"""
    reach = []
    for p in pieces:
        ops, frontier = set(), [p]
        for _ in range(depth):
            nxt = []
            for x in frontier:
                for i in g.users(x):
                    base = short(g.op(i))
                    if base in _pointwise():
                        ops.add(i)
                    if base in _pointwise() or base in VIEWS:
                        nxt.extend(g.op(i).outputs)
            frontier = nxt
        reach.append(ops)
    return any(a & b for k, a in enumerate(reach) for b in reach[k + 1:])


def _written_out(g: Graph, s: int, linear_ops: frozenset):
    """The core around softmax op ``s``: a batched matmul of two activations before it, and one
    taking its result as the left operand after it."""
    def is_mm(i, t):
        return short(g.op(i)) in ("bmm", "matmul") and i not in linear_ops

    softmax = g.op(s)
    m1, _ = _reach(g, softmax.inputs[0], False, is_mm)
    m2, via = _reach(g, softmax.outputs[0], True, lambda i, t: is_mm(i, t) and g.op(i).inputs[0] == t)
    if m1 is None or m2 is None:
        return None
    a, b = g.op(m1).inputs[:2]
    return Core(a, b, g.op(m2).inputs[1], g.op(m2).outputs[0], frozenset({m1, m2}))


# ------------------------------------------------------------------------------------------
# blocks
# ------------------------------------------------------------------------------------------


def block_inputs(g: Graph, linears) -> tuple:
    """The activations the Linears read, followed back through order-keeping views: one tensor
    when the projections share their input (a norm's output)."""
    out = []
    for lin in linears:
        t = lin.activation
        while True:
            op = g.made_by(t)
            if op is None or not op.inputs or not isinstance(op.inputs[0], str):
                break
            if short(op) in PLAIN_VIEWS | {"route"}:
                t = op.inputs[0]  # (routed rows: the tokens they were routed from)
            elif (x := _quantized(g, t)) is not None:
                t = x  # BitNet's per-token absmax quantization of the input: a function of it alone
            else:
                break
        out.append(t)
    return tuple(dict.fromkeys(out))


def _quantized(g: Graph, t: str):
    """The tensor ``x`` when ``t`` quantizes it — made from ``x`` alone (constants aside) by element-wise
    ops and statistics over its last dim, a ``round`` among them (BitNet's 8-bit activations,
    ``round(x * s).clamp(-128, 127) / s`` with ``s = 127 / amax(|x|, -1)``); else None. Walked back
    latest op first until one tensor is left. A norm of ``x`` (no rounding) is no quantization: the
    block's input stays the norm's output."""
    frontier, rounds = {t}, False
    for _ in range(32):
        x = max(frontier, key=lambda y: g.producer.get(y, -1))
        i = g.producer.get(x)
        if i is None or not (short(g.op(i)) in _pointwise() or _feature_statistic(g, i)):
            return None
        rounds = rounds or short(g.op(i)) == "round"
        frontier = (frontier - {x}) | {y for y in g.op(i).inputs if isinstance(y, str)}
        if len(frontier) == 1:
            (x,) = frontier
            return x if rounds and not _is_param(g, x) else None
    return None


def block_output(g: Graph, lin: Linear, inputs: tuple = ()) -> str:
    """Where a block ends: the residual ``add`` its last Linear's output reaches through
    order-keeping views, or the end of those views. On the way, a ``mul`` (a gate: Qwen2-MoE's
    ``sigmoid(x W) * shared_expert(x)``, linear in the output) and an ``add`` of another result of
    the block's ``inputs`` (``combines``: the routed experts' sum) are inside the block, so its
    partial sums are added up before the one reduction at the residual add."""
    t = lin.output
    for _ in range(16):
        users = g.users(t)
        if len(users) != 1:
            return t
        op = g.op(users[0])
        base = short(op)
        if base in PLAIN_VIEWS and len(op.outputs) == 1:
            t = op.outputs[0]
        elif base == "add" and sum(isinstance(x, str) for x in op.inputs) == 2:
            if not combines(g, op, t, inputs):
                return op.outputs[0]
            t = op.outputs[0]
        elif base == "mul" and inputs and op.inputs.count(t) == 1 and len(op.outputs) == 1:
            t = op.outputs[0]
        elif base == "unroute" and op.inputs[0] == t and len(op.outputs) == 1:  # routed rows combined: linear
            t = op.outputs[0]
        else:
            return t
    return t


def combines(g: Graph, op, t: str, inputs: tuple) -> bool:
    """Is ``op`` (an add reading ``t``) a sum of two results of a block's ``inputs`` — its other
    operand computed from them too (the routed experts beside a shared expert), not the residual
    stream the block's output rejoins? Walked back in program order, never before the first op
    reading ``inputs``."""
    if not inputs:
        return False
    lo = min((i for x in inputs for i in g.users(x)), default=None)
    if lo is None:
        return False
    want = set(inputs)
    todo = [x for x in op.inputs if isinstance(x, str) and x != t]
    seen: set = set()
    while todo:
        x = todo.pop()
        if x in want:
            return True
        i = g.producer.get(x)
        if x in seen or i is None or i < lo:
            continue
        seen.add(x)
        todo.extend(y for y in g.op(i).inputs if isinstance(y, str))
    return False


def module_of(names) -> str:
    """The module path shared by parameter names. ``module_of(["a.b.q.weight", "a.b.o.weight"]) -> "a.b"``"""
    parts = [n.split(".")[:-1] for n in names]
    if not parts:
        return ""
    common = parts[0]
    for p in parts[1:]:
        k = 0
        while k < min(len(common), len(p)) and common[k] == p[k]:
            k += 1
        common = common[:k]
    return ".".join(common)


def find_blocks(program: Program) -> Structure:
    """Every block of ``program`` by structure (module docstring); memoised per Program.

    ``find_blocks(llama(layers=2)).summary() -> "2 attention, 2 mlp, 4 norm"``
    """
    got = program.__dict__.get("_structure")
    if got is None:
        got = _find_blocks(program)
        object.__setattr__(program, "_structure", got)
    return got


def _find_blocks(program: Program) -> Structure:
    g = graph(program)
    linears = find_linears(program)
    by_output = {lin.output: lin for lin in linears}
    by_activation = {(lin.op, lin.activation): lin for lin in linears}
    linear_ops = frozenset(lin.op for lin in linears)
    claimed: set = set()
    blocks = []
    stacked = _stacked_linears(g, [n for n, s in program.tensors.items() if s.kind == "param" and len(s.shape) == 3])
    # an attention's projections may be experts' (JetMoE's mixture of attention: q and o per expert, the
    # routed rows reaching the core through route / unroute(pairs=True), which only move rows)
    attn_by_output = {**by_output, **{lin.output: lin for lin in stacked}}
    attn_by_activation = {**by_activation, **{(lin.op, lin.activation): lin for lin in stacked}}
    for cores in shared_cores(attention_cores(g, linear_ops)):
        sinks = frozenset().union(*(c.sinks for c in cores))
        first = linears_behind(g, tuple(x for c in cores for x in (c.q, c.k, c.v)), sinks, attn_by_output)
        ahead = [linears_ahead(g, c.output, attn_by_activation) for c in cores]
        last = tuple(sorted(set().union(*ahead), key=lambda lin: lin.op)) if all(ahead) else ()
        first = tuple(lin for lin in first if lin not in claimed)
        last = tuple(lin for lin in last if lin not in claimed)
        if first and last:
            claimed.update(first + last)
            first = tuple(_one_role(g, lin, cores) for lin in first)
            blocks.append(replace(_block("attention", g, first, last), heads=_cut_heads(g, cores[0], first),
                                  runs=head_runs(g, first, cores, sinks | {lin.op for lin in last})))
    outputs = set(program.outputs)
    for wide in (False, True):  # then a norm of the ffn features before the down Linear (BitNet's ffn_sub_norm)
        for down in linears:
            if down in claimed or wide and _reaches_output(g, down.output, outputs):
                continue  # (a head's input norm, past the last residual add, is no MLP's)
            ups = linears_behind(g, (down.activation,), frozenset({down.op}), by_output, wide=wide)
            ups = tuple(lin for lin in ups if lin not in claimed and lin != down)
            if ups:
                claimed.update(ups + (down,))
                blocks.append(_block("mlp", g, ups, (down,)))
    blocks.extend(_others(program, g, linears, claimed))
    order = {id(b): _first_op(b, g) for b in blocks}
    return Structure(linears, tuple(sorted(blocks, key=lambda b: (order[id(b)], KINDS.index(b.kind)))))


def _cut_heads(g: Graph, core, first: tuple) -> int | None:
    """The heads a column cut of an attention's projections divides: its query heads, or, when a
    projection is an expert stack (JetMoE: each (token, choice) row gets one expert's heads, the
    core attends k choices x those heads), the heads of one row: its features over the head dim."""
    heads = query_heads(g, core)
    stacked = [lin for lin in first if len(g.program.tensors[lin.weight].shape) == 3]
    shape = g.program.tensors[core.q].shape
    if heads is None or not stacked or len(shape) != 4:
        return heads
    features = g.program.tensors[stacked[0].output].shape[-1] // max(stacked[0].parts, 1)
    return features // shape[-1] if features % shape[-1] == 0 else heads


def _first_op(b: Block, g: Graph) -> int:
    ops = [lin.op for lin in b.first + b.last]
    ops += [g.producer[b.output]] if b.output in g.producer else []
    return min(ops) if ops else 0


def _block(kind: str, g: Graph, first: tuple, last: tuple) -> Block:
    name = module_of([lin.weight for lin in first + last])
    inputs = block_inputs(g, first)
    return Block(kind, name, first, last, inputs, block_output(g, last[-1], inputs))


def _others(program: Program, g: Graph, linears: tuple, claimed: set) -> list:
    """Embeddings, norms, heads and expert stacks."""
    out = []
    tensors = program.tensors
    biases = {lin.bias for lin in linears if lin.bias}
    outputs = set(program.outputs)
    for op in program.ops:
        base = short(op)
        params = tuple(x for x in op.inputs if _is_param(g, x))
        if base == "embedding" and params and op.inputs[0] == params[0]:
            out.append(Block("embedding", module_of(params), inputs=(op.inputs[1],), output=op.outputs[0],
                             params=params[:1]))
        elif base in NORMS and params:
            out.append(Block("norm", module_of(params), inputs=(op.inputs[0],), output=op.outputs[0], params=params))
        elif base == "mul" and len(scales := _scales(g, op)) == 1 and len(tensors[scales[0][1]].shape) == 1 and \
                scales[0][1] not in biases:
            params = (scales[0][1],)
            act = [x for x in op.inputs if isinstance(x, str) and x != scales[0][0]]
            if act and tensors[act[0]].shape and tensors[act[0]].shape[-1] == tensors[params[0]].shape[0]:
                out.append(Block("norm", module_of(params), inputs=(_normalized(g, act[0]),), output=op.outputs[0],
                                 params=params))
    seen_heads = set()
    for lin in linears:
        if lin in claimed or lin.weight in seen_heads:
            continue
        if _reaches_output(g, lin.output, outputs):
            seen_heads.add(lin.weight)
            out.append(Block("head", module_of([lin.weight]), first=(lin,), inputs=block_inputs(g, (lin,)),
                             output=lin.output))
    experts = [n for n, s in tensors.items() if s.kind == "param" and len(s.shape) >= 3 and _feeds_batched(g, n)]
    if experts:
        biases = [b for w in experts for o in _batched_outputs(g, w) for b in _expert_biases(g, o)]
        params = tuple(dict.fromkeys(experts + biases))
        out.append(Block("experts", module_of(params), params=params))
    return out


def _scales(g: Graph, op) -> list:
    """``(operand, parameter)`` of each operand of ``op`` that is a parameter, or a parameter
    plus (or times) a constant: muse_glimmer's gain-centred norm scales by ``weight + 1.0``."""
    out = []
    for x in op.inputs:
        if _is_param(g, x):
            out.append((x, x))
            continue
        src = g.made_by(x) if isinstance(x, str) else None
        if src is not None and short(src) in ("add", "sub", "mul") and len(src.inputs) == 2:
            ps = [i for i in src.inputs if _is_param(g, i)]
            if len(ps) == 1 and not any(isinstance(i, str) for i in src.inputs if i != ps[0]):
                out.append((x, ps[0]))
    return out


_SAME = ("_to_copy", "to", "type_as", "alias")


def _expert_biases(g: Graph, out: str) -> list:
    """The per-expert biases added to routed rows ``out`` of an expert matmul: ``out + b[:, None]``
    with ``b`` a parameter ``[experts, features]`` (transformers' ``bias[sorted expert ids]``, as
    ``program.routing`` reads it), through a cast or an alias."""
    got = []
    for i in g.users(out):
        op = g.op(i)
        if short(op) != "add":
            continue
        for x in op.inputs:
            src = g.made_by(x) if isinstance(x, str) and x != out else None
            while src is not None and short(src) in _SAME and isinstance(src.inputs[0], str):
                src = g.made_by(src.inputs[0])  # the bias cast to the rows' dtype, or aliased (torchtitan's GPT-OSS)
            if src is not None and short(src) == "unsqueeze" and dict(src.params).get("dim") == 1 and \
                    _is_param(g, src.inputs[0]) and len(g.program.tensors[src.inputs[0]].shape) == 2:
                got.append(src.inputs[0])
    return got


def _reaches_output(g: Graph, t: str, outputs: set) -> bool:
    seen, stack = set(), [t]
    while stack:
        x = stack.pop()
        if x in outputs:
            return True
        if x in seen:
            continue
        seen.add(x)
        for i in g.users(x):
            if i in g.through:
                stack.extend(g.op(i).outputs)
    return False


def weight_consumers(program: Program) -> tuple:
    """Indices of the ops that read a parameter, through views (the matmul of a Linear, a
    convolution, an embedding lookup, a norm's scale), in program order."""
    g = graph(program)
    found: set = set()
    for name, spec in program.tensors.items():
        if spec.kind != "param":
            continue
        stack, seen = [name], set()
        while stack:
            t = stack.pop()
            if t in seen:
                continue
            seen.add(t)
            for i in g.users(t):
                if short(g.op(i)) in VIEWS:
                    stack.extend(g.op(i).outputs)
                else:
                    found.add(i)
    return tuple(sorted(found))


def derived(program: Program, names) -> frozenset:
    """Every tensor computed from ``names`` (them included). ``derived(p, ["x"])``"""
    out = set(names)
    for op in program.ops:
        if any(isinstance(i, str) and i in out for i in op.inputs):
            out.update(op.outputs)
    return frozenset(out)


def expert_linears(program: Program, block: Block) -> tuple:
    """``(first, last, outputs)`` of an ``experts`` block for tensor parallelism inside each
    expert: its grouped weights as Linears of their batched matmul (``_grouped_mm(rows, w, offs)``,
    ``bmm(rows, w)`` or routed rows' ``einsum("erd,edf->erf", rows, w)``: ``w``'s dims followed through
    permutes and views to the contracted and
    the output features; fused gate|up counted as parts), *last* when its rows come from another
    expert matmul's output, and the residual ``add`` each last one's output reaches through a
    single path of ops. ``expert_linears(prog, b)[0][0].out_dim -> 1``"""
    g = graph(program)
    lins = _stacked_linears(g, block.params)
    outputs = {lin.output for lin in lins}
    last = tuple(lin for lin in lins if _reaches_back(g, lin.activation, outputs - {lin.output}))
    first = tuple(lin for lin in lins if lin not in last)
    outs = (_residual_after(g, lin.output, _sources(program, lin, first)) for lin in last)
    return first, last, tuple(dict.fromkeys(o for o in outs if o is not None))


def _stacked_linears(g: Graph, params) -> list:
    """The Linears of stacked expert weights ``params`` (``expert_linears``), in op order."""
    lins = []
    for param in params:
        for i, pos, dims in _weight_uses(g, param, ("_grouped_mm", "bmm", "einsum")):
            if short(g.op(i)) == "einsum" and dict(g.op(i).params).get("equation") != "erd,edf->erf":
                continue
            if pos == 1 and len(dims) == 3 and None not in dims[1:] and dims[1] != dims[2]:
                op = g.op(i)
                out = op.outputs[0]
                bias = next(iter(_expert_biases(g, out)), None)
                lins.append(Linear(param, bias, i, out, op.inputs[0], dims[1], dims[2], *_fused_parts(g, out)))
    return sorted(lins, key=lambda lin: lin.op)


def routed_source(program: Program, lin: Linear) -> str | None:
    """The tokens an expert matmul's rows are gathered from (``x`` of the ``index`` that routes
    them, through views), or None: what Megatron-SP gathers once for the router and the experts."""
    g = graph(program)
    t = lin.activation
    for _ in range(8):
        i = g.producer.get(t)
        if i is None:
            return None
        op = g.op(i)
        base = short(op)
        if base in ("index", "index_select", "route") and isinstance(op.inputs[0], str):
            return op.inputs[0]
        if base not in VIEWS or not isinstance(op.inputs[0], str):
            return None
        t = op.inputs[0]
    return None


def view_root(program: Program, t: str, depth: int = 8) -> str:
    """The tensor ``t`` is a view of, through view ops (``t`` itself when it is made otherwise):
    the routed tokens ``x.view(-1, dim)`` an expert reads are the ``x`` its router reads too.
    ``view_root(prog, "layers.0.moe.view") -> "layers.0.ffn_norm.mul_1"``"""
    g = graph(program)
    for _ in range(depth):
        i = g.producer.get(t)
        if i is None or short(g.op(i)) not in VIEWS or not isinstance(g.op(i).inputs[0], str):
            return t
        t = g.op(i).inputs[0]
    return t


def _sources(program: Program, last: Linear, first: tuple) -> tuple:
    """The routed tokens (``routed_source``) of the first expert matmuls whose outputs ``last``'s
    rows are made from (its own layer's, when one experts block holds every layer's stacks)."""
    g = graph(program)
    own = (routed_source(program, f) for f in first if _reaches_back(g, last.activation, {f.output}))
    return tuple(dict.fromkeys(x for x in own if x is not None))


def _reaches_back(g: Graph, t: str, targets: set, depth: int = 8) -> bool:
    """Is ``t`` made from one of ``targets`` through at most ``depth`` pass-through ops?"""
    todo = [(t, 0)]
    while todo:
        name, d = todo.pop()
        if name in targets:
            return True
        i = g.producer.get(name)
        if i is None or d >= depth or not g.passes(i):
            continue
        todo.extend((x, d + 1) for x in g.op(i).inputs if isinstance(x, str))
    return False


def _residual_after(g: Graph, t: str, sources: tuple = (), depth: int = 16) -> str | None:
    """The residual ``add`` (two tensor operands) ``t`` reaches along a single path of ops; an add
    of another result of the routed ``sources`` (a shared expert's output: ``combines``) is passed,
    and an expert's bias added to its rows is not one."""
    for _ in range(depth):
        users = [i for i in g.users(t) if g.op(i).outputs]
        if len(users) != 1:
            return None
        op = g.op(users[0])
        if short(op) == "add" and sum(isinstance(x, str) for x in op.inputs) == 2 and \
                not combines(g, op, t, sources) and not _expert_biases(g, t):
            return op.outputs[0]
        t = op.outputs[0]
    return None


def _feeds_batched(g: Graph, param: str) -> bool:
    """Does ``param`` reach a batched matmul (bmm, einsum, _grouped_mm) through views?"""
    return bool(_batched_outputs(g, param))


def _batched_outputs(g: Graph, param: str) -> list:
    """The outputs of the batched matmuls (bmm, einsum, _grouped_mm) ``param`` reaches through
    views and casts (torchtitan casts its expert weights to bfloat16 first)."""
    seen, stack, out = set(), [param], []
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        for i in g.users(t):
            base = short(g.op(i))
            if base in BATCHED:
                out.extend(o for o in g.op(i).outputs if o not in out)
            elif base in VIEWS:
                stack.extend(g.op(i).outputs)
    return out


__all__ = ["Block", "Core", "Graph", "Linear", "Structure", "attention_cores", "feature_scales", "feature_statistics",
           "find_blocks", "find_linears", "derived", "graph", "head_runs", "input_scales", "input_statistics",
           "module_of", "query_heads", "shared_cores", "track_dims", "weight_consumers"]
