"""Plans run on torch.distributed (gloo, real processes): every rank's tensors equal the unsharded
run, the executed collectives are the planned ones, and a dead rank stops the job cleanly.
Few and small: each job starts its ranks (several seconds of `import torch`)."""

from __future__ import annotations

import json
import os

import pytest

from .shell import shardlayout

pytest.importorskip("torch")

ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}


def run(*args, env=None):
    """``shardlayout run`` (in this process unless the ranks must see ``env``: ``shell``)."""
    return shardlayout("run", *args, env=env)


@pytest.mark.parametrize("args,planned", [
    (["--mesh", "tp=4", "--style", "megatron", "--layers", "2"],
     {"all_reduce": 4, "backward_all_reduce": 4}),  # Megatron's own count: f and g per block
    (["--mesh", "dp=2,tp=2", "--style", "megatron-sp", "--layers", "2"], None),
    (["--mesh", "tp=3", "--style", "megatron", "--layers", "1"], None),  # uneven heads and features
    (["--model", "moe-dense", "--mesh", "ep=4", "--style", "ep"], None),  # training: the dense form
    (["--mesh", "dp=2,tp=2", "--style", "fsdp", "--layers", "1"], None),  # gathered weights: gradients summed on dp
    (["--mesh", "dp=4", "--style", "dp", "--layers", "1"], None),  # batch 2 on 4 ranks: two hold nothing
    # torchtitan's sequence-parallel plan: a vocab-parallel embedding whose partial output meets
    # replicated norm weights (their gradients arrive partial and are summed), an uneven sequence
    (["--module", "tests/program/zoo.py:make_titan_llama", "--tp-plan", "examples/titan_sp_tp.json", "--mesh",
      "tp=2"], None),
    (["--mesh", "tp=4", "--style", "megatron-sp", "--layers", "1", "--size", "seq=6"], None),
    # a tied embedding on dp: the head's transpose reads the weight with a complete gradient (its
    # output's is summed), the embedding with a partial one: only the embedding's is summed again
    (["--module", "tests/program/zoo.py:make_gpt2_tied", "--mesh", "dp=2", "--style", "dp"], None),
    # training mode: dropout's draws (attention's cut by heads), each rank's piece of one global draw
    (["--module", "tests/program/zoo.py:make_dropout", "--mesh", "tp=2", "--style", "megatron"], None),
])
def test_training_step_equals_the_unsharded_run_and_executes_the_planned_collectives(args, planned):
    r = run(*args, "--json", "--dtype", "float64", "--train")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["equal"] and rep["max_abs_err"] < 1e-8 and rep["grads_max_abs_err"] < 1e-8
    assert rep["tensors_compared"] > 10
    assert rep["collectives"] == rep["planned_collectives"]
    # every planned kind runs as its own torch.distributed primitive
    calls = {k.removeprefix("backward_"): 0 for k in rep["collectives"]}
    for k, n in rep["collectives"].items():
        calls[k.removeprefix("backward_")] += n
    assert rep["torch_calls"] == calls
    if planned is not None:
        assert rep["planned_collectives"] == planned


def test_an_eight_rank_job():
    r = run("--mesh", "dp=2,tp=4", "--style", "megatron", "--layers", "2", "--json", "--dtype", "float64")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["ranks"] == 8 and rep["equal"] and rep["max_abs_err"] < 1e-8
    assert rep["collectives"] == rep["planned_collectives"] == {"all_reduce": 4}


