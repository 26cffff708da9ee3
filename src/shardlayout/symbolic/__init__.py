"""Symbolic integer extents (``Expr``) and a small fact base of guards (``FactBase``).

    >>> batch, seq = sym("batch"), sym("seq")
    >>> facts = FactBase().assume("batch % 2 == 0").assume("seq % 4 == 0")
    >>> str(batch * seq + seq), facts.divides(8, batch * seq), facts.divides(8, seq)
    ('batch*seq + seq', True, None)
"""

from .expr import Expr, as_extent, ceil_div, const, is_symbolic, max_, min_, parse, sym
from .facts import FactBase, Guard

__all__ = [
    "Expr",
    "sym",
    "const",
    "parse",
    "ceil_div",
    "max_",
    "min_",
    "as_extent",
    "is_symbolic",
    "Guard",
    "FactBase",
]
