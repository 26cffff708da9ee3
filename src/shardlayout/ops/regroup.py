"""Regrouping: a view (reshape) moves no data, it cuts the input's flat factor list where the
output dims' boundaries fall.

Read every dim's factors outer to inner, dim after dim: that is one flat list, the mixed
radix of the row-major index of the whole tensor. A row-major reshape keeps that index, so
the output dims are consecutive stretches of the same list. Walk the list against the
output boundaries (the common refinement): a local factor splits freely, a factor on a
mesh axis that a boundary cuts becomes two sub-axes (major piece outside, minor inside)::

    mesh dp=2, tp=4;  (8,12) [dp*4, tp*3] -> (16,6)

    flat        dp(2)   4   tp(4)   3             2*4*4*3 = 96
                            2 | 2                 the boundary at 16 = 2*4*2 cuts tp 2|2
    cut at 16   [dp  4  tp:(1)2] [tp:(2)2  3]
    output      [dp*4*tp:(1)2, tp:(2)2*3]         exact: no data moves
    sub-axes off: gather tp, the piece in the way:  [dp*4, 12] -> [dp*8, 6]

    >>> from shardlayout import Mesh, Sharding
    >>> s = Sharding.parse("[dp*4, tp*3]", Mesh.parse("dp=2,tp=4"))
    >>> target, out = regroup(s, (16, 6))
    >>> str(out), target == s
    ('[dp*4*tp:(1)2, tp:(2)2*3]', True)
    >>> target, out = regroup(s, (16, 6), subaxes=False)   # DTensor cannot say tp:(1)2
    >>> str(target), str(out)
    ('[dp*4, 12]', '[dp*8, 6]')

The flat list is made of *pieces* (``Piece``): an even factor (``LOCAL`` or on an ``AXIS``,
one mixed-radix digit), the uneven ``TAIL`` of a dim (from its first factor that does not
divide it to its end: ``torch.chunk`` cuts, so it ends an output dim and moves as a whole
unless its chunks line up with the output's), or a ``PROGRAM`` (a ``ChunkProgram`` dim,
DTensor's cuts kept verbatim: a whole output dim). The walk builds them as plain tuples of
``Piece``'s fields, by position (a NamedTuple costs ten times a tuple to make); an ``Obstacle``
holds its piece as a ``Piece``. Tails and programs of extent 1 hold all or nothing and float to
any dim::

    (5,4) [x*3 of 5, 4]      flat  [x 3 of 5] 4
    -> (5,2,2)               [x*3 of 5] [2] [2]        the tail ends dim 0: exact
    -> (20,)                 the tail would merge with 4 and change its chunks: gather x

The algorithm is pure steps and a driver. ``fit`` walks the pieces with a cursor (output
dim, room left in it); ``place_even``, ``place_tail`` and ``place_program`` each place one
piece or return the ``Obstacle`` in the way (a value: the piece, and how much of its axis
may stay as an outer sub-axis). ``regroup`` gathers the obstacle (``gather``) and fits
again, so only the piece in the way moves. With sub-axes off, an output that DTensor
placements cannot say is one more obstacle (``dtensor_obstacle``). ``output`` puts the dims
``fit`` built in canonical form.

``regroup`` first tries ``regroup_even``: the same walk in one pass over plain factors, for an
even input with nothing in the way (most views). It builds the output's canonical dims as it
goes and returns None on anything else (an uneven dim, a chunk program, a boundary that fits
no factor, a cut axis with sub-axes off), which the walk then handles
(``tests/ops/test_regroup_even.py`` checks the two agree). The walk asks it again after a
gather that leaves the input even (no tail, no program left); a gather that leaves nothing
sharded leaves every dim local (``gather_last``), with no walk left to do. Both check the
shape they are given; ``even_inferred`` and ``walk_inferred`` are the same on a shape already
inferred (the view rule's bound shape, checked there once, and the walk's own).

Worked examples: ``tests/ops/test_regroup.py`` has one per step (``test_place_even_design_example``
and ``test_regroup_design_example`` are the picture above; ``test_place_tail_*`` and
``test_place_program_*`` the uneven ones); ``tests/ops/test_view.py``: ``test_design_example_needs_sub_axes``,
``test_dtensor_crash_nested_shard_view``, ``test_shardy_sub_axes_512``,
``test_uneven_flatten_stays_local``, ``test_uneven_dim_cut_by_a_view_gathers_it``.
"""

from __future__ import annotations

from enum import Enum
from itertools import product as cartesian
from math import gcd, prod
from typing import NamedTuple

from ..caches import memo
from ..config import settings
from ..errors import NotRepresentable, ShardingSpecError
from ..sharding import Factor, Sharding
from ..sharding.core import ChunkProgram, _built, _product, _trusted_dim, chain_extent
from ..sharding.factors import chunk_counts
from ..sharding.shards import _program_ranges, dim_ranges

_new = tuple.__new__  # Factor(...) without the Python-level NamedTuple __new__: the hot path


class Kind(str, Enum):
    """What a piece of the flat factor list is. ``Kind.TAIL.value -> 'tail'``"""

    LOCAL = "local"  # a local factor of a dim cut evenly: a mixed-radix digit every device has
    AXIS = "axis"  # a factor on a mesh axis (or sub-axis) of a dim cut evenly
    TAIL = "tail"  # the uneven tail of a dim (torch.chunk cuts)
    PROGRAM = "program"  # a ChunkProgram dim (DTensor's cuts)


LOCAL, AXIS, TAIL, PROGRAM = Kind.LOCAL, Kind.AXIS, Kind.TAIL, Kind.PROGRAM


