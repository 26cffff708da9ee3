"""``run --steps`` checkpoints: saved with torch.distributed.checkpoint under one plan, resumed under
another plan and mesh (and by the unsharded reference), the losses equal an uninterrupted run; a
checkpoint of another model or with a damaged file is one clear error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}
MODEL = ["--layers", "1", "--dtype", "float64", "--lr", "0.01"]


def run(*args, env=None):
    cmd = [sys.executable, "-m", "shardlayout", "run", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**ENV, **(env or {})}, cwd=ROOT)


def refused(capsys, *args) -> str:
    """Run the command in this process (it must stop before any rank starts): its one-line error."""
    from shardlayout.cli import main

    assert main(["run", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("shardlayout: error:")
    return err




@pytest.fixture(scope="module")
def saved(tmp_path_factory, run_json):
    """A checkpoint after 5 AdamW steps of Megatron-SP on dp=2,tp=2 (4 ranks), and the losses of 10
    uninterrupted steps."""
    path = str(tmp_path_factory.mktemp("ck") / "step5")
    whole = run_json("--mesh", "dp=2,tp=2", "--style", "megatron-sp", *MODEL, "--steps", "10")
    first = run_json("--mesh", "dp=2,tp=2", "--style", "megatron-sp", *MODEL, "--steps", "5", "--checkpoint", path)
    assert first["checkpoint"]["saved"]["steps"] == 5 and first["equal"]
    return path, whole["losses"], first["losses"]


@pytest.mark.parametrize("plan", [
    ["--mesh", "dp=2,tp=2", "--style", "megatron-sp"],  # the same plan
    ["--mesh", "tp=2", "--style", "megatron"],  # another plan on another mesh, 2 ranks instead of 4
])
def test_resuming_continues_the_uninterrupted_run(saved, tmp_path, plan, run_json):
    import shutil

    path, whole, first = saved
    assert first == pytest.approx(whole[:5], rel=1e-12)
    path = str(shutil.copytree(path, tmp_path / "ck"))
    # every parameter and its AdamW moments resharded by DCP; the unsharded reference resumes from the
    # same files (DTensor shards read back as whole tensors)
    rep = run_json(*plan, *MODEL, "--steps", "5", "--checkpoint", path, "--resume")
    assert rep["checkpoint"]["loaded"]["steps"] == 5 and rep["equal"]
    assert max(abs(a - b) / abs(b) for a, b in zip(rep["losses"], whole[5:])) <= 1e-9
    assert max(abs(a - b) / abs(b) for a, b in zip(rep["reference_losses"], whole[5:])) <= 1e-9
    assert rep["checkpoint"]["saved"]["steps"] == 10  # saved back, swapped in whole


def test_a_rank_dying_while_saving_leaves_the_previous_checkpoint_whole(saved, tmp_path):
    import shutil

    path = tmp_path / "ck"
    shutil.copytree(saved[0], path)
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    r = run("--mesh", "tp=2", "--style", "megatron", *MODEL, "--steps", "1", "--checkpoint", str(path),
            env={"SHARDLAYOUT_FAIL_SAVE_RANK": "1"})
    assert r.returncode == 1 and "rank 1 exited with code 1" in r.stderr
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before  # the 5-step checkpoint, untouched


def test_a_checkpoint_of_another_model_is_refused_before_any_rank_starts(saved, capsys):
    err = refused(capsys, "--mesh", "tp=2", "--style", "megatron", "--layers", "2", "--dtype", "float64", "--steps",
                  "1", "--checkpoint", saved[0], "--resume")
    assert "is of another model: it has no layers.1." in err


def test_a_truncated_or_missing_shard_file_is_one_line_before_any_rank_starts(saved, tmp_path, capsys):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(saved[0], broken)
    shards = sorted(p for p in broken.iterdir() if p.suffix == ".distcp")
    shards[0].write_bytes(shards[0].read_bytes()[:100])  # truncated
    args = ("--mesh", "tp=2", "--style", "megatron", *MODEL, "--steps", "1", "--checkpoint", str(broken), "--resume")
    err = refused(capsys, *args)
    assert f"{shards[0].name} is truncated (100 of at least" in err and "the checkpoint is damaged" in err
    shards[0].unlink()
    assert f"misses its file {shards[0].name}" in refused(capsys, *args)
