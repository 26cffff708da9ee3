"""Hugging Face transformers' own model classes (tiny configs, examples/hf_models.py), imported as
users call them — ``model(input_ids)``, the KV cache on by default — planned by every style and
checked: Megatron's collectives (one all-reduce per attention and per MLP block), every layer
weight cut on ``tp`` in Megatron's dim (or kept whole where the kv heads are fewer than the ranks),
the plan verified on every rank, and auto agreeing with the planner and no costlier than the
best style."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest

from shardlayout import Mesh
from shardlayout.plan import plan
from shardlayout.plan.auto import auto_plan
from shardlayout.plan.estimate import estimate
from shardlayout.program.styles import style_pins

pytest.importorskip("torch")
pytest.importorskip("transformers")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hf_models.py"
TP2, DPTP = Mesh.parse("tp=2"), Mesh.parse("dp=2,tp=2")
COLUMN = ("q_proj", "k_proj", "v_proj", "qkv_proj", "gate_proj", "up_proj", "gate_up_proj", "c_attn", "c_fc")
ROW = ("o_proj", "down_proj", "c_proj")


@functools.cache
def _examples():
    spec = importlib.util.spec_from_file_location("hf_models_example", EXAMPLES)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.cache
def program(name):
    from shardlayout.program.torch_import import from_torch

    model, args = getattr(_examples(), name)()
    return model, from_torch(model, args)


def _cut_dim(s) -> list:
    """The dims of a sharding bound to tp."""
    return [d for d, fs in enumerate(s.dims) if any(f.axis == "tp" for f in fs)]


def _megatron_dims(model, name: str):
    """Where Megatron cuts a layer weight: (column dim, row dim) of its module's weight layout —
    nn.Linear holds (out, in), GPT-2's Conv1D (in, out)."""
    import torch

    module = model.get_submodule(name.rsplit(".", 1)[0])
    return (0, 1) if isinstance(module, torch.nn.Linear) else (1, 0)


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gpt2", "llama_masked",
                                  "qwen3_moe"])
def test_megatron_cuts_every_layer_weight_and_verifies(name):
    model, prog = program(name)
    p = plan(prog, TP2, style="megatron")
    tied = model.config.tie_word_embeddings  # the shared table vocab-parallel: its lookup reduced once
    assert p.counts() == {("all_reduce", ("tp",)): 4 + tied}  # 2 layers: one after attention, one after the MLP
    if tied:  # export names the one table after the head; the lookup and the head read it cut on its rows
        vocab, dim = model.get_input_embeddings().weight.shape
        assert str(p.shardings["lm_head.weight"]) == f"[tp*{vocab // 2}, {dim}]"
        lookup = next(op.outputs[0] for op in prog.ops if op.inputs[:1] == ("lm_head.weight",))
        assert str(p.shardings[lookup]) == f"[2, 8, {dim}]"  # the lookup's partial sum reduced where it is made
    kv = model.config.num_key_value_heads if hasattr(model.config, "num_key_value_heads") else None
    checked = 0
    for t in prog.inputs("param"):
        leaf = t.split(".")[-2]
        if ".layers." not in t and ".h." not in t or not t.endswith("weight") or len(prog.tensors[t].shape) != 2:
            continue
        col, row = _megatron_dims(model, t)
        if leaf in ("k_proj", "v_proj") and kv is not None and kv % 2:
            assert _cut_dim(p.shardings[t]) == [], (t, str(p.shardings[t]))  # MQA: every rank holds the kv head
        elif leaf in COLUMN:
            assert _cut_dim(p.shardings[t]) == [col], (t, str(p.shardings[t]))
        elif leaf in ROW:
            assert _cut_dim(p.shardings[t]) == [row], (t, str(p.shardings[t]))
        else:
            continue
        checked += 1
    assert checked >= 8
    assert p.verify().ok


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_megatron_sp_and_auto_on_dp_tp(name):
    model, prog = program(name)
    sp = plan(prog, DPTP, style="megatron-sp")
    counts, tied = sp.counts(), model.config.tie_word_embeddings  # a tied table's lookup: reduce-scattered
    assert counts[("reduce_scatter", ("tp",))] == 4 + tied and counts[("all_gather", ("tp",))] in (3 + tied, 4 + tied)
    assert set(counts) == {("reduce_scatter", ("tp",)), ("all_gather", ("tp",))}
    assert sp.verify().ok
    a = auto_plan(prog, DPTP)  # raises ModelMismatch if the solver's model and plan() disagree
    assert a.estimate.seconds == a.predicted
    best = min(estimate(plan(prog, DPTP, style_pins(prog, DPTP, s))).seconds for s in ("dp", "megatron"))
    assert a.estimate.seconds <= best
    assert a.plan.verify().ok