class Piece(NamedTuple):
    """A stretch of the flat factor list: one even factor (``LOCAL`` or on an ``AXIS``), the
    uneven ``TAIL`` of a dim or a ``PROGRAM`` dim; ``size`` is its extent, ``dim``/``index``
    where it sits in the input (-1: made by the walk, e.g. merged local factors; never
    gathered).

    ``Piece(AXIS, (Factor(2, "dp"),), 2, 0, 0).sharded -> True``
    """

    kind: Kind
    factors: tuple  # LOCAL, AXIS: (Factor,); TAIL: the tail's factors; PROGRAM: (ChunkProgram,)
    size: int
    dim: int = -1
    index: int = -1

    @property
    def sharded(self) -> bool:
        """Is it on a mesh axis (a tail or program always is)? ``local(4).sharded -> False``."""
        return self.kind != LOCAL


class Obstacle(NamedTuple):
    """The piece in the way: gather it, keeping the outer ``keep`` of its axis as a sub-axis
    (1: gather it whole); ``why`` says what the boundary did.

    ``Obstacle(piece, 2, "a boundary cuts 4 at 6")``
    """

    piece: Piece
    keep: int
    why: str


def obstacle(piece: tuple, keep: int, why: str) -> Obstacle:
    """The ``Obstacle`` of a piece of the walk (a plain tuple there), its piece made a ``Piece``.
    ``obstacle((AXIS, (Factor(4, "x"),), 4, 0, 0), 2, "cut").piece.kind -> Kind.AXIS``"""
    return _new(Obstacle, (_new(Piece, piece), keep, why))


def local(size: int) -> Piece:
    """A local even piece made by the walk. ``local(3) -> Piece(LOCAL, (Factor(3),), 3)``"""
    return Piece(LOCAL, (Factor(size),), size)


# ------------------------------------------------------------------------------------------
# the flat factor list
# ------------------------------------------------------------------------------------------


def flat_pieces(s: Sharding, known: int = -1) -> tuple:
    """``(pieces, floating)``: the input's pieces (plain tuples of ``Piece``'s fields), outer to
    inner, adjacent local factors merged (even across dims). Tails and programs of extent 1 hold all or nothing on each
    device and sit anywhere: they are set aside in ``floating`` (the local pieces around
    them merge) and placed last. ``known``: where the view rule's evenness check stopped (-1: no
    check); the dims before are even and not programs, dim ``known`` uneven unless a program, and
    their products are not taken again.

    ``[dp*4, tp*3]`` -> ``(dp 4 tp 3)``; ``[x*3 of 5, 4]`` -> ``(TAIL(x*3 of 5) 4)``;
    ``[2, x of 1, 3]`` -> ``(6)`` and floating ``(TAIL(x of 1))``.
    """
    out: list = []
    floating: list = []
    first = None  # the first piece of the run of local factors not yet in out
    run = 0  # the run's size (its pieces merged: 0 while it is one factor)
    shape = s.shape
    d = -1
    for fs in s.dims:
        d += 1
        n = shape[d]
        if type(fs) is ChunkProgram:
            if n == 1:
                floating.append((PROGRAM, (fs,), n, d, 0))  # the local pieces around still merge
            else:
                if first is not None:
                    out.append(first if not run else (LOCAL, (_new(Factor, (run, None, 1)),), run, -1, -1))  # run_piece
                    first = None
                out.append((PROGRAM, (fs,), n, d, 0))
            continue
        if d < known:  # seen even by the caller
            uneven = False
        elif d == known:  # seen uneven (not a program: that is above)
            uneven = True
        else:
            p = 1
            for f in fs:
                p *= f[0]
            uneven = p != n
        if uneven:  # even_prefix(n, fs) inlined; q: the product of the even prefix
            j, q, last_j = 0, 1, len(fs) - 1
            while j < last_j and n % (q * fs[j][0]) == 0:
                q *= fs[j][0]
                j += 1
            digits = fs[:j]
        else:  # even dim: every factor is a digit
            digits = fs
        i = 0
        for f in digits:
            size, axis, _ = f
            if axis is not None:
                if first is not None:
                    out.append(first if not run else (LOCAL, (_new(Factor, (run, None, 1)),), run, -1, -1))  # run_piece
                    first = None
                out.append((AXIS, (f,), size, d, i))
            elif first is None:
                first, run = (LOCAL, (f,), size, d, i), 0
            else:  # merged into the run: one Factor for the whole run, made when it ends
                run = (run or first[2]) * size
            i += 1
        if uneven and fs:  # the tail: from the first factor that does not divide the dim on
            size = n // q
            if size == 1:
                floating.append((TAIL, fs[j:], size, d, j))
            else:
                if first is not None:
                    out.append(first if not run else (LOCAL, (_new(Factor, (run, None, 1)),), run, -1, -1))  # run_piece
                    first = None
                out.append((TAIL, fs[j:], size, d, j))
    if first is not None:
        out.append(first if not run else (LOCAL, (_new(Factor, (run, None, 1)),), run, -1, -1))  # run_piece
    return tuple(out), tuple(floating)


def run_piece(first: tuple, run: int) -> tuple:
    """The piece of a run of adjacent local factors (``flat_pieces``): its ``first`` piece when
    it is one factor (``run`` 0), else one local piece of size ``run`` made by the walk.

    ``run_piece((LOCAL, (Factor(2),), 2, 0, 0), 6) -> (LOCAL, (Factor(6),), 6, -1, -1)``
    """
    return first if not run else (LOCAL, (_new(Factor, (run, None, 1)),), run, -1, -1)


