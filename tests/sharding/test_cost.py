"""The one cost model: DTensor's formulas exactly, validated inputs, order-independent sums."""

from __future__ import annotations

import pytest

from shardlayout import CostModel, Mesh, Sharding, ShardingError, cost, plan_move
from shardlayout.sharding.collective import AxisPiece, Collective, CollectiveKind

M = Mesh.parse("dp=2,tp=4")
A, B = Sharding.parse("[dp*4, tp*3]", M), Sharding.parse("[dp*4, 12]", M)


def one(kind, n, nbytes, axis="tp"):
    return Collective(kind, (AxisPiece(axis, n),), (), nbytes, A, B)


@pytest.mark.parametrize("kind,hops,extra", [(CollectiveKind.ALL_GATHER, 3, 0), (CollectiveKind.REDUCE_SCATTER, 3, 0),
                                             (CollectiveKind.ALL_REDUCE, 6, 0), (CollectiveKind.ALL_TO_ALL, 3, 1.0)])
def test_dtensor_formulas(kind, hops, extra):
    nbytes = 3 * 2**20
    us = 6.6 + hops * 0.6 + nbytes / 2**30 * hops / 4 / 87.7 * 1e6 + extra
    assert CostModel().seconds(one(kind, 4, nbytes)) == pytest.approx(us * 1e-6, rel=1e-12)


def test_local_steps_and_groups_of_one_are_free():
    assert CostModel().seconds(Collective(CollectiveKind.LOCAL, (), (), 0, A, B)) == 0
    assert CostModel().seconds(one(CollectiveKind.ALL_GATHER, 1, 10**6)) == 0


def test_per_axis_overrides_and_penalty_switch():
    slow = CostModel(bandwidth={"dp": 1e9}, hop_latency={"dp": 5e-6})
    c = one(CollectiveKind.ALL_GATHER, 2, 10**6, axis="dp")
    assert slow.seconds(c) > CostModel().seconds(c)
    assert slow.seconds(one(CollectiveKind.ALL_GATHER, 4, 10**6)) == CostModel().seconds(one(CollectiveKind.ALL_GATHER,
                                                                                              4, 10**6))
    a2a = one(CollectiveKind.ALL_TO_ALL, 4, 1000)
    assert CostModel().seconds(a2a) - CostModel(all_to_all_penalty=0).seconds(a2a) == pytest.approx(1e-6)
    assert hash(slow) == hash(CostModel(hop_latency={"dp": 5e-6}, bandwidth={"dp": 1e9}))


@pytest.mark.parametrize("bad", [dict(latency=-1), dict(default_bandwidth=0), dict(bandwidth={"tp": float("nan")}),
                                 dict(hop_latency={"tp": "fast"}), dict(latency=True)])
def test_bad_cost_models_are_refused(bad):
    with pytest.raises(ShardingError, match="CostModel"):
        CostModel(**bad)


def test_cost_is_an_exact_sum_in_any_order():
    moves = plan_move(Sharding.parse("[dp*4, tp*3] +sum(x)", Mesh.parse("dp=2,tp=4,x=2")),
                      Sharding.parse("[8, 12]", Mesh.parse("dp=2,tp=4,x=2")))
    assert len(moves) >= 2
    assert cost(moves) == cost(tuple(reversed(moves))) == cost(moves, CostModel())
    assert cost(()) == 0.0
