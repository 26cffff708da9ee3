"""The CuTe layout algebra, with C++ CuTe semantics and admissibility checks.

Every operation refuses an input whose answer would be wrong (composition's
stride- and shape-divisibility conditions, complements and inverses of
non-injective layouts) with a :class:`~shardlayout.errors.LayoutError` that names
the operation, the operands and the violated condition. Results are memoised:
layouts are immutable, so a repeated call is a dictionary look-up.

    >>> str(logical_divide(Layout(16, 1), 4))
    '(4,4):(1,4)'
"""

from __future__ import annotations

from ..caches import memo
from ..errors import LayoutError
from .core import MAX_DEPTH, Layout, _fmt, _new, _norm, _repr, as_layout, make_layout, too_deep
from .inttuple import _flatten_into, leaves, product

__all__ = [
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
]

_CACHE = 1 << 16

# How the hot paths stay cheap on a first call: the memos are keyed by the plain (shape, stride)
# tuples of the operands, hashed in C (no ``Layout.__hash__`` call); the computations run on flat
# lists of leaves, never on intermediate Layout objects; and only the result becomes a Layout.


def _txt(shape, stride) -> str:
    """The text form of ``shape:stride`` (``str`` of the Layout), for error messages."""
    return f"{_fmt(shape)}:{_fmt(stride)}"


def _flat2(shape: tuple, stride: tuple):
    """The leaves of a tuple ``shape`` and its ``stride``: the tuples themselves when flat,
    else two new lists. ``_flat2((2, (3, 4)), (1, (2, 6))) -> ([2, 3, 4], [1, 2, 6])``"""
    for x in shape:
        if type(x) is tuple:
            fs: list = []
            fd: list = []
            _flatten_into(shape, fs)
            _flatten_into(stride, fd)
            return fs, fd
    return shape, stride


def _tiler(t, where: str, level: int = 0):
    """Normalise a tiler: Layout, int, None, text, or a (nested) sequence of those."""
    if t is None or type(t) is int or isinstance(t, Layout):
        if type(t) is int and t <= 0:
            raise LayoutError(f"{where}: tiler {t} is not positive; an int tiler n means n:1")
        return t
    if isinstance(t, (tuple, list)):
        if level >= MAX_DEPTH:
            raise too_deep(where, "tiler", t, level)
        return tuple(_tiler(x, where, level + 1) for x in t)
    if isinstance(t, str):
        return Layout.parse(t)
    raise LayoutError(
        f"{where}: tiler {_repr(t)} is not a Layout, an int, None or a tuple of tilers"
    )


def _layout(x, where: str) -> Layout:
    if isinstance(x, Layout):
        return x
    return as_layout(x, where)


def _pack(shapes: list, strides: list) -> Layout:
    if len(shapes) == 1:
        return _new(shapes[0], strides[0])
    return _new(tuple(shapes), tuple(strides))


def _by_mode(where: str, A: Layout, tiler: tuple, f, keep_rest: bool) -> Layout:
    if len(tiler) > A.rank:
        raise LayoutError(
            f"{where}: tiler has {len(tiler)} modes but layout {A} has rank {A.rank}; "
            "a by-mode tiler may not have more modes than the layout"
        )
    modes = [f(A[i], tiler[i]) for i in range(len(tiler))]
    if keep_rest:
        modes.extend(A[i] for i in range(len(tiler), A.rank))
    return make_layout(modes)


# --------------------------------------------------------------------------------------
# coalesce / filter
# --------------------------------------------------------------------------------------


def _coalesce_lists(fs, fd):
    """Coalesced flat modes as two lists (``[1], [0]`` when everything is size 1)."""
    pairs = zip(fs, fd)
    for cs, cd in pairs:  # noqa: B007 - the first mode of size other than 1 starts the merge
        if cs != 1:
            break
    else:
        return [1], [0]
    shapes: list = []
    strides: list = []
    for s, d in pairs:
        if s != 1:
            if cs * cd == d:
                cs *= s
            else:
                shapes.append(cs)
                strides.append(cd)
                cs = s
                cd = d
    shapes.append(cs)
    strides.append(cd)
    return shapes, strides


def _coalesce_flat(fs, fd) -> Layout:
    shapes, strides = _coalesce_lists(fs, fd)
    return _pack(shapes, strides)