def even_prefix(n: int, fs: tuple) -> int:
    """How many leading factors cut a dim of size ``n`` evenly: all of them on an even dim;
    on an uneven one, those whose product divides ``n`` (never the last).

    ``even_prefix(12, (Factor(2, "x"), Factor(6))) -> 2``;
    ``even_prefix(10, (Factor(2, "x"), Factor(2, "y"), Factor(3))) -> 1``
    """
    p = 1
    for f in fs:
        p *= f.size
    if p == n:
        return len(fs)
    j, p = 0, 1
    while j < len(fs) - 1 and n % (p * fs[j].size) == 0:
        p *= fs[j].size
        j += 1
    return j


# ------------------------------------------------------------------------------------------
# the walk: place each piece, or say which piece is in the way
# ------------------------------------------------------------------------------------------


def advance(out_shape: tuple, k: int, room: int) -> tuple:
    """The cursor ``(k, room)``: output dim ``k`` has ``room`` elements left, moved past full
    dims (and size-1 dims); ``(len(out_shape), 1)`` at the end.

    ``advance((4, 1, 6), 0, 1) -> (2, 6)``
    """
    n = len(out_shape)
    while room == 1 and k < n:
        k += 1
        room = out_shape[k] if k < n else 1
    return k, room


def split(f: Factor, outer: int) -> tuple:
    """``f`` as (outer piece, inner piece); an axis factor becomes two sub-axes.

    ``split(Factor(4, "tp"), 2) -> (Factor(2, 'tp', 1), Factor(2, 'tp', 2))``
    """
    size, axis, pre = f
    if axis is None:
        return _new(Factor, (outer, None, 1)), _new(Factor, (size // outer, None, 1))
    return _new(Factor, (outer, axis, pre)), _new(Factor, (size // outer, axis, pre * outer))


def place_even(pieces: tuple, i: int, cur: tuple, out_shape: tuple, subaxes: bool):
    """Piece ``i``, a ``LOCAL`` or ``AXIS`` factor, fills the room left, split at every
    boundary it straddles (an axis factor into sub-axes). A boundary that divides neither
    it nor the room: ``blame``.

    ``tp(4)`` at room 2 of (16,6) after ``dp 4``: ``tp:(1)2`` ends dim 0, ``tp:(2)2`` starts dim 1.
    """
    _, (f,), size, _, _ = head = pieces[i]
    k, room = cur
    if size <= room:  # the common case: it fits
        if size == 1:  # used up by a tail or program before it
            return (), cur, pieces
        if room % size:
            return blame(pieces, i, room, subaxes)
        room //= size
        return ((k, f),), ((k, room) if room != 1 else advance(out_shape, k, 1)), pieces
    items = []
    while size > 1:
        if size <= room:
            if room % size:
                return blame(pieces, i, room, subaxes)
            items.append((k, f))
            k, room = advance(out_shape, k, room // size)
            break
        if size % room:
            return blame(pieces, i, room, subaxes)
        axis = f[1]
        pre = f[2] if axis is not None else 1  # (split makes local pieces with pre 1)
        if axis is not None and not subaxes:
            return obstacle(head, 1, f"a boundary cuts {head[2]} at {room} and sub-axes are disabled")
        # split(f, room) and advance(out_shape, k, 1) inlined: the outer piece ends dim k
        items.append((k, _new(Factor, (room, axis, pre))))
        size //= room
        f = _new(Factor, (size, axis, pre * room if axis is not None else 1))
        n = len(out_shape)
        k += 1
        while k < n and out_shape[k] == 1:
            k += 1
        room = out_shape[k] if k < n else 1
    return tuple(items), (k, room), pieces


def blame(pieces: tuple, i: int, room: int, subaxes: bool) -> Obstacle:
    """The piece in the way when a boundary (``room`` left) fits even piece ``i`` nowhere: the
    piece itself when on an axis (keeping the outer ``gcd`` with sub-axes on), else the
    sharded piece next to it, the next one first.

    A local piece always has one: adjacent local factors are merged, the walk puts a local
    piece after a tail or program only right after it, and the last piece always fits.
    ``blame((Piece(AXIS, (Factor(4, "x"),), 4, 0, 0),), 0, 6, True).keep -> 2``
    """
    head = pieces[i]
    if head[0] is AXIS:
        keep = gcd(head[2], room) if subaxes else 1
        return obstacle(head, keep, f"a boundary cuts {head[2]} at {room}")
    for j in (i + 1, i - 1):
        if 0 <= j < len(pieces) and pieces[j][0] is not LOCAL:  # sharded
            return obstacle(pieces[j], 1, f"a boundary at {room} falls inside local {head[2]} next to it")
    raise AssertionError(f"local piece {head} has no sharded neighbour")  # pragma: no cover


def tail_body(piece: Piece) -> tuple:
    """The factors that cut a tail (its trailing local factor only enumerates the chunk).

    ``tail_body(Piece(TAIL, (Factor(2, "x"), Factor(3)), 5)) -> (Factor(size=2, axis='x', pre=1),)``
    """
    fs = piece[1]  # piece.factors
    return fs[:-1] if fs and fs[-1].axis is None else fs


def place_tail(pieces: tuple, i: int, cur: tuple, out_shape: tuple, subaxes: bool):
    """Piece ``i``, an uneven tail, ends an output dim, whole or cut where its chunks line up:

    - it fills the room exactly;
    - (outer cut) the room is a divisor of it whose ``torch.chunk`` chunks hold the same
      elements: its axes end this dim, the inner rest is a local factor of the next dim;
    - (inner merge) the room is it times ``q`` and the local factors right after it make
      up ``q`` with the same chunks: they merge into it;
    - (region) it and all the local factors after it form a region of which this dim takes
      ``room`` blocks with the same chunks; the rest is a local piece, the factors are used up.

    Else it is the obstacle. ``[x*3 of 5, 4] -> (5, 2, 2)``: the tail fills dim 0.
    """
    head = pieces[i]
    k, need = cur
    if k == len(out_shape):  # pragma: no cover  (the sizes multiply to the same total)
        return obstacle(head, 1, "an uneven dim has no output dim to live in")
    size = head[2]
    if need == size:
        return tuple([(k, f) for f in head[1]]), advance(out_shape, k, 1), pieces
    fs = head[1]  # tail_body(head) inlined
    body = fs[:-1] if fs and fs[-1][1] is None else fs
    # same_chunks asks same_axis_chunks when every factor of the body is on an axis (a tail's, as a
    # rule) and the counts are positive (they are here): asked directly, no memo key made per question
    placed, sizes = [], []  # one loop, no comprehension (a call of its own)
    for f in body:
        placed.append((k, f))
        if f[1] is not None:  # f.axis
            sizes.append(f[0])
    placed, sizes = tuple(placed), tuple(sizes)
    chunks = same_axis_chunks if len(sizes) == len(body) else None
    if need < size and size % need == 0 and (chunks(sizes, size, need, 1, size // need) if chunks else
                                             same_chunks(body, size, need, 1, size // need)):
        rest = size // need
        k2, room2 = advance(out_shape, k, 1)
        if k2 == len(out_shape) or room2 % rest:
            return obstacle(head, 1, "the inner part of an uneven dim straddles a boundary")
        return placed + ((k2, Factor(rest)),), advance(out_shape, k2, room2 // rest), pieces
    q = need // size if need % size == 0 else 0
    if q > 1 and (chunks(sizes, size, size * q, q, 1) if chunks else same_chunks(body, size, size * q, q, 1)):
        shrunk = take_inner(pieces, i, q)
        if shrunk is not None:
            return placed, advance(out_shape, k, 1), shrunk
    nf = leading_locals(pieces, i + 1)
    follow = pieces[i + 1 : i + 1 + nf]
    q = 1
    for p in follow:
        q *= p[2]  # p.size
    region = size * q
    if region % need == 0 and (chunks(sizes, size, need, q, region // need) if chunks else
                               same_chunks(body, size, need, q, region // need)):
        rest = region // need
        spent = tuple([(LOCAL, (Factor(1),), 1, p[3], p[4]) for p in follow])
        new = ((local(rest),) if rest > 1 else ()) + spent
        return placed, advance(out_shape, k, 1), pieces[: i + 1] + new + pieces[i + 1 + nf :]
    return obstacle(head, 1, "an uneven dim must end an output dim and stay whole")


def place_program(pieces: tuple, i: int, cur: tuple, out_shape: tuple, subaxes: bool):
    """Piece ``i``, a DTensor chunk program, is a whole output dim: alone, with the local
    factors right after it merged in, or cut so that its outer part is the dim (the inner
    part a local piece) — each only where DTensor's chunks hold the same elements. Else it
    is the obstacle.

    ``[chunks(a/3, b) of 16] -> (16,)``: the program is dim 0.
    """
    head = pieces[i]
    k, need = cur
    size, prog = head[2], head[1][0]
    fresh = k < len(out_shape) and need == out_shape[k]
    if fresh and need < size and size % need == 0 and same_program_chunks(prog, need, size // need):
        inner = (local(size // need),)
        return ((k, prog),), advance(out_shape, k, 1), pieces[: i + 1] + inner + pieces[i + 1 :]
    q = need // size if need % size == 0 else 0
    if not fresh or not q:
        return obstacle(head, 1, "a DTensor chunk program must stay a whole dim")
    if q > 1:
        pieces = take_inner(pieces, i, q)
        if pieces is None or not same_program_chunks(prog, size, q):
            return obstacle(head, 1, "a DTensor chunk program must stay a whole dim")
    return ((k, prog),), advance(out_shape, k, 1), pieces


def leading_locals(pieces: tuple, j: int) -> int:
    """How many pieces from ``j`` on are local. ``leading_locals((x, local(2), y), 1) -> 1``"""
    n = 0
    for p in pieces[j:]:
        if p[0] is not LOCAL:  # p.sharded, without the property call
            break
        n += 1
    return n


def take_inner(pieces: tuple, i: int, q: int):
    """``pieces`` with the outer digits of the local pieces right after piece ``i`` used up
    to make exactly ``q`` (each keeps its inner rest), or None when they cannot.

    ``take_inner((x, local(6), y), 0, 2) -> (x, local(3), y)``;
    ``take_inner((x, local(6), y), 0, 4) -> None``
    """
    got, used = 1, []
    for p in pieces[i + 1 :]:
        if got == q:
            break
        kind, _, size, d, index = p
        if kind is not LOCAL:  # sharded
            return None
        want = q // got
        if size % want == 0:
            take = want
        elif want % size == 0:
            take = size
        else:
            return None
        got *= take
        used.append((LOCAL, (Factor(size // take),), size // take, d, index))
    if got != q:
        return None
    return pieces[: i + 1] + tuple(used) + pieces[i + 1 + len(used) :]


def settle_floating(dims: tuple, floating: tuple, out_shape: tuple):
    """Place the extent-1 tails and programs: each takes a free output dim of size 1, else a
    tail goes innermost in the last dim, its first axis factor cutting chunks of extent 1
    as it did (``below_chunks``): all or nothing on each device, as before. Returns the dims
    or the ``Obstacle`` that has nowhere to go.

    ``[2, x of 1, 3] -> (6,)``: ``[6*x of 6]``; ``(1, 6)``: ``[x of 1, 6]``.
    """
    for t in floating:
        free = [j for j in range(len(dims)) if out_shape[j] == 1 and not dims[j]]
        if free:
            j, new = free[0], (t[1][0] if t[0] is PROGRAM else t[1])
        elif t[0] is TAIL and dims and type(dims[-1]) is not ChunkProgram:
            j, new = len(dims) - 1, below_chunks(out_shape[-1], dims[-1], t[1])
        else:
            return obstacle(t, 1, "a shard of extent 1 needs an output dim to live in")
        dims = dims[:j] + (new,) + dims[j + 1 :]
    return dims


def below_chunks(n: int, fs: tuple, tail: tuple) -> tuple:
    """The factors ``fs`` of a dim of size ``n`` followed by those of an extent-1 ``tail``; where
    the chunks its first axis factor would cut are longer than 1 (an uneven ``fs`` leaves
    its innermost local factor implicit), a local factor cuts them down to 1 first.

    ``below_chunks(36, (Factor(6), Factor(4, "b")), (Factor(2, "c"),))`` -> ``6*b*2*c``
    (b leaves chunks of 2); ``below_chunks(12, (Factor(2), Factor(4, "c")), (Factor(2), Factor(2, "b")))``
    -> ``2*c*2*b`` (the tail's own 2 does it).
    """
    lead = 0
    while lead < len(tail) and tail[lead].axis is None:
        lead += 1
    head = fs + tail[:lead]
    ext = chain_extent(n, [f.size for f in head])
    return head + ((Factor(ext),) if ext > 1 else ()) + tail[lead:]


def fit(pieces: tuple, floating: tuple, out_shape: tuple, subaxes: bool):
    """The output dims (per dim a tuple of factors, or a ChunkProgram) holding ``pieces`` in
    order and the ``floating`` ones where they fit, or the ``Obstacle`` in the way.

    Each step places piece ``i`` and returns ``(items, cursor, pieces)`` — the
    ``(output dim, Factor or ChunkProgram)`` it placed, the cursor after them (``advance``)
    and the pieces, those after ``i`` possibly split or used up — or the ``Obstacle``.

    ``fit(*flat_pieces(s), (16, 6), True)`` for ``[dp*4, tp*3]`` (``s``):
    ``((dp, 4, tp:(1)2), (tp:(2)2, 3))``.
    """
    n = len(out_shape)
    out: list = [()] * n  # per output dim, the factors placed so far
    k = 0  # the cursor (output dim k, room left in it): advance(out_shape, -1, 1) inlined
    while k < n and out_shape[k] == 1:
        k += 1
    room = out_shape[k] if k < n else 1
    i = 0
    programs = False
    while i < len(pieces):
        head = pieces[i]
        kind = head[0]  # .kind, dispatched by identity (an Enum's hash is a Python call)
        if kind is LOCAL or kind is AXIS:
            size = head[2]
            if size <= room:  # place_even's common case inlined: it fits (the hot path)
                if size != 1:  # (1: used up by a tail or program before it)
                    if room % size:
                        return blame(pieces, i, room, subaxes)
                    out[k] += head[1]  # (f,)
                    room //= size
                    while room == 1 and k < n:  # advance(out_shape, k, 1)
                        k += 1
                        room = out_shape[k] if k < n else 1
                i += 1
                continue
            step = place_even(pieces, i, (k, room), out_shape, subaxes)
        elif kind is TAIL:
            step = place_tail(pieces, i, (k, room), out_shape, subaxes)
        else:
            programs = True
            step = place_program(pieces, i, (k, room), out_shape, subaxes)
        if type(step) is Obstacle:
            return step
        items, (k, room), pieces = step
        for j, item in items:
            out[j] += (item,)
        i += 1
    dims = tuple(out)
    if programs:  # a program is alone in its dim
        dims = tuple([d[0] if d and type(d[0]) is ChunkProgram else d for d in dims])
    return settle_floating(dims, floating, out_shape) if floating else dims


# ------------------------------------------------------------------------------------------
# chunks that line up (uneven tails and programs)
# ------------------------------------------------------------------------------------------


@memo(4096)
def same_chunks(body: tuple, n_in: int, n_out: int, q_in: int, q_out: int) -> bool:
    """Do ``body`` cutting ``n_in`` (each element a block of ``q_in``) and ``body`` cutting
    ``n_out`` (blocks of ``q_out``) hold the same elements on every device?

    A body of axis factors only (a tail's, as a rule) is answered per chunk length
    (``same_axis_chunks``); one with local factors device by device.

    ``same_chunks((Factor(4, "a"),), 9, 3, 1, 3) -> True``: ``[0,3) [3,6) [6,9) []`` either way
    """
    sizes = tuple([f[0] for f in body if f[1] is not None])  # the axis factors' sizes
    if len(sizes) == len(body) and n_in >= 1 and n_out >= 1 and q_in >= 1 and q_out >= 1:
        return same_axis_chunks(sizes, n_in, n_out, q_in, q_out)
    axes = [j for j, f in enumerate(body) if f.axis is not None]
    for combo in cartesian(*(range(body[j].size) for j in axes)):
        digits = [None] * len(body)
        for j, g in zip(axes, combo):
            digits[j] = g
        a = [(lo * q_in, hi * q_in) for lo, hi in dim_ranges(n_in, body, digits)]
        b = [(lo * q_out, hi * q_out) for lo, hi in dim_ranges(n_out, body, digits)]
        if merge_ranges(a) != merge_ranges(b):
            return False
    return True


def same_axis_chunks(sizes: tuple, n_in: int, n_out: int, q_in: int, q_out: int) -> bool:
    """``same_chunks`` for a body of axis factors of these ``sizes`` (``n`` and ``q`` positive).

    Each device holds one chunk of the chunk tree: the first factor cuts the dim into equal
    chunks and a last, shorter one (``chunk_counts``), the next cuts each of those, and so
    on. The devices hold the same elements either way when the first cut makes as many
    chunks, of the same lengths in elements (so at the same places), and the rest of the
    body cuts a full chunk alike and the last one alike.

    ``same_axis_chunks((4,), 9, 3, 1, 3) -> True``: 3 chunks of 3 elements either way
    """
    if not sizes:
        return n_in * q_in == n_out * q_out  # the whole range
    k = sizes[0]
    if n_in >= 1 and n_out >= 1:  # chunk_counts(n_in, k) and chunk_counts(n_out, k) inlined
        c_in = -(-n_in // k)
        full_in = n_in // c_in
        r_in = n_in - full_in * c_in
        c_out = -(-n_out // k)
        full_out = n_out // c_out
        r_out = n_out - full_out * c_out
    else:
        c_in, full_in, r_in = chunk_counts(n_in, k)
        c_out, full_out, r_out = chunk_counts(n_out, k)
    if c_in * q_in != c_out * q_out or full_in != full_out or r_in * q_in != r_out * q_out:
        return False
    rest = sizes[1:]
    if not rest:  # the whole ranges of both chunks: equal, as just compared
        return True
    return same_axis_chunks(rest, c_in, c_out, q_in, q_out) and (
        not r_in or same_axis_chunks(rest, r_in, r_out, q_in, q_out)
    )


@memo(4096)
def same_program_chunks(prog: ChunkProgram, n: int, q: int) -> bool:
    """Does DTensor's chunk program on ``n * q`` hold the blocks of ``q`` it holds on ``n``?

    ``same_program_chunks(ChunkProgram([Step(2, "x")]), 4, 2) -> True``; with n = 3: False
    """
    for digits in cartesian(*(range(st.size) for st in prog)):
        a = [(lo * q, hi * q) for lo, hi in _program_ranges(n, prog, digits)]
        b = _program_ranges(n * q, prog, digits)
        if merge_ranges(a) != merge_ranges(b):
            return False
    return True


def merge_ranges(rs: list) -> tuple:
    """Join touching ranges, drop empty ones. ``merge_ranges([(0, 2), (2, 4), (5, 5)]) -> ((0, 4),)``"""
    out: list = []
    for lo, hi in rs:
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        elif hi > lo:
            out.append((lo, hi))
    return tuple(out)


# ------------------------------------------------------------------------------------------
# the driver: fit, gather what is in the way, fit again
# ------------------------------------------------------------------------------------------


def gather(s: Sharding, obstacle: Obstacle) -> Sharding:
    """``s`` with the obstacle's piece made local (an axis factor keeps its outer ``keep`` as
    a sub-axis; a tail becomes one local factor; a program dim is gathered whole).

    ``[x*3] (x=4)`` with obstacle ``x`` keep 2 -> ``[x:(1)2*6]``
    """
    (kind, factors, size, d, i), keep, _ = obstacle
    fs = s.dims[d]
    if kind is PROGRAM:
        new: tuple = ()
    elif kind is TAIL:
        new = fs[:i] + (_new(Factor, (size, None, 1)),)
    else:
        _, axis, pre = factors[0]
        if keep > 1:
            mid = (_new(Factor, (keep, axis, pre)), _new(Factor, (size // keep, None, 1)))
        else:
            mid = (_new(Factor, (size, None, 1)),)
        new = fs[:i] + mid + fs[i + 1 :]
    return s._with_dim(d, new)


def output(s: Sharding, out_shape: tuple, dims: tuple) -> Sharding:
    """The view's output: ``fit``'s ``dims`` in canonical form, as ``Sharding._trusted`` puts
    them, without its work on the dims that already are (most that ``fit`` builds): none on
    a dim of size 1, or one factor the size of its dim.

    ``output(s, (16, 6), ((dp, 4, tp:(1)2), (tp:(2)2, 3)))`` -> ``[dp*4*tp:(1)2, tp:(2)2*3]``
    """
    mesh = s.mesh
    canon = []
    k = -1  # (an index, not enumerate: cheaper on a few dims)
    for fs in dims:
        k += 1
        n = out_shape[k]
        if type(fs) is tuple and (fs[0][0] == n != 1 if len(fs) == 1 else not fs and n == 1):  # [0]: .size
            canon.append(fs)
        else:
            canon.append(_trusted_dim(mesh, out_shape, k, fs))
    return _built(Sharding, mesh, out_shape, tuple(canon), s.partial)


def left_after(obstacle: Obstacle, pieces: tuple) -> tuple:
    """``(sharded, uneven)``: once the obstacle is gathered, does some piece of the input stay
    sharded, or uneven (a tail or a program)? ``pieces``: all of them, floating ones too.

    ``left_after(Obstacle(x, 1, why), (local(3), x)) -> (False, False)``; keep 2: ``(True, False)``
    """
    sharded, uneven = obstacle.keep != 1, False  # keep > 1: a sub-axis stays
    piece = obstacle.piece
    for p in pieces:
        kind = p[0]  # p.kind; is it sharded (not LOCAL)?
        if kind is not LOCAL and p != piece:
            sharded = True
            uneven = uneven or kind is not AXIS
    return sharded, uneven


def gather_last(s: Sharding, obstacle: Obstacle, out_shape: tuple) -> tuple:
    """``(gather(s, obstacle), output)`` when the obstacle is the last sharded piece
    (``left_after``): every dim is local then. The gathered dim is even with local
    factors only, one factor in canonical form (``_trusted_dim`` merges them); ``fit`` cuts
    the one local piece at every output boundary, one factor per output dim.

    ``[3, x*4] (x=2) -> (4, 6)``: x is in the way, ``([3, 8], [4, 6])``
    """
    d = obstacle[0][3]  # obstacle.piece.dim
    mesh, partial, shape, dims = s.mesh, s.partial, s.shape, s.dims
    n = shape[d]
    gathered = ((_new(Factor, (n, None, 1)),),) if n != 1 else ((),)  # local_dims(shape[d : d + 1])
    target = _built(Sharding, mesh, shape, dims[:d] + gathered + dims[d + 1 :], partial)
    return target, _built(Sharding, mesh, out_shape, local_dims(out_shape), partial)


def local_dims(shape: tuple) -> tuple:
    """Each dim of ``shape`` local, in canonical form: one factor, none on a dim of size 1.

    ``local_dims((10, 1)) -> ((Factor(size=10, axis=None, pre=1),), ())``
    """
    out = []  # a loop, not a comprehension: no frame of its own (a first call makes few dims)
    for n in shape:
        out.append((_new(Factor, (n, None, 1)),) if n != 1 else ())
    return tuple(out)


def dtensor_obstacle(target: Sharding, out: Sharding):
    """With sub-axes off the output must have DTensor placements: None when it has, else the
    innermost sharded piece of ``target`` as the obstacle.

    ``[x*3 of 5] -> (5,)`` has placements: None.
    """
    if even_whole_axes(out) or has_placements(out):
        return None
    pieces, floating = flat_pieces(target)
    last = max((p for p in pieces + floating if p[0] is not LOCAL), key=lambda p: (p[3], p[4]))  # sharded
    return obstacle(last, 1, f"DTensor placements cannot say {out}")


def even_whole_axes(s: Sharding) -> bool:
    """Is every dim of ``s`` even and every axis factor a whole mesh axis? Such a sharding has
    DTensor placements (``to_placements`` reads each split factor off the factors in front;
    ``tests/ops/test_regroup_even.py`` checks the claim), so ``dtensor_obstacle`` need not ask.

    ``even_whole_axes(Sharding.parse("[dp*4, tp*3]", m)) -> True``; ``[tp:(1)2*6]``: False
    """
    mesh = s.mesh
    for n, fs in zip(s.shape, s.dims):
        if type(fs) is ChunkProgram:
            return False
        p = 1
        for size, axis, pre in fs:
            p *= size
            if axis is not None and (pre != 1 or size != mesh.shape[mesh.names.index(axis)]):
                return False
        if p != n:
            return False
    return True


def has_placements(s: Sharding) -> bool:
    """Can DTensor placements say ``s``? (``to_placements`` answers by raising; this turns the
    answer into a value at the boundary.) ``has_placements(Sharding.parse("[x*4]", m)) -> True``
    """
    try:
        s.to_placements()
    except NotRepresentable:
        return False
    return True


def regroup(s: Sharding, out_shape, subaxes: bool | None = None) -> tuple:
    """``(input_target, output)`` for viewing ``s`` as ``out_shape`` (row-major reshape).

    ``input_target == s`` when the view needs no communication (then it *is* ``s``);
    otherwise it is ``s`` with only the pieces in the way gathered. ``subaxes`` defaults to
    ``settings.subaxes``. An even input that regroups with nothing in the way takes
    ``regroup_even`` (the same answer in one pass); everything else the walk below.

    ``regroup(Sharding.parse("[dp*4, tp*3]", m), (96,))[1] -> [dp*4*tp*3]``
    """
    if subaxes is None:
        subaxes = settings.subaxes
    out = regroup_even(s, out_shape, subaxes)
    if out is not None:
        return s, out
    return regroup_walk(s, out_shape, subaxes)


def regroup_walk(s: Sharding, out_shape, subaxes: bool) -> tuple:
    """``regroup`` by the walk alone: ``fit``, gather the obstacle, fit again; with sub-axes
    off, an output DTensor placements cannot say is one more obstacle.

    It stops early when it can (``left_after``): a gather that leaves nothing sharded leaves
    every dim local (``gather_last``); one that leaves no tail nor program lets
    ``regroup_even`` answer in one pass when nothing else is in the way (the walk's answer:
    ``tests/ops/test_regroup_even.py``).
    ``regroup_walk(s, (16, 6), True) == regroup(s, (16, 6), True)``"""
    return walk_inferred(s, infer_view_shape(s.shape, out_shape), subaxes)


def walk_inferred(s: Sharding, out_shape: tuple, subaxes: bool, known: int = -1) -> tuple:
    """``regroup_walk`` on an ``out_shape`` already inferred (``infer_view_shape``: a tuple of
    ints >= 1 of the input's count), as the view rule has it; ``known``: where the view rule's
    evenness check of ``s`` stopped (``flat_pieces``). ``walk_inferred(s, (16, 6), True)``"""
    target = s
    while True:
        pieces, floating = flat_pieces(target, known)
        known = -1  # (a gathered target: nothing known)
        dims = fit(pieces, floating, out_shape, subaxes)
        if type(dims) is Obstacle:
            obstacle = dims
        else:
            out = output(s, out_shape, dims)
            obstacle = None if subaxes else dtensor_obstacle(target, out)
            if obstacle is None:
                return target, out
        sharded, uneven = left_after(obstacle, pieces + floating if floating else pieces)
        if not sharded:
            return gather_last(target, obstacle, out_shape)
        target = gather(target, obstacle)
        if not uneven:  # every dim even, none a program: the rest are axis and local pieces, and a
            # gathered tail is one local factor after the even prefix (``gather``), a program dim local
            out = even_inferred(target, out_shape, subaxes, True)
            if out is not None:
                return target, out


# ------------------------------------------------------------------------------------------
# the fast path: an even input that regroups with nothing in the way
# ------------------------------------------------------------------------------------------



def regroup_even(s: Sharding, out_shape, subaxes: bool):
    """The output of viewing ``s`` as ``out_shape`` (a tuple of positive ints) when every dim
    of ``s`` is even and no piece is in the way, else None (``regroup`` then walks, and raises
    on a bad shape). One pass of ``fit`` over the factors: the flat list with adjacent local
    factors merged, each factor cut at every boundary it straddles (an axis factor into
    sub-axes), each placed factor merged with the one before it in its dim where the
    canonical form merges them (``sharding.factors._merge_even``), so the output's dims are
    canonical as they are built (``Sharding._trusted`` would give an equal Sharding).

    With sub-axes off it also needs every axis factor of ``s`` to be a whole mesh axis: no
    boundary may cut one, so the output's are whole too, on even dims, and DTensor placements
    say such a sharding (``to_placements`` reads each split factor off the factors in front;
    ``tests/ops/test_regroup.py`` checks it), so ``dtensor_obstacle`` has nothing to find.

    ``[dp*4, tp*3] -> (16, 6)``: ``[dp*4*tp:(1)2, tp:(2)2*3]``
    """
    if type(out_shape) is not tuple:
        return None
    total = 1
    for x in out_shape:
        if type(x) is not int or x < 1:
            return None
        total *= x
    if total != prod(s.shape):
        return None  # not the same number of elements (or a -1 to infer): infer_view_shape
    return even_inferred(s, out_shape, subaxes)


def even_inferred(s: Sharding, out_shape: tuple, subaxes: bool, checked: bool = False):
    """``regroup_even`` on an ``out_shape`` already inferred (``infer_view_shape``: a tuple of
    ints >= 1 of the input's count), as the view rule and the walk have it; ``checked``: the
    caller has seen every dim even and none a program (the view rule).
    ``even_inferred(s, (16, 6), True)`` for ``[dp*4, tp*3]``: ``[dp*4*tp:(1)2, tp:(2)2*3]``"""
    dims = s.dims
    if not checked:
        shape = s.shape
        d = 0  # (an index, not zip: a zip costs more than it saves on a few dims)
        for fs in dims:  # first the cheap answer of most walks: an uneven dim
            if type(fs) is ChunkProgram:
                return None
            p = 1
            for f in fs:
                p *= f[0]
            if p != shape[d]:
                return None  # an uneven dim: a tail for the walk
            d += 1
    new = _new
    flat: list = []  # the factors, adjacent local ones merged
    mesh = s.mesh
    whole = None if subaxes else mesh  # with sub-axes off: the mesh to check axis factors against
    for fs in dims:
        for f in fs:
            size, axis, pre = f
            if axis is None:
                if flat and flat[-1][1] is None:
                    flat[-1] = new(Factor, (flat[-1][0] * size, None, 1))
                    continue
            elif whole is not None and (pre != 1 or size != whole.shape[whole.names.index(axis)]):
                return None  # a sub-axis with sub-axes off: the walk decides
            flat.append(f)
    n = len(out_shape)
    out = []  # a list per output dim (a loop: a comprehension is a call of its own)
    for _ in range(n):
        out.append([])
    k = 0
    while k < n and out_shape[k] == 1:
        k += 1
    room = out_shape[k] if k < n else 1
    for f in flat:
        size, axis, pre = f
        while True:
            if size <= room:  # f (what is left of it) fits in dim k
                if room % size:
                    return None
                room //= size
                g, size = f, 1
            else:  # a boundary cuts f: its outer piece ends dim k
                if size % room or (axis is not None and not subaxes):
                    return None
                g = new(Factor, (room, axis, pre))
                size //= room
                if axis is not None:
                    pre *= room
                f = new(Factor, (size, axis, pre))
                room = 1
            dk = out[k]
            # merged with the factor before it where the canonical form merges: two pieces of one
            # axis, in order (two local factors never meet: the flat list merged them, and a cut
            # one's inner rest starts a dim)
            if axis is not None and dk and dk[-1][1] == axis and dk[-1][2] * dk[-1][0] == g[2]:
                h = dk[-1]
                dk[-1] = new(Factor, (h[0] * g[0], axis, h[2]))
            else:
                dk.append(g)
            if room == 1:
                k += 1
                while k < n and out_shape[k] == 1:
                    k += 1
                room = out_shape[k] if k < n else 1
            if size == 1:
                break
    return _built(Sharding, mesh, out_shape, tuple(map(tuple, out)), s.partial)  # dims canonical as built


def infer_view_shape(shape: tuple, out_shape) -> tuple:
    """The view's shape with ``-1`` filled in, checked to keep the number of elements.

    ``infer_view_shape((8, 12), (-1, 6)) -> (16, 6)``; ``infer_view_shape((4,), 4) -> (4,)``
    """
    if type(out_shape) is tuple:  # the common case: a tuple of positive ints, nothing to infer
        p = 1
        for x in out_shape:
            if type(x) is not int or x < 1:
                break
            p *= x
        else:
            if p == prod(shape):
                return out_shape
    if isinstance(out_shape, int):
        out_shape = (out_shape,)
    out_shape = [int(x) for x in out_shape]
    total = _product(shape)
    if out_shape.count(-1) > 1:
        raise ShardingSpecError(f"view: shape {tuple(out_shape)} has more than one -1")
    if -1 in out_shape:
        rest = _product(x for x in out_shape if x != -1)
        if rest == 0 or total % rest:
            raise ShardingSpecError(f"view: cannot view {shape} ({total} elements) as {tuple(out_shape)}")
        out_shape[out_shape.index(-1)] = total // rest
    if any(x < 1 for x in out_shape) or _product(out_shape) != total:
        raise ShardingSpecError(
            f"view: shape {tuple(out_shape)} has {_product(out_shape)} elements, the input {shape} has "
            f"{total}; a view keeps the number of elements"
        )
    return tuple(out_shape)
