"""Token-choice routing written with aten ops, recognised as ragged ops (``route``, ``unroute``).

torch.export gives a torchtitan- or Megatron-style MoE layer as aten ops whose shapes are all
static — ``topk`` of the router scores, ``histc``/``bincount`` of the chosen experts,
``argsort`` of them, ``index``/``gather`` of the tokens by the sorted order, ``cumsum`` offsets
into ``torch._grouped_mm``, and ``scatter_add``/``index_add`` back to the tokens — while what
is data-dependent, how many rows each expert gets, hides in the values of the offsets. Planned
op by op, the offsets read as a partial sum across ranks and every sorted tensor as a global
permutation, so the tokens are all-gathered. Here the pattern becomes what it means:

    index(x, argsort(idx.view(-1)) // k)     -> route(x, idx)             (experts x ragged rows)
    index(s.view(-1), argsort(idx.view(-1)))  -> route(s, idx, pairs=True)  (the per-choice scores)
    index(b, sort(idx.view(-1)).values)      -> unsqueeze(b, 1)   (b [E, ...]: each row's expert's bias, dense
                                                                   (E, 1, ...), broadcast over the expert's rows)
    _grouped_mm(a, w, offs)                  -> einsum("erd,edf->erf", a, w)  (offs: a's own extents)
    scatter_add(zeros, 0, order // k, y)     -> unroute(y, idx)   (index_add, index_put(accumulate) alike)
    index(y, inv).view(T, k, D).sum(1)       -> unroute(y, idx)   (inv[order] = arange: the rows put back in
                                                                   (token, choice) order, then each token's
                                                                   k rows summed: transformers' MoE)
    index_add(zeros(T*k, D), 0, order, y)    -> unroute(y, idx, pairs=True).view(T*k, D)  (put back, not summed:
                                                                   JetMoE's mixture of attention)
    index(x.view(-1, D), order)              -> route(x.view(T, k, D), idx, pairs=True)   (x viewed (..., k, D):
                                                                   one row per (token, choice))

Token ids may be ``order // k`` with floor or trunc rounding (the positions are >= 0), and the counts
a one-hot ``zeros(T, E).scatter(1, idx, 1)`` summed over the tokens, through casts (JetMoE).
The index ``idx`` (T, k) is a ``topk``'s, or k choices over the (T, E) scores concatenated on the
last dim (``max``/``argmax`` with keepdim, or top-ks: PhiMoE's "sparsemixer" router). Every op
between the route and the unroute runs on the nested rows (``program.ragged``); the counting, sorting
and offsets ops that fed only the pattern are dropped. A program without the pattern is
returned as it is.

    >>> from shardlayout.program import ProgramBuilder
    >>> b = ProgramBuilder()
    >>> x = b.input("x", (8, 4)); p = b.input("p", (8, 3))
    >>> v, i = b.op("topk", [p], name="topk", n_out=2, dtypes=("float32", "int64"), k=2, dim=1)
    >>> o = b.op("sort", [b.op("view", [i], size=(-1,))], name="sort", n_out=2, dtypes=("int64", "int64"), stable=True)
    >>> tok = b.op("div", [o[1], 2], rounding_mode="floor")
    >>> ys = b.op("silu", [b.op("index", [x, tok], name="xs")])
    >>> b.output(b.op("index_add", [b.op("zeros_like", [x]), tok, ys], name="out", dim=0))
    >>> [op.target for op in recognise_routing(b.build()).ops]
    ['topk', 'route', 'silu', 'unroute']
"""

from __future__ import annotations

from ..errors import ShardingError
from ..ops.ragged import SPLITS
from ..ops.result import canonical_op_name
from . import Program, ProgramBuilder, ProgramError

_FLATTEN = ("view", "reshape", "_unsafe_view", "flatten")


def _flat_of(prog: Program, op, name: str) -> str | None:
    """The (T, k) tensor ``name`` flattens to (T*k,), or None."""
    if canonical_op_name(op.target) not in _FLATTEN or len(op.inputs) != 1:
        return None
    src = op.inputs[0]
    s, out = prog.tensors[src].shape, prog.tensors[name].shape
    return src if len(s) == 2 and out == (s[0] * s[1],) else None


