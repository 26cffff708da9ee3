"""Memos change speed, never answers: plans are byte-identical cold, warm and with every memo
cleared between ops; caches are bounded and clearable."""

from __future__ import annotations

import pytest

from shardlayout import Mesh
from shardlayout.caches import cache_stats, clear_caches, memo
from shardlayout.plan import plan
from shardlayout.program.models import STYLES, llama, moe, style_pins


def _plan_json(prog, mesh, style):
    return plan(prog, mesh, style_pins(prog, mesh, style)).to_json(include_timing=False)


@pytest.mark.parametrize("style", STYLES)
def test_plans_are_byte_identical_cold_and_warm(style):
    mesh = Mesh.parse("dp=2,tp=2")
    prog = moe() if style == "ep" else llama(layers=2)
    clear_caches()
    cold = _plan_json(prog, mesh, style)
    warm = _plan_json(prog, mesh, style)
    again = _plan_json(moe() if style == "ep" else llama(layers=2), mesh, style)  # fresh objects, warm memos
    assert cold == warm == again


def test_plan_identical_when_every_memo_is_cleared_between_ops(monkeypatch):
    """The strongest form: no memo survives from one op to the next, so nothing is ever a hit."""
    import shardlayout.ops.registry as registry
    import shardlayout.plan as plan_module

    mesh = Mesh.parse("dp=2,tp=4")
    prog = llama(layers=2)
    pins = style_pins(prog, mesh, "megatron-sp")
    warm = plan(prog, mesh, pins).to_json(include_timing=False)
    real = registry.OpDef.resolve

    def uncached(self, *a, **k):
        clear_caches()
        return real(self, *a, **k)

    monkeypatch.setattr(registry.OpDef, "resolve", uncached)
    monkeypatch.setattr(plan_module, "_SEEN", {})  # plan's own probe of the op memo never hits either
    assert plan(prog, mesh, pins).to_json(include_timing=False) == warm


def test_repeated_layers_hit_the_memo():
    clear_caches()
    mesh = Mesh.parse("dp=2,tp=4")
    prog = llama(layers=4)
    plan(prog, mesh, style_pins(prog, mesh, "megatron-sp"))
    seen = cache_stats()["shardlayout.ops.registry._SEEN"]["size"]
    # each distinct op call is computed once: 4 layers call as many distinct ops as 1 layer (plus
    # the ops whose inputs are the previous layer's outputs), far fewer than the 200 ops
    assert 0 < seen < len(prog.ops) // 3


def test_clear_caches_empties_every_memo_and_stats_name_them():
    mesh = Mesh.parse("tp=2")
    prog = llama(layers=1)
    plan(prog, mesh, style_pins(prog, mesh, "megatron"))
    stats = cache_stats()
    assert stats["shardlayout.ops.registry._SEEN"]["size"] > 0
    assert all(s["maxsize"] is None or s["size"] <= s["maxsize"] for s in stats.values())
    clear_caches()
    assert all(s["size"] == 0 for s in cache_stats().values())


def test_memo_is_bounded_and_refuses_a_bad_size():
    calls = []

    @memo(2)
    def square(x):
        calls.append(x)
        return x * x

    for x in (1, 2, 3, 1):
        square(x)
    assert calls == [1, 2, 3, 1]  # 1 was evicted by 3 (at most 2 entries)
    assert square.cache_info().currsize == 2
    with pytest.raises(ValueError):
        memo(0)


def test_calls_equal_in_python_but_different_in_type_are_told_apart():
    """``keepdim=1`` must be refused even after ``keepdim=True`` was accepted and memoised."""
    from shardlayout import Sharding, propagate
    from shardlayout.errors import OpError

    s = Sharding.parse("[4, tp*2]", Mesh.parse("tp=2"))
    propagate("mean", [s], dim=-1, keepdim=True)
    with pytest.raises(OpError):
        propagate("mean", [s], dim=-1, keepdim=1)


def test_paused_gc_restores_the_collector_even_on_error():
    import gc

    from shardlayout.caches import paused_gc

    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with paused_gc():
            assert not gc.isenabled()
            raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()  # a caller's own choice is kept
    finally:
        gc.enable()
