"""Symbolic programs: the builder with symbols, Program.at, interpolated output shapes, JSON, and
torch.export with dynamic dims (Dim names kept, sizes read in views, facts), through the CLI too."""

from __future__ import annotations

import json
import random
import warnings

import pytest

from shardlayout import Mesh, ShardingError
from shardlayout.cli import main
from shardlayout.plan import plan
from shardlayout.program import Program, ProgramBuilder, ProgramError
from shardlayout.program.shapes import shape_of
from shardlayout.program.symbols import evaluate_params, evaluate_shape, has_extent, infer_shapes
from shardlayout.symbolic import FactBase, Guard, sym


def mlp(symbols: dict | None = None, batch="batch", seq="seq") -> Program:
    """x (batch, seq, 16) -> flatten -> up -> relu -> down -> unflatten -> + x."""
    b = ProgramBuilder(symbols=symbols)
    x = b.input("x", (batch, seq, 16))
    w1, w2 = b.param("w1", (16, 32)), b.param("w2", (32, 16))
    h = b.op("view", [x], size=(f"{batch}*{seq}" if symbols else batch * seq, 16), name="flat")
    d = b.op("mm", [b.op("relu", [b.op("mm", [h, w1], name="up")], name="act"), w2], name="down")
    y = b.op("view", [d], size=(batch, seq, 16), name="back")
    b.output(b.op("add", [y, x], name="y"))
    return b.build()


def test_builder_keeps_symbolic_shapes_and_concrete_examples():
    p = mlp({"batch": 4, "seq": 16})
    assert p.tensors["flat"].shape == (64, 16) and p.example == {"batch": 4, "seq": 16}
    assert [str(e) for e in p.sym_shape("up")] == ["batch*seq", "32"]
    assert p.sym_shape("back") == (sym("batch"), sym("seq"), 16) and p.sym_shape("w1") == (16, 32)
    flat = next(op for op in p.ops if op.name == "flat")
    assert dict(flat.sym_params) == {"size": ("batch*seq", 16)} and flat.kwargs()["size"] == (64, 16)


def test_at_equals_the_program_built_at_those_sizes():
    p = mlp({"batch": 4, "seq": 16})
    for b in ({"batch": 6, "seq": 10}, {"batch": 1, "seq": 3}):
        q = p.at(b)
        assert q == mlp(b)  # the same symbolic program with another example
        direct = mlp(None, b["batch"], b["seq"])  # and, concretely, the program written with ints
        assert q.tensors == direct.tensors
        assert [(op.target, op.params, op.outputs) for op in q.ops] == [(op.target, op.params, op.outputs)
                                                                      for op in direct.ops]


def test_json_round_trip_keeps_symbols_facts_and_symbolic_params():
    b = ProgramBuilder(symbols={"batch": 4, "seq": 16}, facts=["seq % 2 == 0", "batch <= 1024"])
    x = b.input("x", ("batch", "seq", 8))
    b.output(b.op("view", [x], size=("batch", "seq//2", 16)))
    p = b.build()
    text = p.to_json()
    assert json.loads(text)["symbols"] == {"batch": 4, "seq": 16}
    assert Program.from_json(text) == p and [str(g) for g in p.facts] == ["batch <= 1024", "seq % 2 == 0"]
    bad = json.loads(text)
    bad["tensors"][0]["sym_shape"] = ["batch", "sek", 8]
    with pytest.raises(ShardingError, match="unknown symbol 'sek'"):
        Program.from_json(json.dumps(bad))


