"""Plans of repeated programs (plan.repeat): the plan made from the compressed program and
expanded equals the planner's plan of the whole program (the oracle: the same program with
every instance materialised, planned op by op), and verifies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlayout.mesh import Mesh
from shardlayout.plan import plan
from shardlayout.program import Program
from shardlayout.program.models import llama
from shardlayout.program.styles import apply_style
from shardlayout.sharding import Sharding


def _flat(p: Program) -> Program:
    return Program(p.tensors, p.ops, p.outputs, p.symbols, p.sym_shapes, p.facts, p.notes)


def _same(a, b) -> None:
    assert a.to_json(include_timing=False) == b.to_json(include_timing=False)
    assert a.shardings == b.shardings and list(a.shardings) == list(b.shardings)
    assert a.ops == b.ops and [(o.params, o.local) for o in a.ops] == [(o.params, o.local) for o in b.ops]
    assert a.collectives == b.collectives and a.moves == b.moves
    assert a.total_seconds == b.total_seconds


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(["dp=2,tp=4", "tp=2", "dp=2", "dp=2,tp=2", "tp=4"]),
       st.sampled_from(["megatron", "megatron-sp", "dp", "fsdp"]), st.integers(6, 11), st.booleans())
def test_the_expanded_plan_is_the_whole_programs(mesh, style, layers, backward):
    m = Mesh.parse(mesh)
    p = llama(layers=layers)
    try:
        pins = apply_style(p, m, style).pins
    except Exception:
        return  # a style the mesh has no axis for (tested in program/test_repeat)
    got = plan(p, m, pins, backward=backward)
    assert got.repeated is not None and "ops" not in got.__dict__  # nothing read per op yet
    _same(got, plan(_flat(p), m, pins, backward=backward))


def test_no_pins_and_user_pins_on_every_layer():
    m = Mesh.parse("dp=2,tp=2")
    p = llama(layers=7)
    _same(plan(p, m), plan(_flat(p), m))
    pins = {f"layers.{i}.w_up": "[16, tp*16]" for i in range(7)} | {"x": "[dp*1, 8, 16]"}
    got = plan(p, m, pins)
    assert got.repeated is not None
    _same(got, plan(_flat(p), m, pins))


def test_a_middle_layer_pinned_apart_plans_the_whole_program():
    m = Mesh.parse("tp=2")
    p = llama(layers=8)
    pins = apply_style(p, m, "megatron").pins
    pins["layers.5.wq"] = Sharding.parse("[tp*8, 16]", m)  # one layer unlike the others
    got = plan(p, m, pins)
    assert got.repeated is None
    _same(got, plan(_flat(p), m, pins))
    assert str(got.shardings["layers.5.wq"]) == "[tp*8, 16]"


def test_a_pin_on_no_tensor_is_still_an_error():
    m = Mesh.parse("tp=2")
    with pytest.raises(Exception, match="layers.5.nothing"):
        plan(llama(layers=8), m, {"layers.5.nothing": "[16, 16]"})


def test_a_repeated_plan_verifies_on_its_compressed_program():
    m = Mesh.parse("dp=2,tp=2")
    p = llama(layers=8)
    got = plan(p, m, apply_style(p, m, "megatron-sp").pins)
    v = got.verify()
    assert v.ok and got.verified and any("compressed program" in n for n in v.notes)
    whole = plan(_flat(p), m, apply_style(p, m, "megatron-sp").pins).verify()
    assert whole.ok and whole.ops == v.ops  # the same distinct op calls: a middle layer adds none


def test_the_plan_reads_every_op_of_a_repeated_program_only_when_asked():
    m = Mesh.parse("tp=2")
    p = llama(layers=30)
    got = plan(p, m, apply_style(p, m, "megatron").pins)
    assert "ops" not in p.__dict__ and "collectives" not in got.__dict__
    assert len(got.collectives) == 60 and len(got.ops) == 1500 and "ops" in p.__dict__
    assert got.ops[20 * 50].name == "layers.20.attn_norm.sq"


_WEIGHTS = ["wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "attn_norm", "mlp_norm"]


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(["dp=2,tp=2", "tp=4", "dp=2"]), st.lists(st.tuples(st.sampled_from(_WEIGHTS),
                                                                      st.integers(0, 1)), max_size=3),
       st.integers(6, 9), st.booleans())
def test_random_pins_alike_on_every_layer_plan_as_the_whole(mesh, picks, layers, first_apart):
    m = Mesh.parse(mesh)
    p = llama(layers=layers)
    axis = m.names[-1]
    pins = {}
    for w, d in picks:
        shape = (16,) if w.endswith("norm") else (32, 16) if w == "w_down" else (16, 32) if w.startswith("w_") \
            and w != "wo" and w not in ("wq", "wk", "wv") else (16, 16)
        d = min(d, len(shape) - 1)
        dims = [f"{axis}*{n // m.axis_size(axis)}" if i == d else str(n) for i, n in enumerate(shape)]
        for i in range(layers):
            if not (first_apart and i == 0):  # layer 0 unpinned: the rest still alike
                pins[f"layers.{i}.{w}"] = f"[{', '.join(dims)}]"
    got = plan(p, m, pins)
    _same(got, plan(_flat(llama(layers=layers)), m, pins))
