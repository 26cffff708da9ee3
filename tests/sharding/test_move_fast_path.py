"""plan_move's fast path (a move that only slices locally, decided from the factor lists) gives
exactly what the general path gives, on random pairs and on pairs built to be free slices."""

from __future__ import annotations

from hypothesis import given

from shardlayout import Sharding
from shardlayout.sharding.collective import CollectiveKind
from shardlayout.sharding.cost import DEFAULT_COST_MODEL
from shardlayout.sharding.move import _only_local, _plan_general, _plan_move

from .test_move import placement_pairs


def _same_answer(a, b):
    if a == b:
        return
    general = _plan_general(a, b, 4, DEFAULT_COST_MODEL)
    if _only_local(a, b):
        assert _plan_move(a, b, 4, DEFAULT_COST_MODEL) == general, (str(a), str(b))
        assert [c.kind for c in general] == [CollectiveKind.LOCAL]
    return general


@given(placement_pairs())
def test_fast_path_agrees_with_the_general_path(ab):
    _same_answer(*ab)


@given(placement_pairs())
def test_free_slices_take_the_fast_path(ab):
    """Replicated -> sharded on the same axes is a free slice: the fast path must take it."""
    a, b = ab
    rep = Sharding(a.mesh, a.shape)
    if b.partial or rep == b:
        return
    assert _only_local(rep, b)
    _same_answer(rep, b)
