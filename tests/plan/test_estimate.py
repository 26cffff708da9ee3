"""The largest piece a rank holds, decided per dim from its digit classes, against every rank."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shardlayout import Mesh, Sharding
from shardlayout.plan.estimate import largest_piece
from shardlayout.sharding import Factor

from ..sharding.strategies import shardings


def _every_rank(s: Sharding) -> tuple:
    shapes = [s.local_shape(r) for r in range(s.mesh.size)]
    return tuple(max(sh[d] for sh in shapes) for d in range(s.ndim))


@given(shardings())
@settings(max_examples=300, deadline=None)
def test_largest_piece_is_the_largest_over_every_rank(s):
    assert largest_piece(s) == _every_rank(s)


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=150, deadline=None)
def test_largest_piece_of_dtensor_chunk_programs(seed):
    """Uneven strided placements (DTensor's ``_StridedShard``) are kept as chunk programs."""
    import random

    rng = random.Random(seed)
    sizes = tuple(rng.choice([2, 3, 4]) for _ in range(rng.randint(1, 3)))
    mesh = Mesh(sizes, ("a", "b", "c")[: len(sizes)])
    shape = tuple(rng.randint(1, 13) for _ in range(rng.randint(1, 2)))
    pl = [rng.choice(["R", f"S({rng.randrange(len(shape))})", f"SS({rng.randrange(len(shape))},{rng.choice([2, 3])})"])
          for _ in range(mesh.ndim)]
    s = Sharding.from_placements(mesh, shape, pl)
    assert largest_piece(s) == _every_rank(s), (str(s), pl)


def test_a_later_coordinate_can_hold_more_than_coordinate_zero():
    """[a:2, 3, b:2] of 7: a=0 keeps 4 elements cut in three parts (2, 2, 0), a=1 keeps 3 (1, 1, 1);
    b=0 then holds 1+1+0 = 2 on a=0 but 1+1+1 = 3 on a=1: the largest piece is not rank 0's."""
    mesh = Mesh.parse("a=2,b=2")
    s = Sharding(mesh, (7,), [[Factor(2, "a"), Factor(3), Factor(2, "b")]])
    assert s.local_shape(0) == (2,) and largest_piece(s) == (3,) == _every_rank(s)


@given(shardings())
@settings(max_examples=300, deadline=None)
def test_local_bytes_is_the_largest_piece_over_every_rank(s):
    import math

    from shardlayout.plan.estimate import local_bytes

    want = max(math.prod(s.local_shape(r)) for r in range(s.mesh.size)) * 4
    assert local_bytes(s, "float32") == want
