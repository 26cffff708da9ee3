"""Rank classes from factor lists: they partition the mesh, every member of a class holds pieces of
the same shapes (checked against every rank's index arrays), representatives are members, and
groups are enumerated from the pieces exactly as a scan of the mesh finds them."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from shardlayout import AxisPiece, Mesh, Sharding
from shardlayout.execute.classes import axis_group, class_key, group_ranks, rank_classes, representatives

from ..sharding.strategies import shardings


@settings(max_examples=60)
@given(st.data())
def test_classes_partition_the_mesh_into_equal_local_programs(data):
    a = data.draw(shardings())
    b = data.draw(shardings(mesh=a.mesh))
    mesh = a.mesh
    classes = rank_classes(mesh, (a, b))
    keys = {r: class_key(mesh, (a, b), r) for r in mesh.ranks()}
    assert Counter(keys.values()) == {c.key: c.size for c in classes}
    shapes: dict = {}
    for r, k in keys.items():
        assert shapes.setdefault(k, (a.local_shape(r), b.local_shape(r))) == (a.local_shape(r), b.local_shape(r))
    for c in classes:
        assert all(keys[r] == c.key for r in c.representatives)
    assert set(representatives(classes)) <= set(mesh.ranks())


def test_uneven_shards_give_a_few_classes_on_8192_ranks():
    m = Mesh.parse("dp=256,tp=32")
    cls = rank_classes(m, (Sharding.parse("[dp of 2, tp of 8, 16]", m), Sharding.parse("[16, tp]", m)))
    assert sorted(c.size for c in cls) == [16, 48, 2032, 6096]  # dp < 2 or not, tp < 8 or not
    assert representatives(cls) == (0, 8, 39, 63, 64, 72, 8167, 8191)
    even = rank_classes(m, (Sharding.parse("[dp*2, tp*4, 16]", m),))
    assert len(even) == 1 and even[0].size == 8192 and even[0].representatives == (0, 8191)


def _scan(mesh, rank, pieces):
    """The group by brute force: every rank whose coordinates agree with ``rank``'s once the
    pieces' digits are zeroed."""
    def outside(coord):
        out = list(coord)
        for p in pieces:
            i = mesh.axis_index(p.axis)
            stride = mesh.shape[i] // (p.pre * p.size)
            out[i] -= ((out[i] // stride) % p.size) * stride
        return out

    return [q for q in mesh.ranks() if outside(mesh.coord(q)) == outside(mesh.coord(rank))]


def test_groups_are_enumerated_from_the_pieces():
    m = Mesh.parse("dp=2,tp=4")
    cases = [(AxisPiece("tp", 4),), (AxisPiece("dp", 2),), (AxisPiece("tp", 2, 1),), (AxisPiece("tp", 2, 2),),
             (AxisPiece("dp", 2), AxisPiece("tp", 2, 2)), ()]
    for r in m.ranks():
        for pieces in cases:
            assert list(group_ranks(m, r, pieces)) == _scan(m, r, pieces), (r, pieces)
    assert group_ranks(m, 5, (AxisPiece("tp", 2, 2),)) == (4, 5)
    assert axis_group(m, 5, ("dp",)) == (1, 5) and axis_group(m, 5, ()) == (5,)