def test_mixtral_experts_are_tensor_parallel_inside_each_expert():
    """Mixtral's experts run ``transformers::grouped_mm_fallback`` (float32), read as torch's grouped
    mm, and its routing as route / per-expert einsum / unroute; under megatron each expert's fused
    gate|up is column-parallel per part and its down row-parallel, the partial sums ride through the
    routing's combine to one all-reduce per layer."""
    _, prog = program("mixtral")
    targets = {op.target for op in prog.ops}
    assert {"route", "einsum", "unroute"} <= targets and not any("transformers" in t for t in targets)
    p = plan(prog, TP2, style_pins(prog, TP2, "megatron"))
    assert p.counts() == {("all_reduce", ("tp",)): 4}
    for layer in (0, 1):
        pre = f"model.layers.{layer}.mlp.experts."
        assert str(p.shardings[pre + "gate_up_proj"]) == "[4, 2*tp*32, 32]"  # (experts, gate|up, in)
        assert str(p.shardings[pre + "down_proj"]) == "[4, 32, tp*32]"  # (experts, out, in)
    assert p.verify().ok


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_hf_moe_under_ep_moves_tokens_not_experts(name):
    """transformers' grouped-mm path (sort the (token, choice) pairs by expert, index the tokens, count
    them with histc, run grouped mms, undo the sort with an inverse permutation and sum each token's
    k rows) is read as route / per-expert einsums / unroute: expert parallelism moves each layer's
    routed rows there and back (two all_to_alls of exactly the rows one device sends), the experts
    stay where ep put them, proven with real routing."""
    _, prog = program(name)
    names = {op.target for op in prog.ops}
    assert {"route", "unroute"} <= names and "aten._grouped_mm.default" not in names
    p = plan(prog, Mesh.parse("ep=2"), style="ep")
    ideal = 16 * 2 * 32 * 4 // 2  # 16 tokens x top-2 rows of dim 32, float32, one device's share
    assert p.counts() == {("all_to_all", ("ep",)): 4} and all(c.bytes == ideal for c in p.collectives)
    assert p.verify().ok


def test_megatron_sp_gathers_the_routed_tokens_once_per_moe_layer():
    """Under megatron-sp the tokens the router and the experts read are gathered once (not the
    router's outputs one by one): one all_gather before and one reduce_scatter after each block."""
    _, prog = program("qwen3_moe")
    p = plan(prog, TP2, style_pins(prog, TP2, "megatron-sp"))
    assert p.counts() == {("all_gather", ("tp",)): 4, ("reduce_scatter", ("tp",)): 4}
    assert p.verify().ok



def test_falcon_kv_picked_by_a_constant_index_is_attention_cut_by_kv_groups():
    """Falcon's new decoder architecture views its fused q|k|v as (kv groups, q heads + k + v,
    head_dim) and picks k and v with a constant index (``qkv[:, :, :, [-2]]``): a fixed pick, so
    the attention block is found, its q|k|v cut by whole kv groups, its dense row-parallel; attention
    and MLP in parallel share one all_reduce per layer, the tied table one more for its lookup."""
    _, prog = program("falcon")
    assert sum(op.target == "aten.index.Tensor" for op in prog.ops) >= 4
    p = plan(prog, TP2, style="megatron")
    assert p.counts() == {("all_reduce", ("tp",)): 3}
    for layer in (0, 1):
        pre = f"transformer.h.{layer}."
        assert str(p.shardings[pre + "self_attention.query_key_value.weight"]) == "[tp*32, 32]"  # 2 groups of 32
        assert str(p.shardings[pre + "self_attention.dense.weight"]) == "[32, tp*16]"
        assert str(p.shardings[pre + "mlp.dense_h_to_4h.weight"]) == "[tp*64, 32]"
    assert str(p.shardings["lm_head.weight"]) == "[tp*64, 32]"
    assert p.verify().ok


def test_qwen2_moe_shared_expert_and_routed_experts_are_reduced_once():
    """Qwen2-MoE adds ``sigmoid(x W) * shared_expert(x)`` to the routed experts' sum: the shared
    expert's partial output is gated (a replicated per-token scalar), added to the experts' partial
    output, and the MoE block reduced once at its residual add."""
    _, prog = program("qwen2_moe")
    p = plan(prog, TP2, style="megatron")
    assert p.counts() == {("all_reduce", ("tp",)): 4}
    for layer in (0, 1):
        pre = f"model.layers.{layer}.mlp."
        assert str(p.shardings[pre + "shared_expert.up_proj.weight"]) == "[tp*32, 32]"
        assert str(p.shardings[pre + "shared_expert.down_proj.weight"]) == "[32, tp*32]"
        assert str(p.shardings[pre + "experts.down_proj"]) == "[4, 32, tp*24]"
        assert str(p.shardings[pre + "add"]) == "[16, 32] +sum(tp)"  # shared + routed, still a partial sum
    assert p.verify().ok
