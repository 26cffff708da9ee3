"""A torch-exported torchtitan-style MoE (examples/titan_moe.py) recognised as route / unroute and run
expert parallel on 4 real gloo ranks: every rank equals the unsharded torch run, and the only
collectives are the planned dispatch and combine all_to_alls. One job (each rank imports torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from shardlayout.cli import main  # noqa: E402

TITAN = Path(__file__).resolve().parents[2] / "examples" / "titan_moe.py"


def test_titan_moe_runs_expert_parallel_on_four_gloo_ranks(capsys):
    argv = ["run", "--module", f"{TITAN}:make_bincount_index_add", "--mesh", "ep=4", "--style", "ep",
            "--nproc", "4", "--json"]
    assert main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["backend"] == "gloo" and rep["ranks"] == 4 and rep["mesh"] == "ep=4"
    assert rep["equal"] is True and rep["first_mismatch_on_rank0"] is None and rep["tensors_compared"] > 10
    assert rep["collectives"] == rep["planned_collectives"] == {"all_to_all": 2}
    assert rep["torch_calls"]["all_to_all"] == 2


def test_titan_per_expert_loop_runs_expert_parallel_on_four_gloo_ranks(capsys):
    """torchtitan's for-loop experts (torch.split by counts.tolist(), cat, zero padding): read as the
    grouped computation, then as routed rows; the same two all_to_alls, every rank equal, and one
    training step's gradients equal too."""
    argv = ["run", "--module", f"{TITAN}:make_loop_small", "--mesh", "ep=4", "--style", "ep", "--nproc", "4", "--train",
            "--dtype", "float64", "--json"]
    assert main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["equal"] is True and rep["first_mismatch_on_rank0"] is None and rep["tensors_compared"] > 10
    assert rep["grads_max_rel_err"] < 1e-9  # training through the routed rows: the module's own autograd
    assert rep["collectives"] == rep["planned_collectives"]
    assert rep["collectives"]["all_to_all"] == 2 and rep["collectives"]["backward_all_to_all"] == 1


def test_training_a_bfloat16_layer_is_compared_at_bfloat16_tolerance(capsys):
    """The grouped matmuls compute in bfloat16: sharded sums round differently from the unsharded
    ones by about one bfloat16 unit, which the report allows for and says so (not a float64 1e-10)."""
    argv = ["run", "--module", f"{TITAN}:make_small", "--mesh", "ep=2", "--style", "ep", "--nproc", "2", "--train",
            "--dtype", "float64", "--json"]
    assert main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["equal"] is True and rep["tolerance"].startswith("bfloat16")
    assert 0 < rep["grads_max_rel_err"] < 2e-2 and rep["max_rel_err"] < 2e-2