def _scan(prog: Program) -> dict:
    """The routing handles: topk index tensors, their flattened views, sort orders, token ids."""
    topk, flat, order, token, spread, ids, inverse, merged = {}, {}, {}, {}, {}, {}, {}, {}
    choices = {}  # a (T, j) index of one or more choices among E experts -> (T, E)
    batched = {}  # a top-k index of (..., k) over scores (..., E) -> its (T, k) view (torchtitan's 3-D router)
    for op in prog.ops:
        n = canonical_op_name(op.target)
        ins, outs = op.inputs, op.outputs
        kw = dict(op.params)
        choice = _choice(prog, op, n)
        if choice is not None:
            choices[outs[-1]] = choice
        if n == "topk" and len(outs) == 2:
            src = prog.tensors[ins[0]].shape
            dim = kw.get("dim", -1) % len(src)
            if len(src) == 2 and dim == 1:
                t, k = prog.tensors[outs[1]].shape
                topk[outs[1]] = {"vals": outs[0], "tokens": t, "k": k, "experts": src[1]}
            elif len(src) > 2 and dim == len(src) - 1:
                batched[outs[1]] = None
        elif n == "cat" and len(ins) >= 2 and all(i in choices for i in ins) and \
                len({choices[i] for i in ins}) == 1 and len(prog.tensors[outs[0]].shape) == 2 and \
                kw.get("dim", 0) in (1, -1):
            t, k = prog.tensors[outs[0]].shape  # choices side by side: the (T, k) index of a top-k (sparsemixer)
            topk[outs[0]] = {"vals": None, "tokens": t, "k": k, "experts": choices[ins[0]][1]}
        elif n in _FLATTEN and len(ins) == 1 and ins[0] in batched and batched[ins[0]] is None and \
                len(prog.tensors[outs[0]].shape) == 2 and \
                prog.tensors[outs[0]].shape[1] == prog.tensors[ins[0]].shape[-1]:
            batched[ins[0]] = outs[0]  # (..., k) viewed (T, k): the routing's index from here on
            src = next(prog.tensors[o.inputs[0]].shape for o in prog.ops if ins[0] in o.outputs)
            t, k = prog.tensors[outs[0]].shape
            topk[outs[0]] = {"vals": None, "tokens": t, "k": k, "experts": src[-1]}
        elif outs and _flat_of(prog, op, outs[0]) is not None:
            flat[outs[0]] = _flat_of(prog, op, outs[0])
        elif n in ("sort", "argsort") and ins and flat.get(ins[0]) in topk and not kw.get("descending"):
            order[outs[-1]] = flat[ins[0]]  # sort's indices, or argsort's only output
            if len(outs) == 2:
                ids[outs[0]] = flat[ins[0]]  # sort's values: the expert ids in sorted order (counted alike)
        elif n == "index_put" and len(ins) == 3 and ins[1] in order and not kw.get("accumulate") and \
                _is_arange(prog, ins[2], prog.tensors[ins[1]].shape[0]):
            inverse[outs[0]] = order[ins[1]]  # inv[order] = arange: the inverse permutation
        elif n in ("div", "floor_divide") and len(ins) == 2 and ins[0] in order and \
                (n == "floor_divide" or kw.get("rounding_mode") in ("floor", "trunc")) and \
                ins[1] == topk[order[ins[0]]]["k"]:  # positions are >= 0: trunc is floor (JetMoE)
            token[outs[0]] = order[ins[0]]
        elif ins and ins[0] in token and (n == "unsqueeze" and kw.get("dim") in (1, -1) or n in _FLATTEN and
                                          prog.tensors[outs[0]].shape == prog.tensors[ins[0]].shape + (1,)):
            spread[outs[0]] = token[ins[0]]  # token ids as a column: unsqueeze(-1), or reshape(-1, 1) as torchtitan
        elif n == "expand" and ins and ins[0] in spread:
            spread[outs[0]] = spread[ins[0]]
        if n in _FLATTEN and len(ins) == 1 and len(outs) == 1 and len(prog.tensors[outs[0]].shape) >= 2:
            merged[outs[0]] = ins[0]  # (..., k, *D) viewed (T*k, *D): rows in (token, choice) order if k fits
    h = {"topk": topk, "flat": flat, "order": order, "token": token, "spread": spread, "ids": ids,
         "inverse": inverse, "batched": batched, "merged": merged}
    producer = {o: op for op in prog.ops for o in op.outputs}
    for op in prog.ops:  # repeat_interleave(counts): each sorted row's expert id, as sort's values
        if canonical_op_name(op.target) == "repeat_interleave" and len(op.inputs) == 1 and len(op.outputs) == 1:
            counts = _padded(prog, op.inputs[0], producer)
            rows = prog.tensors[op.outputs[0]].shape
            for idx, t in topk.items():
                if rows == (t["tokens"] * t["k"],) and prog.tensors[counts].shape == (t["experts"],) and \
                        _counts_of_routing(prog, counts, h, producer, idx):
                    ids[op.outputs[0]] = idx
    return h


