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


def test_qwen2_tied_with_biases_trains_with_adamw_on_dp_and_tp(tmp_path, run_json):
    # the tied embedding on dp: the head reads it with a complete gradient, the embedding with a
    # partial one (summed once, not twice); the k biases' gradients are float32 noise, which the
    # parameter check must skip rather than call a difference
    import transformers

    transformers.Qwen2Config(vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                             num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=True,
                             max_position_embeddings=64).save_pretrained(tmp_path)
    rep = run_json("--hf", str(tmp_path), "--size", "batch=2,seq=12", "--mesh", "dp=2,tp=2", "--style", "megatron",
                   "--steps", "2")
    assert rep["equal"] and rep["max_loss_rel_err"] <= 1e-5 and rep["max_param_rel_err"] <= 1e-5
    assert rep["collectives"] == rep["planned_collectives"]
    assert rep["param_elements_skipped"] < 2_000  # a few hundred of ~40k parameter elements here


def test_hf_qwen3_moe_trains_expert_parallel_as_the_unsharded_model():
    """transformers' Qwen3-MoE under --style ep: its routing read as route / einsum / unroute, the
    tokens sent to their experts' rank and back (all_to_all with the routing's split sizes), 2 AdamW
    steps equal to the unsharded model; no float64 run of it exists on CPU (torch's grouped mm has no
    float64 kernel), which the report says."""
    r = shardlayout("run", "--module", EXAMPLE + ":qwen3_moe", "--mesh", "ep=2", "--style", "ep", "--steps", "2",
                    "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert rep["equal"] and rep["max_param_rel_err"] <= 1e-5
    assert rep["collectives"]["forward"] == {"all_to_all": 4}
    assert rep["collectives"] == rep["planned_collectives"]
    assert "Double" in rep["float64_reference_missing"]


def test_gpt_oss_biased_experts_train_tensor_parallel_as_the_unsharded_model(run_json):
    """GPT-OSS's experts (per-expert biases on routed rows, an interleaved gate|up) under megatron
    on tp=2: the routed rows reach the column-parallel experts through Megatron's "f" (the gradient
    summed over tp, on the rows' stored blocks), 2 SGD steps equal the unsharded model. (AdamW turns
    float32 rounding of near-zero expert gradients into lr-sized steps, and no float64 reference
    exists for grouped mm on CPU; SGD compares the gradients themselves.)"""
    rep = run_json("--module", EXAMPLE + ":gpt_oss", "--mesh", "tp=2", "--style", "megatron", "--steps", "2",
                   "--optimizer", "sgd")
    assert rep["equal"] and rep["max_loss_rel_err"] <= 1e-5 and rep["max_param_rel_err"] <= 1e-5
    assert rep["collectives"]["forward"] == {"all_reduce": 4}
    assert rep["collectives"] == rep["planned_collectives"]


def test_diffllama_trains_under_megatron_as_the_unsharded_model(run_json):
    """transformers' DiffLlama (differential attention: head ``i`` paired with ``i + H/2``) on 2 gloo
    ranks: q, k and v cut in each half of their heads (``[2*tp*8]``), so each rank computes its
    pairs locally; 2 AdamW steps equal the unsharded model, Megatron's 4 forward all_reduces."""
    rep = run_json("--module", EXAMPLE + ":diffllama", "--mesh", "tp=2", "--style", "megatron", "--steps", "2")
    assert rep["equal"] and rep["max_loss_rel_err"] <= 1e-5 and rep["max_param_rel_err"] <= 1e-5
    assert rep["collectives"]["forward"] == {"all_reduce": 4}
    assert rep["collectives"] == rep["planned_collectives"]