def _random_call(rng, names):
    """A random op call over symbolic inputs whose output shape the rule decides."""
    a, c = (sym(n) for n in rng.sample(names, 2))
    k = rng.choice([2, 3, 4])
    return rng.choice([
        ("view", [(a, c, 8)], {"size": (a * c, 8)}),
        ("view", [(a * k, c)], {"size": (a, k * c)}),
        ("cat", [(a, 8), (c + 1, 8)], {"dim": 0}),
        ("mm", [(a * c, 8), (8, k)], {}),
        ("chunk", [(a * k, c)], {"chunks": k}),
        ("slice", [(a + c, 8)], {"dim": 0, "start": 1, "end": 1 << 60, "step": k}),
        ("expand", [(1, c)], {"size": (a, c)}),
        ("sum", [(a, c, 4)], {"dim": (1,)}),
        ("permute", [(a, c, 4)], {"dims": (2, 0, 1)}),
        ("narrow", [(a + k, c)], {"dim": 0, "start": 1, "length": a}),
    ])


@pytest.mark.parametrize("seed", range(12))
def test_interpolated_shapes_match_the_rules_at_random_bindings(seed):
    rng = random.Random(seed)
    names = ["a", "b", "c"]
    example = {n: rng.randint(2, 9) for n in names}
    target, ins, params = _random_call(rng, names)
    sym_params = {k: v for k, v in params.items() if has_extent(v)}
    concrete = {**params, **{k: evaluate_params(v, example) for k, v in sym_params.items()}}
    out, special = infer_shapes(target, ins, concrete, sym_params, example, ())
    assert special == ()
    for b in FactBase().sample(6, seed, 1, 40, symbols=names):
        try:
            want = shape_of(target, [evaluate_shape(s, b) for s in ins],
                            {**params, **{k: evaluate_params(v, b) for k, v in sym_params.items()}})
        except ShardingError:
            continue  # the call is not defined at these sizes (e.g. chunk of 1 row)
        if len(want) == len(out):
            assert [evaluate_shape(s, b) for s in out] == [tuple(s) for s in want], (target, b)


def test_floor_forms_and_specialisation_are_explicit():
    s = sym("seq")
    out, special = infer_shapes("chunk", [(s, 8)], {"chunks": 2}, {}, {"seq": 5}, ())
    # two pieces only from seq = 2 on: the form is claimed there (a range fact), not below
    assert [str(x[0]) for x in out] == ["ceil(seq/2)", "seq//2"] and special == (Guard.parse("seq >= 2"),)
    out, special = infer_shapes("slice", [(s, 8)], {"dim": 0, "start": 0, "end": 1 << 60, "step": 3}, {},
                                {"seq": 9}, ())
    assert str(out[0][0]) == "ceil(seq/3)"
    # chunk(seq, 3) has 2 or 3 outputs depending on seq: no extent-wise form, so seq is specialised
    b = ProgramBuilder(symbols={"seq": 9})
    b.op("chunk", [b.input("x", ("seq", 8))], chunks=3, n_out=3)
    p = b.build()
    assert p.facts == (Guard.eq("seq", 9),)
    with pytest.raises(ShardingError, match="violates the fact seq == 9"):
        p.at({"seq": 12})


def test_bad_symbolic_input_is_one_line_error():
    b = ProgramBuilder(symbols={"batch": 4})
    with pytest.raises(ProgramError, match=r"unknown symbol 'seq'.*declare it"):
        b.input("x", ("batch", "seq"))
    with pytest.raises(ProgramError, match="unknown symbol 'batch'"):
        ProgramBuilder().input("x", ("batch", 4))
    with pytest.raises(ProgramError, match="does not hold at the example"):
        ProgramBuilder(symbols={"batch": 3}, facts=["batch % 2 == 0"])
    p = ProgramBuilder(symbols={"batch": 4}, facts=["2 <= batch <= 1024"])
    p.input("x", ("batch", 8))
    prog = p.build()
    for bad, msg in (({"batch": 2048}, "violates the fact 2 <= batch <= 1024"),
                     ({"sek": 8}, "not a symbol of the program"), ({"batch": 0}, "int >= 1")):
        with pytest.raises(ShardingError, match=msg) as e:
            prog.at(bad)
        assert "\n" not in str(e.value)
    b = ProgramBuilder(symbols={"seq": 4})
    x = b.input("x", ("seq", 8))
    with pytest.raises(ShardingError, match=r"fails at seq=\d+.*as a fact"):
        b.op("view", [x], size=("seq//2", 16))  # needs seq % 2 == 0, which the program does not state