def _tail(prog: Program, name: str, producer: dict) -> str | None:
    """The trailing row ``_padded`` drops from ``name``, or None."""
    op = producer.get(name)
    return op.inputs[1] if _padded(prog, name, producer) != name and op is not None and \
        canonical_op_name(op.target) == "cat" else None


def _padded(prog: Program, name: str, producer: dict) -> str:
    """``a`` when ``name`` is ``cat([a, tail])`` on dim 0 with one trailing row (a slack entry, as
    torchtitan's GPT-OSS pads the counts, or a zero row under a table), through casts; else ``name``."""
    op = producer.get(name)
    while op is not None and canonical_op_name(op.target) in _CASTS and len(op.inputs) == 1:
        name, op = op.inputs[0], producer.get(op.inputs[0])
    if op is None or canonical_op_name(op.target) != "cat" or len(op.inputs) != 2 or \
            dict(op.params).get("dim", 0) != 0 or not all(isinstance(i, str) for i in op.inputs):
        return name
    return op.inputs[0] if prog.tensors[op.inputs[1]].shape[:1] == (1,) else name


def _choice(prog: Program, op, n: str) -> tuple | None:
    """``(T, E)`` when ``op`` chooses experts for each of T tokens among E — the indices of
    ``max(scores, dim=-1, keepdim=True)``, ``argmax(scores, dim=-1, keepdim=True)`` or a top-k over
    the last dim of 2-D scores (T, E) — else None. Such choices concatenated along their last dim
    are a top-k index: PhiMoE's sparsemixer takes an arg-max, masks the chosen expert's score to
    -inf and takes another (which one each arg-max picks is the router's business; the routing only
    reads the index)."""
    if not op.inputs or not isinstance(op.inputs[0], str) or n not in ("max", "argmax", "topk"):
        return None
    src, kw = prog.tensors[op.inputs[0]].shape, dict(op.params)
    dim = kw.get("dim", -1)
    if len(src) != 2 or not isinstance(dim, int) or dim % 2 != 1:  # argmax(dim=None): of the whole tensor
        return None
    if n == "topk":
        return (src[0], src[1]) if len(op.outputs) == 2 else None
    keep = len(op.outputs) == (2 if n == "max" else 1) and kw.get("keepdim")
    return (src[0], src[1]) if keep and prog.tensors[op.outputs[-1]].shape == (src[0], 1) else None


def _is_arange(prog: Program, name: str, n: int) -> bool:
    """Is ``name`` made by ``arange(0, n)`` (step 1)?"""
    op = next((op for op in prog.ops if name in op.outputs), None)
    if op is None or canonical_op_name(op.target) != "arange":
        return False
    kw = dict(op.params)
    return kw.get("start", 0) == 0 and kw.get("end") == n and kw.get("step", 1) == 1


def _is_zeros(prog: Program, name: str, producer: dict) -> bool:
    op = producer.get(name)
    if op is None:
        return False
    n, kw = canonical_op_name(op.target), dict(op.params)
    return (n in ("zeros_like", "zeros", "new_zeros") or (n in ("full_like", "full", "new_full", "fill")
                                                           and kw.get("fill_value", kw.get("value")) == 0))


