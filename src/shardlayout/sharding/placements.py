"""DTensor placements and JAX PartitionSpecs <-> ``Sharding``.

DTensor applies placements left to right over the mesh dims: ``Shard(d)`` cuts the
current local piece of dim d into ``n`` chunks (torch.chunk) and keeps the device's;
``_StridedShard(d, sf)`` first cuts it into ``sf`` chunks, cuts each into ``n`` and keeps
the device's chunk of each, in order. On even dims both only bind digits of the local
index to the mesh axis; we do exactly that, and decide uneven cases from the chunk
lengths of the definition (``_cut_matches``: never per element, so a dim of 2**40
elements costs what a dim of 8 does). A conversion that would lose information raises
``NotRepresentable``.

Reading placements or a spec gives the parts of a Sharding (``ShardingParts``), which
``Sharding.from_placements`` / ``from_partition_spec`` check and build; writing them
reads a Sharding's fields (``ShardingLike``). So this module needs only ``factors.py``,
never ``core.py``, which is built on it.

    >>> from shardlayout import Mesh, Sharding
    >>> m = Mesh.parse("dp=2,tp=2")
    >>> parts_from_placements(m, (8, 8), ["SS(0,2)", "S(0)"]).dims[0]
    (Factor(size=2, axis='tp', pre=1), Factor(size=2, axis='dp', pre=1), Factor(size=2, axis=None, pre=1))
    >>> str(Sharding.from_placements(m, (8, 8), ["SS(0,2)", "S(0)"]))
    '[tp*dp*2, 8]'
"""

from __future__ import annotations

import re
import reprlib
from typing import NamedTuple

from ..caches import memo
from ..errors import NotRepresentable, ShardingSpecError
from ..layout.inttuple import ceil_div
from ..mesh import Mesh
from .factors import (
    REDUCE_OPS,
    ChunkProgram,
    Factor,
    ShardingLike,
    Step,
    _canonical_dim,
    _fmt_factor,
    _is_leaf,
    _product,
    chain_extent,
    chunk_counts,
    chunk_length,
    digit_classes,
    held_length,
    level_lengths,
    parse_factor,
)

# ------------------------------------------------------------------------------------------
# placement values
# ------------------------------------------------------------------------------------------

_RE_S = re.compile(r"^S\(\s*(-?\d{1,4000})\s*\)$", re.ASCII)  # ASCII digits, not thousands: '٠' is no dim
_RE_SS = re.compile(r"^SS\(\s*(-?\d{1,4000})\s*,\s*(\d{1,4000})\s*\)$", re.ASCII)
_RE_P = re.compile(r"^P(?:\(\s*([a-z]+)\s*\))?$")


def parse_placement(p, ndim: int, where: str = "placement") -> tuple:
    """Normalise one placement to ``("R",)``, ``("S", d)``, ``("SS", d, sf)`` or ``("P", op)``.

    Accepts ``"R"``, ``"S(0)"``, ``"SS(0,2)"``, ``"P"``, ``"P(max)"``, torch's objects and their
    reprs (``"Shard(dim=0)"``, ``"_StridedShard(dim=0, sf=2)"``, ``"Replicate()"``, ``"Partial(sum)"``).
    ``parse_placement("SS(1,2)", 2) -> ('SS', 1, 2)``
    """
    if isinstance(p, str):
        t = re.sub(r"\b(dim|sf|split_factor)\s*=\s*", "", p.strip())
        t = re.sub(r"^_StridedShard\(|^_S\(", "SS(", t)
        t = t.replace("Shard", "S").replace("Replicate()", "R").replace("Partial", "P")
        t = t.replace("P()", "P")
        if t == "R":
            return ("R",)
        m = _RE_S.match(t)
        if m:
            return ("S", _dim(int(m.group(1)), ndim, where))
        m = _RE_SS.match(t)
        if m:
            return ("SS", _dim(int(m.group(1)), ndim, where), _split_factor(int(m.group(2)), p, where))
        m = _RE_P.match(t)
        if m:
            op = m.group(1) or "sum"
            if op not in REDUCE_OPS:
                raise ShardingSpecError(f"{where}: reduce op {op!r} of {p!r} is not one of {REDUCE_OPS}")
            return ("P", op)
        raise ShardingSpecError(
            f"{where}: {p!r} is not a placement; write 'R', 'S(d)', 'SS(d,sf)', 'P' or 'P(sum|avg|max|min)'"
        )
    cls = type(p).__name__
    if cls == "Replicate":
        return ("R",)
    if cls == "_StridedShard":
        return ("SS", _dim(p.dim, ndim, where), _split_factor(int(p.split_factor), p, where))
    if cls == "Shard":
        return ("S", _dim(p.dim, ndim, where))
    if cls in ("Partial", "_Partial", "_NormPartial", "MaskPartial"):
        op = getattr(p, "reduce_op", "sum")
        op = {"sum": "sum", "avg": "avg", "max": "max", "min": "min"}.get(str(op), None)
        if op is None:
            raise NotRepresentable(f"{where}: {p!r} reduces with {p.reduce_op!r}, not sum/avg/max/min")
        return ("P", op)
    raise ShardingSpecError(f"{where}: {p!r} is not a placement")


