"""``--style auto``: the ILP's model of the planner is exact, the chain solver equals the full ILP,
the auto plan is never slower than a built-in style under the same budget, and it verifies.

Small meshes and few layers (CI); ``benchmarks/bench_auto.py`` runs 8 and 32 layers on 8 and 64
devices.
"""

from __future__ import annotations

import json
import math

import pytest

from shardlayout import Mesh, Sharding
from shardlayout.cli import main
from shardlayout.plan import plan
from shardlayout.plan.auto import MemoryBudgetError, NoPlanFits, auto_plan, parse_memory
from shardlayout.plan.chain import segments, shared_inputs, slot_groups
from shardlayout.plan.estimate import estimate
from shardlayout.plan.space import Context, domains, evaluate, op_table, seed_plans, unify
from shardlayout.program.models import llama, moe

MESH = "dp=2,tp=2"
SLOW_FLOPS = 1e9  # a slow device makes compute matter: the unconstrained optimum is not "replicate all"


def _best_style(a):
    best = a.best_style()
    return math.inf if best is None else best.estimate.seconds


def test_ParseMemory_UnitsArePowersOf1024Or1000():
    assert parse_memory("80GiB") == 80 * 2**30
    assert parse_memory("80G") == 80 * 2**30
    assert parse_memory("512 MB") == 512 * 10**6
    assert parse_memory("40kib") == 40 * 1024
    assert parse_memory("1e9") == 10**9
    assert parse_memory(4096) == 4096


@pytest.mark.parametrize("bad", ["80XB", "GiB", "-5GiB", "0", "", True])
def test_ParseMemory_Garbage_RaisesNamingTheForm(bad):
    with pytest.raises(MemoryBudgetError):
        parse_memory(bad)


@pytest.mark.parametrize("prog", [llama(layers=2), moe()], ids=["llama2", "moe"])
def test_Space_EveryOpTableAddsUpToThePlannersEstimate(prog):
    """The ILP's terms for an assignment are exactly (bit for bit) estimate(plan(all pinned))."""
    mesh = Mesh.parse(MESH)
    segs = segments(prog)
    shared = shared_inputs(prog, [(s.lo, s.hi) for s in segs]) if len(segs) > 1 else frozenset()
    ctx = Context.of(prog, mesh, shared=shared)
    seeds = seed_plans(prog, mesh, {})
    doms = unify(domains(prog, seeds), slot_groups(segs))
    tables = [op_table(prog, i, doms, ctx) for i in range(len(prog.ops))]
    for label, p in seeds:
        got = plan(prog, mesh, dict(p.shardings))
        terms = evaluate(prog, tables, got.shardings, ctx)
        assert math.fsum(terms[0] + terms[1] + terms[2]) == estimate(got).seconds, label
        assert estimate(got).seconds == estimate(p).seconds, label  # pinning everything changes nothing
        assert estimate(got).forward == got.cost


@pytest.mark.parametrize("layers,mesh", [(1, "tp=2"), (2, MESH), (3, MESH)])
def test_Chain_EqualsFullIlp_Unconstrained(layers, mesh):
    prog, m = llama(layers=layers), Mesh.parse(mesh)
    chain = auto_plan(prog, m, flop_rate=SLOW_FLOPS, method="chain")
    full = auto_plan(prog, m, flop_rate=SLOW_FLOPS, method="full")
    assert chain.gap == full.gap == 0
    assert chain.estimate.seconds == full.estimate.seconds
    assert chain.estimate.seconds == chain.predicted


@pytest.mark.parametrize("layers,mesh,budget", [(1, "tp=2", "50KiB"), (1, "tp=2", "42KiB"), (2, "tp=2", "90KiB")])
def test_Chain_UnderABudget_IsWithinItsReportedGapOfTheFullIlp(layers, mesh, budget):
    prog, m = llama(layers=layers), Mesh.parse(mesh)
    chain = auto_plan(prog, m, memory_per_device=budget, method="chain")
    full = auto_plan(prog, m, memory_per_device=budget, method="full")
    assert full.gap == 0 and full.binding == "memory"
    assert full.estimate.seconds <= chain.estimate.seconds * (1 + 1e-12)
    assert chain.estimate.seconds * (1 - chain.gap) <= full.estimate.seconds * (1 + 1e-12)
    assert max(chain.estimate.memory, full.estimate.memory) <= parse_memory(budget)