def recognise_routing(prog: Program) -> Program:
    """``prog`` with token-choice routing written in aten ops rewritten to ragged ops (module
    docstring); ``prog`` itself when it has none, or only part of it (all or nothing: a program
    whose rewrite would leave routed rows meeting an op that is not defined on them, or reaching an
    output, is returned as it was — planned op by op, exactly, with gathers)."""
    h = _scan(prog)
    if not h["order"] or prog.is_symbolic:
        return prog
    try:
        out = _replay(prog, h)
    except ShardingError:  # part of the pattern only (an op the rewrite left meets ragged rows): as it was
        return prog
    if any(out.tensors[o].ragged is not None for o in out.outputs):
        return prog  # rows never combined back into the tokens: not the pattern
    return out


def _replay(prog: Program, h: dict) -> Program:
    """The program rebuilt with the routing ops rewritten (may raise: ``recognise_routing``)."""
    producer = {o: op for op in prog.ops for o in op.outputs}
    b = ProgramBuilder()
    for name in prog.inputs():
        t = prog.tensors[name]
        b._add(t)
    ragged: dict = {}  # a routed tensor -> the top-k index its rows were routed by
    unsorted: dict = {}  # rows put back in (token, choice) order, not yet summed -> (rows, top-k index)
    per_expert: set = set()  # each routed row's expert's row of a table, held (E, 1, ...) per expert
    for op in prog.ops:
        n = canonical_op_name(op.target)
        ins, kw = op.inputs, op.kwargs()
        dtypes = [prog.tensors[o].dtype for o in op.outputs]
        if _unsort(prog, op, n, ins, kw, h, ragged, unsorted, b, dtypes) or \
                _pairs(prog, op, n, ins, kw, h, ragged, b, dtypes, producer):
            continue
        if n in _FLATTEN and ins and ins[0] in per_expert and \
                prog.tensors[op.outputs[0]].shape == prog.tensors[ins[0]].shape:
            b.op("alias", [ins[0]], name=op.name, dtypes=dtypes)  # a view to the rows' own shape: the same rows
            per_expert.add(op.outputs[0])
            continue
        routed = _rewrite(prog, op, n, ins, kw, h, ragged, producer)
        if routed is not None and routed[0] == "unsqueeze" and n in ("index", "index_select"):
            per_expert.update(op.outputs)
        if routed is not None:
            target, inputs, params, extra = routed
            if extra:  # x + unroute(...): the combine first, then the add under the op's own name
                tmp = b.op(target, inputs, name=f"{op.name}_combine", dtypes=dtypes, **params)
                b.op("add", [extra, tmp], name=op.name, dtypes=dtypes)
            else:
                b.op(target, inputs, name=op.name, dtypes=dtypes, **params)
            if target == "route":
                ragged.update((o, inputs[1]) for o in op.outputs)
            elif target != "unroute" and ins[0] in ragged:
                ragged.update((o, ragged[ins[0]]) for o in op.outputs)
            continue
        mine = [ragged[i] for i in ins if isinstance(i, str) and i in ragged]
        if mine:
            if n in ("unsqueeze", "squeeze") + tuple(SPLITS) and isinstance(kw.get("dim"), int) and kw["dim"] >= 0:
                kw = {**kw, "dim": kw["dim"] + 1}  # a flat dim d >= 1 is nested dim d + 1
            ragged.update((o, mine[0]) for o in op.outputs)
            column = _as_column(prog, op, n)
            if column is not None:  # rows.reshape(-1, 1) (torchtitan's scores): the same trailing dim, nested
                b._op(column, list(ins), op.name, 1, dtypes, {"dim": -1})
                continue
        b._op(op.target, list(ins), op.name, len(op.outputs), dtypes if op.outputs else None, kw)
    for o in prog.outputs:
        b.output(o)
    return _live(b.build())


