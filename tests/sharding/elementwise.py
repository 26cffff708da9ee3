"""Element-wise oracles: the definitions the symbolic metadata functions must agree with.

Each enumerates the elements (or ranges) a device holds, so it is only for small tensors:
the tests compare it with the symbolic function on random small cases
(``test_symbolic.py``). It is the code ``placements.py`` and ``shards.py`` used before
deciding from chunk lengths (see ``git log``), kept verbatim where it was a definition.
"""

from __future__ import annotations

from itertools import product

from shardlayout.layout.inttuple import ceil_div
from shardlayout.sharding.factors import factor_digit
from shardlayout.sharding.shards import dim_ranges


def torch_chunk(xs: list, k: int, i: int) -> list:
    """``torch.chunk(xs, k)[i]`` (ceil-sized chunks; trailing ones short or empty)."""
    c = ceil_div(len(xs), k) if xs else 0
    return xs[i * c : (i + 1) * c]


def torch_chunks(xs: list, k: int) -> list:
    """All ``k`` parts of ``torch.chunk(xs, k)``, empty ones included, in order."""
    return [torch_chunk(xs, k, i) for i in range(k)]


def dtensor_dim_indices(N: int, progs, mesh, d: int, coord) -> list:
    """DTensor's own definition, on index lists: the elements of dim d held at ``coord``."""
    cur = list(range(N))
    for i, p in enumerate(progs):
        if p[0] not in ("S", "SS") or p[1] != d:
            continue
        n, c = mesh.shape[i], coord[i]
        if p[0] == "S":
            cur = torch_chunk(cur, n, c)
        else:
            cur = [x for part in torch_chunks(cur, p[2]) for x in torch_chunk(part, n, c)]
    return cur


def held(N: int, factors, mesh, coord) -> list:
    """The elements of a dim of size N that ``factors`` give the device at ``coord``, in order."""
    digits = [None if f.axis is None else factor_digit(mesh, f, coord) for f in factors]
    return [x for lo, hi in dim_ranges(N, tuple(factors), digits) for x in range(lo, hi)]


def matches_dtensor(mesh, shape, progs, factors, d: int) -> bool:
    """True when ``factors`` give every device the elements of dim d that DTensor's
    placements ``progs`` give it, in the same order (every coordinate, every element)."""
    coord = [0] * mesh.ndim
    for c in product(*(range(n) for n in mesh.shape)):
        coord = tuple(c)
        if dtensor_dim_indices(shape[d], progs, mesh, d, coord) != held(shape[d], factors, mesh, coord):
            return False
    return True


def cut_matches(mesh, N: int, lv, sf: int, axis: str, cand) -> bool:
    """``placements._cut_matches`` element by element: DTensor's cut ``SS(d, sf)`` on ``axis``
    of the list ``lv`` holds, against what ``cand`` holds, on every device."""
    i = mesh.axis_index(axis)
    n = mesh.shape[i]
    for c in product(*(range(k) for k in mesh.shape)):
        coord = tuple(c)
        have = held(N, lv, mesh, coord)
        want = [x for part in torch_chunks(have, sf) for x in torch_chunk(part, n, coord[i])]
        if want != held(N, cand, mesh, coord):
            return False
    return True


def local_shape(s, rank: int) -> tuple:
    """The local shape as the number of indices held, dim by dim."""
    return tuple(len(ix) for ix in s.indices(rank))
