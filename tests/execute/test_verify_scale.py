"""Verification at scale: 8192 ranks proven and sampled per rank class; the work follows the
distinct ops, not the layers or the ranks; memory stays within the budget (values are hashes of
global indices, references are sampled boxes)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlayout import Mesh, Sharding, register_op
from shardlayout.execute.verify import VerifyError, hashed, verify
from shardlayout.ops.strategy import FactorMap, factor_rule
from shardlayout.plan import plan
from shardlayout.program import ProgramBuilder
from shardlayout.program.models import llama, style_pins


def _llama_plan(text, layers=2, **dims):
    m = Mesh.parse(text)
    prog = llama(layers=layers, **dims)
    return plan(prog, m, style_pins(prog, m, "megatron-sp"))


def test_8192_ranks_are_proven_and_sampled_per_class():
    p = _llama_plan("dp=256,tp=32")
    v = p.verify()
    assert v.ok and v.proven and v.mode == "classes" and v.checked == len(p.program.ops)
    assert v.ops == 26 and v.classes < 200 and v.simulated < 1000  # not 8192 of anything
    assert p.verified is True


def test_the_work_follows_distinct_ops_not_layers():
    one, four = _llama_plan("dp=2,tp=4", layers=1).verify(), _llama_plan("dp=2,tp=4", layers=4).verify()
    assert (one.ops, one.collectives, one.classes, one.simulated) == (four.ops, four.collectives, four.classes,
                                                                        four.simulated)
    assert four.checked == 4 * one.checked


def test_memory_stays_within_the_budget_on_large_tensors():
    p = _llama_plan("dp=64,tp=8", layers=1, batch=64, seq=1024, dim=512, heads=8, ffn=2048)
    x = p.program.tensors["x"].shape  # 33M elements: 256 MiB as float64 if materialised
    assert np.prod(x) >= 1 << 25
    tracemalloc.start()
    try:
        v = p.verify(budget=1 << 18)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert v.ok and v.proven
    assert peak < 64 << 20, peak
    assert all("numeric check skipped" in n for n in v.notes)  # what did not fit says so


def _bad_mm(a, b):
    return a @ b + 1.0  # +1 on every rank: a partial sum over 8 ranks adds 8


def test_sampled_boxes_check_matmuls_beyond_the_budget():
    register_op("test_mm_plus_one", "a, b", factor_rule(lambda n, i, p: FactorMap(("mk", "kn"), "mn", linear="multi")),
                _bad_mm, replace_existing=True)
    m = Mesh.parse("dp=8,tp=8")
    for target, ok in (("mm", True), ("test_mm_plus_one", False)):
        b = ProgramBuilder()
        x, w = b.input("x", (512, 256)), b.param("w", (256, 512))
        b.output(b.op("relu", [b.op(target, [x, w], name="y")], name="z"))
        p = plan(b.build(), m, {"x": Sharding.parse("[dp*64, tp*32]", m), "w": Sharding.parse("[tp*32, 512]", m)})
        v = p.verify(budget=1 << 12)  # 131072-element operands: only sampled boxes fit
        assert v.ok is ok and not v.notes, v
        if ok:
            assert v.proven
        else:
            assert v.first_mismatch.startswith("y (op y)") and round(v.max_error) == 7  # 8 ranks add 1, not 1


def test_values_are_a_pure_function_of_the_global_index():
    a = hashed(3, np.arange(10))
    assert np.array_equal(a, hashed(3, np.arange(10))) and not np.array_equal(a, hashed(4, np.arange(10)))
    assert np.array_equal(hashed(3, np.array([7, 2])), a[[7, 2]]) and -1 <= a.min() and a.max() < 1


def test_an_unknown_mode_names_the_choices():
    p = _llama_plan("tp=2", layers=1)
    with pytest.raises(VerifyError, match="'classes' proves every rank"):
        verify(p, "everything")
    with pytest.raises(VerifyError, match="budget"):
        p.verify(budget=0)


_SPECIAL = st.sampled_from([0.0, 1.0, -1.0, 1e-7, 1e308, -1e308, float("inf"), float("-inf"), float("nan")])


@given(st.lists(st.tuples(_SPECIAL | st.floats(-10, 10), _SPECIAL | st.floats(-10, 10)), min_size=1, max_size=6))
@settings(max_examples=300, deadline=None)
def test_the_numeric_comparison_is_np_allclose(pairs):
    """The oracle's comparison (a fast test, np.allclose where any difference is not finite)
    accepts exactly what ``np.allclose(..., equal_nan=True)`` accepts."""
    import warnings

    from shardlayout.execute.verify import _close

    got, want = [p[0] for p in pairs], [p[1] for p in pairs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert _close(got, want, 1e-6, 1e-6)[0] == np.allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)


@given(st.lists(st.tuples(st.complex_numbers(max_magnitude=10), st.complex_numbers(max_magnitude=10)), min_size=1,
                max_size=6))
@settings(max_examples=100, deadline=None)
def test_complex_values_are_compared_on_both_parts(pairs):
    """Complex values (a rotary embedding written with view_as_complex) are compared as complex
    numbers — an imaginary part that differs is a difference — exactly as np.allclose does."""
    from shardlayout.execute.verify import _close

    got, want = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    assert _close(got, want, 1e-6, 1e-6)[0] == np.allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)
    assert not _close(want + 1j, want, 1e-6, 1e-6)[0]