def _unsort(prog, op, n, ins, kw, h, ragged, unsorted, b, dtypes) -> bool:
    """transformers' combine: ``index(y, inv)`` (rows back in (token, choice) order), ``view(T, k, ...)``,
    ``sum(1)`` is ``unroute(y, idx)``; the first two make nothing (True: handled), the sum makes the
    unroute. Any other use of the unsorted rows raises (the rewrite is undone)."""
    if n in ("index", "index_select") and len(ins) == 2 and ins[0] in ragged and ins[1] in h["inverse"] and \
            kw.get("dim", 0) == 0 and h["inverse"][ins[1]] == ragged[ins[0]]:
        unsorted[op.outputs[0]] = (ins[0], ragged[ins[0]], False)
        return True
    held = [i for i in ins if isinstance(i, str) and i in unsorted]
    if not held:
        return False
    rows, idx, pairs = unsorted[held[0]]
    t = h["topk"][idx]
    shape = prog.tensors[held[0]].shape
    if n in _FLATTEN and len(ins) == 1 and not pairs and \
            prog.tensors[op.outputs[0]].shape == (t["tokens"], t["k"]) + shape[1:]:
        unsorted[op.outputs[0]] = (rows, idx, True)
        return True
    if n == "sum" and len(ins) == 1 and pairs and tuple(kw.get("dim") or ()) in ((1,), (-len(shape) + 1,)) and \
            not kw.get("keepdim"):
        b.op("unroute", [rows, idx], name=op.name, dtypes=dtypes)
        return True
    raise ShardingError(f"op {op.name} reads routed rows put back in token order ({held[0]}) other than by "
                        "viewing them (tokens, k, ...) and summing the k choices")


def _pairs(prog, op, n, ins, kw, h, ragged, b, dtypes, producer) -> bool:
    """Rows kept one per (token, choice), not summed (JetMoE's mixture of attention: each token's
    k query projections come back side by side, and its k attention outputs go out again):
    ``index_put(zeros(T*k, *D), order, y, accumulate)`` (``index_add`` / ``index_copy`` on dim 0
    alike) puts the routed rows back at their pairs' positions, ``unroute(y, idx, pairs=True)``
    (``(T, k, *D)``) viewed ``(T*k, *D)``; ``index(x, order)`` with ``x`` a ``(T*k, *D)`` view of
    ``(..., k, *D)`` (one row per pair, the choices inner) routes those rows: ``x`` viewed ``(T, k,
    *D)`` and ``route(..., pairs=True)``. True when ``op`` was one of these (its ops are emitted)."""
    order, topk = h["order"], h["topk"]
    if n in ("index_put", "index_add", "index_copy") and len(ins) == 3 and ins[1] in order and \
            ins[2] in ragged and order[ins[1]] == ragged[ins[2]] and \
            (kw.get("dim") == 0 if n != "index_put" else True) and kw.get("alpha", 1) == 1 and \
            _is_zeros(prog, ins[0], producer):
        idx = ragged[ins[2]]
        t = topk[idx]
        base, rows = prog.tensors[ins[0]].shape, prog.tensors[ins[2]].shape
        if base != (t["tokens"] * t["k"],) + rows[1:]:
            return False
        pairs = b.op("unroute", [ins[2], idx], name=f"{op.name}_pairs", dtypes=dtypes, pairs=True)
        b.op("view", [pairs], name=op.name, dtypes=dtypes, size=tuple(base))
        return True
    if n in ("index", "index_select") and len(ins) == 2 and kw.get("dim", 0) == 0 and ins[1] in order and \
            ins[0] in h["merged"] and ins[0] not in h["flat"]:
        idx = order[ins[1]]
        t = topk[idx]
        x, src = prog.tensors[ins[0]].shape, prog.tensors[h["merged"][ins[0]]].shape
        j = len(src) - len(x)  # the choice dim of src, just before x's trailing dims
        if j < 1 or src[j] != t["k"] or tuple(src[j + 1:]) != tuple(x[1:]) or x[0] != t["tokens"] * t["k"]:
            return False
        view = b.op("view", [ins[0]], name=f"{op.name}_pairs", dtypes=dtypes, size=(t["tokens"], t["k"]) + x[1:])
        b.op("route", [view, idx], name=op.name, dtypes=dtypes, experts=t["experts"], pairs=True)
        ragged[op.outputs[0]] = idx
        return True
    return False


def _as_column(prog, op, n: str):
    """``"unsqueeze"`` / ``"squeeze"`` when a view of routed rows only adds / drops a trailing
    size-1 dim (``reshape(-1, 1)``), which on nested rows is that same dim; else None."""
    if n not in _FLATTEN or len(op.inputs) != 1 or len(op.outputs) != 1:
        return None
    a, out = prog.tensors[op.inputs[0]].shape, prog.tensors[op.outputs[0]].shape
    if out == a + (1,):
        return "unsqueeze"
    if a == out + (1,) and len(out) >= 1:
        return "squeeze"
    return None


