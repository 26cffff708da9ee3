"""Rank classes: which ranks run the same local program, computed from factor lists alone.

A rank's local piece of one dim of a sharding depends only on the digits its mesh coordinate
gives the *axis factors of that dim* (``shards.dim_ranges``): ``[dp of 2, tp of 8, 16]`` reads
``dp`` in dim 0 and ``tp`` in dim 1, nothing else. So for a set of shardings (the operands of
one op, or the source and target of one collective):

1. every uneven dim that carries axis factors is an *item* ``(extent, factors)`` reading a set
   of axes (an even dim cuts equal chunks for every coordinate: it never splits a class);
2. axes read together by some item are *coupled*; the coupled sets (components) are disjoint,
   and an axis no item reads is irrelevant to the local program;
3. per component, its coordinates are enumerated (the product of *its* axis sizes only — 256
   and 32 on ``dp=256,tp=32``, never 8192 unless one dim reads both) and each gets the key
   "chunk lengths of every item it reads" (``[(0, 1)]`` -> ``(1,)``, an empty chunk ``()``);
4. a class is one key per component; its size is the product of the components' counts.

Two ranks of one class hold pieces of the same shapes, cut into the same chunk lengths, for
every operand: their local programs are the same program on relabelled global indices. Even
shardings give one class; ``torch.chunk``'s uneven cuts give a few (full, short, empty).

Why one representative proves the class: the index-level checks (``execute.proof``) hold for
*every* rank, for every value, by construction — they compare index sets, not numbers. What a
numeric run adds is evidence that the op's declared index map (which letters pass through,
which must be whole) is its true semantics, and an op that honours that map is equivariant
under relabelling the indices of its pass-through letters. Within a class the relabelling is
a bijection between equally long chunk lists, so a run on one member is a run on all of them.
We run two members per class (the first and the last coordinate of every component): a map
that wrongly lets a position-dependent index (a causal mask's query position) pass through is
invisible on the first chunk and caught on the last.

    >>> from shardlayout import Mesh, Sharding
    >>> m = Mesh.parse("dp=256,tp=32")
    >>> cls = rank_classes(m, (Sharding.parse("[dp of 2, tp of 8, 16]", m),))
    >>> [(c.size, c.key, c.representatives) for c in cls][:2]
    [(16, (((1,),), ((1,),)), (0, 39)), (48, (((1,),), ((),)), (8, 63))]
    >>> sorted(c.size for c in cls)  # dp < 2 or not, tp < 8 or not
    [16, 48, 2032, 6096]
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from ..caches import memo
from ..mesh import Mesh, group_ranks
from ..sharding.shards import dim_ranges


@dataclass(frozen=True)
class RankClass:
    """Ranks with the same local program: ``key`` (per component, the chunk lengths of every
    dim it reads), ``size`` (how many ranks) and ``representatives`` (first and last member)."""

    key: tuple
    size: int
    representatives: tuple


@memo(1 << 14)
def dim_axes(mesh: Mesh, factors) -> tuple:
    """Mesh axes a dim's factors read, in mesh order. ``dim_axes(m, (Factor(2, "dp"), Factor(4))) -> ('dp',)``"""
    used = {f.axis for f in factors if f.axis is not None}
    return tuple(a for a in mesh.names if a in used)


