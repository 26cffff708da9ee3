"""The command line: output, --json, and one-line errors."""

from __future__ import annotations

import json

import pytest

from shardlayout.cli import main


def test_demo_plans_and_verifies_the_llama_block(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "4 x all_gather on tp, 4 x reduce_scatter on tp" in out
    assert "verified: every rank simulated" in out


def test_layout_command_text_and_json(capsys):
    assert main(["layout", "composition", "20:2", "(5,4):(4,1)"]) == 0
    assert capsys.readouterr().out.strip() == "(5,4):(8,2)"
    assert main(["layout", "logical_divide", "(4,6):(6,1)", "[2,_]", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["result"] == "((2,2),6):((6,12),1)" and data["size"] == 24


def test_layout_command_error_is_one_line(capsys):
    assert main(["layout", "composition", "(4,6):(6,1)", "6"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardlayout: error: composition(") and err.count("\n") == 1
    assert main(["layout", "coalesce", "(4,2):(1"]) == 2
    assert "Layout.parse" in capsys.readouterr().err


def test_show_placements_text(capsys):
    assert main(["show", "--mesh", "dp=2,tp=4", "--shape", "8,12", "--placements", "S(0),S(1)"]) == 0
    out = capsys.readouterr().out
    assert "[dp*4, tp*3]" in out and "[S(0), S(1)]" in out and "PartitionSpec('dp', 'tp')" in out
    assert "rank   5 (dp=1,tp=1): local (4, 3)  dim0 4:8  dim1 3:6" in out


def test_show_strided_picture(capsys):
    assert main(["show", "--mesh", "dp=2,tp=2", "--shape", "8,4", "--placements", "SS(0,2),S(0)"]) == 0
    out = capsys.readouterr().out
    # rows 0:2 on rank 0, 2:4 on rank 2 (dp=1), 4:6 on rank 1 (tp=1): tp outer, dp inner
    assert "0:2 |  0" in out and "2:4 |  2" in out and "4:6 |  1" in out


def test_show_json_and_sub_axes(capsys):
    assert main(["show", "--mesh", "dp=2,tp=4", "--sharding", "[dp*4*tp:(1)2, tp:(2)2*3]", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["placements"] is None and "sub-axes" in data["placements_error"]
    assert data["shape"] == [16, 6] and len(data["ranks"]) == 8
    assert data["ranks"][1]["ranges"][1] == [[3, 6]]


def test_show_partition_spec(capsys):
    assert main(["show", "--mesh", "dp=2,tp=4", "--shape", "16,3", "--partition-spec", "('dp','tp'),None",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sharding"] == "[dp*tp*2, 3]"


def test_show_errors_are_one_line(capsys):
    assert main(["show", "--mesh", "dp=2", "--shape", "8", "--placements", "S(3)"]) == 2
    assert "dim 3 is out of range" in capsys.readouterr().err
    assert main(["show", "--mesh", "dp=2,tp", "--sharding", "[dp*4]"]) == 2
    assert "name=size" in capsys.readouterr().err
    assert main(["show", "--mesh", "dp=2", "--placements", "S(0)"]) == 2
    assert "--shape" in capsys.readouterr().err


def test_view_command(capsys):
    argv = ["view", "--mesh", "dp=2,tp=4", "--shape", "8,12", "--placements", "S(0),S(1)", "--to", "16,6"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "no data moves" in out and "[dp*4*tp:(1)2, tp:(2)2*3]" in out
    assert main(argv + ["--no-subaxes", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["communication"] and data["collectives"][0]["kind"] == "all_gather"
    assert data["output"]["placements"] == ["S(0)", "R"]
    assert main(["view", "--mesh", "x=2", "--shape", "24", "--placements", "SS(0,3)", "--to", "5,5"]) == 2
    assert "keeps the number of elements" in capsys.readouterr().err


def test_explain_command(capsys):
    assert main(["explain", "mm", "--mesh", "dp=2,tp=4", "--inputs", "[dp*4, tp*4]", "[tp*4, 6]"]) == 0
    out = capsys.readouterr().out
    assert "output 0: [dp*4, 6] +sum(tp)" in out and "collectives: none" in out
    assert "candidates (" in out and "tp: replicate" in out and " *      0.00 µs" in out
    assert main(["explain", "mm", "--mesh", "dp=2,tp=4", "--inputs", "[dp*4, tp*4]", "[tp*4, 6]", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cost_seconds"] == 0 and len(data["candidates"]) > 4
    assert all("collectives" in c and "cost_seconds" in c for c in data["candidates"])
    assert main(["explain", "aten._softmax.default", "--mesh", "dp=2,tp=4", "--inputs", "8,12:S(0),S(1)",
                 "--param", "dim=1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["communication"] and data["collectives"][0]["axes_text"] == "tp"
    assert main(["explain", "frobnicate", "--mesh", "x=2", "--inputs", "[x*2]"]) == 2
    assert "no sharding rule" in capsys.readouterr().err


def test_plan_command(capsys, tmp_path):
    assert main(["plan", "--mesh", "dp=2,tp=4", "--style", "megatron", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "4 x all_reduce on tp" in out and "verified" in out
    assert main(["plan", "--style", "megatron-sp", "--json", "--verify"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verified"] is True and "plan_seconds" in data
    assert sorted({(c["kind"], (c["axes_text"],)) for c in data["collectives"]}) == [
        ("all_gather", ("tp",)), ("reduce_scatter", ("tp",))]
    assert main(["plan", "--layers", "0"]) == 2
    assert "layers" in capsys.readouterr().err
    assert main(["plan", "--model", "gpt5"]) == 2
    assert "unknown model 'gpt5'" in capsys.readouterr().err
    assert main(["plan", "--mesh", "dp=2,", "--style", "dp"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    bad = tmp_path / "p.json"
    bad.write_text("{not json")
    assert main(["plan", "--program", str(bad)]) == 2
    assert "malformed" in capsys.readouterr().err
    assert main(["plan", "--pin", "x=[dp*3, 8, 16]"]) == 2
    assert "has shape (6, 8, 16), the tensor has (2, 8, 16)" in capsys.readouterr().err
    assert main(["plan", "--pin", "nosuch=[2]"]) == 2
    assert "no such tensor" in capsys.readouterr().err


def test_plan_user_module_and_export(capsys, tmp_path, monkeypatch):
    import pytest

    torch = pytest.importorskip("torch")
    (tmp_path / "usermodel.py").write_text(
        "import torch\nfrom shardlayout.program.torch_models import LlamaTorch\n"
        "def make():\n    return LlamaTorch(1), (torch.randn(2, 8, 16), torch.randn(8, 4), torch.randn(8, 4))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["plan", "--module", "usermodel:make", "--mesh", "tp=4", "--style", "megatron", "--verify"]) == 0
    assert "2 x all_reduce on tp" in capsys.readouterr().out
    from shardlayout.program.torch_models import LlamaTorch

    ep = torch.export.export(LlamaTorch(1), (torch.randn(2, 8, 16), torch.randn(8, 4), torch.randn(8, 4)))
    torch.export.save(ep, str(tmp_path / "m.pt2"))
    assert main(["plan", "--export", str(tmp_path / "m.pt2"), "--mesh", "tp=2", "--style", "megatron-sp",
                 "--verify"]) == 0
    assert "verified" in capsys.readouterr().out
    assert main(["plan", "--module", "nosuchmod:make"]) == 2
    assert "No module named" in capsys.readouterr().err


def test_export_command(capsys):
    assert main(["export", "--to", "dtensor", "--mesh", "dp=2,tp=2", "--style", "megatron", "--layers", "1",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mesh"] == {"names": ["dp", "tp"], "shape": [2, 2]}
    assert data["tensors"]["layers.0.wq"]["placements"] == ["Replicate()", "Shard(dim=1)"]
    assert main(["export", "--to", "jax", "--mesh", "dp=2,tp=2", "--style", "fsdp", "--layers", "1"]) == 0
    assert 'layers.0.wq         (16, 16)       ["dp", null]' in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # argparse refuses it: usage on stderr, exit 2
        main(["export", "--to", "onnx"])
    assert e.value.code == 2


USER_MODEL = '''
import torch


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32, bias=False)
        self.down = torch.nn.Linear(32, 16, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x.float()))).to(x.dtype)  # casts import too


def make():
    return MLP(), (torch.randn(4, 16),)


def broken():
    raise RuntimeError("no weights here")
'''


def test_module_from_a_file_or_the_current_directory(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    (tmp_path / "usermlp.py").write_text(USER_MODEL)
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--module", "usermlp.py:make", "--mesh", "tp=2", "--pin", "up.weight=[tp*16, 16]",
                 "--verify"]) == 0
    assert "verified" in capsys.readouterr().out
    assert main(["plan", "--module", "usermlp:make", "--mesh", "tp=2", "--json"]) == 0
    assert "up.weight" in json.loads(capsys.readouterr().out)["tensors"]
    for spec, msg in [("nope.py:make", "no file 'nope.py'"), ("usermlp:nothere", "has no callable 'nothere'"),
                      ("usermlp:broken", "broken() raised RuntimeError: no weights here")]:
        assert main(["plan", "--module", spec]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1, err


def test_version_json_errors_and_no_tracebacks(capsys, monkeypatch):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("shardlayout 0.")
    assert main(["plan", "--mesh", "dp=2,", "--json"]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out)["error"]["type"] == "MeshError"
    assert captured.err.startswith("shardlayout: error: Mesh.parse") and captured.err.count("\n") == 1

    import shardlayout.jobs

    def boom(args):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(shardlayout.jobs, "build_plan", boom)
    assert main(["plan"]) == 1  # a failure we did not foresee: one line, exit 1, no traceback
    err = capsys.readouterr().err
    assert "internal error ZeroDivisionError" in err and "--debug" in err and "Traceback" not in err
    with pytest.raises(ZeroDivisionError):
        main(["--debug", "plan"])


def test_the_header_names_the_program(tmp_path, capsys):
    from shardlayout.program.models import llama

    f = tmp_path / "prog.json"
    f.write_text(llama(layers=1).to_json())
    assert main(["plan", "--program", str(f), "--mesh", "tp=2"]) == 0
    assert capsys.readouterr().out.startswith(f"plan of {f} (")


@pytest.mark.parametrize("args,match", [
    (["show", "--mesh", "x=" + "1" + "0" * 30, "--shape", "4", "--placements", "S(0)"], "more than the 1048576"),
    (["show", "--mesh", "x=2", "--shape", "8", "--placements", "SS(0," + "1" + "0" * 30 + ")"], "split factor"),
    (["plan", "--layers", "100000"], "go up to 4096 layers"),
])
def test_absurd_sizes_are_refused_at_once(args, match, capsys):
    assert main(args) == 2
    assert match in capsys.readouterr().err


def test_show_on_real_sizes_is_bounded(capsys):
    # a 128256 x 4096 embedding on 16384 devices: the picture per block (8 row blocks of 16032),
    # holders too many to list named by coordinate, 16 ranks computed
    assert main(["show", "--mesh", "dp=2048,tp=8", "--shape", "128256,4096", "--placements", "R,S(0)"]) == 0
    out = capsys.readouterr().out
    assert "0:16032 |  tp=0" in out and "112224:128256 |  tp=7" in out and "16368 more ranks" in out


@pytest.mark.parametrize("args,match", [
    (["run", "--mesh", "tp=2", "--nproc", "0"], "--nproc 0: the mesh tp=2 has 2 devices"),
    (["run", "--mesh", "tp=2", "--timeout", "nan"], "positive, finite number of seconds"),
    (["run", "--mesh", "tp=2", "--repeat", "-1"], "give 0 or more steps"),
    (["explain", "mm", "--mesh", "tp=2", "--inputs", "[tp*2, 4]", "[4, 4]", "--top", "0"], "give 1 or more"),
])
def test_bad_option_values_are_refused(args, match, capsys):
    pytest.importorskip("torch")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1


@pytest.mark.parametrize("extra", [["--memory", "80GiB"], ["--training", "sgd"]])
def test_auto_only_options_without_style_auto_are_refused(extra, capsys):
    assert main(["plan", "--style", "dp", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardlayout: error:") and "only for --style auto" in err and len(err.splitlines()) == 1


def test_flop_rate_sets_the_stream_estimates_without_auto(capsys):
    # compute at 1 TFLOP/s makes the Megatron-SP gathers worth streaming at these sizes; the line says the rate
    argv = ["plan", "--model", "llama", "--layers", "1", "--size", "dim=256,seq=1024,batch=1,heads=4,ffn=512",
            "--mesh", "tp=2", "--style", "megatron-sp"]
    assert main(argv + ["--flop-rate", "1e12"]) == 0
    out = capsys.readouterr().out
    assert "step (forward, at 1 TFLOP/s)" in out and "stream overlap(s)" in out
    assert main(argv) == 0 and "stream overlap" not in capsys.readouterr().out  # at the default 100 TFLOP/s: none
    assert main(argv + ["--ring"]) == 0  # a ring (one step on tp=2) still pays there
    lines = [x for x in capsys.readouterr().out.splitlines() if " chunks [" in x]
    assert lines and all("(ring: 1 send/recv steps)" in x for x in lines)
    for bad in ("0", "-1", "nan", "inf"):
        assert main(argv + ["--flop-rate", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("shardlayout: error:") and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv", [["plan", "--model", "llama", "--size", "dim=64,dim=32", "--mesh", "tp=2"],
                                  ["plan", "--model", "llama", "--size", ",,", "--mesh", "tp=2"],
                                  ["export", "--model", "llama", "--mesh", "tp=2", "--style", "megatron",
                                   "--to", "dtensor", "--timeline", "x.png"]])
def test_size_and_timeline_misuse_is_one_line(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as e:  # a usage error (an option the command does not take)
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(("shardlayout: error:", "usage:", "shardlayout"))


def test_explain_reads_a_stream_factor_and_says_where_the_chunks_go(capsys):
    assert main(["explain", "mm", "--mesh", "tp=2", "--inputs", "[tp*~4*16, 32]", "[32, tp*32]"]) == 0
    out = capsys.readouterr().out
    assert "stream: input 0 [tp*~4*16, 32] passes dim 0 through to output 0 dim 0" in out
    assert main(["explain", "mm", "--mesh", "tp=2", "--inputs", "[64, tp*~2*16]", "[tp*32, 64]", "--json"]) == 0
    (st,) = json.loads(capsys.readouterr().out)["streams"]
    assert (st["input"], st["dim"], st["chunks"], st["output"]) == (0, 1, 2, None)  # a contracted dim
    assert main(["explain", "mm", "--mesh", "tp=2", "--inputs", "[~4*tp*16, 32]", "[32, 32]"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardlayout: error:") and "mesh-axis factors" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("op", ["softmax", "cumsum"])
def test_explain_does_not_claim_a_stream_passes_through_a_normalised_or_scanned_dim(op, capsys):
    assert main(["explain", op, "--mesh", "tp=2", "--inputs", "[tp*~2*8, 16]", "--param", "dim=0"]) == 0
    out = capsys.readouterr().out
    assert "reads dim 0 whole" in out and "passes dim 0 through" not in out


def test_plan_of_a_deep_llama_says_what_verify_covered(capsys):
    assert main(["plan", "--model", "llama", "--layers", "9", "--mesh", "tp=2", "--style", "megatron",
                 "--verify"]) == 0
    out = capsys.readouterr().out
    assert "total: 18 collectives (18 x all_reduce on tp)" in out and "layers.6.attn_out3" in out
    assert "verified on the compressed program (instances 0-3 and the last of 9); the other 4" in out


def test_the_version_lives_in_one_place(capsys):
    """``pyproject.toml`` reads the version from the package; the installed metadata, the package and
    ``--version`` agree, and CHANGELOG.md has a section for it."""
    import importlib.metadata
    import re as _re
    from pathlib import Path as _Path

    import shardlayout

    root = _Path(__file__).resolve().parents[1]
    text = (root / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text and not _re.search(r"^version\s*=\s*\"", text, _re.M)
    assert importlib.metadata.version("shardlayout") == shardlayout.__version__
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"shardlayout {shardlayout.__version__}"
    assert f"## {shardlayout.__version__}" in (root / "CHANGELOG.md").read_text()
