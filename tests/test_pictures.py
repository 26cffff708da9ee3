"""Pictures: the per-block cell table (checked against Sharding's own index sets), the text
picture and matplotlib files (show/plan --png/--svg), and progress bars."""

from __future__ import annotations

import io
import itertools
import json
import sys
import time

import pytest

from shardlayout import Mesh, Sharding
from shardlayout.cli import main
from shardlayout.report import picture, progress
from shardlayout.report.cells import cell_table, dim_blocks
from shardlayout.sharding.factors import ChunkProgram, Factor

CASES = [  # (mesh, shape or None, placements or sharding text): 1-D to 3-D meshes
    ("x=4", (8,), ["S(0)"]),
    ("x=3", (10,), ["S(0)"]),  # uneven: 4, 4, 2
    ("x=4", (3,), ["S(0)"]),  # uneven with an empty rank
    ("dp=2,tp=2", (8, 4), ["SS(0,2)", "S(0)"]),  # strided
    ("dp=2,tp=2", (9,), ["S(0)", "S(0)"]),  # nested uneven (DESIGN.md)
    ("x=2", (5,), ["SS(0,2)"]),  # uneven strided: DTensor's chunk program
    ("x=3", (10,), ["SS(0,2)"]),
    ("dp=2,tp=4", None, "[dp*4*tp:(1)2, tp:(2)2*3]"),  # sub-axes
    ("dp=2,tp=4", None, "[tp:(2)2*3, tp:(1)2*2] +sum(dp)"),
    ("x=2,y=2", (9,), ["SS(0,2)", "SS(0,2)"]),  # a chunk program: [0,1,5] [2,6] [3,7] [4,8]
    ("a=2,b=2,c=2", (9, 5, 6), ["S(0)", "SS(2,2)", "S(2)"]),  # 3-D mesh, 3-D tensor
    ("a=2,b=3,c=2", (4, 7, 6), ["R", "SS(1,2)", "P(sum)"]),
    ("x=2", (), ["R"]),  # a scalar
]


def _sharding(mesh, shape, spec):
    m = Mesh.parse(mesh)
    return Sharding.parse(spec, m) if shape is None else Sharding.from_placements(m, shape, spec)


def _elements(t, cell) -> set:
    return set(itertools.product(*(range(t.dims[d].blocks[b].lo, t.dims[d].blocks[b].hi) for d, b in enumerate(cell))))


@pytest.mark.parametrize("mesh,shape,spec", CASES, ids=[f"{m} {s}" for m, _, s in CASES])
def test_cell_table_is_what_each_rank_holds(mesh, shape, spec):
    s = _sharding(mesh, shape, spec)
    t = cell_table(s)
    assert t.complete
    for r in s.mesh.ranks():  # the cells a rank holds are exactly its local index set
        want = set(itertools.product(*(ix.tolist() for ix in s.indices(r))))
        got = set().union(*(_elements(t, c) for c in t.device_cells(r))) if t.device_cells(r) else set()
        assert got == want, (r, s)
    for cell in t.cells():  # and the holders of a cell are exactly the ranks holding its elements
        holders = [r for r in s.mesh.ranks() if _elements(t, cell) <= set(itertools.product(
            *(ix.tolist() for ix in s.indices(r))))]
        assert t.holder_ranks(cell) == holders and t.holder_count(cell) == len(holders)


def test_chunk_program_dims_are_cut_as_dtensor_cuts_them():
    s = _sharding("x=2,y=2", (9,), ["SS(0,2)", "SS(0,2)"])
    assert isinstance(s.dims[0], ChunkProgram)
    t = cell_table(s)  # DTensor: rank 0 [0,1,5], 1 [2,6], 2 [3,7], 3 [4,8]
    assert [(b.lo, b.hi, t.label((i,))) for i, b in enumerate(t.dims[0].blocks)] == [
        (0, 2, "0"), (2, 3, "1"), (3, 4, "2"), (4, 5, "3"), (5, 6, "0"), (6, 7, "1"), (7, 8, "2"), (8, 9, "3")]
    u = cell_table(_sharding("x=3", (10,), ["SS(0,2)"]))  # DESIGN.md: [0,1,5,6] [2,3,7,8] [4,9]
    assert [(b.lo, b.hi, u.label((i,))) for i, b in enumerate(u.dims[0].blocks)] == [
        (0, 2, "0"), (2, 4, "1"), (4, 5, "2"), (5, 7, "0"), (7, 9, "1"), (9, 10, "2")]


def test_blocks_are_bounded_and_never_enumerate_the_tensor():
    t0 = time.perf_counter()
    d = dim_blocks(10**18, (Factor(1 << 20, "x"), Factor(10**18 >> 20)), max_blocks=64)
    assert not d.complete and len(d.blocks) == 64 and d.size == 10**18
    big = _sharding("dp=2048,tp=8", (128256, 4096), ["S(0)", "S(1)"])
    t = cell_table(big)
    assert not t.dims[0].complete and t.dims[1].complete and len(t.dims[1].blocks) == 8
    assert t.label((3, 5)) == "29"
    assert time.perf_counter() - t0 < 60  # a hang guard: enumerating 10**18 cells would never end


def test_large_holder_sets_are_named_by_coordinates():
    s = _sharding("dp=2048,tp=8", (128256, 4096), ["R", "S(0)"])
    text = picture(s)
    assert "0:16032 |  tp=0" in text and "112224:128256 |  tp=7" in text
    one = Sharding.parse("[x*4]", Mesh.parse("x=4,y=2"))
    assert "0,1" in picture(one) or "0-1" in picture(one)


