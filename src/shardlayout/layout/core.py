"""The CuTe ``Layout``: a function from coordinates to offsets, ``shape:stride``.

Immutable and hashable; the stride defaults to column-major, as in CuTe.

    >>> L = Layout((4, 2), (1, 4)); L(5), str(L)
    (5, '(4,2):(1,4)')
"""

from __future__ import annotations

import numbers
import reprlib

from ..errors import LayoutError
from .inttuple import (
    IntTuple,
    congruent,
    crd2idx,
    depth,
    flatten,
    prefix_product,
    product,
)


def _repr(x) -> str:
    """A short repr of user input, safe on deep or huge values (``reprlib``)."""
    return reprlib.repr(x)


MAX_DEPTH = 64  # CuTe layouts nest a few levels; deeper is a mistake (and would exhaust Python's stack)


def _norm(x, what: str, positive: bool, where: str, level: int = 0):
    """Turn lists into tuples and numpy ints into ints; refuse anything else. A tuple that is
    already well formed is returned as is (the common case, checked without rebuilding it)."""
    if type(x) is int:
        return x if x > 0 or not positive else _int_leaf(x, what, positive, where)
    if type(x) is tuple and level < MAX_DEPTH:
        for y in x:
            if type(y) is not int or (positive and y <= 0):
                break
        else:
            return x
    if isinstance(x, (tuple, list)):
        if level >= MAX_DEPTH:
            raise too_deep(where, what, x, level)
        return tuple([_norm(y, what, positive, where, level + 1) for y in x])
    return _int_leaf(x, what, positive, where)


def too_deep(where: str, what: str, x, above: int = 0) -> LayoutError:
    """The LayoutError of ``what`` (a tuple/list found ``above`` levels down) nested past
    ``MAX_DEPTH``, naming its depth."""
    n = _nesting(x, above)
    if n is None:
        return LayoutError(f"{where}: {what} contains itself (a list nested in itself); give nested tuples of ints")
    return LayoutError(f"{where}: {what} is nested {n} levels deep, more than the {MAX_DEPTH} a layout may have; "
                       "flatten it (CuTe layouts nest a few levels)")


def check_depth(x, where: str, what: str):
    """``x`` itself when it is an int or a tuple/list nested at most ``MAX_DEPTH`` levels, else
    the LayoutError of :func:`too_deep` (checked without recursion)."""
    if isinstance(x, (tuple, list)):
        n = _nesting(x, 0)
        if n is None or not isinstance(n, int) or n > MAX_DEPTH:
            raise too_deep(where, what, x)
    return x


def _nesting(x, above: int, cap: int = 1 << 20):
    """The nesting depth of tuple/list ``x`` plus ``above``, found without recursion (each
    container once); "more than N" (text) past ``cap`` containers, None for one that contains
    itself."""
    depth: dict = {}
    stack = [(x, False)]
    on_path: set = set()
    seen = 0
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            depth[key] = 1 + max((depth[id(c)] for c in node if isinstance(c, (tuple, list))), default=0)
            continue
        if key in depth:
            continue
        if key in on_path:
            return None
        seen += 1
        if seen > cap:
            return f"more than {above + MAX_DEPTH}"
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in node if isinstance(c, (tuple, list)) and id(c) not in depth)
    return above + depth[id(x)]