def test_forward_run_in_float32():
    r = run("--mesh", "dp=2,tp=2", "--style", "megatron", "--layers", "1", "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["equal"] and rep["grads_max_abs_err"] is None
    assert rep["collectives"] == rep["planned_collectives"] == {"all_reduce": 2}


def test_stream_choices_run_chunk_by_chunk_and_equal_the_unsharded_run():
    # at 1 TFLOP/s the Megatron-SP gathers and reduce-scatters are worth streaming at these sizes;
    # trained: the backward follows each chunk (a chunk's gradient sum, a chunk's reduce-scatter adjoint)
    args = ("--model", "llama", "--layers", "1", "--size", "dim=128,seq=512,batch=1,heads=4,ffn=256", "--mesh",
            "tp=2", "--style", "megatron-sp", "--flop-rate", "1e12", "--dtype", "float64", "--train", "--json")
    r = run(*args)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["equal"] and rep["max_rel_err"] < 1e-12 and rep["grads_max_rel_err"] < 1e-12
    assert rep["streams"] and rep["streams_whole"] is None
    chunks = sum(st["chunks"] for st in rep["streams"])
    assert rep["collectives"] == rep["planned_collectives"]  # k per streamed move, forward and backward
    assert rep["collectives"]["backward_all_reduce"] >= sum(st["chunks"] for st in rep["streams"]
                                                            if st["side"] == "before")
    assert sum(rep["collectives"].values()) >= chunks > len(rep["streams"])
    whole = json.loads(run(*args, "--no-streams").stdout)  # the same plan with whole moves
    assert whole["equal"] and not whole["streams"] and whole["streams_whole"] == "--no-streams"
    assert sum(whole["collectives"].values()) < sum(rep["collectives"].values())


def test_ring_streams_run_step_by_step_and_train_equal_to_the_unsharded_run():
    """``--ring``: each Megatron-SP gather runs as a ring (rank r computes its own shard, then
    k - 1 sends to the next rank), and training through it sums each shard's partial gradients at
    its owner (the ring's reverse) instead of a sum per chunk: only the norm weights' gradients
    are all-reduced there."""
    r = run("--model", "llama", "--layers", "1", "--size", "dim=128,seq=512,batch=2,heads=4,ffn=256", "--mesh",
            "tp=4", "--style", "megatron-sp", "--flop-rate", "1e12", "--dtype", "float64", "--train", "--json",
            "--ring")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["equal"] and rep["max_rel_err"] < 1e-12 and rep["grads_max_rel_err"] < 1e-12
    rings = [st for st in rep["streams"] if st["side"] == "before"]
    assert len(rings) == 2 and all(st["chunks"] == 4 for st in rings)
    assert rep["collectives"] == rep["planned_collectives"]
    assert rep["collectives"]["permute"] == sum(st["chunks"] - 1 for st in rings) and "all_gather" not in \
        rep["collectives"]
    # each step is one all_to_all_single at the dispatcher, forward and (for a tensor with a gradient) backward
    assert rep["torch_calls"]["all_to_all"] == rep["collectives"]["permute"] + rep["collectives"]["backward_all_to_all"]


def test_a_dead_rank_stops_the_job_with_one_line_naming_it():
    r = run("--mesh", "tp=2", "--style", "megatron", "--layers", "1", "--timeout", "5",
            env={**ENV, "SHARDLAYOUT_FAIL_RANK": "1"})
    assert r.returncode == 1
    assert "rank 1 exited with code 1; every other rank was stopped" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_input_is_refused_before_any_rank_starts():
    r = run("--mesh", "tp=2", "--nproc", "3")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "one rank per device" in r.stderr


def test_grad_tensors_follow_parameters_to_outputs_through_differentiable_ops():
    from shardlayout.program import ProgramBuilder
    from shardlayout.run.backward import grad_tensors

    b = ProgramBuilder()
    x, w = b.input("x", (4, 8)), b.param("w", (8, 6))
    y = b.op("mm", [x, w], name="y")
    mask = b.op("gt", [y, 0.0], name="mask")  # boolean: no gradient flows through it
    dead = b.op("relu", [y], name="dead")  # depends on w but no output needs it
    b.output(b.op("mul", [y, mask], name="z"))
    assert grad_tensors(b.build()) == {"w", "y", "z"}
    assert dead not in grad_tensors(b.build())
