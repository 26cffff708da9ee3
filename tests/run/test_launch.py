"""Plans run on torch.distributed (gloo, real processes): every rank's tensors equal the unsharded
run, the executed collectives are the planned ones, and a dead rank stops the job cleanly.
Few and small: each job starts its ranks (several seconds of `import torch`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}


def run(*args, env=None):
    cmd = [sys.executable, "-m", "shardlayout", "run", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env or ENV)


@pytest.mark.parametrize("args,planned", [
    (["--mesh", "dp=2,tp=2", "--style", "megatron-sp", "--layers", "2"], {"all_gather": 4, "reduce_scatter": 4}),
    (["--mesh", "tp=3", "--style", "megatron", "--layers", "1"], None),  # uneven heads and features
])
def test_run_equals_the_unsharded_run_and_executes_the_planned_collectives(args, planned):
    r = run(*args, "--json", "--dtype", "float64")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["equal"] and rep["max_abs_err"] < 1e-8 and rep["tensors_compared"] > 20
    assert rep["collectives"] == rep["planned_collectives"]
    if planned is not None:
        assert rep["planned_collectives"] == planned


def test_a_dead_rank_stops_the_job_with_one_line_naming_it():
    r = run("--mesh", "tp=2", "--style", "megatron", "--layers", "1", "--timeout", "5",
            env={**ENV, "SHARDLAYOUT_FAIL_RANK": "1"})
    assert r.returncode == 1
    assert "rank 1 exited with code 1; every other rank was stopped" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_input_is_refused_before_any_rank_starts():
    r = run("--mesh", "tp=2", "--nproc", "3")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "one rank per device" in r.stderr