def _int_leaf(x, what: str, positive: bool, where: str) -> int:
    """``x`` as an int leaf (numpy ints accepted), or a LayoutError saying why not."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise LayoutError(
            f"{where}: {what} entry {_repr(x)} is not an integer; {what}s are nested tuples of ints"
        )
    x = int(x)
    if positive and x <= 0:
        raise LayoutError(
            f"{where}: {what} entry {x} is not positive; every mode of a shape must have size >= 1"
        )
    return x


class _Slots:
    """The storage of a ``Layout``, still writable: :func:`_new` fills one with plain (fast)
    attribute stores, then makes it a ``Layout``, which refuses every write."""

    __slots__ = ("shape", "stride", "_hash", "_flat")


def _new(shape, stride) -> "Layout":
    """A Layout from an already valid ``shape`` and ``stride``, without checks (hot path).
    ``_new((4, 2), (1, 4)) == Layout((4, 2))``"""
    obj = _object_new(_Slots)
    obj.shape = shape
    obj.stride = stride
    obj._hash = obj._flat = None
    obj.__class__ = Layout  # from here on immutable
    return obj


_object_new = object.__new__


class Layout(_Slots):
    """A CuTe layout ``shape:stride`` (nested int tuples, congruent). Immutable.

    ``Layout((4, 2))`` is column-major ``(4,2):(1,4)``; ``Layout(8, 1)`` is ``8:1``.
    """

    __slots__ = ()

    def __init__(self, shape: IntTuple, stride: IntTuple | None = None):
        where = "Layout"
        shape = _norm(shape, "shape", True, where)
        if stride is None:
            stride = prefix_product(shape)
        else:
            stride = _norm(stride, "stride", False, where)
            if not congruent(shape, stride):
                raise LayoutError(
                    f"{where}: shape {_fmt(shape)} and stride {_fmt(stride)} are not congruent "
                    "(they must have the same nesting); give one stride per shape entry"
                )
        _set_shape(self, shape)
        _set_stride(self, stride)
        _set_hash(self, None)
        _set_flat(self, None)

    # -- immutability: only this module writes the slots (``_Slots``, ``_set_*``) ----------
    def __setattr__(self, name, value):
        raise AttributeError(
            f"Layout is immutable: cannot set {name!r} of {self}; build a new Layout instead"
        )

    def __delattr__(self, name):
        raise AttributeError(f"Layout is immutable: cannot delete {name!r} of {self}")

    # -- attributes ---------------------------------------------------------------------
    def _flats(self) -> tuple:
        """``(flat_shape, flat_stride)``, computed once per object."""
        f = self._flat
        if f is None:
            f = (flatten(self.shape), flatten(self.stride))
            _set_flat(self, f)
        return f

    @property
    def flat_shape(self) -> tuple:
        """Leaves of the shape. ``Layout(((2, 2), 4)).flat_shape -> (2, 2, 4)``."""
        return self._flats()[0]

    @property
    def flat_stride(self) -> tuple:
        """Leaves of the stride. ``Layout(((2, 2), 4)).flat_stride -> (1, 2, 4)``."""
        return self._flats()[1]

    def size(self) -> int:
        """Size of the domain. ``Layout((4, 2)).size() -> 8``."""
        return product(self.shape)

    def cosize(self) -> int:
        """One past the largest offset (CuTe: ``L(size-1) + 1``). ``Layout(4, 2).cosize() -> 7``."""
        return self(self.size() - 1) + 1

    @property
    def rank(self) -> int:
        """Number of top-level modes. ``Layout((4, 2)).rank -> 2``."""
        return len(self.shape) if type(self.shape) is tuple else 1

    @property
    def depth(self) -> int:
        """Nesting depth. ``Layout(((2, 2), 4)).depth -> 2``."""
        return depth(self.shape)

    def flatten(self) -> "Layout":
        """Same function, one level of modes. ``Layout(((2, 2), 4)).flatten() -> (2,2,4):(1,2,4)``."""
        if type(self.shape) is not tuple:
            return self
        return _new(*self._flats())

    def __len__(self) -> int:
        return self.rank

    def __getitem__(self, i: int) -> "Layout":
        """Mode ``i`` as a layout. ``Layout((4, 2))[1] -> 2:4``."""
        rank = self.rank
        if type(i) is slice and type(self.shape) is tuple:
            return _new(self.shape[i], self.stride[i])
        if type(i) is not int or not -rank <= i < rank:
            if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not -rank <= i < rank:
                raise LayoutError(f"Layout {self}: mode {_repr(i)} is not a mode of this rank-{rank} layout; give an "
                                  f"int from {-rank} to {rank - 1}" if rank else
                                  f"Layout {self}: mode {_repr(i)} does not exist; a rank-0 layout has no modes")
            i = int(i)
        if type(self.shape) is tuple:
            return _new(self.shape[i], self.stride[i])
        return self

    def __iter__(self):
        for i in range(self.rank):
            yield self[i]

    # -- evaluation ---------------------------------------------------------------------
    def __call__(self, *crd) -> int:
        """Offset at a 1-D index or a coordinate. ``Layout((4, 2))(1, 1) -> 5``."""
        if len(crd) == 1:
            crd = crd[0]
        if type(crd) is int:
            return self._eval_index(crd)
        return self.crd2idx(crd)

    def _eval_index(self, idx: int) -> int:
        fs, fd = self._flats()
        if not fs:  # the rank-0 layout ():() of size 1: its one offset is 0 (cosize 1, as CuTe's coshape says)
            return 0
        off = 0
        last = len(fs) - 1
        for k in range(last):
            s = fs[k]
            off += (idx % s) * fd[k]
            idx //= s
        return off + idx * fd[last]

    def crd2idx(self, crd: IntTuple) -> int:
        """Offset of a (possibly hierarchical) coordinate. ``Layout((4, 2)).crd2idx((1, 1)) -> 5``."""
        if type(crd) is not int:
            crd = _norm(crd, "coordinate", False, f"Layout {self}")
        try:
            return crd2idx(crd, self.shape, self.stride)
        except ValueError as e:
            raise LayoutError(f"Layout {self}: {e}") from None

    def idx2crd(self, idx: int) -> IntTuple:
        """Natural coordinate of a 1-D index. ``Layout((4, 2)).idx2crd(5) -> (1, 1)``."""
        from .inttuple import idx2crd

        if type(idx) is not int:
            if isinstance(idx, bool) or not isinstance(idx, numbers.Integral):
                raise LayoutError(f"Layout {self}: idx2crd index {_repr(idx)} is not an int; give a 1-D index, "
                                  f"e.g. 0 to {self.size() - 1}")
            idx = int(idx)
        return idx2crd(idx, self.shape)

    def values(self) -> list:
        """Offsets at every index of the domain, in order. ``Layout(3, 2).values() -> [0, 2, 4]``."""
        return [self._eval_index(i) for i in range(self.size())]

    # -- identity -----------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return self.shape == other.shape and self.stride == other.stride

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = hash((self.shape, self.stride))
            _set_hash(self, h)
        return h

    def __str__(self) -> str:
        return f"{_fmt(self.shape)}:{_fmt(self.stride)}"

    def __repr__(self) -> str:
        return f"Layout({self.shape!r}, {self.stride!r})"

    def __reduce__(self):
        return (Layout, (self.shape, self.stride))

    # -- text form ----------------------------------------------------------------------
    @staticmethod
    def parse(text: str) -> "Layout":
        """Read the text form. ``Layout.parse("(4,2):(1,4)") -> Layout((4, 2), (1, 4))``."""
        if not isinstance(text, str) or text.count(":") != 1 or not text.isascii():
            raise LayoutError(
                f"Layout.parse: {_repr(text)} is not 'shape:stride', e.g. '(4,2):(1,4)' or '8:1'"
            )
        left, right = text.split(":")
        try:
            shape = _parse_inttuple(left, text)
            stride = _parse_inttuple(right, text)
        except (RecursionError, ValueError) as e:  # nested too deep, an int of thousands of digits
            if isinstance(e, LayoutError):
                raise
            raise LayoutError(f"Layout.parse: {text[:40]!r}... is nested too deeply or has too long an int") from None
        return Layout(shape, stride)


# Writers of the slots of a Layout, bypassing its ``__setattr__`` (which refuses every
# write): the slot descriptors' own ``__set__``, bound once, for ``__init__`` and the caches.
_set_shape = _Slots.shape.__set__
_set_stride = _Slots.stride.__set__
_set_hash = _Slots._hash.__set__
_set_flat = _Slots._flat.__set__


def _fmt(t) -> str:
    if type(t) is tuple:
        return "(" + ",".join(_fmt(x) for x in t) + ")"
    return str(t)


def _parse_inttuple(s: str, whole: str):
    s = s.replace(" ", "")
    pos = 0

    def fail(msg):
        raise LayoutError(f"Layout.parse: {msg} in {whole!r}; expected e.g. '((2,2),4):((1,2),4)'")

    def value():
        nonlocal pos
        if pos < len(s) and s[pos] == "(":
            pos += 1
            items = []
            if pos < len(s) and s[pos] == ")":
                fail("empty tuple")
            while True:
                items.append(value())
                if pos < len(s) and s[pos] == ",":
                    pos += 1
                    continue
                if pos < len(s) and s[pos] == ")":
                    pos += 1
                    return tuple(items)
                fail(f"unexpected character at {pos} of {s!r}")
        start = pos
        if pos < len(s) and s[pos] in "+-":
            pos += 1
        while pos < len(s) and s[pos].isdigit():
            pos += 1
        if start == pos or not s[start:pos].lstrip("+-"):
            fail(f"expected an integer at {start} of {s!r}")
        return int(s[start:pos])

    v = value()
    if pos != len(s):
        fail(f"trailing text {s[pos:]!r}")
    return v


def make_layout(*layouts) -> Layout:
    """Concatenate layouts as the modes of a new layout.

    ``make_layout(Layout(4, 1), Layout(2, 4)) -> (4,2):(1,4)``; one argument gives a rank-1 tuple.
    """
    if len(layouts) == 1 and not isinstance(layouts[0], Layout):
        layouts = tuple(layouts[0])
    for x in layouts:
        if not isinstance(x, Layout):
            raise LayoutError(f"make_layout: {_repr(x)} is not a Layout; pass Layout objects")
    if any(type(x.shape) is tuple for x in layouts) and 1 + max(depth(x.shape) for x in layouts) > MAX_DEPTH:
        raise LayoutError(f"make_layout: the result would be nested {1 + max(depth(x.shape) for x in layouts)} "
                          f"levels deep, more than the {MAX_DEPTH} a layout may have; flatten a mode first")
    return _new(tuple(x.shape for x in layouts), tuple(x.stride for x in layouts))


def as_layout(x, where: str) -> Layout:
    """A Layout from a Layout, an int ``n`` (``n:1``) or text. ``as_layout(4, 'op') -> 4:1``."""
    if isinstance(x, Layout):
        return x
    if type(x) is int:
        if x <= 0:
            raise LayoutError(f"{where}: tiler {x} is not positive; an int tiler n means n:1")
        return _new(x, 1)
    if isinstance(x, str):
        return Layout.parse(x)
    raise LayoutError(f"{where}: {_repr(x)} is not a Layout, an int, or layout text")
