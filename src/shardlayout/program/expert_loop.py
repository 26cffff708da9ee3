"""Per-expert loops read as one grouped expert computation.

torchtitan's for-loop experts (``use_grouped_mm=False``), and most hand-written MoE layers, run
each expert on its own slice of the sorted rows::

    sizes = counts.tolist()                       # data-dependent: torch.export's u0 .. u{E-1}
    for e, xe in enumerate(torch.split(x, sizes)):
        outs.append(silu(xe @ w1[e].T) * (xe @ w3[e].T) @ w2[e].T)
    y = torch.cat(outs)                           # (+ torchtitan's x[:sum(sizes)] and zero padding)

torch.export unrolls the loop: E copies of the expert's ops on rows of unbacked sizes. Here, on
the exported graph, the E copies are checked to be the same computation (the same ops and
arguments, expert e reading ``w[e]`` where expert 0 reads ``w[0]``) and become one: expert 0's
ops run on all the rows, ``xe @ w[e]`` becomes ``_grouped_mm(x, w, offs=cumsum(counts))`` — what
the loop computes, whatever the counts — and the split, the per-expert copies, the ``.tolist()``
scalars and their asserts, the prefix slice ``x[:sum(sizes)]`` and the zero padding after the cat
(zero rows whenever the counts sum to the rows) are not imported. ``program.routing`` then
reads the grouped form as routed rows; a loop whose counts are not a top-k routing's is refused
(``check_loops_routed``): its rows cannot be planned without their counts. A loop may split the
output of an earlier loop over the same counts (JetMoE: gate|up in one loop, down in the next),
whose size is the sum of those counts: its rows are the earlier loop's.

    >>> expert_loops([]) == LoopRewrite()
    True
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

from ..ops.result import canonical_op_name
from . import ProgramError

_WEIGHT_VIEWS = frozenset({"permute", "transpose", "t", "view", "_unsafe_view", "reshape", "_to_copy", "clone",
                           "detach", "alias", "contiguous", "expand"})
_MATMULS = frozenset({"mm", "matmul"})
_ZEROS = frozenset({"full", "zeros", "new_zeros", "new_full"})


@dataclass(frozen=True)
class LoopRewrite:
    """What the import does with the nodes of the per-expert loops of a graph.

    ``skip``: nodes not imported; ``alias``: node -> the node whose tensor it is (expert 0's
    split output is the whole rows, the cat is expert 0's output run on all rows); ``emit``:
    node -> ``("weight", dim shift)`` (a view of a stacked weight), ``("grouped_mm", split)``
    or ``("rows",)`` (one of expert 0's ops, run on every row); ``offsets``: split node -> the
    counts node (``cumsum`` of it is emitted at the split); ``sums``: per loop, the symbols of
    its counts and the rows they sum to; ``grouped``: names of the emitted grouped matmuls."""

    skip: frozenset = frozenset()
    alias: dict = field(default_factory=dict)
    emit: dict = field(default_factory=dict)
    offsets: dict = field(default_factory=dict)
    sums: tuple = ()
    grouped: frozenset = frozenset()
    rows: dict = field(default_factory=dict)  # split node -> the node of the rows it splits


def _short(node) -> str:
    return canonical_op_name(str(node.target)) if node.op == "call_function" else ""


def _nodes_in(x) -> list:
    """The graph nodes among a node's args / kwargs (nested lists flattened)."""
    if hasattr(x, "op") and hasattr(x, "users"):
        return [x]
    if isinstance(x, (list, tuple)):
        return [n for v in x for n in _nodes_in(v)]
    if isinstance(x, dict):
        return [n for v in x.values() for n in _nodes_in(v)]
    return []


def _inputs(node) -> list:
    return _nodes_in(list(node.args)) + _nodes_in(dict(node.kwargs))


def _arg(node, i: int, name: str, default=None):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _shape(node) -> tuple | None:
    val = node.meta.get("val")
    return tuple(val.shape) if hasattr(val, "shape") else None


def node_where(node) -> str:
    """Where an exported node comes from, for an error: its name, the innermost module's path and
    class, and the source line. ``node 'log1p' in model.layers.0.mlp.act_fn (XIELUActivation), File
    "activations.py", line 321, in forward``"""
    stack = node.meta.get("nn_module_stack") or {}
    path, cls = list(stack.values())[-1] if stack else ("", None)
    cls = getattr(cls, "__name__", None) or (str(cls).rpartition(".")[2].rstrip("'>") if cls else "")
    module = f" in {path} ({cls})" if isinstance(path, str) and path else ""
    lines = (node.meta.get("stack_trace") or "").strip().splitlines()
    return f"node {node.name!r}{module}" + (f", {lines[-2].strip()}" if len(lines) >= 2 else "")


def _element(node):
    """``(counts node, index)`` when ``node`` is one element of a 1-D tensor: ``squeeze(slice(C,
    0, i, i+1))``, ``select(C, 0, i)`` or ``unbind(C)[i]``; else None."""
    n = _short(node)
    if n == "squeeze" and node.args and hasattr(node.args[0], "op"):
        inner = node.args[0]
        if _short(inner) == "slice" and _arg(inner, 1, "dim", 0) == 0:
            start, end = _arg(inner, 2, "start", 0) or 0, _arg(inner, 3, "end")
            if isinstance(start, int) and end == start + 1:
                return inner.args[0], start
        return None
    if n == "select" and _arg(node, 1, "dim") == 0 and isinstance(_arg(node, 2, "index"), int):
        return node.args[0], _arg(node, 2, "index")
    if node.op == "call_function" and node.target is operator.getitem and hasattr(node.args[0], "op") \
            and _short(node.args[0]) == "unbind" and _arg(node.args[0], 1, "dim", 0) == 0:
        return node.args[0].args[0], node.args[1]
    return None


def _free(node) -> frozenset:
    """The sympy symbols of a node's SymInt / SymBool value or of its shape."""
    val = node.meta.get("val")
    vals = list(val.shape) if hasattr(val, "shape") else [val]
    out: set = set()
    for v in vals:
        expr = getattr(getattr(v, "node", None), "expr", None)
        if expr is not None:
            out |= set(expr.free_symbols)
    return frozenset(out)


def expert_loops(nodes) -> LoopRewrite:
    """The per-expert loops among ``nodes`` (an exported graph's, in order) and what to import
    for them (module docstring); ``LoopRewrite()`` when there are none. A split by
    ``.tolist()`` sizes that is not such a loop raises ProgramError naming what differs."""
    nodes = list(nodes)
    order = {n: i for i, n in enumerate(nodes)}
    skip, alias, emit, offsets, sums, grouped, rows, symbol_sets = set(), {}, {}, {}, [], set(), {}, []
    for node in nodes:
        if _short(node) == "split_with_sizes" and any(
                hasattr(s, "op") and _short(s) == "_local_scalar_dense" for s in _arg(node, 1, "split_sizes", ())):
            loop = _loop(node, order, dict(sums))
            skip |= loop["skip"]
            alias.update(loop["alias"])
            emit.update(loop["emit"])
            offsets[node] = loop["counts"]
            symbol_sets.append(loop["symbols"])
            sums.append((loop["counts_symbols"], loop["rows"]))
            grouped |= {g.name for g in loop["grouped"]}
            rows[node] = loop["rows_node"]
    if not offsets:
        return LoopRewrite()
    syms = frozenset(s for group in symbol_sets for s in group)
    for node in nodes:  # the counts' own asserts (u0 >= 0, u0 + ... + u3 == rows): true by construction
        if str(node.target).startswith(("aten._assert_scalar", "aten.sym_constrain_range")) and node.args and \
                hasattr(node.args[0], "op") and _free(node.args[0]) & syms:
            skip.add(node)
    return LoopRewrite(frozenset(skip), alias, emit, offsets, tuple(sums), frozenset(grouped), rows)


def _loop(split, order: dict, known: dict) -> dict:
    """One loop at its split node (``expert_loops``); ``known``: the count symbols of the loops
    before it -> their rows (a loop may split the output of an earlier loop on the same counts)."""
    what = f"per-expert loop at {node_where(split)}"
    if _arg(split, 2, "dim", 0) not in (0, -len(_shape(split.args[0]) or (1,))):
        raise ProgramError(f"{what}: the rows are split along dim {_arg(split, 2, 'dim')}; a per-expert loop "
                           "splits the sorted rows along dim 0")
    sizes = list(_arg(split, 1, "split_sizes"))
    experts = len(sizes)
    counts, skip = None, set()
    for e, u in enumerate(sizes):
        got = _element(u.args[0]) if hasattr(u, "op") and _short(u) == "_local_scalar_dense" else None
        if got is None or got[1] not in (e, e - experts) or (counts is not None and got[0] is not counts):
            raise ProgramError(f"{what}: split size {e} is not element {e} of one counts tensor (.tolist() of the "
                               "rows per expert); only torch.split(rows, counts.tolist()) is read as expert loop")
        counts = got[0]
        skip.add(u)
        skip.add(u.args[0])
        inner = u.args[0].args[0]
        if _short(inner) in ("slice", "unbind"):
            skip.add(inner)
    if _shape(counts) != (experts,):
        raise ProgramError(f"{what}: the counts {counts.name!r} have shape {_shape(counts)}, not ({experts},)")
    rows_node, alias = split.args[0], {}
    symbols = frozenset(s for u in sizes for s in _free(u))
    if _short(rows_node) == "slice" and _arg(rows_node, 1, "dim", 0) == 0 and \
            (_arg(rows_node, 2, "start", 0) or 0) == 0:  # torchtitan's x[:sum(sizes)]
        end = _arg(rows_node, 3, "end")
        expr = getattr(getattr(end.meta.get("val"), "node", None), "expr", None) if hasattr(end, "op") else None
        total = sum(getattr(getattr(u.meta.get("val"), "node", None), "expr", 0) for u in sizes)
        if expr is None or (expr - total).expand() != 0:
            raise ProgramError(f"{what}: the rows are cut to {end} before the split, not to the sum of the counts")
        alias[rows_node] = rows_node.args[0]
        symbols |= _free(rows_node)
        rows_node = rows_node.args[0]
    shape = _shape(rows_node)
    counts_symbols = tuple(getattr(getattr(u.meta.get("val"), "node", None), "expr", None) for u in sizes)
    rows = shape[0] if shape else None
    if shape and not isinstance(rows, int):  # an earlier loop's output (JetMoE: two loops on one split)
        expr = getattr(getattr(rows, "node", None), "expr", None)
        rows = known.get(counts_symbols) if expr is not None and None not in counts_symbols and \
            (expr - sum(counts_symbols)).expand() == 0 else None
    if not isinstance(rows, int):
        raise ProgramError(f"{what}: the rows {rows_node.name!r} have no static size ({shape}), nor the sum of the "
                           "counts of an earlier loop on static rows")
    heads = {}
    for user in split.users:
        if user.target is operator.getitem and isinstance(user.args[1], int):
            heads[user.args[1] % experts] = user
    if sorted(heads) != list(range(experts)):
        raise ProgramError(f"{what}: experts {sorted(set(range(experts)) - set(heads))} use no rows; every expert "
                           "of the loop must run")
    regions = [_region(heads[e], heads) for e in range(experts)]
    cat = _the_cat(regions, heads, what)  # (and cuts each region at it)
    weights = [_weights(region, heads[e], e, experts, what) for e, region in enumerate(regions)]
    seqs = [sorted(r | w, key=order.__getitem__) for r, w in zip(regions, weights)]
    for e in range(1, experts):
        _same(seqs[0], seqs[e], heads[0], heads[e], weights[0], weights[e], what, e)
    out0 = cat.args[0][0]
    alias[cat] = out0
    alias[heads[0]] = rows_node
    emit, grouped = {}, []
    for node in seqs[0]:
        if node in weights[0]:
            if _short(node) == "select":
                alias[node] = node.args[0]
            else:
                emit[node] = ("weight",)
            continue
        ins = _inputs(node)
        w_in = [i for i in ins if i in weights[0]]
        if w_in and _short(node) in _MATMULS and len(node.args) == 2 and node.args[1] in weights[0] and \
                node.args[0] not in weights[0] and len(_shape(node.args[1]) or ()) == 2:
            emit[node] = ("grouped_mm", split)
            grouped.append(node)
        elif w_in:
            raise ProgramError(f"{what}: {node_where(node)} ({_short(node)}) uses the per-expert tensor "
                               f"{w_in[0].name!r} other than as the right operand of a matmul (rows @ w[e]); "
                               "only per-expert matmul weights are supported (a per-expert bias or scale is not)")
        else:
            emit[node] = ("rows",)
    padded = _padding(cat, symbols, rows, what)
    if padded is not None:
        alias[padded[0]] = out0
        skip |= padded[1]
    for e in range(1, experts):
        skip |= set(seqs[e]) | {heads[e]}
    return {"skip": skip, "alias": alias, "emit": emit, "counts": counts, "symbols": symbols, "rows": rows,
            "grouped": grouped, "counts_symbols": counts_symbols, "rows_node": rows_node}


def _region(head, heads: dict) -> set:
    """Everything computed from one expert's rows (up to the outputs)."""
    seen, stack = set(), [head]
    while stack:
        n = stack.pop()
        for u in n.users:
            if u not in seen and u.op == "call_function":
                seen.add(u)
                stack.append(u)
    return seen


def _the_cat(regions: list, heads: dict, what: str):
    """The ``cat`` joining every expert's output (the first node every expert reaches)."""
    common = set.intersection(*regions) if regions else set()
    cats = [n for n in common if _short(n) == "cat" and len(_nodes_in(n.args[0])) == len(regions)]
    cat = None
    for n in cats:
        outs = list(n.args[0])
        if all(o in r and o is not heads[e] for e, (o, r) in enumerate(zip(outs, regions))) and \
                _arg(n, 1, "dim", 0) == 0:
            if cat is None or cat in _region(n, heads):  # the first such cat (the padding cat comes after)
                cat = n
    if cat is None:
        raise ProgramError(f"{what}: the experts' outputs are not joined by one torch.cat(outputs, dim=0) in "
                           "expert order")
    after = _region(cat, heads) | {cat}
    for e, r in enumerate(regions):
        r -= after
        out = cat.args[0][e]
        for n in r:
            leak = [u for u in n.users if u not in r and u is not cat]
            if leak or (n is out and len(n.users) != 1):
                raise ProgramError(f"{what}: expert {e}'s {node_where(n)} is used outside the loop "
                                   f"({(leak or list(n.users))[0].name!r}); an expert's values may only reach "
                                   "the cat of the outputs")
    return cat


def _weights(region: set, head, e: int, experts: int, what: str) -> set:
    """The per-expert operands of a region: ``select(w, 0, e)`` and views of it."""
    out = set()
    for n in region:
        for a in _inputs(n):
            if a in region or a is head:
                continue
            chain, cur = [], a
            while _short(cur) in _WEIGHT_VIEWS and cur.args and hasattr(cur.args[0], "op"):
                chain.append(cur)
                cur = cur.args[0]
            if _short(cur) == "select" and _arg(cur, 1, "dim") == 0:
                idx = _arg(cur, 2, "index")
                if idx not in (e, e - experts):
                    raise ProgramError(f"{what}: expert {e} reads {node_where(cur)}, row {idx} of "
                                       f"{cur.args[0].name!r}; expert e must read w[e]")
                out |= set(chain) | {cur}
    return out


def _same(seq0: list, seq: list, head0, head, w0: set, w: set, what: str, e: int) -> None:
    """Expert ``e``'s ops are expert 0's with its own rows and ``w[e]`` for ``w[0]``."""
    if [_short(n) for n in seq] != [_short(n) for n in seq0]:
        raise ProgramError(f"{what}: expert {e} runs {[_short(n) for n in seq]}, expert 0 runs "
                           f"{[_short(n) for n in seq0]}; every expert must run the same ops")
    pos0 = {n: i for i, n in enumerate(seq0)}
    pos = {n: i for i, n in enumerate(seq)}

    def same(a, b, select_index: bool) -> bool:
        if hasattr(a, "op") or hasattr(b, "op"):
            if not (hasattr(a, "op") and hasattr(b, "op")):
                return False
            if a is head0 or b is head:
                return a is head0 and b is head
            if a in pos0 or b in pos:
                return a in pos0 and b in pos and pos0[a] == pos[b]
            return a is b  # a tensor every expert shares
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return len(a) == len(b) and all(same(x, y, False) for x, y in zip(a, b))
        return select_index or a == b

    for n0, n in zip(seq0, seq):
        sel = _short(n0) == "select" and n0 in w0
        args0, args = list(n0.args), list(n.args)
        ok = len(args0) == len(args) and all(same(a, b, sel and i == 2) for i, (a, b) in enumerate(zip(args0, args)))
        ok = ok and n0.kwargs.keys() == n.kwargs.keys() and all(same(n0.kwargs[k], n.kwargs[k], False)
                                                                for k in n0.kwargs)
        if not ok:
            raise ProgramError(f"{what}: expert {e}'s {node_where(n)} differs from expert 0's {n0.name!r} in its "
                               "arguments; every expert must run the same computation on its own rows and w[e]")


def _padding(cat, symbols: frozenset, rows: int, what: str):
    """torchtitan's ``vstack((out, out.new_zeros((rows - sum(sizes), dim))))``: ``(the padded cat,
    {the zeros})`` when the zeros have no rows whenever the counts sum to ``rows``; else None."""
    users = list(cat.users)
    if len(users) != 1 or _short(users[0]) != "cat" or _arg(users[0], 1, "dim", 0) != 0:
        return None
    pad = users[0]
    parts = list(pad.args[0])
    if not parts or parts[0] is not cat:
        return None
    zeros = set()
    for z in parts[1:]:
        if not hasattr(z, "op") or _short(z) not in _ZEROS:
            return None
        val = z.meta.get("val")
        n = val.shape[0] if hasattr(val, "shape") and len(val.shape) else None
        expr = getattr(getattr(n, "node", None), "expr", n)
        if not _zero_when_summed(expr, symbols, rows):
            raise ProgramError(f"{what}: the rows padded after the cat ({node_where(z)}) are not rows - sum(counts)")
        zeros.add(z)
    return pad, zeros


def _zero_when_summed(expr, symbols: frozenset, rows: int) -> bool:
    """Is ``expr`` zero whenever the loop's counts sum to ``rows`` (u0 = rows - u1 - ...)?"""
    if isinstance(expr, int):
        return expr == 0
    free = sorted(set(expr.free_symbols) & symbols, key=str)
    if not free:
        return expr == 0
    u0, rest = free[0], free[1:]
    return (expr.subs(u0, rows - sum(rest))).expand() == 0


def check_loops_routed(prog, rows: dict) -> None:
    """The rows of every per-expert loop (``{tensor name: split node name}``) were read as routed
    rows (``program.routing``); raises ProgramError naming the loop otherwise: rows split by
    counts that are not a top-k routing's cannot be planned (their sizes are known at run time
    only, and torchtitan's padding is empty only when the counts sum to the rows)."""
    for name, split in sorted(rows.items()):
        t = prog.tensors.get(name)
        if t is None or t.ragged is None:
            raise ProgramError(
                f"per-expert loop at node {split!r}: its rows {name!r} were not read as routed rows: the split sizes "
                "must be the per-expert counts of a top-k routing (histc / bincount of the flattened top-k experts, "
                "rows gathered by argsort // k and summed back into the tokens), and every op on the rows must be "
                "defined on routed rows (row-wise ops, rows @ w[e]); write the routing as torchtitan does, or use "
                "torch._grouped_mm")


__all__ = ["LoopRewrite", "check_loops_routed", "expert_loops"]