# Beyond any tensor dim (torch's int64 sizes): refused at once as absurd. Nothing enumerates
# split factors (cuts are decided from chunk lengths), so any real one is cheap, however large.
MAX_SPLIT_FACTOR = (1 << 63) - 1


def _split_factor(sf: int, p, where: str) -> int:
    if not 1 <= sf <= MAX_SPLIT_FACTOR:
        raise ShardingSpecError(f"{where}: split factor {sf} of {p!r} must be in [1, {MAX_SPLIT_FACTOR}]")
    return sf


def _dim(d: int, ndim: int, where: str) -> int:
    if not -ndim <= d < ndim:
        raise ShardingSpecError(f"{where}: dim {d} is out of range for a tensor with {ndim} dims")
    return d % ndim


def dtensor_repr(p: tuple) -> str:
    """DTensor's own repr of a normalised placement. ``dtensor_repr(("SS", 0, 2)) -> '_StridedShard(dim=0, sf=2)'``."""
    if p[0] == "R":
        return "Replicate()"
    if p[0] == "S":
        return f"Shard(dim={p[1]})"
    if p[0] == "SS":
        return f"_StridedShard(dim={p[1]}, sf={p[2]})"
    return f"Partial({p[1]})"


def format_placement(p: tuple) -> str:
    """``format_placement(("SS", 0, 2)) -> 'SS(0,2)'``."""
    if p[0] == "R":
        return "R"
    if p[0] == "S":
        return f"S({p[1]})"
    if p[0] == "SS":
        return f"SS({p[1]},{p[2]})"
    return f"P({p[1]})"


# ------------------------------------------------------------------------------------------
# placements -> Sharding
# ------------------------------------------------------------------------------------------


class ShardingParts(NamedTuple):
    """What a Sharding is built from, before it checks them: ``Sharding(mesh, *parts)``.

    ``ShardingParts((8,), ((Factor(2, "x"), Factor(4)),)).partial -> ()``
    """

    shape: tuple
    dims: tuple
    partial: tuple = ()


def parts_from_placements(mesh: Mesh, shape, placements) -> ShardingParts:
    """DTensor placements (one per mesh dim) to a Sharding's parts, DTensor semantics exactly.

    ``parts_from_placements(Mesh.parse("x=2"), (8,), ["S(0)"]).dims -> ((Factor(2, "x"), Factor(4)),)``
    """
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(shape)
    if isinstance(placements, (str, bytes)) or not hasattr(placements, "__iter__"):
        example = ", ".join(["'S(0)'"] + ["'R'"] * (mesh.ndim - 1)) if mesh.ndim else ""
        raise ShardingSpecError(
            f"from_placements: placements {reprlib.repr(placements)} are not a list; give one placement per mesh "
            f"dim of {mesh or 'the mesh'}, e.g. [{example}]")
    placements = list(placements)
    if len(placements) != mesh.ndim:
        raise ShardingSpecError(
            f"from_placements: {len(placements)} placements for mesh {mesh} with {mesh.ndim} dims; "
            "give one placement per mesh dim"
        )
    progs = tuple(parse_placement(p, len(shape), f"placement {i} ({p!r})") for i, p in enumerate(placements))
    if all(type(n) is int for n in shape):
        return _parts(mesh, shape, progs)
    return _parts.__wrapped__(mesh, shape, progs)  # let Sharding name the bad size, uncached


@memo(1 << 14)
def _parts(mesh: Mesh, shape: tuple, progs: tuple) -> ShardingParts:
    """``parts_from_placements`` on parsed placements: each cut, dim by dim, from lengths."""
    levels = [[Factor(n)] for n in shape]
    programs: dict = {}  # dim -> DTensor steps, for dims no factor layout reproduces
    partial = []
    for i, prog in enumerate(progs):
        name, n = mesh.names[i], mesh.shape[i]
        if prog[0] == "R":
            continue
        if prog[0] == "P":
            partial.append((name, prog[1]))
            continue
        d = prog[1]
        sf = prog[2] if prog[0] == "SS" else 1
        programs.setdefault(d, []).append(Step(n, name, 1, sf))
        if n == 1 or levels[d] is None:
            continue
        lv, levels[d] = levels[d], None  # None: no factor layout, the dim becomes a ChunkProgram
        for cand, exact in _cut_candidates(shape[d], lv, sf, n, name):
            if exact or _cut_matches(mesh, shape[d], lv, sf, name, cand):
                levels[d] = cand
                break
    dims = tuple(
        tuple(lv) if lv is not None else ChunkProgram(st for st in programs[d] if st.size > 1)
        for d, lv in enumerate(levels)
    )
    return ShardingParts(shape, dims, tuple(partial))


