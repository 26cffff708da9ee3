"""DTensor placements and JAX PartitionSpecs <-> ``Sharding``.

DTensor applies placements left to right over the mesh dims: ``Shard(d)`` cuts the
current local piece of dim d into ``n`` chunks (torch.chunk) and keeps the device's;
``_StridedShard(d, sf)`` first cuts it into ``sf`` chunks, cuts each into ``n`` and keeps
the device's chunk of each, in order. On even dims both only bind digits of the local
index to the mesh axis; we do exactly that, and check uneven cases against the
definition itself. A conversion that would lose information raises ``NotRepresentable``.

    >>> from shardlayout.mesh import Mesh
    >>> m = Mesh.parse("dp=2,tp=2")
    >>> str(from_placements(m, (8, 8), ["SS(0,2)", "S(0)"]))
    '[tp*dp*2, 8]'
"""

from __future__ import annotations

import re

from ..errors import NotRepresentable, ShardingSpecError
from ..mesh import Mesh
from .core import (
    REDUCE_OPS,
    ChunkProgram,
    Factor,
    Sharding,
    Step,
    _fmt_factor,
    _product,
    ceil_div,
    chain_extent,
)

# ------------------------------------------------------------------------------------------
# placement values
# ------------------------------------------------------------------------------------------

_RE_S = re.compile(r"^S\(\s*(-?\d+)\s*\)$")
_RE_SS = re.compile(r"^SS\(\s*(-?\d+)\s*,\s*(\d+)\s*\)$")
_RE_P = re.compile(r"^P(?:\(\s*([a-z]+)\s*\))?$")


def parse_placement(p, ndim: int, where: str = "placement") -> tuple:
    """Normalise one placement to ``("R",)``, ``("S", d)``, ``("SS", d, sf)`` or ``("P", op)``.

    Accepts ``"R"``, ``"S(0)"``, ``"SS(0,2)"``, ``"P"``, ``"P(max)"`` and torch's objects.
    ``parse_placement("SS(1,2)", 2) -> ('SS', 1, 2)``
    """
    if isinstance(p, str):
        t = p.strip().replace("Shard", "S").replace("Replicate()", "R").replace("Partial", "P")
        t = t.replace("P()", "P")
        if t == "R":
            return ("R",)
        m = _RE_S.match(t)
        if m:
            return ("S", _dim(int(m.group(1)), ndim, where))
        m = _RE_SS.match(t)
        if m:
            sf = int(m.group(2))
            if sf < 1:
                raise ShardingSpecError(f"{where}: split factor {sf} of {p!r} must be >= 1")
            return ("SS", _dim(int(m.group(1)), ndim, where), sf)
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
        return ("SS", _dim(p.dim, ndim, where), int(p.split_factor))
    if cls == "Shard":
        return ("S", _dim(p.dim, ndim, where))
    if cls in ("Partial", "_Partial", "_NormPartial", "MaskPartial"):
        op = getattr(p, "reduce_op", "sum")
        op = {"sum": "sum", "avg": "avg", "max": "max", "min": "min"}.get(str(op), None)
        if op is None:
            raise NotRepresentable(f"{where}: {p!r} reduces with {p.reduce_op!r}, not sum/avg/max/min")
        return ("P", op)
    raise ShardingSpecError(f"{where}: {p!r} is not a placement")


def _dim(d: int, ndim: int, where: str) -> int:
    if not -ndim <= d < ndim:
        raise ShardingSpecError(f"{where}: dim {d} is out of range for a tensor with {ndim} dims")
    return d % ndim


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


