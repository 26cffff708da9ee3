"""DTensor placements and JAX PartitionSpecs <-> ``Sharding``.

DTensor applies placements left to right over the mesh dims: ``Shard(d)`` cuts the
current local piece of dim d into ``n`` chunks (torch.chunk) and keeps the device's;
``_StridedShard(d, sf)`` first cuts it into ``sf`` chunks, cuts each into ``n`` and keeps
the device's chunk of each, in order. On even dims both only bind digits of the local
index to the mesh axis; we do exactly that, and check uneven cases against the
definition itself. A conversion that would lose information raises ``NotRepresentable``.

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
from itertools import product
from typing import NamedTuple

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
    _product,
    chain_extent,
    factor_digit,
    parse_factor,
)

# ------------------------------------------------------------------------------------------
# placement values
# ------------------------------------------------------------------------------------------

_RE_S = re.compile(r"^S\(\s*(-?\d+)\s*\)$")
_RE_SS = re.compile(r"^SS\(\s*(-?\d+)\s*,\s*(\d+)\s*\)$")
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


MAX_SPLIT_FACTOR = 1 << 20


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
    placements = list(placements)
    if len(placements) != mesh.ndim:
        raise ShardingSpecError(
            f"from_placements: {len(placements)} placements for mesh {mesh} with {mesh.ndim} dims; "
            "give one placement per mesh dim"
        )
    progs = [parse_placement(p, len(shape), f"placement {i} ({p!r})") for i, p in enumerate(placements)]
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
            if exact or _matches_dtensor(mesh, shape, progs[: i + 1], cand, d):
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
    DTensor's own definition (``_matches_dtensor``).
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


def _dtensor_dim_indices(N: int, progs, mesh: Mesh, d: int, coord) -> list:
    """DTensor's own definition, on index lists: the elements of dim d held at ``coord``."""
    cur = list(range(N))
    for i, p in enumerate(progs):
        if p[0] not in ("S", "SS") or p[1] != d:
            continue
        n, c = mesh.shape[i], coord[i]
        if p[0] == "S":
            cur = _torch_chunk(cur, n, c)
        else:
            cur = [x for part in _torch_chunks(cur, p[2]) for x in _torch_chunk(part, n, c)]
    return cur


def _torch_chunk(xs: list, k: int, i: int) -> list:
    """``torch.chunk(xs, k)[i]`` (ceil-sized chunks; trailing ones short or empty)."""
    c = ceil_div(len(xs), k) if xs else 0
    return xs[i * c : (i + 1) * c]


def _torch_chunks(xs: list, k: int) -> list:
    """The non-empty chunks of ``torch.chunk(xs, k)``, in order (at most ``len(xs)``)."""
    c = ceil_div(len(xs), k) if xs else 0
    return [xs[a : a + c] for a in range(0, len(xs), c)] if c else []


def _matches_dtensor(mesh, shape, progs, factors, d: int) -> bool:
    """True when ``factors`` give every device the elements of dim d that DTensor's
    placements ``progs`` give it, in the same order. Only the mesh axes cutting dim d
    matter, so only their coordinates are enumerated."""
    axes = {i for i, p in enumerate(progs) if p[0] in ("S", "SS") and p[1] == d}
    axes |= {mesh.axis_index(f.axis) for f in factors if f.axis is not None}
    axes = sorted(axes)
    coord = [0] * mesh.ndim
    for vals in product(*(range(mesh.shape[i]) for i in axes)):
        for i, v in zip(axes, vals):
            coord[i] = v
        c = tuple(coord)
        want = _dtensor_dim_indices(shape[d], progs, mesh, d, c)
        digits = [None if f.axis is None else factor_digit(mesh, f, c) for f in factors]
        got = [x for lo, hi in _held_ranges(shape[d], factors, digits) for x in range(lo, hi)]
        if want != got:
            return False
    return True


def _held_ranges(N: int, factors, digits) -> list:
    """``shards.dim_ranges`` for a check: the same chunk tree, but empty chunks are dropped
    as they appear, so a large split factor on a short dim stays cheap (a candidate such
    as ``SS(0,405)`` on 24 elements would otherwise enumerate every empty chunk).
    ``_held_ranges(9, [Factor(2, "x"), Factor(5)], [1, None]) -> [(5, 9)]``"""
    ranges = [(0, N)]
    last = len(factors) - 1
    for j, f in enumerate(factors):
        if f.axis is None and j == last:
            break
        out = []
        for lo, hi in ranges:
            c = ceil_div(hi - lo, f.size)
            for k in range(f.size) if f.axis is None else (digits[j],):
                a = lo + k * c
                if a >= hi:
                    break
                out.append((a, min(a + c, hi)))
        ranges = out
    return ranges


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
    """
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
    not that of ``s`` is dropped before any element-wise check."""
    mesh, shape, target = s.mesh, s.shape, s.dims[d]
    cands = [_split_factors(mesh, target, i, name) for i, name in axes]
    wants = [_frame(target, {name for _, name in axes[: t + 1]}) for t in range(len(axes))]
    progs = [("R",)] * mesh.ndim
    everything = {name for _, name in axes}

    def go(t: int, lv: list):
        if t == len(axes):
            return [] if _canonical_dim(mesh, shape, d, lv) == target else None
        i, name = axes[t]
        for sf in cands[t]:
            progs[i] = ("S", d) if sf == 1 else ("SS", d, sf)
            options = _cut_candidates(shape[d], lv, sf, mesh.shape[i], name)
            fits = [_frame(c, everything) == wants[t] for c, _ in options]
            for k, (cand, exact) in enumerate(options):
                if not any(fits[k:]):
                    break
                if exact or _matches_dtensor(mesh, shape, progs[: i + 1], cand, d):
                    # from_placements takes this candidate: follow it only if it fits
                    rest = go(t + 1, cand) if fits[k] else None
                    if rest is not None:
                        return [sf] + rest
                    break
        progs[i] = ("R",)
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