def digit(mesh: Mesh, f, c: int) -> int:
    """The digit of axis factor ``f`` at coordinate ``c`` of its axis. ``digit(m, Factor(2, "tp", 2), 3) -> 1``"""
    n = mesh.axis_size(f.axis)
    return (c // (n // (f.pre * f.size))) % f.size


@memo(1 << 17)
def ranges_at(mesh: Mesh, n: int, factors, coords: tuple) -> tuple:
    """The global ranges one dim holds at the coordinates ``coords`` of its axes (``dim_axes``
    order), in local order. ``ranges_at(m, 9, (Factor(2, "x"), Factor(5)), (1,)) -> ((5, 9),)``"""
    digits = [None if p is None else coords[p[0]] // p[1] % p[2] for p in _digit_plan(mesh, factors)]
    return tuple(dim_ranges(n, factors, digits))


@memo(1 << 14)
def _digit_plan(mesh: Mesh, factors) -> tuple:
    """Per factor of a dim: None (local) or ``(position in dim_axes, divisor, size)``; its digit at
    coordinates ``coords`` (``dim_axes`` order) is ``coords[position] // divisor % size`` (``digit``)."""
    axes = dim_axes(mesh, factors)
    return tuple(None if f.axis is None else (axes.index(f.axis), mesh.axis_size(f.axis) // (f.pre * f.size), f.size)
                 for f in factors)


def chunk_lengths(ranges) -> tuple:
    """``((0, 3), (5, 5), (7, 9)) -> (3, 2)``: the lengths of the non-empty chunks."""
    return tuple(hi - lo for lo, hi in ranges if hi > lo)


def coordinates(mesh: Mesh, axes: tuple):
    """Every coordinate tuple of ``axes`` (row-major).
    ``list(coordinates(Mesh.parse("x=2"), ("x",))) -> [(0,), (1,)]``"""
    return product(*(range(mesh.axis_size(a)) for a in axes))


def items_of(shardings) -> tuple:
    """``((extent, factors), ...)``: the distinct *uneven* dims of ``shardings`` that read a mesh
    axis. An even dim gives every rank the same chunk lengths, so it never splits a class.
    ``items_of((Sharding.parse("[dp of 2, tp*4]", m),))`` -> ``((2, (Factor(256, 'dp'),)),)``"""
    out = []
    for s in shardings:
        for d in range(s.ndim):
            fs = s.dims[d]
            if any(f.axis is not None for f in fs) and not s.is_even(d) and (s.shape[d], fs) not in out:
                out.append((s.shape[d], fs))
    return tuple(out)


def components(mesh: Mesh, items: tuple) -> tuple:
    """Disjoint sets of coupled axes (mesh order), each with the items that read it:
    ``((axes, (item, ...)), ...)``. ``components(m, ((9, (Factor(2, "dp"), Factor(2, "tp"))),))``
    -> one component ``("dp", "tp")``."""
    parent = {a: a for a in mesh.names}

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for _, fs in items:
        axes = dim_axes(mesh, fs)
        for a in axes[1:]:
            parent[find(a)] = find(axes[0])
    groups: dict = {}
    for item in items:
        groups.setdefault(find(dim_axes(mesh, item[1])[0]), []).append(item)
    out = []
    for root, its in groups.items():
        axes = tuple(a for a in mesh.names if find(a) == root)
        out.append((axes, tuple(its)))
    return tuple(out)


@memo(4096)
def component_classes(mesh: Mesh, axes: tuple, items: tuple) -> tuple:
    """Classes of one component: ``((key, count, first coords, last coords), ...)`` in order of
    first appearance; ``key`` is the chunk lengths of each item at those coordinates.
    ``component_classes(m, ("x",), ((3, (Factor(2, "x"),)),))`` (x=2)
    -> ``((((2,),), 1, (0,), (0,)), (((1,),), 1, (1,), (1,)))``"""
    seen: dict = {}
    order = []
    reads = [(n, fs, tuple(axes.index(a) for a in dim_axes(mesh, fs))) for n, fs in items]
    for coords in coordinates(mesh, axes):
        key = tuple(chunk_lengths(ranges_at(mesh, n, fs, tuple(coords[i] for i in pos))) for n, fs, pos in reads)
        hit = seen.get(key)
        if hit is None:
            seen[key] = [1, coords, coords]
            order.append(key)
        else:
            hit[0] += 1
            hit[2] = coords
    return tuple((k, seen[k][0], seen[k][1], seen[k][2]) for k in order)


@memo(4096)
def rank_classes(mesh: Mesh, shardings: tuple) -> tuple:
    """The rank classes of a set of shardings (module docstring), as :class:`RankClass` values;
    their sizes add up to ``mesh.size``. ``rank_classes(m, (s,))``"""
    comps = components(mesh, items_of(shardings))
    per = [component_classes(mesh, axes, its) for axes, its in comps]
    out = []
    for combo in product(*per):
        first = [0] * mesh.ndim
        last = [n - 1 for n in mesh.shape]
        size = 1
        for (axes, _), (_, count, lo, hi) in zip(comps, combo):
            size *= count
            for a, x, y in zip(axes, lo, hi):
                first[mesh.axis_index(a)] = x
                last[mesh.axis_index(a)] = y
        other = 1
        for i, a in enumerate(mesh.names):
            if not any(a in axes for axes, _ in comps):
                other *= mesh.shape[i]
        reps = tuple(dict.fromkeys((mesh.rank_of(tuple(first)), mesh.rank_of(tuple(last)))))
        out.append(RankClass(tuple(c[0] for c in combo), size * other, reps))
    return tuple(out)


def class_key(mesh: Mesh, shardings: tuple, rank: int) -> tuple:
    """The key of ``rank``'s class (``RankClass.key``), from its coordinate alone.
    ``class_key(m, (s,), 5) in {c.key for c in rank_classes(m, (s,))} -> True``"""
    coord = mesh.coord(rank)
    key = []
    for axes, its in components(mesh, items_of(shardings)):
        at = {a: coord[mesh.axis_index(a)] for a in axes}
        key.append(tuple(chunk_lengths(ranges_at(mesh, n, fs, tuple(at[a] for a in dim_axes(mesh, fs))))
                         for n, fs in its))
    return tuple(key)


def representatives(classes) -> tuple:
    """Every class's representatives, sorted, without repeats. ``representatives(rank_classes(m, (s,)))``"""
    return tuple(sorted({r for c in classes for r in c.representatives}))


def axis_group(mesh: Mesh, rank: int, axes) -> tuple:
    """The ranks that agree with ``rank`` everywhere but on the whole mesh ``axes``, ascending.
    ``axis_group(Mesh.parse("dp=2,tp=4"), 5, ("dp",)) -> (1, 5)``"""
    from ..sharding.collective import AxisPiece

    if not axes:
        return (rank,)
    return group_ranks(mesh, rank, tuple(AxisPiece(a, mesh.axis_size(a)) for a in axes))


__all__ = ["RankClass", "axis_group", "chunk_lengths", "class_key", "component_classes", "components", "coordinates",
           "digit", "dim_axes", "group_ranks", "items_of", "rank_classes", "ranges_at", "representatives"]
