"""CuTe layout algebra (C++ CuTe semantics): ``Layout`` and its operations.

    >>> from shardlayout.layout import Layout, composition
    >>> str(composition(Layout(20, 2), Layout((5, 4), (4, 1))))
    '(5,4):(8,2)'
"""

from . import inttuple as _it
from .algebra import (
    blocked_product,
    coalesce,
    complement,
    composition,
    filter,
    flat_divide,
    left_inverse,
    logical_divide,
    logical_product,
    raked_product,
    right_inverse,
    tiled_divide,
    tiled_product,
    zipped_divide,
    zipped_product,
)
from .core import Layout, make_layout, too_deep


def _guarded(f):
    """An int-tuple function that refuses a tuple nested past Python's stack with a LayoutError
    naming its depth (never a RecursionError); no cost on the way in."""
    import functools

    @functools.wraps(f)
    def g(*args):
        try:
            return f(*args)
        except RecursionError:
            deep = [a for a in args if isinstance(a, (tuple, list))]
            raise too_deep(f.__name__, "an int-tuple", deep[0] if len(deep) == 1 else tuple(deep)) from None

    return g


congruent, crd2idx, depth, flatten, idx2crd, product, rank = (
    _guarded(f) for f in (_it.congruent, _it.crd2idx, _it.depth, _it.flatten, _it.idx2crd, _it.product, _it.rank))

__all__ = [
    "Layout",
    "make_layout",
    "coalesce",
    "filter",
    "composition",
    "complement",
    "right_inverse",
    "left_inverse",
    "logical_divide",
    "zipped_divide",
    "tiled_divide",
    "flat_divide",
    "logical_product",
    "zipped_product",
    "tiled_product",
    "blocked_product",
    "raked_product",
    "congruent",
    "crd2idx",
    "idx2crd",
    "depth",
    "flatten",
    "product",
    "rank",
]


def size(layout: Layout) -> int:
    """Size of the domain. ``size(Layout((4, 2))) -> 8``."""
    return layout.size()


def cosize(layout: Layout) -> int:
    """One past the largest offset. ``cosize(Layout(4, 2)) -> 7``."""
    return layout.cosize()


__all__ += ["size", "cosize"]
