"""Guards of a plan of a symbolic program, and its verification at other sizes."""

from __future__ import annotations

import json

import pytest

from shardlayout import Mesh, Sharding
from shardlayout.plan import plan
from shardlayout.plan.guards import carry, decisions, plan_guards, sample_bindings
from shardlayout.program import ProgramBuilder


def mlp(facts=(), flatten: bool = True):
    """x (batch, seq, 16) -> [flatten] -> up -> relu -> down -> [unflatten] -> + x."""
    b = ProgramBuilder(symbols={"batch": 4, "seq": 16}, facts=facts)
    x = b.input("x", ("batch", "seq", 16))
    w1, w2 = b.param("w1", (16, 32)), b.param("w2", (32, 16))
    h = b.op("view", [x], size=("batch*seq", 16), name="flat") if flatten else x
    d = b.op("mm" if flatten else "matmul", [b.op("relu", [b.op("mm" if flatten else "matmul", [h, w1], name="up")],
                                                   name="act"), w2], name="down")
    y = b.op("view", [d], size=("batch", "seq", 16), name="back") if flatten else d
    b.output(b.op("add", [y, x], name="y"))
    return b.build()


MESH = Mesh.parse("dp=2,tp=4")


def test_batch_and_sequence_sharding_guards_both_and_verifies_at_more_sizes():
    p = plan(mlp(), MESH, {"x": "[dp*2, tp*4, 16]"})
    # flat is [dp*2*tp*4, 16] too: batch*seq % 8 == 0 is implied by the two, so it is not listed
    assert [str(g) for g in p.guards] == ["batch % 2 == 0", "seq % 4 == 0"]
    v = p.verify()
    assert v.ok and len(v.bindings) == 3
    others = [dict(b) for b in v.bindings[1:]]
    assert all(b != {"batch": 4, "seq": 16} and b["batch"] % 2 == 0 and b["seq"] % 4 == 0 for b in others)
    assert p.verified_at == v.bindings and json.loads(p.to_json())["verified_at"][0] == {"batch": 4, "seq": 16}


def test_megatron_style_guards_only_the_batch():
    p = plan(mlp(), MESH, style="megatron")
    assert [str(g) for g in p.guards] == ["batch % 2 == 0"]
    assert p.verify().ok


def test_program_facts_are_guards_and_implied_ones_are_dropped():
    p = plan(mlp(facts=["batch % 4 == 0", "seq <= 4096"]), MESH, {"x": "[dp*2, tp*4, 16]"})
    assert [str(g) for g in p.guards] == ["batch % 4 == 0", "seq % 4 == 0", "seq <= 4096"]  # batch % 2 is implied
    assert [str(g) for g in plan_guards(p, uneven=True)] == ["batch % 4 == 0", "seq <= 4096", "seq >= 4"]


def test_plan_json_states_symbols_shapes_and_guards():
    data = json.loads(plan(mlp(), MESH, {"x": "[dp*2, tp*4, 16]"}).to_json())
    assert data["symbols"] == {"batch": 4, "seq": 16}
    assert data["guards"] == ["batch % 2 == 0", "seq % 4 == 0"]
    assert data["shapes"]["flat"] == ["batch*seq", 16] and data["shapes"]["w1"] == [16, 32]


def test_verify_at_sizes_the_guards_exclude_names_the_tensor_and_both_bindings():
    p = plan(mlp(), MESH, {"x": "[dp*2, tp*4, 16]"})
    v = p.verify(sizes=[{"batch": 3}])  # batch 3 does not divide by dp: x is uneven there, flat is gathered
    assert not v.ok and v.reason == "decisions"
    assert "differ at batch=3, seq=16 from the example batch=4, seq=16: tensor 'flat'" in v.first_mismatch