def test_a_styles_plan_as_first_incumbent_leaves_the_binding_budget_optimum_unchanged(monkeypatch):
    """The full ILP under a binding budget starts its branch and bound from the best style plan
    that fits (``ilp._incumbent``: a feasible point, never below the optimum); the optimum found is
    the same as without it."""
    from shardlayout.plan import ilp

    prog, m = llama(layers=2), Mesh.parse("tp=2")
    got = []
    real = ilp._incumbent

    def spy(h, model, upper, starts):
        values = real(h, model, upper, starts)
        got.append(values)
        return values

    monkeypatch.setattr(ilp, "_incumbent", spy)
    warm = auto_plan(prog, m, memory_per_device="90KiB", method="full")
    assert got and got[0] is not None  # a style fits 90 KiB: its completion was handed over
    monkeypatch.setattr(ilp, "_incumbent", lambda *a: None)
    cold = auto_plan(prog, m, memory_per_device="90KiB", method="full")
    assert warm.gap == cold.gap == 0 and warm.binding == "memory"
    assert warm.estimate.seconds == pytest.approx(cold.estimate.seconds, rel=1e-12)


CASES = [(llama(layers=1), MESH, None), (llama(layers=1), MESH, "64KiB"), (llama(layers=2), MESH, None),
         (llama(layers=2), "tp=2", "90KiB"), (moe(), MESH, None), (moe(), MESH, "60KiB")]


@pytest.mark.parametrize("prog,mesh,budget", CASES,
                         ids=["llama1", "llama1-64KiB", "llama2", "llama2-tp-90KiB", "moe", "moe-60KiB"])
def test_Auto_NeverAboveTheBestStyle_AndVerifies(prog, mesh, budget):
    a = auto_plan(prog, Mesh.parse(mesh), memory_per_device=budget)
    assert a.estimate.seconds <= _best_style(a) * (1 + 1e-12)
    assert a.estimate.seconds == a.predicted
    assert budget is None or a.estimate.memory <= parse_memory(budget)
    assert a.plan.verify().ok


def test_Auto_SlowDevice_ShardsAndBeatsEveryStyle():
    a = auto_plan(llama(layers=2), Mesh.parse(MESH), flop_rate=SLOW_FLOPS)
    assert a.gap == 0 and a.estimate.seconds <= _best_style(a)
    assert a.estimate.compute < estimate(plan(a.plan.program, a.plan.mesh), flop_rate=SLOW_FLOPS).compute
    assert a.plan.verify().ok


def test_Auto_BudgetTooSmall_SaysTheSmallestThatWorks():
    prog, m = llama(layers=1), Mesh.parse("tp=2")
    with pytest.raises(NoPlanFits) as e:
        auto_plan(prog, m, memory_per_device="10KiB")
    smallest = e.value.smallest
    assert f"give --memory {smallest}" in str(e.value)
    a = auto_plan(prog, m, memory_per_device=smallest)
    assert a.estimate.memory == smallest
    with pytest.raises(NoPlanFits):
        auto_plan(prog, m, memory_per_device=smallest - 1)


def test_Auto_PinsAndPartialStylesAreKept():
    from shardlayout.program.models import style_pins

    prog, m = llama(layers=2), Mesh.parse(MESH)
    x = Sharding.parse("[dp, 8, 16]", m)
    first = {k: v for k, v in style_pins(prog, m, "megatron").items() if k.startswith("layers.0.")}
    a = auto_plan(prog, m, {"x": x, **first}, memory_per_device="80KiB")
    assert a.plan.shardings["x"] == x
    assert all(a.plan.shardings[k] == v for k, v in first.items())
    assert a.estimate.seconds == a.predicted and a.plan.verify().ok