# ------------------------------------------------------------------------------------------
# torch.export
# ------------------------------------------------------------------------------------------

torch = pytest.importorskip("torch")

MODULE = '''
import torch
from torch.export import Dim


class ReadsSizes(torch.nn.Module):
    """Reads x.shape[0] and x.size(1) into its views: sym_size nodes under dynamic shapes."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32, bias=False)
        self.down = torch.nn.Linear(32, 16, bias=False)

    def forward(self, x):
        b, t = x.shape[0], x.size(1)
        return self.down(torch.relu(self.up(x.reshape(b * t, 16)))).view(b, t, 16) + x


class NoSizes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32, bias=False)
        self.down = torch.nn.Linear(32, 16, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x))) + x


def make():
    torch.manual_seed(0)
    return ReadsSizes(), (torch.randn(4, 16, 16),)


def make_dynamic():
    torch.manual_seed(0)
    return ReadsSizes(), (torch.randn(4, 16, 16),), {"x": {0: Dim("batch", max=1024), 1: Dim("seq")}}
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import importlib.util

    path = tmp_path_factory.mktemp("mods") / "dyn_model.py"
    path.write_text(MODULE)
    spec = importlib.util.spec_from_file_location("dyn_model_for_tests", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    warnings.filterwarnings("ignore")
    return mod, path


@pytest.fixture(scope="module")
def reads_sizes(models):
    from shardlayout.program.torch_import import from_torch

    mod, _ = models
    module, args, dynamic = mod.make_dynamic()
    return from_torch(module, args, dynamic)


def test_export_keeps_dim_names_shapes_and_ranges(reads_sizes):
    p = reads_sizes
    assert p.example == {"batch": 4, "seq": 16}
    assert [str(g) for g in p.facts] == ["batch <= 1024"]
    assert [str(e) for e in p.sym_shape("x")] == ["batch", "seq", "16"]
    assert any([str(e) for e in p.sym_shape(n)] == ["batch*seq", "32"] for n in p.tensors)
    views = [dict(op.sym_params) for op in p.ops if op.sym_params]
    assert {"size": ("batch*seq", 16)} in views and {"size": ("batch", "seq", 16)} in views


def test_export_reading_sizes_plans_with_guards_and_verifies_at_two_more_sizes(reads_sizes):
    m = Mesh.parse("dp=2,tp=2")
    p = plan(reads_sizes, m, {"x": "[dp*2, tp*8, 16]"})
    assert [str(g) for g in p.guards] == ["batch % 2 == 0", "batch <= 1024", "seq % 2 == 0"]
    v = p.verify()
    assert v.ok and len(v.bindings) >= 3 and dict(v.bindings[0]) == {"batch": 4, "seq": 16}
    assert all(b["batch"] % 2 == 0 and b["seq"] % 2 == 0 for b in map(dict, v.bindings))


def test_export_without_size_reads_is_symbolic_too(models):
    from torch.export import Dim

    from shardlayout.program.torch_import import from_torch

    mod, _ = models
    p = from_torch(mod.NoSizes(), (torch.randn(4, 8, 16),), {"x": {0: Dim("batch")}})
    assert p.example == {"batch": 4} and p.sym_shape("x") == (sym("batch"), 8, 16)
    q = plan(p, Mesh.parse("dp=2"), {"x": "[dp*2, 8, 16]"})
    assert [str(g) for g in q.guards] == ["batch % 2 == 0"] and q.verify().ok


def test_cli_dynamic_json_has_symbolic_shapes_guards_and_verified_sizes(models, capsys):
    _, path = models
    code = main(["plan", "--module", f"{path}:make", "--dynamic", "x:0=batch,x:1=seq", "--mesh", "dp=2,tp=2",
                 "--pin", "x=[dp*2, tp*8, 16]", "--verify", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["verified"] is True
    assert data["symbols"] == {"batch": 4, "seq": 16}
    assert data["guards"] == ["batch % 2 == 0", "seq % 2 == 0"]
    assert ["batch*seq", 32] in data["shapes"].values() and data["shapes"]["x"] == ["batch", "seq", 16]
    assert len(data["verified_at"]) >= 3


def test_cli_factory_returning_dynamic_shapes_prints_guards(models, capsys):
    _, path = models
    code = main(["plan", "--module", f"{path}:make_dynamic", "--mesh", "dp=2,tp=2", "--style", "megatron",
                 "--verify"])
    out = capsys.readouterr().out
    assert code == 0
    assert "guards: batch % 2 == 0, batch <= 1024" in out and "(batch, seq, 16)" in out
    assert "sizes verified: batch=4, seq=16 (example); " in out


@pytest.mark.parametrize("spec, msg", [
    ("y:0=batch", "has no input 'y'; its inputs are x"),
    ("x:3=batch", "input 'x' has 3 dims"),
    ("1:0=batch", "position 1 does not exist"),
    ("x0=batch", "write INPUT:DIM=SYMBOL"),
])
def test_cli_dynamic_naming_a_missing_input_or_dim_exits_2(models, capsys, spec, msg):
    _, path = models
    code = main(["plan", "--module", f"{path}:make", "--dynamic", spec, "--mesh", "dp=2"])
    err = capsys.readouterr().err
    assert code == 2 and msg in err and err.count("\n") == 1


def test_cli_dynamic_without_module_exits_2(capsys):
    assert main(["plan", "--model", "llama", "--dynamic", "x:0=batch"]) == 2
    assert "--dynamic applies to --module" in capsys.readouterr().err


def test_runtime_assert_expressions_become_guards_or_notes():
    from shardlayout.program.torch_import import _sympy_guard

    assert str(_sympy_guard("Eq(Mod(s0, 4), 0)")) == "s0 % 4 == 0"
    assert str(_sympy_guard("Eq(PythonMod(s0*s1, 8), 0)")) == "(s0*s1) % 8 == 0"
    assert str(_sympy_guard("u0 <= 64")) == "u0 <= 64" and str(_sympy_guard("Eq(s0, 128)")) == "s0 == 128"
    assert _sympy_guard("Ne(s0, 1)") is None  # not a guard: kept as a note by the importer


def test_a_saved_dynamic_export_plans_with_torch_symbol_names(models, tmp_path, capsys):
    mod, _ = models
    module, args, dynamic = mod.make_dynamic()
    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(module, args, dynamic_shapes=dynamic), str(path))
    code = main(["plan", "--export", str(path), "--mesh", "dp=2", "--pin", "x=[dp*2, 16, 16]", "--json"])
    data = json.loads(capsys.readouterr().out)
    b, s = sorted(data["symbols"], key=data["symbols"].get)  # the archive has no Dim names: torch's own
    assert code == 0 and data["symbols"] == {b: 4, s: 16} and data["shapes"]["x"] == [b, s, 16]
    assert data["guards"] == [f"{b} % 2 == 0", f"{b} <= 1024"]


def test_a_shape_fitted_at_large_sizes_is_claimed_only_where_it_holds():
    """``x[:5]`` has 5 rows only from n = 5 on; a chunk in 2 has two pieces only from n = 2 on:
    the fitted shapes come with the range they hold in, as facts."""
    b = ProgramBuilder(symbols={"n": 8})
    x = b.input("x", ("n", 4))
    b.output(b.op("slice", [x], name="y", dim=0, start=0, end=5))
    b.output(b.op("slice", [x], name="z", dim=0, start=3))
    p = b.build()
    assert [str(f) for f in p.facts] == ["n >= 5"]
    assert str(p.sym_shape("z")[0]) == "n - 3"