def test_text_picture_unchanged_for_small_cases():
    s = _sharding("dp=2,tp=2", (8, 4), ["SS(0,2)", "S(0)"])
    assert picture(s).splitlines()[1:] == ["      0:4", "0:2 |  0", "2:4 |  2", "4:6 |  1", "6:8 |  3"]


# --- files -------------------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("mesh,shape,spec", [c for c in CASES if c[1] != ()], ids=lambda x: str(x)[:30])
def test_show_writes_png_and_svg(mesh, shape, spec, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png, svg = tmp_path / "s.png", tmp_path / "s.svg"
    args = ["show", "--mesh", mesh, "--png", str(png), "--svg", str(svg)]
    args += ["--sharding", spec] if shape is None else ["--shape", ",".join(map(str, shape)),
                                                         "--placements", ",".join(spec)]
    assert main(args) == 0
    assert f"picture written to {png}" in capsys.readouterr().out
    assert png.read_bytes().startswith(PNG) and png.stat().st_size > 5000
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text


def test_show_json_names_the_pictures_and_big_tensors_draw(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "big.png"
    assert main(["show", "--mesh", "dp=2048,tp=8", "--shape", "128256,4096", "--placements", "S(0),S(1)",
                 "--png", str(png), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pictures"] == [str(png)]
    assert png.read_bytes().startswith(PNG)


def test_plan_writes_a_per_layer_diagram(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from shardlayout.report.figure import _fold, plan_rows

    png, svg = tmp_path / "plan.png", tmp_path / "plan.svg"
    assert main(["plan", "--style", "megatron", "--layers", "4", "--png", str(png), "--svg", str(svg)]) == 0
    assert png.read_bytes().startswith(PNG) and "<svg" in svg.read_text()
    svg_text = svg.read_text()
    assert "all_reduce on tp" in svg_text and "layers.1 .. layers.3: the same as layers.0" in svg_text

    from argparse import Namespace

    from shardlayout import jobs

    p = jobs.build_plan(Namespace(model="llama", program=None, module=None, export=None, layers=4, mesh="dp=2,tp=4",
                                  style="megatron", pin=None))
    folded = _fold(plan_rows(p))
    assert [(layer, len(reps)) for layer, _, reps in folded] == [("inputs", 0), ("layers.0", 3)]
    rows = dict((name, (what, str(s), cs)) for name, what, s, cs in folded[1][1])
    assert rows["wq"][:2] == ("param", "[16, tp*4]") and rows["resid1"][2][0].kind.value == "all_reduce"


def test_picture_errors_are_one_line(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    base = ["show", "--mesh", "x=2", "--shape", "4", "--placements", "S(0)"]
    assert main(base + ["--png", str(tmp_path / "no" / "dir" / "x.png")]) == 2
    assert capsys.readouterr().err.startswith("shardlayout: error: picture")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert main(base + ["--svg", str(tmp_path / "x.svg")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'shardlayout[plot]'" in err and err.count("\n") == 1


# --- progress bars -----------------------------------------------------------------------

def test_progress_bar_only_when_turned_on_and_transient():
    from rich.console import Console

    buf = io.StringIO()
    with progress.enabled(True, console=Console(file=buf, force_terminal=True, width=80), delay=0.0):
        with progress.task("planning something"):
            time.sleep(0.3)
        assert list(progress.track(range(3), "walking")) == [0, 1, 2]
    assert "planning something" in buf.getvalue()
    quiet = io.StringIO()
    with progress.enabled(True, console=Console(file=quiet, force_terminal=True), delay=5.0):
        with progress.task("short step"):  # ends before the delay: never drawn
            pass
    assert quiet.getvalue() == ""
    with progress.enabled(True):  # stderr is not a terminal here (captured): off
        with progress.task("x") as advance:
            advance()
    assert list(progress.track(iter("ab"), "no bar")) == ["a", "b"]


def test_commands_print_no_bar_when_not_a_terminal(capsys):
    assert main(["plan", "--layers", "1", "--verify"]) == 0
    assert capsys.readouterr().err == ""


def test_plan_timeline_of_stream_overlaps(tmp_path, capsys):
    """``--timeline`` draws each overlap serial and chunked; the chunked schedule ends at the
    pipelined estimate; a plan where no stream pays is refused with one line."""
    pytest.importorskip("matplotlib")
    from shardlayout.plan import plan
    from shardlayout.plan.stream import stream_plan
    from shardlayout.program.models import llama, style_pins
    from shardlayout.report.figure import stream_schedule

    size = "dim=4096,seq=4096,batch=1,heads=32,ffn=11008"
    out = tmp_path / "t.svg"
    assert main(["plan", "--model", "llama", "--layers", "1", "--size", size, "--mesh", "tp=8", "--style",
                 "megatron-sp", "--timeline", str(out)]) == 0
    assert out.read_text().lstrip().startswith("<?xml") and f"picture written to {out}" in capsys.readouterr().out
    prog, m = llama(layers=1, dim=4096, seq=4096, batch=1, heads=32, ffn=11008), Mesh.parse("tp=8")
    choices = [c for style in ("megatron", "megatron-sp")
               for c in stream_plan(plan(prog, m, style_pins(prog, m, style)), ring=True).choices]
    assert {c.style for c in choices} == {"ring", "chunks"}
    for c in choices:
        serial, streamed = stream_schedule(c)
        assert serial[-1][0] + serial[-1][1] == pytest.approx(c.serial)
        assert max(s + w for s, w, _ in streamed) == pytest.approx(c.overlapped)
    assert main(["plan", "--model", "llama", "--mesh", "tp=2", "--style", "megatron", "--timeline",
                 str(tmp_path / "none.png")]) == 2
    assert "no stream pays" in capsys.readouterr().err
