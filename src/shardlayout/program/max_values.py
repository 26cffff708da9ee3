"""A ``max`` (or ``min``) over a dim whose indices nobody reads, read as ``amax`` (``amin``).

``torch.max(x, dim)`` returns values and indices; an index names one of all candidates, so the dim
must be whole on every rank (a cut gathers ``x``). Per-token absolute-max scaling — BitNet's
8-bit activation quantization, ``127 / x.abs().max(dim=-1, keepdim=True).values`` — reads the values
alone: as ``amax`` over the dim they are a max of each rank's maxes, a ``[batch, seq, 1]`` partial
max all-reduced where a cut of the features needs it, not a gather of ``x``. The values are the same
numbers. A program without the pattern is returned as it is.

    >>> from shardlayout.program import ProgramBuilder
    >>> b = ProgramBuilder(); x = b.input("x", (2, 4))
    >>> values, _ = b.op("max", [x], name="m", n_out=2, dim=-1, keepdim=True)
    >>> b.output(b.op("neg", [values], name="y"))
    >>> [(op.target, op.outputs) for op in max_values(b.build()).ops]
    [('amax', ('m.0',)), ('neg', ('y',))]
"""

from __future__ import annotations

from ..ops.result import canonical_op_name
from . import Program, ProgramBuilder
from .rewrite import readers, rebuilt

LATTICE = {"max": "amax", "min": "amin"}


def max_values(prog: Program) -> Program:
    """``prog`` with every ``max``/``min`` over a dim whose indices are unread as ``amax``/``amin``
    (module docstring); ``prog`` itself when it has none."""
    if prog.is_symbolic:
        return prog
    users = readers(prog)
    found = [k for k, op in enumerate(prog.ops) if canonical_op_name(op.target) in LATTICE and len(op.outputs) == 2
             and op.kwargs().get("dim") is not None and not users.get(op.outputs[1])]
    if not found:
        return prog
    emit = {k: (lambda b, op=prog.ops[k]: _emit(prog, op, b)) for k in found}
    return rebuilt(prog, emit, set())


def _emit(prog: Program, op, b: ProgramBuilder) -> None:
    kw = op.kwargs()
    values = op.outputs[0]
    b.op(LATTICE[canonical_op_name(op.target)], [op.inputs[0]], name=values, dim=(kw["dim"],),
         keepdim=bool(kw.get("keepdim", False)), dtypes=[prog.tensors[values].dtype])


__all__ = ["max_values"]