def coalesce(layout, profile=None) -> Layout:
    """Fewest modes with the same function on the domain (by mode with a tuple ``profile``).

    ``coalesce(Layout((2, (1, 6)), (1, (6, 2)))) -> 12:1``
    """
    if profile is None and type(layout) is Layout:
        shape = layout.shape
        if type(shape) is int:  # a single mode: nothing to merge, no memo probe
            return layout if shape != 1 else _new(1, 0)
        return _coalesce_of(shape, layout.stride)
    if type(layout) is not Layout:
        layout = _layout(layout, "coalesce")
    return _coalesce(layout, _tiler(profile, "coalesce"))


@memo(_CACHE)
def _coalesce(L: Layout, profile) -> Layout:
    if type(profile) is tuple:
        return _by_mode("coalesce", L, profile, _coalesce, True)
    return coalesce(L)


@memo(_CACHE)
def _coalesce_of(shape: tuple, stride: tuple) -> Layout:
    """Coalesce a layout given as plain int-tuples: :func:`_coalesce_lists` fused with the
    flattening and the packing, without its lists when one mode is left (the hot path)."""
    for x in shape:
        if type(x) is tuple:
            fs: list = []
            fd: list = []
            _flatten_into(shape, fs)
            _flatten_into(stride, fd)
            break
    else:
        fs = shape  # flat: no copies
        fd = stride
    pairs = zip(fs, fd)
    for cs, cd in pairs:  # noqa: B007 - the first mode of size other than 1 starts the merge
        if cs != 1:
            break
    else:
        return _new(1, 0)
    shapes = strides = None  # the finished modes, once there are any
    for s, d in pairs:
        if s != 1:
            if cs * cd == d:
                cs *= s
                continue
            if shapes is None:
                shapes = [cs]
                strides = [cd]
            else:
                shapes.append(cs)
                strides.append(cd)
            cs = s
            cd = d
    if shapes is None:
        return _new(cs, cd)
    shapes.append(cs)
    strides.append(cd)
    if fs is shape and len(shapes) == len(shape):
        return _new(shape, stride)  # already coalesced: share the tuples
    return _new(tuple(shapes), tuple(strides))


def filter(layout, profile=None) -> Layout:  # noqa: A001 - CuTe's name
    """Coalesce after dropping stride-0 modes. ``filter(Layout((4, 2), (0, 1))) -> 2:1``."""
    return _filter(_layout(layout, "filter"), _tiler(profile, "filter"))


@memo(_CACHE)
def _filter(L: Layout, profile) -> Layout:
    if type(profile) is tuple:
        return _by_mode("filter", L, profile, _filter, True)
    fs, fd = L._flats()
    return _coalesce_flat([1 if d == 0 else s for s, d in zip(fs, fd)], fd)


# --------------------------------------------------------------------------------------
# composition
# --------------------------------------------------------------------------------------


def _unit_tail_extends_differently(fs, fd) -> bool:
    """True when A ends in a size-1 mode that coalescing drops and that would have
    extended A past its domain differently (C++ CuTe overflows into it, pycute into the
    previous mode)."""
    if fs[-1] != 1:
        return False
    d = fd[-1]
    for i in range(len(fs) - 2, -1, -1):  # the last mode before it of size other than 1
        if fs[i] != 1:
            return fs[i] * fd[i] != d
    return d != 0


def _leaves_domain(bshape, bstride, size: int) -> bool:
    hi = lo = 0
    for s, d in zip(leaves(bshape), leaves(bstride)):
        if d > 0:
            hi += (s - 1) * d
        else:
            lo += (s - 1) * d
    return lo < 0 or hi >= size


def _cname(ctx) -> str:
    """``composition(A, B)`` for the operands ``ctx = (A.shape, A.stride, B.shape, B.stride)``."""
    return f"composition({_txt(ctx[0], ctx[1])}, {_txt(ctx[2], ctx[3])})"


