"""The command line: output, --json, and one-line errors."""

from __future__ import annotations

import json

from shardlayout.cli import main


def test_demo_runs(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "rank 7" in out


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
