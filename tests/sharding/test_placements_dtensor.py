"""Local shards equal DTensor's own, on random meshes, shapes and placements.

The oracle is torch 2.13's own split functions (``Shard._split_tensor``,
``_StridedShard._split_tensor``) applied left to right over the mesh dims, as DTensor
distributes a tensor.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from shardlayout import Mesh, NotRepresentable, Sharding

torch = pytest.importorskip("torch")
from torch.distributed.tensor.placement_types import (  # noqa: E402
    Partial,
    Replicate,
    Shard,
    _StridedShard,
)


def dtensor_local(mesh: Mesh, tensor, placements, coord):
    t = tensor
    for i, p in enumerate(placements):
        if isinstance(p, (Shard, _StridedShard)):
            shards, _ = p._split_tensor(t, mesh.shape[i], with_padding=False)
            t = shards[coord[i]]
    return t


def random_case(rng: random.Random, with_ss=True):
    mesh_nd = rng.randint(1, 3)
    mesh = Mesh(tuple(rng.randint(2, 4) for _ in range(mesh_nd)), ("a", "b", "c")[:mesh_nd])
    nd = rng.randint(1, 3)
    shape = tuple(rng.randint(1, 16) for _ in range(nd))
    placements = []
    for _ in range(mesh_nd):
        k = rng.random()
        if k < 0.2:
            placements.append(Replicate())
        elif k < 0.65 or not with_ss:
            placements.append(Shard(rng.randrange(nd)))
        elif k < 0.95:
            placements.append(_StridedShard(rng.randrange(nd), split_factor=rng.choice([2, 3, 4])))
        else:
            placements.append(Partial())
    return mesh, shape, placements


def compare(mesh, shape, placements) -> None:
    s = Sharding.from_placements(mesh, shape, placements)
    g = torch.arange(int(np.prod(shape))).reshape(shape)
    gn = g.numpy()
    for r in mesh.ranks():
        want = dtensor_local(mesh, g, placements, mesh.coord(r)).numpy()
        got = gn[np.ix_(*s.indices(r))]
        assert got.shape == want.shape == s.local_shape(r), (s, placements, r)
        assert np.array_equal(got, want), (str(s), placements, r, got, want)
    return s


def test_local_shards_equal_dtensor_on_random_placements():
    rng = random.Random(0)
    compared = refused = 0
    uneven = strided = nested = 0
    for _ in range(700):
        mesh, shape, placements = random_case(rng)
        try:
            s = compare(mesh, shape, placements)
        except NotRepresentable:
            refused += 1
            continue
        compared += 1
        uneven += not s.is_even()
        strided += any(isinstance(p, _StridedShard) for p in placements)
        dims = [p.dim for p in placements if isinstance(p, Shard)]
        nested += len(dims) != len(set(dims))
    print(f"compared {compared}, refused {refused}, uneven {uneven}, strided {strided}, nested {nested}")
    assert compared >= 600 and uneven >= 50 and strided >= 100 and nested >= 50
    assert refused == 0


def realistic_case(rng: random.Random):
    """FSDP2+TP style: an SS's split factor is the product of the later mesh dims that
    shard the same tensor dim (DTensor's own meaning of split_factor)."""
    mesh, shape, placements = random_case(rng, with_ss=False)
    out = []
    for i, p in enumerate(placements):
        if isinstance(p, Shard) and rng.random() < 0.5:
            later = [
                mesh.shape[j]
                for j in range(i + 1, mesh.ndim)
                if isinstance(placements[j], Shard) and placements[j].dim == p.dim
            ]
            if later:
                out.append(_StridedShard(p.dim, split_factor=int(np.prod(later))))
                continue
        out.append(p)
    return mesh, shape, out


def test_realistic_strided_placements_are_all_representable():
    rng = random.Random(3)
    strided = 0
    for _ in range(500):
        mesh, shape, placements = realistic_case(rng)
        compare(mesh, shape, placements)
        strided += any(isinstance(p, _StridedShard) for p in placements)
    assert strided >= 50


def test_every_plain_shard_placement_is_representable():
    rng = random.Random(1)
    for _ in range(300):
        mesh, shape, placements = random_case(rng, with_ss=False)
        compare(mesh, shape, placements)


def test_round_trip_placements_sharding_placements():
    rng = random.Random(2)
    done = 0
    for _ in range(400):  # includes ChunkProgram dims (uneven strided cuts)
        mesh, shape, placements = random_case(rng)
        try:
            s = Sharding.from_placements(mesh, shape, placements)
            back = s.to_placements()
        except NotRepresentable:
            continue
        s2 = Sharding.from_placements(mesh, shape, back)
        assert s2 == s
        for r in mesh.ranks():
            assert all(np.array_equal(x, y) for x, y in zip(s.indices(r), s2.indices(r)))
        objs = s.to_dtensor()
        assert Sharding.from_placements(mesh, shape, objs) == s
        done += 1
    assert done >= 300


@pytest.mark.parametrize(
    "shape,placements,want",
    [
        ((9,), ["S(0)", "S(0)"], [[0, 1, 2], [3, 4], [5, 6], [7, 8]]),
    ],
)
def test_design_examples_nested_uneven(shape, placements, want):
    mesh = Mesh((2, 2), ("x", "y"))
    s = Sharding.from_placements(mesh, shape, placements)
    assert [list(s.indices(r)[0]) for r in mesh.ranks()] == want
    assert str(s) == "[x*y*3 of 9]"


def test_design_examples_strided_uneven():
    s = Sharding.from_placements(Mesh.parse("x=2"), (5,), ["SS(0,2)"])
    assert [list(s.indices(r)[0]) for r in range(2)] == [[0, 1, 3], [2, 4]]
    s = Sharding.from_placements(Mesh.parse("x=3"), (10,), ["SS(0,2)"])
    assert [list(s.indices(r)[0]) for r in range(3)] == [[0, 1, 5, 6], [2, 3, 7, 8], [4, 9]]


def test_every_placement_list_round_trips():
    """Any DTensor placement list converts to a Sharding and back to placements that mean
    the same: the same Sharding, and torch's own split functions give every rank the same
    piece from the placements we return."""
    rng = random.Random(4)
    uneven_strided = 0
    for _ in range(300):
        mesh, shape, placements = random_case(rng)
        s = compare(mesh, shape, placements)
        back = s.to_dtensor()
        assert compare(mesh, shape, back) == s, (placements, str(s), back)
        uneven_strided += not s.is_even() and any(isinstance(p, _StridedShard) for p in placements)
    assert uneven_strided >= 30


@pytest.mark.parametrize(
    "mesh,shape,placements,text",
    [
        # SS(2,2) on a leaves each a-rank two blocks of 2; S(2) on b then picks the block
        # with b's major half and the element with its minor half: b is split into sub-axes
        (Mesh((3, 4, 2), ("a", "b", "c")), (2, 9, 12), ["SS(2,2)", "S(2)", "S(2)"],
         "[2, 9, b:(1)2*a*b:(2)2*c of 12]"),
        # the second SS cuts innermost, behind the local chunks of the first: its split
        # factor is the run of local factors right before b, not all of them
        (Mesh((3, 3), ("a", "b")), (6,), ["SS(0,2)", "SS(0,2)"], "[2*a*2*b of 6]"),
    ],
)
def test_to_placements_inverts_uneven_strided_cuts(mesh, shape, placements, text):
    s = Sharding.from_placements(mesh, shape, placements)
    assert str(s) == text
    assert s.to_placements() == tuple(placements)
    assert compare(mesh, shape, s.to_dtensor()) == s


def test_to_placements_refuses_an_uneven_order_dtensor_cannot_cut():
    # a DTensor cut numbers the pieces of its axis major first, outer to inner
    mesh = Mesh((2, 4), ("a", "b"))
    s = Sharding.parse("[b:(2)2*a*2*b:(1)2 of 13]", mesh)
    with pytest.raises(NotRepresentable, match="order of mesh axes"):
        s.to_placements()