def from_placements(mesh: Mesh, shape, placements) -> Sharding:
    """DTensor placements (one per mesh dim) to a Sharding, DTensor semantics exactly."""
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
        N = shape[d]
        lv = levels[d]
        body = lv[:-1] if lv and lv[-1].local else lv
        if all(not f.local for f in body):
            # the local piece is one range: cut it (exact, even or not)
            new = body + ([Factor(sf)] if sf > 1 else []) + [Factor(n, name)]
            ext = chain_extent(N, [f.size for f in new])
            levels[d] = new + ([Factor(ext)] if ext > 1 else [])
            continue
        # several local pieces: bind the right digits (exact on even dims), or else cut
        # innermost; uneven candidates are checked against DTensor's own definition
        cands = []
        absorbed = _absorb(lv, sf, n, name)
        if absorbed is not None:
            cands.append(absorbed)
        new = body + ([Factor(sf)] if sf > 1 else []) + [Factor(n, name)]
        ext = chain_extent(N, [f.size for f in new])
        cands.append(new + ([Factor(ext)] if ext > 1 else []))
        levels[d] = None  # no factor layout: the dim becomes a ChunkProgram
        for cand in cands:
            even = _product(f.size for f in cand) == N and _product(f.size for f in lv) == N
            if (even and cand is absorbed) or _matches_dtensor(mesh, shape, progs[: i + 1], cand, d):
                levels[d] = cand
                break
    dims = [
        lv if lv is not None else ChunkProgram(st for st in programs[d] if st.size > 1)
        for d, lv in enumerate(levels)
    ]
    return Sharding(mesh, shape, dims, partial)


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
            cur = _torch_chunk(cur, n)[c]
        else:
            cur = [x for part in _torch_chunk(cur, p[2]) for x in _torch_chunk(part, n)[c]]
    return cur


def _torch_chunk(xs: list, k: int) -> list:
    c = ceil_div(len(xs), k) if xs else 0
    return [xs[i * c : (i + 1) * c] if c else [] for i in range(k)]


def _matches_dtensor(mesh, shape, progs, factors, d: int) -> bool:
    from .shards import dim_ranges, factor_digit

    for r in mesh.ranks():
        coord = mesh.coord(r)
        want = _dtensor_dim_indices(shape[d], progs, mesh, d, coord)
        digits = [None if f.axis is None else factor_digit(mesh, f, coord) for f in factors]
        got = [x for lo, hi in dim_ranges(shape[d], tuple(factors), digits) for x in range(lo, hi)]
        if want != got:
            return False
    return True


# ------------------------------------------------------------------------------------------
# Sharding -> placements
# ------------------------------------------------------------------------------------------


def to_placements(s: Sharding) -> tuple:
    """DTensor placements reproducing ``s`` exactly, or ``NotRepresentable`` saying why."""
    mesh = s.mesh
    partial = dict(s.partial)
    out = []
    applied: set = set()
    steps = {
        st.axis: (d, st.sf)
        for d, fs in enumerate(s.dims)
        if isinstance(fs, ChunkProgram)
        for st in fs
    }
    for name, n in zip(mesh.names, mesh.shape):
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
        if len(pieces) > 1 or pieces[0][2].size != n:
            shown = ", ".join(_fmt_factor(f, mesh) for _, _, f in pieces)
            raise NotRepresentable(
                f"{s}: mesh axis {name!r} is split into sub-axes ({shown}); DTensor has no "
                "placement for a piece of a mesh dim (Shardy and shardlayout do)"
            )
        d, j, _ = pieces[0]
        sf = _product(
            f.size for f in s.dims[d][:j] if f.local or mesh.axis_index(f.axis) > mesh.axis_index(name)
        )
        out.append("S(%d)" % d if sf == 1 else "SS(%d,%d)" % (d, sf))
        applied.add(name)
    result = tuple(out)
    try:
        back = from_placements(mesh, s.shape, result)
    except NotRepresentable:
        back = None
    if back != s:
        raise NotRepresentable(
            f"{s}: no DTensor placement list reproduces this order of mesh axes within a dim "
            f"(the nearest, {list(result)}, means {back}); DTensor applies mesh dims left to right"
        )
    return result


def to_dtensor(s: Sharding) -> list:
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


def from_partition_spec(mesh: Mesh, shape, spec) -> Sharding:
    """JAX's per-dim axes (major first) to a Sharding; sub-axes as ``'x:(1)2'``.

    ``from_partition_spec(Mesh.parse("x=2,y=2"), (8, 4), (("x", "y"), None))``
    """
    from .core import parse_factor

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
            dims.append([])
            continue
        names = (entry,) if isinstance(entry, str) else tuple(entry)
        fs = [parse_factor(a, mesh) for a in names]
        total = _product(f.size for f in fs)
        if len(fs) > 1 and shape[d] % total:
            raise NotRepresentable(
                f"from_partition_spec: dim {d} (size {shape[d]}) on {names} is uneven; JAX cuts "
                f"it once into {total} padded chunks, which differs from cutting axis by axis"
            )
        dims.append(fs)
    return Sharding(mesh, shape, dims)


def to_partition_spec(s: Sharding) -> tuple:
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