def _compose_int(As, Ad, s: int, d: int, ctx, used: list) -> tuple:
    """A o (s:d) for an integral mode of B; returns (shape, stride).

    ``used[m]`` accumulates the largest coordinate of A's mode ``m`` this mode of B
    reaches, so that the caller can check B's modes add without carries."""
    if d == 0:
        return s, 0
    R = len(As)
    if R == 1:
        return s, d * Ad[0]
    if d < 0:
        raise LayoutError(
            f"{_cname(ctx)}: B has the negative stride {d} and A is not linear "
            "(it has more than one mode after coalescing), so A o B is not a layout; "
            "negative tiler strides are admissible only over a single-mode A"
        )
    rshape: list = []
    rstride: list = []
    rest_shape = s
    rest_stride = d
    for i in range(R - 1):
        cs = As[i]
        if rest_stride % cs == 0:
            next_shape = 1
            next_stride = rest_stride // cs
        elif cs % rest_stride == 0:
            next_shape = cs // rest_stride
            next_stride = 1
        else:
            raise LayoutError(
                f"{_cname(ctx)}: stride divisibility condition violated: B's stride "
                f"{rest_stride} reaches A's mode of size {cs} and neither divides the other, so "
                "A o B is not a layout; use a tiler whose strides follow A's mode boundaries"
            )
        if next_shape == 1 or rest_shape == 1:
            rest_stride = next_stride
            continue
        new_shape = next_shape if next_shape < rest_shape else rest_shape
        if rest_shape % new_shape:
            raise LayoutError(
                f"{_cname(ctx)}: shape divisibility condition violated: B's mode of "
                f"size {rest_shape} must be split by A's mode of size {new_shape}, which does "
                "not divide it, so A o B is not a layout; use a tiler whose sizes divide "
                "A's modes"
            )
        rshape.append(new_shape)
        rstride.append(rest_stride * Ad[i])
        used[i] += rest_stride * (new_shape - 1)
        rest_shape //= new_shape
        rest_stride = next_stride
    if not rshape:
        return rest_shape, rest_stride * Ad[R - 1]
    if rest_shape != 1:
        rshape.append(rest_shape)
        rstride.append(rest_stride * Ad[R - 1])
    if len(rshape) == 1:
        return rshape[0], rstride[0]
    return tuple(rshape), tuple(rstride)


def _compose_rec(As, Ad, shape, stride, ctx, used):
    if type(shape) is not tuple:
        return _compose_int(As, Ad, shape, stride, ctx, used)
    rs: list = []
    rd: list = []
    for s, d in zip(shape, stride):
        if type(s) is tuple:
            s, d = _compose_rec(As, Ad, s, d, ctx, used)
        else:
            s, d = _compose_int(As, Ad, s, d, ctx, used)
        rs.append(s)
        rd.append(d)
    return tuple(rs), tuple(rd)


def _scale(stride, k: int):
    """Every leaf of ``stride`` times ``k``. ``_scale((1, (2, 0)), 3) -> (3, (6, 0))``."""
    if type(stride) is not tuple:
        return stride * k
    return tuple([_scale(d, k) if type(d) is tuple else d * k for d in stride])


def _compose(ashape, astride, bshape, bstride) -> tuple:
    """``A o B`` on plain int-tuples: the result's ``(shape, stride)``, or a LayoutError."""
    if bstride == 0 and type(bshape) is int:
        return bshape, 0  # a constant B reads A(0) == 0 (and stays inside A's domain)
    fs = leaves(ashape)
    fd = astride if fs is ashape else leaves(astride)
    if fs and fs[-1] == 1 and _unit_tail_extends_differently(fs, fd):  # (a rank-0 A is 1:0: fs is empty)
        size = product(ashape)
        if _leaves_domain(bshape, bstride, size):
            raise LayoutError(
                f"{_cname((ashape, astride, bshape, bstride))}: B reaches past A's domain "
                f"(size {size}), and A ends in a size-1 mode, so how A extends beyond its "
                "domain is ambiguous (C++ CuTe follows the size-1 mode's stride, pycute the "
                "previous mode's); drop the trailing size-1 mode of A or keep B inside A's domain"
            )
    As, Ad = _coalesce_lists(fs, fd)
    if len(As) == 1:  # A is linear: B with its strides scaled, no condition to check
        k = Ad[0]
        return bshape, (bstride if k == 1 else _scale(bstride, k))
    ctx = (ashape, astride, bshape, bstride)
    used = [0] * len(As)
    if type(bshape) is not tuple:
        return _compose_int(As, Ad, bshape, bstride, ctx, used)
    shape, stride = _compose_rec(As, Ad, bshape, bstride, ctx, used)
    # B's modes are composed one by one; their sum is A's sum only if, in every mode of A
    # but the last, the coordinates they reach add up without a carry.
    for m in range(len(As) - 1):
        if used[m] >= As[m]:
            raise LayoutError(
                f"{_cname(ctx)}: B's modes together reach coordinate {used[m]} "
                f"of A's mode of size {As[m]} (after coalescing A), so "
                "composing them one by one carries into the next mode and A o B is not "
                "a layout (left-distributivity fails); split B so its modes hit "
                "disjoint modes of A"
            )
    return shape, stride


