"""nvFuser's reshape cases (shared/conformance/nvfuser_cases.md 5, 6, 7, 22, 23, 36) in our terms:
a DIDx/DIDy outer split is a factor on a mesh axis. Every result is checked on every rank."""

from __future__ import annotations

import numpy as np

from shardlayout import Mesh, Sharding, propagate

from .checks import local_check, reshape_local


def run(s, shape):
    p = propagate("reshape", [s], shape=shape)
    x = np.arange(int(np.prod(s.shape)), dtype=np.float64).reshape(s.shape)
    local_check(p, x, lambda a: a.reshape(shape), reshape_local)
    return p


def test_case5_sharded_non_divisible_reshape():
    # [6] outer_split(0,2) DIDx -> [3,2]: nvFuser throws (3 % 2 != 0). No exact sharding
    # exists (device 0 would hold row 0 and half of row 1): we gather d, and say so.
    s = Sharding.parse("[d*3]", Mesh.parse("d=2"))
    p = run(s, (3, 2))
    assert p.needs_communication and [c.axes_text() for c in p.collectives] == ["d"]
    assert str(p.outputs[0]) == "[3, 2]"


def test_case6_sharded_inner_reshape():
    # [3,10] outer_split(1,2) DIDx -> [30]: nvFuser throws (DID on the merge's inner input).
    # Exact here: the d factor just sits inside the merged dim (DTensor: SS(0,3)).
    s = Sharding.parse("[3, d*5]", Mesh.parse("d=2"))
    p = run(s, (30,))
    assert not p.needs_communication and str(p.outputs[0]) == "[3*d*5]"
    assert p.outputs[0].to_placements() == ("SS(0,3)",)


def test_case7_reshape_with_independent_splits():
    # mesh {2,3}: DIDy=2 (outer), DIDx=3. [3dx,5,7dy,9] -> [3dx*5, 7dy*9]: DIDx on axis 0, DIDy on 1
    m = Mesh((2, 3), ("dy", "dx"))
    s = Sharding.parse("[dx*3, 5, dy*7, 9]", m)
    p = run(s, (45, 126))
    out = p.outputs[0]
    assert not p.needs_communication and str(out) == "[dx*15, dy*63]"
    assert [d for d, fs in enumerate(out.dims) for f in fs if f.axis == "dx"] == [0]
    assert [d for d, fs in enumerate(out.dims) for f in fs if f.axis == "dy"] == [1]


def test_case22_splitting_view_is_not_resharding():
    # [b,s,h*e] (h=96, e=128) -> [b,s,h,e], both outer_split(2,2) DIDx: no resharding
    s = Sharding.parse("[2, 3, d*6144]", Mesh.parse("d=2"))
    p = run(s, (2, 3, 96, 128))
    assert not p.needs_communication and str(p.outputs[0]) == "[2, 3, d*48, 128]"


def test_case23_merging_view_is_not_resharding():
    s = Sharding.parse("[2, 3, d*48, 128]", Mesh.parse("d=2"))
    p = propagate("flatten", [s], start_dim=2)
    assert not p.needs_communication and str(p.outputs[0]) == "[2, 3, d*6144]"


def test_case36_merging_reshape_outer_split_maps():
    # [4,2] outer_split(0,2) -> [8] outer_split(0,2): the same device split
    s = Sharding.parse("[d*2, 2]", Mesh.parse("d=2"))
    p = run(s, (8,))
    assert not p.needs_communication and str(p.outputs[0]) == "[d*4]"
