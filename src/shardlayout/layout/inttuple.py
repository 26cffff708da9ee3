"""Nested integer tuples: the shapes and strides of CuTe layouts.

An int-tuple is an ``int`` or a tuple of int-tuples. All functions are pure and
recurse the same way over the nesting (pycute's pattern).

    >>> flatten((2, (3, 4)))
    (2, 3, 4)
"""

from __future__ import annotations

from typing import Union

IntTuple = Union[int, tuple]


def is_int(x: object) -> bool:
    """True for a plain Python int (bool excluded). ``is_int(3) -> True``."""
    return type(x) is int


def is_tuple(x: object) -> bool:
    """True for a tuple. ``is_tuple((1, 2)) -> True``."""
    return type(x) is tuple


def flatten(t: IntTuple) -> tuple:
    """The leaves of ``t`` in order, as a flat tuple. ``flatten((2, (3, 4))) -> (2, 3, 4)``."""
    f = leaves(t)
    return f if type(f) is tuple else tuple(f)


def leaves(t: IntTuple):
    """The leaves of ``t`` in order: ``t`` itself when it is a flat tuple, else a new list
    (cheaper than :func:`flatten` on hot paths). ``leaves((2, (3, 4))) -> [2, 3, 4]``."""
    if type(t) is not tuple:
        return (t,)
    for x in t:
        if type(x) is tuple:
            break
    else:
        return t
    out: list = []
    _flatten_into(t, out)
    return out


def _flatten_into(t: tuple, out: list) -> None:
    for x in t:
        if type(x) is tuple:
            _flatten_into(x, out)
        else:
            out.append(x)


def product(t: IntTuple) -> int:
    """Product of all leaves. ``product((2, (3, 4))) -> 24``."""
    if type(t) is not tuple:
        return t
    p = 1
    for x in t:
        p *= x if type(x) is not tuple else product(x)
    return p


def rank(t: IntTuple) -> int:
    """Number of top-level modes (1 for an int). ``rank((2, (3, 4))) -> 2``."""
    return len(t) if type(t) is tuple else 1


def depth(t: IntTuple) -> int:
    """Nesting depth (0 for an int). ``depth((2, (3, 4))) -> 2``."""
    if type(t) is not tuple:
        return 0
    return 1 + max((depth(x) for x in t), default=0)


def congruent(a: IntTuple, b: IntTuple) -> bool:
    """Same nesting profile. ``congruent((2, (3, 4)), (1, (2, 6))) -> True``."""
    if type(a) is not tuple:
        return type(b) is not tuple
    if type(b) is not tuple or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if (type(x) is tuple or type(y) is tuple) and not congruent(x, y):
            return False
    return True


def unflatten(flat, profile: IntTuple) -> IntTuple:
    """Rebuild the nesting of ``profile`` from the flat sequence ``flat``.

    ``unflatten((1, 2, 3), (0, (0, 0))) -> (1, (2, 3))``
    """
    it = iter(flat)

    def rec(p):
        if type(p) is tuple:
            return tuple(rec(x) for x in p)
        return next(it)

    return rec(profile)


def prefix_product(t: IntTuple, init: int = 1) -> IntTuple:
    """Exclusive prefix product, congruent to ``t``. ``prefix_product((2, (3, 4))) -> (1, (2, 6))``."""
    flat = leaves(t)
    out = []
    p = init
    for x in flat:
        out.append(p)
        p *= x
    if flat is t:
        return tuple(out)
    return unflatten(out, t)


def ceil_div(a: int, b: int) -> int:
    """Ceiling division of positive ints. ``ceil_div(7, 2) -> 4``."""
    return -(-a // b)


def idx2crd(idx: int, shape: IntTuple) -> IntTuple:
    """Column-major coordinate of a 1-D index; overflow goes to the last mode (CuTe).

    ``idx2crd(5, (2, 3)) -> (1, 2)``
    """
    if type(shape) is not tuple:
        return idx
    out = []
    n = len(shape)
    for i, s in enumerate(shape):
        sz = product(s)
        if i == n - 1:
            out.append(idx2crd(idx, s))
        else:
            out.append(idx2crd(idx % sz, s))
            idx //= sz
    return tuple(out)


def crd2idx(crd: IntTuple, shape: IntTuple, stride: IntTuple) -> int:
    """Offset of a coordinate (an int coordinate into a tuple mode is a 1-D index).

    ``crd2idx((1, 2), (2, 3), (1, 2)) -> 5``
    """
    if type(crd) is tuple:
        if type(shape) is not tuple or len(crd) != len(shape):
            raise ValueError(f"coordinate {crd} is not congruent to shape {shape}")
        return sum(crd2idx(c, s, d) for c, s, d in zip(crd, shape, stride))
    if type(shape) is not tuple:
        return crd * stride
    # int coordinate into a tuple mode: split it column-major, overflow into the last mode
    total = 0
    n = len(shape)
    for i, (s, d) in enumerate(zip(shape, stride)):
        if i == n - 1:
            total += crd2idx(crd, s, d)
        else:
            sz = product(s)
            total += crd2idx(crd % sz, s, d)
            crd //= sz
    return total