def composition(a, b) -> Layout:
    """``A o B``: the layout ``i -> A(B(i))`` with B's shape.

    ``composition(Layout(20, 2), Layout((5, 4), (4, 1))) -> (5,4):(8,2)``. A tuple tiler
    composes by mode and, as in C++ CuTe, drops the modes of A it does not touch.
    """
    if type(a) is not Layout:
        a = _layout(a, "composition")
    if type(b) is Layout:
        return _composition_of(a.shape, a.stride, b.shape, b.stride)
    if type(b) is int and b > 0:
        return _composition_of(a.shape, a.stride, b, 1)
    return _composition(a, _tiler(b, "composition"))


def _composition(A: Layout, b) -> Layout:
    """``A o b`` for a normalised tiler ``b`` (None, int, Layout or tuple of tilers)."""
    if b is None:
        return A
    if type(b) is tuple:
        return _composition_by_mode(A, b)
    if type(b) is int:
        return _composition_of(A.shape, A.stride, b, 1)
    return _composition_of(A.shape, A.stride, b.shape, b.stride)


@memo(_CACHE)
def _composition_by_mode(A: Layout, b: tuple) -> Layout:
    return _by_mode("composition", A, b, _composition, False)


@memo(_CACHE)
def _composition_of(ashape, astride, bshape, bstride) -> Layout:
    return _new(*_compose(ashape, astride, bshape, bstride))


# --------------------------------------------------------------------------------------
# complement
# --------------------------------------------------------------------------------------


def complement(layout, cotarget=None) -> Layout:
    """The ordered layout of the offsets ``layout`` does not reach, up to ``cotarget``.

    ``complement(Layout(4, 1), 24) -> 6:4``; ``cotarget`` defaults to ``cosize(filter(layout))``.
    """
    L = layout if type(layout) is Layout else _layout(layout, "complement")
    if cotarget is not None and type(cotarget) is not int:
        if isinstance(cotarget, (tuple, list)):
            cotarget = product(_norm(cotarget, "cotarget", True, f"complement({L}, ...)"))
    if cotarget is not None and (type(cotarget) is not int or cotarget <= 0):
        raise LayoutError(
            f"complement({L}, {_repr(cotarget)}): cotarget must be a positive int (or a shape)"
        )
    return _complement(L.shape, L.stride, cotarget)


@memo(_CACHE)
def _complement(shape, stride, cotarget) -> Layout:
    return _new(*_complement_modes(shape, stride, cotarget))


