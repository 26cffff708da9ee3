"""Rewriting an imported program: who reads each tensor, and the program rebuilt with some ops
replaced. The import's pattern passes (``head_norms``, ``parallel_residual``) find their ops with
:func:`readers` and rebuild with :func:`rebuilt`.

    >>> from shardlayout.program import ProgramBuilder
    >>> b = ProgramBuilder(); x = b.input("x", (2, 4)); b.output(b.op("relu", [x], name="y"))
    >>> readers(b.build())
    {'y': [-1], 'x': [0]}
"""

from __future__ import annotations

from . import Program, ProgramBuilder


def readers(prog: Program) -> dict:
    """``{tensor: [op index, ...]}``: the ops reading each tensor, in program order; a program
    output is also read by the caller (index -1). ``readers(prog)["x"] -> [0]``"""
    out: dict = {o: [-1] for o in prog.outputs}
    for k, op in enumerate(prog.ops):
        for i in op.inputs:
            if isinstance(i, str):
                out.setdefault(i, []).append(k)
    return out


def rebuilt(prog: Program, emit: dict, dropped) -> Program:
    """``prog`` with op ``k`` of ``emit`` replaced by what ``emit[k](builder)`` adds, the ops of
    ``dropped`` left out and every other op copied as it is (names, dtypes and params kept).
    ``rebuilt(prog, {3: lambda b: ...}, {4, 5})``"""
    b = ProgramBuilder()
    for name in prog.inputs():
        b._add(prog.tensors[name])
    for k, op in enumerate(prog.ops):
        if k in emit:
            emit[k](b)
        elif k not in dropped:
            dtypes = [prog.tensors[o].dtype for o in op.outputs]
            b._op(op.target, list(op.inputs), op.name, len(op.outputs), dtypes if op.outputs else None, op.kwargs())
    for o in prog.outputs:
        b.output(o)
    return b.build()


__all__ = ["readers", "rebuilt"]