def test_Auto_RepeatedLayers_SolveTheSameBlocks():
    """Blocks of one kind are solved once per boundary pair: 6 layers need the block solves of 3."""
    m = Mesh.parse(MESH)
    few = auto_plan(llama(layers=3), m, flop_rate=SLOW_FLOPS)
    many = auto_plan(llama(layers=6), m, flop_rate=SLOW_FLOPS)
    assert few.stats["kinds"] == many.stats["kinds"] == 4
    assert few.stats["solves"] == many.stats["solves"]
    assert many.estimate.seconds == many.predicted


def test_PlanStyleAuto_IsTheAutoPlan():
    prog, m = llama(layers=1), Mesh.parse(MESH)
    p = plan(prog, m, style="auto", memory_per_device="64KiB")
    assert p.shardings == auto_plan(prog, m, memory_per_device="64KiB").plan.shardings
    with pytest.raises(Exception, match="style='auto'"):
        plan(prog, m, memory_per_device="64KiB")


def _cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_Cli_StyleAuto_TextAndJson(capsys):
    code, out, _ = _cli(capsys, "plan", "--style", "auto", "--layers", "1", "--mesh", MESH, "--memory", "64KiB")
    assert code == 0
    assert "auto: HiGHS over" in out and "one exact ILP over" in out
    assert "binding constraint:" in out and "megatron" in out
    code, out, _ = _cli(capsys, "plan", "--style", "auto", "--layers", "1", "--mesh", MESH, "--memory", "64KiB",
                        "--json")
    assert code == 0
    data = json.loads(out)
    assert data["auto"]["gap"] == 0 and data["auto"]["estimate"]["memory_bytes"] <= 64 * 1024
    assert {s["style"] for s in data["auto"]["styles"]} >= {"megatron", "fsdp"}


def test_Cli_StyleAuto_BadOrTooSmallBudget(capsys):
    code, _, err = _cli(capsys, "plan", "--style", "auto", "--layers", "1", "--mesh", MESH, "--memory", "lots")
    assert code == 2 and err.count("\n") == 1 and "80GiB" in err
    code, _, err = _cli(capsys, "plan", "--style", "auto", "--layers", "1", "--mesh", MESH, "--memory", "1KiB")
    assert code == 1 and err.count("\n") == 1 and "the smallest budget with a plan is" in err


