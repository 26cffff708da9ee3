"""Placement strings and JAX PartitionSpecs: parsing, round trips, what cannot be said."""

from __future__ import annotations

import pytest
from hypothesis import given

from shardlayout import Mesh, NotRepresentable, Sharding, ShardingSpecError
from shardlayout.sharding import parse_placement

from .strategies import shardings

M = Mesh.parse("dp=2,tp=4")


@pytest.mark.parametrize(
    "text,want",
    [
        ("R", ("R",)),
        ("S(1)", ("S", 1)),
        ("S(-1)", ("S", 1)),
        ("SS(0,2)", ("SS", 0, 2)),
        ("P", ("P", "sum")),
        ("P(max)", ("P", "max")),
        ("Shard(0)", ("S", 0)),
    ],
)
def test_parse_placement(text, want):
    assert parse_placement(text, 2) == want


@pytest.mark.parametrize("text,needle", [("S(2)", "out of range"), ("Q", "not a placement"),
                                          ("P(mean)", "not one of"),
                                          ("SS(0,0)", r"must be in \[1, 9223372036854775807\]"),
                                          (f"SS(0,{10**25})", "must be in")])
def test_bad_placements(text, needle):
    with pytest.raises(ShardingSpecError, match=needle.replace("(", r"\(")):
        parse_placement(text, 2)


def test_placement_count_must_match_mesh():
    with pytest.raises(ShardingSpecError, match="one placement per mesh dim"):
        Sharding.from_placements(M, (8, 8), ["S(0)"])


@given(shardings())
def test_placements_round_trip_when_representable(s):
    try:
        p = s.to_placements()
    except NotRepresentable as e:
        assert "sub-axes" in str(e) or "order of mesh axes" in str(e)
        return
    assert Sharding.from_placements(s.mesh, s.shape, p) == s


@given(shardings())
def test_partition_spec_round_trip_when_representable(s):
    try:
        spec = s.to_partition_spec()
    except NotRepresentable:
        return
    assert Sharding.from_partition_spec(s.mesh, s.shape, spec) == s


def test_axis_order_dtensor_cannot_say():
    # tp outer, dp inner in dim 0, and dp also... a strided order with a local between:
    s = Sharding.parse("[tp*2*dp*2]", M)
    p = s.to_placements()  # SS on dp: representable
    assert Sharding.from_placements(M, s.shape, p) == s
    with pytest.raises(NotRepresentable, match="partial"):
        Sharding.parse("[8] +sum(tp)", M).to_partition_spec()


def test_partition_spec_examples():
    s = Sharding.from_partition_spec(M, (8, 12), ("dp", "tp"))
    assert str(s) == "[dp*4, tp*3]"
    s = Sharding.from_partition_spec(M, (16, 3), (("dp", "tp"),))
    assert str(s) == "[dp*tp*2, 3]" and s.to_partition_spec() == (("dp", "tp"), None)
    with pytest.raises(NotRepresentable, match="uneven"):
        Sharding.from_partition_spec(M, (9, 3), (("dp", "tp"),))
    assert str(Sharding.from_partition_spec(M, (9,), ("tp",))) == "[tp*3 of 9]"


@pytest.mark.parametrize("build,needle", [
    (lambda: Sharding.from_placements(M, (8, 12), None), "from_placements: placements None are not a list; give one "
                                                         "placement per mesh dim of dp=2,tp=4, e.g. ['S(0)', 'R']"),
    (lambda: Sharding.from_placements(M, (8, 12), "S(0),R"), "placements 'S(0),R' are not a list"),
    (lambda: Sharding.from_partition_spec(M, (8, 12), 5), "from_partition_spec: spec 5 is not a PartitionSpec"),
    (lambda: Sharding.from_partition_spec(M, (8, 12), (5, None)), "entry 0 of (5, None) is 5; an entry is None, an "
                                                                  "axis name or a tuple of axis names"),
])
def test_placements_and_specs_that_are_not_lists_are_refused(build, needle):
    with pytest.raises(ShardingSpecError) as e:
        build()
    assert needle in str(e.value), str(e.value)
