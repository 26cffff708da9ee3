"""Which tensors of a program have a ragged dim, and the ops allowed on them.

A ragged dim is born where tokens are routed (``route``: experts x ragged rows) and dies where
they are combined (``unroute``). In between, an op may keep it (row-wise ops on the stored
rows, einsum/bmm over the components with the ragged rows passed through); any other op on a
ragged tensor is an error here, at build time, naming the op — the RFC leaves mixing ragged
and dense rows in one dim, or merging the component dim with anything, undefined.

    >>> from shardlayout.program import ProgramBuilder
    >>> b = ProgramBuilder()
    >>> x = b.input("x", (8, 4)); idx = b.input("idx", (8, 2), "int64"); w = b.param("w", (4, 4, 6))
    >>> xs = b.op("route", [x, idx], name="xs", experts=4)
    >>> h = b.op("einsum", [xs, w], name="h", equation="erd,edf->erf")
    >>> p = b.build(); p.tensors["h"].shape, p.tensors["h"].ragged.dim, p.tensors["h"].ragged.maximum
    ((4, 4, 6), 1, 8)
"""

from __future__ import annotations

from dataclasses import replace

from ..ops.ragged import ROWWISE, SPLITS
from ..ops.result import canonical_op_name
from ..sharding.nested import RaggedError
from ..sharding.ragged import Ragged


def _einsum_ragged(op, ins: list) -> Ragged:
    eq = str(dict(op.params).get("equation", "")).replace(" ", "")
    if canonical_op_name(op.target) == "bmm":
        eq = "erk,ekn->ern"
    terms, out = eq.split("->")[0].split(","), eq.split("->")[1]
    found = None
    for spec, term in zip(ins, terms):
        r = spec.ragged
        if r is None:
            continue
        pair = term[r.dim - 1] + term[r.dim]
        if found is not None and (found[1] != pair or found[0] != r):
            raise RaggedError(f"op {op.name} ({eq}): its ragged operands differ (letters {found[1]} and {pair}); "
                              "operands of one op must share one ragged dim")
        found = (r, pair)
    r, pair = found
    for spec, term in zip(ins, terms):
        if spec.ragged is None and pair[1] in term:
            raise RaggedError(f"op {op.name} ({eq}): dense operand {spec.name} spans the ragged dim {pair[1]!r}; "
                              "ragged and dense rows cannot mix in one dim")
    if pair not in out:
        raise RaggedError(f"op {op.name} ({eq}): the output drops or separates the component and ragged dims "
                          f"{pair!r}; a ragged dim is kept right after its component dim (contracting it is not "
                          "defined)")
    return r.at_dim(out.index(pair) + 1)


def _rowwise_ragged(op, ins: list, out_shape: tuple) -> Ragged:
    rs = {spec.ragged for spec in ins if spec.ragged is not None}
    if len(rs) != 1:
        raise RaggedError(f"op {op.name} ({canonical_op_name(op.target)}): its ragged operands have different "
                          f"ragged dims {sorted(map(str, rs))}; operands of one op must share one ragged dim")
    r = rs.pop()
    lead = len(out_shape) - max(len(s.shape) for s in ins if s.ragged is not None)
    r = r.at_dim(r.dim + lead)
    for spec in ins:
        if spec.ragged is not None:
            continue
        m = len(spec.shape)
        at_r = m - (len(out_shape) - r.dim)
        if at_r >= 0 and spec.shape[at_r] != 1:
            raise RaggedError(f"op {op.name}: dense operand {spec.name} of shape {spec.shape} spans the ragged dim "
                              f"with size {spec.shape[at_r]}; give size 1 there (ragged and dense rows cannot mix)")
        if at_r - 1 >= 0 and spec.shape[at_r - 1] not in (1, r.components):
            raise RaggedError(f"op {op.name}: dense operand {spec.name} of shape {spec.shape} has size "
                              f"{spec.shape[at_r - 1]} in the component dim; give 1 or {r.components}")
    return r