def _cut_candidates(N: int, lv: list, sf: int, n: int, axis: str) -> list:
    """The factor lists ``S``/``SS(d, sf)`` on ``axis`` (size n) may give a dim of size N
    whose factors are ``lv``, in the order tried, each with ``exact`` (True: no check needed).

    One local range is cut exactly, even or not. Several local pieces: bind the right digits
    (exact on even dims), else cut innermost; uneven candidates must be checked against
    DTensor's own definition (``_cut_matches``).
    ``_cut_candidates(8, [Factor(8)], 1, 2, "x") -> [([Factor(2, 'x'), Factor(4)], True)]``
    """
    body = lv[:-1] if lv and lv[-1].local else lv
    new = body + ([Factor(sf)] if sf > 1 else []) + [Factor(n, axis)]
    ext = chain_extent(N, [f.size for f in new])
    if ext > 1:
        new.append(Factor(ext))
    if all(not f.local for f in body):
        return [(new, True)]
    out = []
    absorbed = _absorb(lv, sf, n, axis)
    if absorbed is not None:
        even = _product(f.size for f in absorbed) == N and _product(f.size for f in lv) == N
        out.append((absorbed, even))
    out.append((new, False))
    return out


def _absorb(levels: list, sf: int, n: int, axis: str):
    """Bind the ``n`` local digits that follow the top ``sf`` local digits to ``axis``.

    Returns the new factor list, or None where a boundary falls inside a local factor
    that it does not divide."""
    lo, hi = sf, sf * n
    out = []
    pos = 1
    piece_pre = 1
    for f in levels:
        if not f.local:
            out.append(f)
            continue
        start, end = pos, pos * f.size
        cuts = [start] + [b for b in (lo, hi) if start < b < end] + [end]
        for b in cuts[1:-1]:
            if b % start or f.size % (b // start):
                return None
        for a, b in zip(cuts, cuts[1:]):
            size = b // a
            if lo <= a and b <= hi:
                out.append(Factor(size, axis, piece_pre))
                piece_pre *= size
            else:
                out.append(Factor(size))
        pos = end
    if hi > pos:
        return None
    # pieces of the axis were numbered major first with pre = product of earlier pieces;
    # a sub-axis's pre is the product of the *major* pieces, which is what we built.
    return out


# ------------------------------------------------------------------------------------------
# does a factor list say what DTensor's cut does? (decided from lengths, never per element)
# ------------------------------------------------------------------------------------------
#
# A DTensor cut S / SS(d, sf) on an axis of size n acts on the *list* a device holds of dim d
# (length T): it cuts the list into sf groups (torch.chunk), each group into n chunks, and
# keeps chunk c of every group. Read as the axis's coordinate c of each held element, in
# list order, that is the label string
#
#     D = U(cs)^q U(r)        cs = ceil(T / sf), q = T // cs, r = T - q*cs
#
# where U(m) = 0^b 1^b ... (one group: labels 0, 1, ... in runs of b = ceil(m / n), the last
# run short). A factor list holds the same elements on every device iff it holds, per
# device of the earlier axes, the same list (``_same_held``) and labels it D. Its label
# string is read off its chunk tree, whose nodes of equal length and level are equal: so
# it is a string of runs with powers (``q`` equal chunks), and comparing it with D needs
# only, for each piece, the phases at which it can sit in U(m)^inf (``_Target``).


class _Target:
    """The periodic label string ``U(m)^inf`` of one DTensor group of ``m`` elements cut ``n``
    ways; a summary of a string is ``(length, phases)``: the phases (positions mod m, as
    sorted inclusive intervals) at which it equals ``U(m)^inf``. ``_Target(4, 2).run(1, 2)
    -> (2, ((2, 2),))``"""

    __slots__ = ("m", "run_len", "labels", "ident")

    def __init__(self, m: int, n: int):
        self.m = m
        self.run_len = ceil_div(m, n)
        self.labels = ceil_div(m, self.run_len)
        self.ident = (0, ((0, m - 1),))

    def run(self, label: int, length: int) -> tuple:
        """``label`` repeated ``length`` times. With ``m == 1`` every label is 0, forever."""
        if length == 0:
            return self.ident
        if self.m == 1:
            return (length, ((0, 0),) if label == 0 else ())
        if label >= self.labels:
            return (length, ())
        lo = label * self.run_len
        hi = min(lo + self.run_len, self.m)
        return (length, ((lo, hi - length),) if length <= hi - lo else ())

    def stair(self, label: int, w: int, h: int, k: int) -> tuple:
        """``k`` runs of ``h``, labelled ``label``, ``label + w``, ...: each run between two
        others must be a whole run of the target, so such a string sits at one phase at most."""
        if k <= 2 or h == 0:
            out = self.ident
            for i in range(k):
                out = self.concat(out, self.run(label + i * w, h))
            return out
        last = label + (k - 1) * w
        if w != 1 or h != self.run_len or last >= self.labels:
            return (k * h, ())  # labels step by 1 in the target, its inner runs are run_len long
        mid = (h * (k - 2), (((label + 1) * h, (label + 1) * h),))
        return self.concat(self.concat(self.run(label, h), mid), self.run(last, h))

    def concat(self, x: tuple, y: tuple) -> tuple:
        """The summary of one string followed by another."""
        if not x[1] or not y[1]:
            return (x[0] + y[0], ())
        return (x[0] + y[0], _intersect(x[1], _shift(y[1], -x[0] % self.m, self.m)))

    def power(self, x: tuple, k: int) -> tuple:
        """The summary of ``k`` copies of one string (by squaring: log k concatenations)."""
        total = x[0] * k
        out, base = self.ident, x
        while k:
            if k & 1:
                out = self.concat(out, base)
            k >>= 1
            if k:
                base = self.concat(base, base)
            if not out[1] or not base[1]:  # a piece of the power sits nowhere: nor does it
                return (total, ())
        return out


def _shift(spans: tuple, d: int, m: int) -> list:
    out = []
    for lo, hi in spans:
        lo, hi = lo + d, hi + d
        if hi < m:
            out.append((lo, hi))
        elif lo >= m:
            out.append((lo - m, hi - m))
        else:
            out += [(lo, m - 1), (0, hi - m)]
    return sorted(out)


def _intersect(a, b) -> tuple:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


class _Labels:
    """The label string of ``factors`` for one device of the earlier axes: its held elements
    in order, each labelled with its coordinate on ``axis`` (read from the pieces of
    ``axis`` among the factors), summarised against a ``_Target``. Nodes of the chunk tree
    are ``(level, length, label so far)``; equal nodes are summarised once."""

    def __init__(self, n_elems: int, factors: tuple, mesh: Mesh, axis: str, digits: dict):
        self.n_elems = n_elems
        self.fs = factors
        self.n = mesh.axis_size(axis)
        self.axis = axis
        self.digits = digits  # (axis, pre) -> digit, for the pieces of the earlier axes
        # plain[j]: no piece of ``axis`` at level j or below (every node there is one run)
        self.plain = [not any(f.axis == axis for f in factors[j:]) for j in range(len(factors) + 1)]
        self._held: dict = {}

    def held(self, j: int, L: int) -> int:
        """Elements the node holds (all labels)."""
        key = (j, L)
        h = self._held.get(key)
        if h is None:
            if L == 0 or _is_leaf(self.fs, j):
                h = L
            else:
                f = self.fs[j]
                if f.axis is None or f.axis == self.axis:
                    c, q, r = chunk_counts(L, f.size)
                    h = q * self.held(j + 1, c) + self.held(j + 1, r)
                else:
                    h = self.held(j + 1, chunk_length(L, f.size, self.digits[(f.axis, f.pre)]))
            self._held[key] = h
        return h

    def summary(self, t: _Target, lo: int, hi: int) -> tuple:
        """Summary of positions ``[lo, hi)`` of the whole dim's label string."""
        return self._node(t, {}, 0, self.n_elems, 0, lo, hi)

    def _node(self, t: _Target, memo: dict, j: int, L: int, label: int, lo: int, hi: int) -> tuple:
        h = self.held(j, L)
        lo, hi = max(lo, 0), min(hi, h)
        if lo >= hi:
            return t.ident
        whole = lo == 0 and hi == h
        key = (j, L, label)
        if whole and key in memo:
            return memo[key]
        if _is_leaf(self.fs, j):
            out = t.run(label, hi - lo)
        else:
            f = self.fs[j]
            if f.axis is not None and f.axis != self.axis:
                g = self.digits[(f.axis, f.pre)]
                out = self._node(t, memo, j + 1, chunk_length(L, f.size, g), label, lo, hi)
            else:
                out = self._children(t, memo, j, L, label, lo, hi)
        if whole:
            memo[key] = out
        return out

    def _children(self, t: _Target, memo: dict, j: int, L: int, label: int, lo: int, hi: int) -> tuple:
        f = self.fs[j]
        c, q, r = chunk_counts(L, f.size)
        hc, hr = self.held(j + 1, c), self.held(j + 1, r)
        if f.axis is None:  # q equal children, then the short one: a power
            out = t.ident
            if hc:
                a, b = min(lo, q * hc), min(hi, q * hc)
                i0, i1 = -(-a // hc), b // hc  # whole children i0 .. i1-1
                if i0 > i1:  # [a, b) inside one child
                    out = self._node(t, memo, j + 1, c, label, a - (i1 * hc), b - (i1 * hc))
                else:
                    head = self._node(t, memo, j + 1, c, label, a - (i0 - 1) * hc, hc) if a < i0 * hc else t.ident
                    mid = t.power(self._node(t, memo, j + 1, c, label, 0, hc), i1 - i0)
                    tail = self._node(t, memo, j + 1, c, label, 0, b - i1 * hc)
                    out = t.concat(t.concat(head, mid), tail)
            if hr and hi > q * hc:
                out = t.concat(out, self._node(t, memo, j + 1, r, label, lo - q * hc, hi - q * hc))
            return out
        # a piece of the labelled axis: child i adds i * w to the label
        w = self.n // (f.pre * f.size)
        if self.plain[j + 1]:  # no piece below: child i is one run, the children a staircase
            return self._staircase(t, label, w, hc, q, hr, lo, hi)
        out = t.ident
        b = min(hi, q * hc)
        for i in range(lo // hc, (b - 1) // hc + 1) if hc and lo < b else ():
            out = t.concat(out, self._node(t, memo, j + 1, c, label + i * w, lo - i * hc, hi - i * hc))
            if not out[1]:
                return out
        if hr and hi > q * hc:
            out = t.concat(out, self._node(t, memo, j + 1, r, label + q * w, lo - q * hc, hi - q * hc))
        return out

    def _staircase(self, t: _Target, label: int, w: int, hc: int, q: int, hr: int, lo: int, hi: int) -> tuple:
        """Positions ``[lo, hi)`` of ``q`` runs of ``hc`` labelled ``label + i*w``, then one of
        ``hr`` labelled ``label + q*w``: O(1), whatever ``q``."""
        out = t.ident
        b = min(hi, q * hc)
        if hc and lo < b:
            i0, i1 = lo // hc, (b - 1) // hc
            if i0 == i1:
                out = t.run(label + i0 * w, b - lo)
            else:
                out = t.run(label + i0 * w, (i0 + 1) * hc - lo)
                out = t.concat(out, t.stair(label + (i0 + 1) * w, w, hc, i1 - i0 - 1))
                out = t.concat(out, t.run(label + i1 * w, b - i1 * hc))
        if hr and hi > q * hc:
            out = t.concat(out, t.run(label + q * w, min(hi, q * hc + hr) - max(lo, q * hc)))
        return out


def _cut_matches(mesh: Mesh, N: int, lv, sf: int, axis: str, cand) -> bool:
    """Does ``cand`` hold, on every device, what DTensor's cut ``S``/``SS(d, sf)`` on ``axis``
    leaves of a dim of size ``N`` whose pieces (DTensor's earlier cuts exactly) are ``lv``?

    Decided per class of devices of the earlier axes (``digit_classes``: a few per axis,
    whatever the axis size) from chunk lengths: the cost grows with the number of factors
    and, for pieces of ``axis`` spread over the dim, with the size of ``axis``; never with N.
    ``_cut_matches(Mesh.parse("x=2,y=2"), 10, [Factor(2), Factor(2, "x"), Factor(3)], 1, "y",
    [Factor(2, "y"), Factor(2, "x"), Factor(3)]) -> True``
    """
    lv, cand = tuple(lv), tuple(cand)
    if not _same_held(N, lv, cand, axis):
        return False
    n = mesh.axis_size(axis)
    for digits in digit_classes(N, lv):
        T = held_length(N, lv, digits)
        by_piece = {(f.axis, f.pre): g for f, g in zip(lv, digits) if f.axis is not None}
        labels = _Labels(N, cand, mesh, axis, by_piece)
        if labels.held(0, N) != T:  # equal after _same_held: a cheap guard
            return False
        if T == 0:
            continue
        cs = ceil_div(T, sf)
        q, r = T // cs, T % cs
        if cs == 1:  # every group one element: every label 0
            if not labels.summary(_Target(1, n), 0, T)[1]:
                return False
            continue
        body = labels.summary(_Target(cs, n), 0, q * cs)[1]
        if not body or body[0][0] != 0:
            return False
        if r:
            tail = labels.summary(_Target(r, n), q * cs, T)[1]
            if not tail or tail[0][0] != 0:
                return False
    return True


def _same_held(N: int, lv: tuple, cand: tuple, axis: str) -> bool:
    """Do ``cand`` and ``lv`` hold the same elements on every device of the axes of ``lv``
    (the pieces of the new ``axis`` read as local)? For the candidates of ``_cut_candidates``:
    ``lv``'s leaves cut further (the innermost cut) hold the same; binding digits cuts each
    local factor of ``lv`` into a run of factors of the same product, which holds the same
    where that run cuts every chunk it meets as the factor does (``_chunk_rle``), or where
    no axis of ``lv`` cuts below it. A run cutting some chunk otherwise, above an axis of
    ``lv``, moves that axis's pieces and never says DTensor's cut: found so by the
    element-wise definition on every small case (``tests/sharding/test_symbolic.py``, and
    exhaustively on 2-D and 3-D meshes of sizes 2-4, dims up to 30, split factors up to 8).
    ``_same_held(8, (Factor(8),), (Factor(2, "x"), Factor(4)), "x") -> True``
    """
    body = lv[:-1] if lv and lv[-1].axis is None else lv
    if cand[: len(body)] == body and all(f.axis in (None, axis) for f in cand[len(body) :]):
        return True
    lengths = level_lengths(N, lv)
    last_axis = max((i for i, f in enumerate(lv) if f.axis is not None), default=-1)
    j = 0
    for i, f in enumerate(lv):
        if f.axis is not None:
            if j >= len(cand) or cand[j] != f:
                return False
            j += 1
            continue
        run, p = [], 1
        while p < f.size and j < len(cand) and cand[j].axis in (None, axis):
            run.append(cand[j].size)
            p *= cand[j].size
            j += 1
        if p != f.size:
            return False
        if len(run) > 1 and i < last_axis and i < len(lengths):
            if any(_chunk_rle(L, (f.size,)) != _chunk_rle(L, run) for L in lengths[i]):
                return False
    return j == len(cand)


def _chunk_rle(L: int, sizes, cap: int = 4):
    """The lengths of the non-empty chunks after cutting ``L`` by each size in turn, run-length
    encoded (``((length, count), ...)``), or None past ``cap`` runs.
    ``_chunk_rle(10, (2, 2)) -> ((3, 1), (2, 1), (3, 1), (2, 1))``"""
    seq = [(L, 1)]
    for k in sizes:
        out: list = []
        for x, m in seq:
            c, q, r = chunk_counts(x, k)
            one = [(y, t) for y, t in ((c, q), (r, 1)) if y and t]
            reps = one * m if len(one) > 1 else [(one[0][0], one[0][1] * m)] if one else []
            for y, t in reps:
                if out and out[-1][0] == y:
                    out[-1] = (y, out[-1][1] + t)
                else:
                    out.append((y, t))
                if len(out) > cap:
                    return None
        seq = out
    return tuple(seq)


# ------------------------------------------------------------------------------------------
# Sharding -> placements
# ------------------------------------------------------------------------------------------


def to_placements(s: ShardingLike) -> tuple:
    """DTensor placements reproducing ``s`` exactly, or ``NotRepresentable`` saying why.

    ``Sharding.parse("[tp*2*dp*2]", Mesh.parse("dp=2,tp=4")).to_placements() -> ('SS(0,8)', 'S(0)')``

    Exact by construction: the answer is a placement list whose ``from_placements`` is
    ``s`` itself. The split factors are first read off the factors (the local digits in
    front of each axis's major piece: exact on even dims), and that list is checked; an
    uneven dim where the reading fails (a cut made innermost, behind local chunks of an
    earlier cut) searches the split factors its factors allow (``_search_dim``).

    Decided from the factors and their chunk lengths, never per element (``_cut_matches``),
    and memoised per sharding.
    """
    found = _placements_or_reason(s)
    if isinstance(found, str):
        raise NotRepresentable(found)
    return found


@memo(1 << 14)
def _placements_or_reason(s: ShardingLike):
    """``to_placements``' answer as a value: the placements, or the reason there are none."""
    try:
        return _find_placements(s)
    except NotRepresentable as e:
        return str(e)


def _find_placements(s: ShardingLike) -> tuple:
    mesh = s.mesh
    partial = dict(s.partial)
    out = []
    steps = {
        st.axis: (d, st.sf)
        for d, fs in enumerate(s.dims)
        if isinstance(fs, ChunkProgram)
        for st in fs
    }
    on_dim: dict = {}  # dim -> [(mesh index, axis)] of the axes its factors use, mesh order
    for i, (name, n) in enumerate(zip(mesh.names, mesh.shape)):
        if name in partial:
            out.append(f"P({partial[name]})")
            continue
        if name in steps:
            d, sf = steps[name]
            out.append("S(%d)" % d if sf == 1 else "SS(%d,%d)" % (d, sf))
            continue
        pieces = s.axis_pieces(name)
        if not pieces:
            out.append("R")
            continue
        if len({d for d, _, _ in pieces}) > 1 or _product(f.size for _, _, f in pieces) != n:
            shown = ", ".join(f"{_fmt_factor(f, mesh)} in dim {d}" for d, _, f in pieces)
            raise NotRepresentable(
                f"{s}: mesh axis {name!r} is split into sub-axes ({shown}) that are not the whole "
                "axis in one dim; DTensor has no placement for a piece of a mesh dim (Shardy and "
                "shardlayout do): gather the axis or keep the sharding in shardlayout/Shardy form"
            )
        d, j, _ = pieces[0]  # the major piece; before it, the local digits when it was cut
        sf = _product(f.size for f in s.dims[d][:j] if f.local or mesh.axis_index(f.axis) > i)
        out.append(_placement(d, sf))
        on_dim.setdefault(d, []).append((i, name))
    result = tuple(out)
    back = _try_from_placements(s, result)
    if back == s:
        return result
    found = list(result)
    for d, axes in on_dim.items():
        if back is not None and back.dims[d] == s.dims[d]:
            continue
        # An even dim is cut by binding digits at every step, and the first reading inverts
        # that exactly; only uneven dims (cut innermost, checked element-wise) need a search.
        sfs = None if s.is_even(d) else _search_dim(s, d, axes)
        if sfs is None:
            nearest = "" if back is None else f" (the nearest, {list(result)}, means {back})"
            raise NotRepresentable(
                f"{s}: no S/SS placements of axes {', '.join(a for _, a in axes)} cut dim {d} this "
                f"way: no DTensor placement list reproduces this order of mesh axes within a "
                f"dim{nearest}; DTensor applies mesh dims left to right. Redistribute to an order "
                "DTensor can say, or keep the sharding in shardlayout form"
            )
        for (i, _), sf in zip(axes, sfs):
            found[i] = _placement(d, sf)
    found = tuple(found)
    back = _try_from_placements(s, found)
    if back != s:  # each dim was matched exactly and dims are cut independently
        raise NotRepresentable(
            f"{s}: the placements found dim by dim, {list(found)}, mean {back} (an internal "
            "inconsistency: please report it with this sharding)"
        )
    return found


def _placement(d: int, sf: int) -> str:
    return "S(%d)" % d if sf == 1 else "SS(%d,%d)" % (d, sf)


def _try_from_placements(s: ShardingLike, placements):
    """The Sharding ``placements`` give a tensor of ``s``'s shape on its mesh (built with
    ``s``'s own class), or None when they give none."""
    try:
        return type(s)(s.mesh, *parts_from_placements(s.mesh, s.shape, placements))
    except NotRepresentable:
        return None


def _split_factors(mesh: Mesh, fs: tuple, i: int, name: str) -> list:
    """Split factors that may have put axis ``name`` (mesh dim i) where it is in ``fs``.

    An ``SS(d, sf)`` cut leaves the ``sf`` chunks as local factors (later split by later
    axes) in front of the axis's major piece: either all the local digits before it
    (binding digits, as on even dims: the first answer) or a run right before it (uneven
    dims cut innermost). So each product of a run of local or later-axis factors ending
    at the major piece is a candidate; earlier axes count 1.
    ``_split_factors(Mesh.parse("a=3,b=3"), [Factor(2), Factor(3, "a"), Factor(2), Factor(3, "b")],
    1, "b") -> [4, 2, 1]``
    """
    j = min((j for j, f in enumerate(fs) if f.axis == name), key=lambda j: fs[j].pre)
    out = [1]
    sf = 1
    for f in reversed(fs[:j]):
        if f.local or mesh.axis_index(f.axis) > i:
            sf *= f.size
            if sf not in out:
                out.append(sf)
    out.reverse()  # all of them first, then shorter runs
    return out


def _frame(fs, names) -> tuple:
    """What later cuts leave of ``fs`` for the axes ``names`` already placed: their pieces
    ``(axis, size, pre)`` in order, with the product of the other factors in front of and
    between them (later cuts only split those, or redo the local chunks after the last
    piece). Adjacent pieces of one axis are joined, as the canonical form joins them."""
    out: list = []
    gap = 1
    for f in fs:
        if f.axis is None or f.axis not in names:
            gap *= f.size
            continue
        if gap == 1 and out and out[-1][0] == f.axis and out[-1][1] * out[-1][2] == f.pre:
            out[-1] = (f.axis, out[-1][1] * f.size, out[-1][2])
        else:
            out += [gap, (f.axis, f.size, f.pre)]
            gap = 1
    return tuple(out)


def _search_dim(s: ShardingLike, d: int, axes: list):
    """Split factors (one per axis of ``axes``, mesh order) whose ``S``/``SS`` placements
    make ``from_placements`` give dim d exactly ``s.dims[d]``, or None when none does.

    Depth first over each axis's ``_split_factors``, the first answer in that order. Later
    cuts keep the frame of the axes already placed (``_frame``), so a cut whose frame is
    not that of ``s`` is dropped before it is checked (``_cut_matches``)."""
    mesh, shape, target = s.mesh, s.shape, s.dims[d]
    cands = [_split_factors(mesh, target, i, name) for i, name in axes]
    wants = [_frame(target, {name for _, name in axes[: t + 1]}) for t in range(len(axes))]
    everything = {name for _, name in axes}

    def go(t: int, lv: list):
        if t == len(axes):
            return [] if _canonical_dim(mesh, shape, d, lv) == target else None
        i, name = axes[t]
        for sf in cands[t]:
            options = _cut_candidates(shape[d], lv, sf, mesh.shape[i], name)
            fits = [_frame(c, everything) == wants[t] for c, _ in options]
            for k, (cand, exact) in enumerate(options):
                if not any(fits[k:]):
                    break
                if exact or _cut_matches(mesh, shape[d], lv, sf, name, cand):
                    # from_placements takes this candidate: follow it only if it fits
                    rest = go(t + 1, cand) if fits[k] else None
                    if rest is not None:
                        return [sf] + rest
                    break
        return None

    return go(0, [Factor(shape[d])])


def to_dtensor(s: ShardingLike) -> list:
    """torch placement objects for ``s`` (needs the torch extra)."""
    try:
        from torch.distributed.tensor import Partial, Replicate, Shard
        from torch.distributed.tensor.placement_types import _StridedShard
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise NotRepresentable("to_dtensor needs torch: pip install 'shardlayout[torch]'") from e
    out = []
    for p in to_placements(s):
        q = parse_placement(p, s.ndim)
        if q[0] == "R":
            out.append(Replicate())
        elif q[0] == "S":
            out.append(Shard(q[1]))
        elif q[0] == "SS":
            out.append(_StridedShard(q[1], split_factor=q[2]))
        else:
            out.append(Partial(q[1]))
    return out


# ------------------------------------------------------------------------------------------
# JAX PartitionSpec
# ------------------------------------------------------------------------------------------


def parts_from_partition_spec(mesh: Mesh, shape, spec) -> ShardingParts:
    """JAX's per-dim axes (major first) to a Sharding's parts; sub-axes as ``'x:(1)2'``.

    ``parts_from_partition_spec(Mesh.parse("x=2,y=2"), (8, 4), (("x", "y"), None))``
    """
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(shape)
    if not isinstance(spec, (list, tuple)):
        raise ShardingSpecError(
            f"from_partition_spec: spec {reprlib.repr(spec)} is not a PartitionSpec; give one entry per dim (None, "
            "an axis name or a tuple of axis names), e.g. ('dp', None)")
    spec = list(spec)
    if len(spec) > len(shape):
        raise ShardingSpecError(
            f"from_partition_spec: spec {tuple(spec)} has {len(spec)} entries for a {len(shape)}-d tensor"
        )
    spec += [None] * (len(shape) - len(spec))
    dims = []
    for d, entry in enumerate(spec):
        if entry is None:
            dims.append(())
            continue
        if not isinstance(entry, (str, list, tuple)):
            raise ShardingSpecError(
                f"from_partition_spec: entry {d} of {tuple(spec)} is {reprlib.repr(entry)}; an entry is None, an "
                "axis name or a tuple of axis names, e.g. ('dp', None) or (('dp', 'tp'),)")
        names = (entry,) if isinstance(entry, str) else tuple(entry)
        fs = [parse_factor(a, mesh) for a in names]
        total = _product(f.size for f in fs)
        if len(fs) > 1 and shape[d] % total:
            raise NotRepresentable(
                f"from_partition_spec: dim {d} (size {shape[d]}) on {names} is uneven; JAX cuts "
                f"it once into {total} padded chunks, which differs from cutting axis by axis"
            )
        dims.append(tuple(fs))
    return ShardingParts(shape, tuple(dims))


def to_partition_spec(s: ShardingLike) -> tuple:
    """Per dim: None, an axis name, or a tuple of axes (major first); raises
    ``NotRepresentable`` for partial values or local factors between sharded ones."""
    if s.partial:
        raise NotRepresentable(
            f"{s}: partial values ({', '.join(a for a, _ in s.partial)}) have no PartitionSpec form"
        )
    out = []
    for d, fs in enumerate(s.dims):
        if isinstance(fs, ChunkProgram):
            raise NotRepresentable(
                f"{s}: dim {d} is cut as DTensor's strided placements cut it unevenly; "
                "a PartitionSpec cannot express it"
            )
        axes = [f for f in fs if not f.local]
        if not axes:
            out.append(None)
            continue
        first_local = next((j for j, f in enumerate(fs) if f.local), len(fs))
        if any(not f.local for f in fs[first_local:]):
            raise NotRepresentable(
                f"{s}: dim {d} has a local factor outside its sharded ones (a strided shard); "
                "a PartitionSpec shards each dim in contiguous blocks only"
            )
        if len(axes) > 1 and not s.is_even(d):
            raise NotRepresentable(
                f"{s}: dim {d} is uneven over several axes; JAX would cut it once, not axis by axis"
            )
        names = [_fmt_factor(f, s.mesh) for f in axes]
        out.append(names[0] if len(names) == 1 else tuple(names))
    return tuple(out)
