"""A Hugging Face Llama (transformers' own class, tiny config) called as users call it,
``model(input_ids)``, trained through ``shardlayout run --steps`` on 2 gloo ranks under Megatron:
its losses and updated parameters equal the unsharded model's, and the collectives counted at the
dispatcher are the planned ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .shell import shardlayout

pytest.importorskip("torch")
pytest.importorskip("transformers")

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "hf_models.py")


def test_hf_llama_trains_under_megatron_as_the_unsharded_model():
    r = shardlayout("run", "--module", EXAMPLE + ":llama", "--mesh", "tp=2", "--style", "megatron", "--steps", "2",
                    "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert len(rep["losses"]) == 2
    assert rep["max_loss_rel_err"] <= 1e-5 and rep["max_param_rel_err"] <= 1e-5  # float32
    assert rep["collectives"]["forward"] == {"all_reduce": 4}
    assert rep["collectives"] == rep["planned_collectives"]