def output_ragged(op, ins: list, out_shapes: list) -> list:
    """The Ragged of each output of ``op`` (None for a dense one) from its inputs' specs;
    raises RaggedError for an op that is not defined on a ragged operand."""
    name = canonical_op_name(op.target)
    if name in ("route", "unroute") and len(ins) > 1 and not str(ins[1].dtype).startswith(("int", "uint")):
        raise RaggedError(f"op {op.name} ({name}): the index {ins[1].name} is {ins[1].dtype}; it must hold expert ids "
                          "(an integer dtype, e.g. topk's indices)")
    if name == "route":
        idx = ins[1]
        t, k = idx.shape
        experts = int(dict(op.params)["experts"])
        return [Ragged(1, experts, out_shapes[0][1], t if k <= experts else t * k, t * k,
                       f"bincount({idx.name}, {experts})")]
    ragged_in = [s for s in ins if s.ragged is not None]
    if name == "unroute" and (not ins or ins[0].ragged is None):
        raise RaggedError(f"op {op.name} (unroute): its first operand {ins[0].name if ins else '?'} is dense; unroute "
                          "combines a ragged tensor (the output of route, or of ops on it) back into the tokens")
    if not ragged_in or (name.startswith("_assert") and not out_shapes):  # a runtime check reads no rows
        return [None] * len(out_shapes)
    if name == "unroute":
        if ins[0].ragged is None or any(s.ragged is not None for s in ins[1:]):
            raise RaggedError(f"op {op.name} (unroute): the first operand must be the ragged one (experts x rows), "
                              "the index and weights dense")
        return [None]
    if name in ("einsum", "bmm"):
        return [_einsum_ragged(op, ins)]
    if name in ("unsqueeze", "squeeze") and len(ins) == 1:
        r = ins[0].ragged
        d = dict(op.params).get("dim")
        ndim = len(out_shapes[0]) if name == "unsqueeze" else len(ins[0].shape)
        d = None if d is None else (d + ndim if d < 0 else d)
        if d is None or d <= r.dim:
            raise RaggedError(f"op {op.name} ({name}, dim {d}): only dims after the ragged dim {r.dim} may be added "
                              "or removed; the component and ragged dims stay together")
        return [r]
    if name in ROWWISE:
        return [_rowwise_ragged(op, ins, out_shapes[0])] * len(out_shapes)
    if name in SPLITS and len(ragged_in) == 1 and ins[0].ragged is not None:
        r, d = ins[0].ragged, dict(op.params).get("dim", 0)
        d = d + len(ins[0].shape) if isinstance(d, int) and d < 0 else d
        if not isinstance(d, int) or d <= r.dim:
            raise RaggedError(f"op {op.name} ({name}, dim {d}): routed rows are cut only along a dim after the "
                              f"ragged dim {r.dim} (the rows of each expert stay whole)")
        return [r] * len(out_shapes)
    names = ", ".join(s.name for s in ragged_in)
    raise RaggedError(f"op {op.name} ({name}) takes the ragged tensor {names}; ragged tensors go through route, "
                      f"einsum/bmm over their components, row-wise ops ({', '.join(sorted(ROWWISE))}) and "
                      "unroute. Combine (unroute) before this op")


def with_ragged(tensors: dict, ops) -> dict:
    """``tensors`` with every op output's ``ragged`` set from the ops, in program order (as they
    are when no op routes or combines: only ``route`` makes a ragged tensor)."""
    if not any(canonical_op_name(op.target) in ("route", "unroute") for op in ops) and \
            all(t.ragged is None for t in tensors.values()):
        return tensors
    out = dict(tensors)
    for op in ops:
        ins = [out[i] for i in op.inputs if isinstance(i, str)]
        specs = [out[o] for o in op.outputs]
        got = output_ragged(op, ins, [s.shape for s in specs])
        for spec, r in zip(specs, got):
            if spec.ragged != r:
                out[spec.name] = replace(spec, ragged=r)
    return out


__all__ = ["output_ragged", "with_ragged"]