def test_uneven_plans_claim_sizes_that_do_not_divide():
    prog = mlp(flatten=False)  # no flatten: an uneven batch keeps every decision
    p = plan(prog, MESH, {"x": "[dp*2, tp*4, 16]"}, uneven=True)
    assert [str(g) for g in p.guards] == ["batch >= 2", "seq >= 4"]  # every mesh axis still cuts its dim
    drawn = sample_bindings(p, 2)
    assert any(b["batch"] % 2 or b["seq"] % 4 for b in drawn)  # at least one size that does not divide
    v = p.verify()
    assert v.ok and len(v.bindings) == 3
    # with a flatten, uneven shards do not survive it: the check fails and says where
    q = plan(mlp(), MESH, {"x": "[dp*2, tp*4, 16]"}, uneven=True)
    w = q.verify()
    assert not w.ok and "the plan's decisions differ at" in w.first_mismatch and "tensor 'flat'" in w.first_mismatch


def test_decisions_ignore_sizes_but_not_axes():
    prog = mlp()
    a = plan(prog, MESH, {"x": "[dp*2, tp*4, 16]"})
    b = plan(prog.at({"batch": 8, "seq": 8}), MESH, {"x": "[dp*4, tp*2, 16]"})
    c = plan(prog, MESH, {"x": "[tp*1, dp*8, 16]"})
    assert decisions(a) == decisions(b) and decisions(a) != decisions(c)


def test_pins_are_carried_to_other_shapes():
    m = Mesh.parse("dp=2,tp=4")
    assert str(carry(Sharding.parse("[dp*4, tp*3]", m), (6, 8))) == "[dp*3, tp*2]"
    assert str(carry(Sharding.parse("[3*tp*2, 8] +sum(dp)", m), (48, 8))) == "[3*tp*4, 8] +sum(dp)"


def test_cli_table_prints_guards(tmp_path, capsys):
    from shardlayout.cli import main

    f = tmp_path / "prog.json"
    f.write_text(mlp().to_json())
    assert main(["plan", "--program", str(f), "--mesh", "dp=2,tp=4", "--pin", "x=[dp*2, tp*4, 16]", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "guards: batch % 2 == 0, seq % 4 == 0" in out and "(batch, seq, 16)" in out
    assert "sizes verified: batch=4, seq=16 (example); batch=" in out
    assert main(["plan", "--program", str(f), "--mesh", "dp=2,tp=4", "--pin", "x=[dp*2, tp*4, 16]", "--uneven",
                 "--verify"]) == 1
    assert "guards: batch >= 2, seq >= 4" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["[dp*4, 16]"])
def test_concrete_programs_have_no_guards(text):
    b = ProgramBuilder()
    b.output(b.op("relu", [b.input("x", (8, 16))], name="y"))
    p = plan(b.build(), MESH, {"x": text})
    assert p.guards == () and json.loads(p.to_json())["guards"] == [] and p.verify().ok


def test_a_comm_free_slice_of_a_symbolic_dim_is_specialised():
    """Whether a cut falls on the shards depends on the sizes: the plan claims it at the
    example's only, and says so (``seq == 8``); verification at other sizes agrees."""
    m = Mesh.parse("tp=2")
    b = ProgramBuilder(symbols={"seq": 8})
    x = b.input("x", ("seq", 4))
    b.output(b.op("slice", [x], name="y", dim=0, start=0, end=4))
    p = plan(b.build(), m, {"x": Sharding.parse("[tp*4, 4]", m)})
    assert not p.collectives and str(p.shardings["y"]) == "[4*tp of 4, 4]"
    assert "seq == 8" in [str(g) for g in p.guards]
    assert p.verify().ok


def test_uneven_guards_hold_at_the_example():
    m = Mesh.parse("dp=4")
    b = ProgramBuilder(symbols={"batch": 2})
    x = b.input("x", ("batch", 8))
    b.output(b.op("relu", [x], name="y"))
    p = plan(b.build(), m, {"x": Sharding.parse("[dp of 2, 8]", m)}, uneven=True)
    assert [str(g) for g in p.guards] == ["batch >= 2"] and all(g.holds({"batch": 2}) for g in p.guards)
    assert p.verify().ok


@pytest.mark.parametrize("argv", [["--model", "llama", "--layers", "1", "--uneven"],
                                  ["--module", "examples/own_model.py:make", "--dynamic", ""]])
def test_cli_refuses_uneven_without_symbols_and_an_empty_dynamic(argv, capsys):
    from shardlayout.cli import main

    assert main(["plan", "--mesh", "tp=2", "--style", "megatron", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("shardlayout: error:")