def test_a_solver_planner_disagreement_is_an_internal_error_not_bad_input(monkeypatch, capsys):
    """The ILP's model of plan() being wrong is our bug: exit 1 naming it, never exit 2 as if the input were bad."""
    import shardlayout.plan.auto as auto
    from shardlayout.cli import main

    def wrong(*a, **k):
        raise auto.ModelMismatch("auto: the solver predicted 1e-09 s, the planner gives 2e-05 s")

    monkeypatch.setattr(auto, "auto_plan", wrong)
    assert main(["plan", "--mesh", "tp=2", "--style", "auto", "--layers", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("shardlayout: error: internal error ModelMismatch:") and "--debug" in err


def _with_idle_buffer(prog):
    """``prog`` plus a buffer no op reads (as torch.export keeps a rotary table's original copy)."""
    from shardlayout.program import Program

    d = json.loads(prog.to_json())
    d["tensors"].append({"dtype": "float32", "kind": "buffer", "name": "idle", "shape": [64]})
    return Program.from_json(json.dumps(d))


def test_an_input_no_op_reads_is_counted_in_memory_and_in_the_budget():
    prog = _with_idle_buffer(llama(layers=1))
    mesh = Mesh.parse("dp=2,tp=2")
    a = auto_plan(prog, mesh)  # no ModelMismatch: the solver counts the idle buffer as plan() does
    assert a.estimate.memory == estimate(a.plan).memory and "idle" in a.plan.shardings
    with pytest.raises(NoPlanFits) as e:
        auto_plan(prog, mesh, memory_per_device=1024)
    assert "(1024 bytes)" in str(e.value)  # the user's budget, not the budget left after the idle buffer
    smallest = e.value.smallest
    assert auto_plan(prog, mesh, memory_per_device=smallest).estimate.memory <= smallest
    with pytest.raises(NoPlanFits):
        auto_plan(prog, mesh, memory_per_device=smallest - 1)


def test_a_value_crossing_two_cuts_is_priced_once_by_the_chain():
    """A runtime check right after a value's producer (torch.export's ``_assert_tensor_metadata``)
    makes the value cross two cuts in a row; its readers stay in one block, so the chain's
    optimum is the plan's estimate to the last bit (auto raises ModelMismatch otherwise)."""
    from shardlayout.plan.chain import cuts
    from shardlayout.program import Program

    d = json.loads(llama(layers=2).to_json())
    ops = []
    for op in d["ops"]:
        ops.append(op)
        if op["target"] in ("add", "mul") and op["outputs"]:
            ops.append({"inputs": [op["outputs"][0]], "name": op["name"] + ".check", "outputs": [], "params": {},
                        "target": "_assert_tensor_metadata"})
    d["ops"] = ops
    prog = Program.from_json(json.dumps(d))
    made = [t for _, t in cuts(prog)]
    assert all(a != b for a, b in zip(made, made[1:]))
    a = auto_plan(prog, Mesh.parse("dp=2,tp=2"))
    assert a.estimate.seconds == a.predicted


# ------------------------------------------------------------------------------------------
# a style's promise (keep) and the whole-program search under it
# ------------------------------------------------------------------------------------------

STYLE_CASES = [  # (label, program, mesh, style); the llamas: a real MLP width, and one so narrow that
    # gathering its weights is cheaper than reducing the activation (the promise then binds)
    ("llama", lambda: llama(layers=2, dim=256, ffn=1024, heads=4, seq=64, batch=4), "tp=2", "megatron"),
    ("llama", lambda: llama(layers=2, dim=256, ffn=1024, heads=4, seq=64, batch=4), "dp=2,tp=2", "megatron-sp"),
    ("llama", lambda: llama(layers=2, dim=256, ffn=1024, heads=4, seq=64, batch=4), "dp=2,tp=2", "fsdp"),
    ("narrow-mlp", lambda: llama(layers=2, dim=1024, seq=512, batch=4), "dp=2,tp=2", "megatron"),
    ("narrow-mlp", lambda: llama(layers=2, dim=1024, seq=512, batch=4), "tp=4", "megatron-sp"),
    ("moe", moe, "ep=2", "ep"),
    ("moe", moe, "dp=2,ep=2", "ep"),
]


def _style(label, make, mesh, style):
    from shardlayout.plan import pin_shardings
    from shardlayout.program.styles import apply_style, kept_pins

    prog, m = make(), Mesh.parse(mesh)
    got = apply_style(prog, m, style)
    pins = pin_shardings(prog, m, got.pins)
    return prog, m, pins, kept_pins(pins, got)


@pytest.mark.parametrize("training", ["adam", "inference"])
@pytest.mark.parametrize("label,make,mesh,style", STYLE_CASES)
def test_a_styles_plan_is_the_whole_program_optimum_under_its_promise(label, make, mesh, style, training):
    # the style's per-op choices price forward moves one op at a time; the ILP prices the whole
    # program (forward, planned backward, memory) over every seed's shardings with the style's pins
    # and promise held: it proves (gap 0) that nothing under the promise is cheaper
    prog, m, pins, kept = _style(label, make, mesh, style)
    a = auto_plan(prog, m, pins, training=training, keep=kept)
    assert a.gap == 0
    ours = estimate(plan(prog, m, style=style), training)
    assert ours.seconds == pytest.approx(a.estimate.seconds, rel=1e-12, abs=0)


def test_auto_moves_no_tensor_a_style_or_tp_plan_keeps():
    prog, m, pins, kept = _style(*STYLE_CASES[3])
    assert {"layers.0.w_gate", "layers.0.w_down"} <= kept

    def moved(p):
        return {c.tensor for c in p.collectives} & kept

    free = auto_plan(prog, m, pins, training="adam")
    assert moved(free.plan)  # at this width the search would gather the column weights...
    held = auto_plan(prog, m, pins, training="adam", keep=kept)
    assert not moved(held.plan) and held.gap == 0  # ...which the promise forbids
    assert held.estimate.seconds >= free.estimate.seconds
    assert held.plan.verify().ok