def _rewrite(prog, op, n, ins, kw, h, ragged, producer):
    """``(target, inputs, params, tensor to add or None)`` of the ragged op replacing ``op``, or None."""
    token, order, spread, flat, topk = h["token"], h["order"], h["spread"], h["flat"], h["topk"]
    if n in ("index", "index_select") and len(ins) == 2 and kw.get("dim", 0) == 0:
        x, i = ins
        if i in token:
            t = topk[token[i]]
            if prog.tensors[x].shape[0] != t["tokens"]:
                return None
            return "route", [x, token[i]], {"experts": t["experts"]}, None
        if i in order and x in flat:
            t = topk[order[i]]
            return "route", [flat[x], order[i]], {"experts": t["experts"], "pairs": True}, None
        if i in h["ids"] and prog.tensors[x].shape[0] != topk[h["ids"][i]]["experts"] and \
                _is_zeros(prog, _tail(prog, x, producer), producer):
            x = _padded(prog, x, producer)  # cat([b, zeros(1, ...)])[ids]: the zero row is no expert's
        if i in h["ids"] and prog.tensors[x].shape[0] == topk[h["ids"][i]]["experts"] and \
                len(prog.tensors[x].shape) >= 2:  # x[sorted expert ids]: each routed row's expert's row of x
            return "unsqueeze", [x], {"dim": 1}, None  # (E, 1, ...): dense, broadcast over each expert's rows
    if n == "gather" and len(ins) == 2 and kw.get("dim") == 0 and ins[1] in spread:
        t = topk[spread[ins[1]]]
        if prog.tensors[ins[0]].shape[0] == t["tokens"]:
            return "route", [ins[0], spread[ins[1]]], {"experts": t["experts"]}, None
    if n == "_grouped_mm" and ins and ins[0] in ragged:
        if len(ins) < 3 or not _offsets_of_routing(prog, ins[2], h, producer, ragged[ins[0]]):
            return None  # offsets that are not this routing's counts: left as it is (and the rewrite undone)
        w = prog.tensors[ins[1]]
        if len(w.shape) != 3 or len(prog.tensors[ins[0]].shape) != 2:
            raise ProgramError(f"op {op.name} (_grouped_mm): routed rows {prog.tensors[ins[0]].shape} times weights "
                               f"{w.shape}: only 2-D rows times stacked (experts, in, out) weights are supported")
        return "einsum", [ins[0], ins[1]], {"equation": "erd,edf->erf"}, None
    if n in ("scatter_add", "index_add", "index_put") and len(ins) == 3 and ins[2] in ragged and \
            (kw.get("dim") == 0 if n != "index_put" else bool(kw.get("accumulate"))):
        idx = spread.get(ins[1]) if n == "scatter_add" else token.get(ins[1])
        base, rows = prog.tensors[ins[0]].shape, prog.tensors[ins[2]].shape
        if idx is None or idx != ragged[ins[2]] or base != (topk[idx]["tokens"],) + rows[1:] or \
                (n == "scatter_add" and prog.tensors[ins[1]].shape != rows):
            return None  # not every row summed whole into its token: left as it is (and the rewrite undone)
        return "unroute", [ins[2], idx], {}, (None if _is_zeros(prog, ins[0], producer) else ins[0])
    return None


_CASTS = ("_to_copy", "to", "type_as", "clone", "detach", "view", "reshape", "_unsafe_view")


def _offsets_of_routing(prog: Program, name: str, h: dict, producer: dict, routed_by: str) -> bool:
    """Is ``name`` the cumulative sum of the rows per expert of the routing by top-k index
    ``routed_by`` — ``cumsum`` (through casts) of ``histc(ids, bins=E, min=0, max=E)`` or
    ``bincount(ids, minlength=E)`` of that index flattened (through casts)? Anything else (flipped,
    padded, capacity-rounded offsets, another top-k's counts) is not what ``route`` makes."""
    _, op = _through_casts(prog, producer, name)
    if op is None or canonical_op_name(op.target) != "cumsum" or dict(op.params).get("dim", 0) not in (0, -1):
        return False
    return _counts_of_routing(prog, op.inputs[0], h, producer, routed_by)