def _complement_modes(shape, stride, cotarget) -> tuple:
    """The complement of ``shape:stride`` on plain int-tuples: its ``(shape, stride)``, coalesced."""
    if type(shape) is int:
        modes = [(stride, shape)] if shape != 1 and stride != 0 else []
    else:
        fs, fd = _flat2(shape, stride)
        modes = [(d, s) for s, d in zip(fs, fd) if s != 1 and d != 0]
    explicit = cotarget is not None
    if not explicit:
        cotarget = 1
        for d, s in modes:
            cotarget += (s - 1) * d
    if not modes:
        return (cotarget, 1) if cotarget != 1 else (1, 0)
    modes.sort()
    if modes[0][0] < 0:
        raise LayoutError(
            f"complement({_txt(shape, stride)}, {cotarget}): stride {modes[0][0]} is negative; "
            "the complement is defined for layouts with non-negative strides"
        )
    # The gaps (d // cur):cur between the sorted modes, then the tail up to the cotarget. Each
    # gap ends below the next one's stride (cur < s*d), so no two of them merge: coalescing
    # them only drops the gaps of size 1.
    rs: list = []
    rd: list = []
    cur = 1
    divisible = True
    for d, s in modes:
        if d < cur:
            raise LayoutError(
                f"complement({_txt(shape, stride)}, {cotarget}): layout is not injective (its "
                f"mode {s}:{d} overlaps the offsets below {cur} reached by the smaller-stride "
                "modes); the complement of a non-injective layout is undefined"
            )
        if d != cur:
            q, r = divmod(d, cur)
            if r:
                divisible = False
            if q != 1:
                rs.append(q)
                rd.append(cur)
        cur = s * d
    q = -(-cotarget // cur)
    if q != 1:
        rs.append(q)
        rd.append(cur)
    if len(rs) == 1:
        rs, rd = rs[0], rd[0]
    elif rs:
        rs, rd = tuple(rs), tuple(rd)
    else:
        rs, rd = 1, 0
    if not divisible:
        _check_loose_complement(
            _new(shape, stride), _new(rs, rd), cotarget if explicit else 1,
            f"complement({_txt(shape, stride)}, {cotarget})",
        )
    return rs, rd


def _check_loose_complement(L: Layout, R: Layout, cotarget: int, what: str) -> None:
    """Where strides do not divide, the complement is valid only if it still reaches the
    cotarget and misses every offset of L: check both (pycute does not)."""
    if L.cosize() - 1 + R.cosize() < cotarget:
        raise LayoutError(
            f"{what}: the strides of the layout do not divide each other, and the largest "
            f"ordered complement, {R}, does not reach the cotarget {cotarget} "
            "(divisibility condition); choose a layout whose strides divide each other"
        )
    if L.size() * R.size() > 1 << 22:
        raise LayoutError(
            f"{what}: the strides of the layout do not divide each other, and the layout is "
            "too large to check the complement's disjointness; use dividing strides"
        )
    lv = set(L.values())
    if any(v in lv for v in R.values()[1:]):
        raise LayoutError(
            f"{what}: the strides of the layout do not divide each other, and {R} would "
            "reach offsets the layout already reaches (not disjoint)"
        )


# --------------------------------------------------------------------------------------
# inverses
# --------------------------------------------------------------------------------------


def right_inverse(layout) -> Layout:
    """Largest compact ``R`` with ``layout(R(i)) == i`` for every ``i < size(R)``.

    ``right_inverse(Layout((4, 2), (2, 1))) -> (2,4):(4,1)``
    """
    return _right_inverse(_layout(layout, "right_inverse"))


@memo(_CACHE)
def _right_inverse(L: Layout) -> Layout:
    ls, ld = _coalesce_lists(*L._flats())
    pre = [1]
    for s in ls:
        pre.append(pre[-1] * s)
    order = sorted(range(len(ls)), key=ld.__getitem__)
    rs = [1]
    rd = [0]
    cur = 1
    for i in order:
        if ld[i] == cur:
            rs.append(ls[i])
            rd.append(pre[i])
            cur = ls[i] * ld[i]
    return _coalesce_flat(rs, rd)


def left_inverse(layout) -> Layout:
    """``R`` with ``R(layout(i)) == i`` for every ``i`` in the domain (injective layouts).

    ``left_inverse(Layout((4, 2), (2, 1))) -> (2,4):(4,1)``
    """
    return _left_inverse(_layout(layout, "left_inverse"))


@memo(_CACHE)
def _left_inverse(L: Layout) -> Layout:
    ls, ld = _coalesce_lists(*L._flats())
    if ls == [1]:
        return _new(1, 0)
    for s, d in zip(ls, ld):
        if d < 0:
            raise LayoutError(
                f"left_inverse({L}): stride {d} is negative; the left inverse is defined here for "
                "layouts with non-negative strides"
            )
        if d == 0:
            raise LayoutError(
                f"left_inverse({L}): mode {s}:0 maps {s} indices to one offset, so the layout is not "
                "injective and has no left inverse"
            )
    pre = [1]
    for s in ls:
        pre.append(pre[-1] * s)
    order = sorted(range(len(ls)), key=ld.__getitem__)
    rs: list = []
    rd: list = [0]
    prev_d = 1
    prev_end = 1
    for i in order:
        d = ld[i]
        if d < prev_end:
            raise LayoutError(
                f"left_inverse({L}): mode {ls[i]}:{d} overlaps the offsets below {prev_end} of the "
                "smaller-stride modes, so the layout is not injective (no left inverse)"
            )
        if d % prev_end:
            raise LayoutError(
                f"left_inverse({L}): stride {d} is not a multiple of {prev_end}, the extent of the "
                "smaller-stride modes, so the layout and its complement do not tile a "
                "range and CuTe's left inverse would be wrong (divisibility condition)"
            )
        rs.append(d // prev_d)
        rd.append(pre[i])
        prev_d = d
        prev_end = d * ls[i]
    rs.append(ls[order[-1]])
    return _coalesce_flat(rs, rd)


# --------------------------------------------------------------------------------------
# divides
# --------------------------------------------------------------------------------------


def _relabel(where, f, *args):
    """Call ``f``; prefix any LayoutError with ``where(*...)`` (built only on error)."""
    try:
        return f(*args)
    except LayoutError as e:
        raise LayoutError(f"{where() if callable(where) else where}: {e}") from None


def logical_divide(a, b) -> Layout:
    """``A o (B, B*)``: B's tile as mode 0, the rest as mode 1 (by mode for a tuple tiler).

    ``logical_divide(Layout(16, 1), 4) -> (4,4):(1,4)``
    """
    if type(a) is not Layout:
        a = _layout(a, "logical_divide")
    if type(b) is Layout:
        return _divide(a.shape, a.stride, b.shape, b.stride)
    if type(b) is int and b > 0:
        return _divide(a.shape, a.stride, b, 1)
    return _logical_divide(a, _tiler(b, "logical_divide"))


def _logical_divide(A: Layout, b) -> Layout:
    """Logical divide by a normalised tiler ``b`` (None, int, Layout or tuple of tilers)."""
    if b is None:
        return A
    if type(b) is tuple:
        return _logical_divide_by_mode(A, b)
    if type(b) is int:
        return _divide(A.shape, A.stride, b, 1)
    return _divide(A.shape, A.stride, b.shape, b.stride)


@memo(_CACHE)
def _logical_divide_by_mode(A: Layout, b: tuple) -> Layout:
    return _by_mode("logical_divide", A, b, _logical_divide, True)


@memo(_CACHE)
def _divide(ashape, astride, bshape, bstride) -> Layout:
    """``A o (B, complement(B, size(A)))`` on plain int-tuples, as one Layout."""
    try:
        cs, cd = _complement_modes(bshape, bstride, product(ashape))
        shape, stride = _compose(ashape, astride, (bshape, cs), (bstride, cd))
    except LayoutError as e:
        raise LayoutError(
            f"logical_divide({_txt(ashape, astride)}, {_txt(bshape, bstride)}): {e}"
        ) from None
    return _new(shape, stride)


def _hier_unzip(splitter, A: Layout, b, where: str) -> Layout:
    if b is None:
        return make_layout(_new(1, 0), A)
    if type(b) is tuple:
        if len(b) > A.rank:
            raise LayoutError(
                f"{where}: tiler has {len(b)} modes but layout {A} has rank {A.rank}"
            )
        split = [_hier_unzip(splitter, A[i], b[i], where) for i in range(len(b))]
        first = make_layout([x[0] for x in split])
        second = make_layout([x[1] for x in split] + [A[i] for i in range(len(b), A.rank)])
        return make_layout(first, second)
    return splitter(A, b)


def zipped_divide(a, b) -> Layout:
    """Logical divide with the tiles gathered in mode 0 and the rests in mode 1.

    ``zipped_divide(Layout((4, 6)), (2, 3)) -> ((2,3),(2,2)):((1,4),(2,12))``
    """
    return _zipped_divide(_layout(a, "zipped_divide"), _tiler(b, "zipped_divide"))


@memo(_CACHE)
def _zipped_divide(A: Layout, b) -> Layout:
    return _hier_unzip(_logical_divide, A, b, "zipped_divide")


def tiled_divide(a, b) -> Layout:
    """Zipped divide with the rest modes unpacked: ``((tile), rest0, rest1, ...)``.

    ``tiled_divide(Layout((4, 6)), (2, 3)) -> ((2,3),2,2):((1,4),2,12)``
    """
    r = zipped_divide(a, b)
    return make_layout([r[0]] + list(r[1]))


def flat_divide(a, b) -> Layout:
    """Zipped divide with both modes unpacked: ``(tile0, tile1, ..., rest0, rest1, ...)``.

    ``flat_divide(Layout((4, 6)), (2, 3)) -> (2,3,2,2):(1,4,2,12)``
    """
    r = zipped_divide(a, b)
    return make_layout(list(r[0]) + list(r[1]))


# --------------------------------------------------------------------------------------
# products
# --------------------------------------------------------------------------------------


def logical_product(a, b) -> Layout:
    """``(A, A* o B)``: A repeated as B says (by mode for a tuple tiler; an int n is n:1).

    ``logical_product(Layout((2, 2), (4, 1)), 6) -> ((2,2),(2,3)):((4,1),(2,8))``
    """
    return _logical_product(_layout(a, "logical_product"), _tiler(b, "logical_product"))


@memo(_CACHE)
def _logical_product(A: Layout, b) -> Layout:
    if b is None:
        return A
    if type(b) is tuple:
        return _by_mode("logical_product", A, b, _logical_product, True)
    B = _new(b, 1) if type(b) is int else b

    def where():
        return f"logical_product({A}, {B})"

    comp = _relabel(where, _complement, A.shape, A.stride, A.size() * B.cosize())
    return make_layout(A, _relabel(where, _composition, comp, B))


def zipped_product(a, b) -> Layout:
    """Logical product with the blocks in mode 0 and the repetitions in mode 1.

    ``zipped_product(Layout(2), 3) -> (2,3):(1,2)``
    """
    return _zipped_product(_layout(a, "zipped_product"), _tiler(b, "zipped_product"))


@memo(_CACHE)
def _zipped_product(A: Layout, b) -> Layout:
    return _hier_unzip(_logical_product, A, b, "zipped_product")


def tiled_product(a, b) -> Layout:
    """Zipped product with the repetition modes unpacked. ``tiled_product(Layout(2), 3) -> (2,3):(1,2)``."""
    r = zipped_product(a, b)
    return make_layout([r[0]] + list(r[1]))


def _pad(L: Layout, R: int) -> Layout:
    if type(L.shape) is not tuple:
        shapes, strides = [L.shape], [L.stride]
    else:
        shapes, strides = list(L.shape), list(L.stride)
    while len(shapes) < R:
        shapes.append(1)
        strides.append(0)
    return _new(tuple(shapes), tuple(strides))


def _zip_product(a, b, where: str, blocked: bool) -> Layout:
    A = _layout(a, where)
    B = _layout(b, where)
    R = max(A.rank, B.rank)
    r = _relabel(where, _logical_product, _pad(A, R), _pad(B, R))
    first, second = r[0], r[1]
    if type(second.shape) is not tuple:
        second = _pad(second, 1)
    modes = []
    for i in range(R):
        x, y = first[i], second[i]
        modes.append(make_layout(x, y) if blocked else make_layout(y, x))
    return make_layout(modes)


def blocked_product(a, b) -> Layout:
    """Mode-wise product with A's block inner: mode i is ``(A_i, B'_i)``.

    ``blocked_product(Layout((2, 2)), Layout((3, 4)))`` tiles a 2x2 block 3x4 times.
    """
    return _zip_product(a, b, "blocked_product", True)


def raked_product(a, b) -> Layout:
    """Mode-wise product with A's block outer (interleaved): mode i is ``(B'_i, A_i)``.

    ``raked_product(Layout((2, 2)), Layout((3, 4)))`` rakes a 2x2 block over 3x4.
    """
    return _zip_product(a, b, "raked_product", False)


def clear_caches() -> None:
    """Forget every memoised result of the layout algebra (for benchmarks of first calls).
    ``clear_caches()``; :func:`shardlayout.caches.clear_caches` clears every memo of the package."""
    for f in _MEMOS:
        f.cache_clear()


_MEMOS = (
    _coalesce, _coalesce_of, _filter, _composition_by_mode, _composition_of, _complement, _right_inverse,
    _left_inverse, _logical_divide_by_mode, _divide, _zipped_divide, _logical_product,
    _zipped_product,
)
