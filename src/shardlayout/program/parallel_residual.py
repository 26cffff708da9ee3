"""A parallel residual written ``residual + attention + mlp``, summed branches first.

Cohere, Cohere2 and StableLM (``use_parallel_residual``) run attention and MLP on the same normed
input and add both to the residual as ``residual + attn + mlp``, which is ``(residual + attn) + mlp``:

    add(add(r, a), m)  ->  add(r, add(a, m))

Under Megatron ``a`` and ``m`` are partial sums over tp; ``r + a`` is not linear (every rank would
add ``r``), so op by op ``a`` is all-reduced there and ``m`` again at the second add: two
all_reduces a layer. Summed first, the branches stay one partial sum, reduced once at the add of
the residual — as GPT-J and GPT-NeoX write it (``attn + mlp + residual``). The rewrite applies
where ``r`` is read elsewhere too (a stream: the residual feeding the norm) and ``a``, ``m`` and the
inner sum are each read by the next add alone (the branch outputs), the three of one shape and
dtype; the values differ from the source's by float rounding only. A program without it is
returned as it is.

    >>> from shardlayout.program import ProgramBuilder
    >>> b = ProgramBuilder(); r = b.input("r", (2, 4))
    >>> a = b.op("relu", [r], name="a"); m = b.op("neg", [r], name="m")
    >>> b.output(b.op("add", [b.op("add", [r, a], name="h"), m], name="out"))
    >>> [(op.name, op.inputs) for op in sum_branches_first(b.build()).ops][2:]
    [('h_branches', ('a', 'm')), ('out', ('r', 'h_branches'))]
"""

from __future__ import annotations

from ..ops.result import canonical_op_name
from . import Program
from .rewrite import readers, rebuilt


def sum_branches_first(prog: Program) -> Program:
    """``prog`` with each ``(r + a) + m`` of a parallel residual rewritten ``r + (a + m)`` (module
    docstring); ``prog`` itself when it has none."""
    if prog.is_symbolic:
        return prog
    users = readers(prog)
    made_by = {o: k for k, op in enumerate(prog.ops) for o in op.outputs}
    found = {}  # index of the outer add -> index of the inner add
    for k, op in enumerate(prog.ops):
        inner = _inner_sum(prog, op, users, made_by)
        if inner is not None:
            found[k] = inner
    if not found:
        return prog
    return rebuilt(prog, {k: (lambda b, k=k, i=i: _sum_first(prog, prog.ops[k], prog.ops[i], b))
                          for k, i in found.items()}, set(found.values()))


def _sum_first(prog: Program, op, inner, b) -> None:
    """Add ``r + (a + m)`` for ``op = (r + a) + m`` (``inner``: ``r + a``) to the builder ``b``."""
    r, a = inner.inputs
    dtypes = [prog.tensors[op.outputs[0]].dtype]
    both = b._op(inner.target, [a, op.inputs[1]], f"{inner.name}_branches", 1, dtypes, inner.kwargs())
    b._op(op.target, [r, both], op.name, 1, dtypes, op.kwargs())


def _plain_add(op) -> bool:
    """An ``add`` of two tensors (``alpha`` 1 or none)."""
    kw = op.kwargs()
    return canonical_op_name(op.target) == "add" and kw.get("alpha", 1) == 1 and set(kw) <= {"alpha"} \
        and len(op.inputs) == 2 and all(isinstance(i, str) for i in op.inputs)


def _inner_sum(prog: Program, op, users: dict, made_by: dict):
    """The index of the inner add of ``op = (r + a) + m`` when it is a parallel residual's (``r`` read
    elsewhere, ``a``, ``m`` and ``r + a`` read by these adds alone, all one shape and dtype); else None."""
    if not _plain_add(op):
        return None
    h, m = op.inputs
    k = made_by.get(h)
    if k is None or users.get(h) != [made_by.get(op.outputs[0])] or users.get(m) != users.get(h):
        return None
    inner = prog.ops[k]
    if not _plain_add(inner):
        return None
    r, a = inner.inputs
    t = prog.tensors
    same = {(t[x].shape, t[x].dtype) for x in (r, a, m, h, op.outputs[0])}
    if len(same) != 1 or users.get(a) != [k] or len(users.get(r, ())) < 2 or m in (r, a):
        return None
    return k


__all__ = ["sum_branches_first"]