def _through_casts(prog: Program, producer: dict, t: str) -> tuple:
    """``(source, its producer)``: ``t`` followed back through casts of the same shape."""
    op = producer.get(t)
    while op is not None and canonical_op_name(op.target) in _CASTS and len(op.inputs) == 1 and \
            prog.tensors[op.inputs[0]].shape == prog.tensors[t].shape:
        t = op.inputs[0]
        op = producer.get(t)
    return t, op


def _counts_of_routing(prog: Program, name: str, h: dict, producer: dict, routed_by: str) -> bool:
    """Is ``name`` (through casts) the rows per expert of the routing by top-k index ``routed_by``:
    ``histc`` / ``bincount`` of the index flattened, or a one-hot summed (``_offsets_of_routing``)?"""
    _, op = _through_casts(prog, producer, name)
    if op is None:
        return False
    n, kw = canonical_op_name(op.target), dict(op.params)
    if n == "sum":  # counts as a one-hot: zeros(..., E).scatter(-1, index, 1) summed over every other dim
        return _one_hot_counts(prog, op, h, producer, routed_by)
    ids, _ = _through_casts(prog, producer, op.inputs[0])
    idx = h["flat"].get(ids, h["ids"].get(ids))  # the ids, or the ids sorted: the same counts
    if idx not in h["topk"] or idx != routed_by:
        return False
    e = h["topk"][idx]["experts"]
    if n == "histc":  # bins of width E/E or (E-1)/E over [0, E] or [0, E-1]: integer ids e land in bin e
        return kw.get("bins") == e and kw.get("min", 0) == 0 and (kw.get("max", 0) == e or
                                                                   (e >= 2 and kw.get("max", 0) == e - 1))
    return n == "bincount" and kw.get("minlength") == e and len(op.inputs) == 1


def _one_hot_counts(prog: Program, op, h: dict, producer: dict, routed_by: str) -> bool:
    """Is ``op`` (a ``sum``) the rows per expert of the routing by ``routed_by``: ``sum`` over every
    dim but the last of ``zeros(..., E).scatter(-1, idx, 1)`` (through casts: JetMoE counts a float
    one-hot cast to int64) with ``idx`` the top-k index ``routed_by`` or the one it is a (T, k) view
    of (torchtitan's Qwen3-MoE counts the choices so)?"""
    _, src = _through_casts(prog, producer, op.inputs[0])
    if src is None or canonical_op_name(src.target) != "scatter" or len(src.inputs) != 2:
        return False
    base, idx = src.inputs
    shape = prog.tensors[base].shape
    kw, skw = dict(op.params), dict(src.params)
    dims = sorted(d % len(shape) for d in (kw.get("dim") or ()))
    return (h["batched"].get(idx, idx) == routed_by and skw.get("dim", 0) % len(shape) == len(shape) - 1 and
            skw.get("value") == 1 and _is_zeros(prog, base, producer) and dims == list(range(len(shape) - 1))
            and not kw.get("keepdim"))


def _live(prog: Program) -> Program:
    """``prog`` without the ops nothing uses (a runtime assert lives while what it checks does)."""
    live = set(prog.outputs)
    keep = []
    for op in reversed(prog.ops):
        if op.outputs and not any(o in live for o in op.outputs):
            continue
        if not op.outputs and not all(i in live for i in op.inputs if isinstance(i, str)):
            continue
        keep.append(op)
        live.update(i for i in op.inputs if isinstance(i, str))
    keep.reverse()
    if len(keep) == len(prog.ops):
        return prog
    used = {i for op in keep for i in op.inputs if isinstance(i, str)} | {o for op in keep for o in op.outputs}
    tensors = {n: t for n, t in prog.tensors.items() if n in used or n in prog.outputs or t.kind != "value"}
    return Program(tensors, tuple(keep), prog.outputs, prog.symbols, prog.sym_shapes, prog.facts, prog.notes)


__all__ = ["recognise_routing"]
