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


def _cut_as_megatron(model, p) -> int:
    """Assert every layer weight Megatron places is cut on tp in Megatron's dim
    (``examples/hf_models.py:megatron_cuts``: column out features, row in features, grouped experts
    their ffn dim, kv heads fewer than the ranks whole); how many were checked."""
    checked = 0
    for name, dims in _examples().megatron_cuts(model, tp=2).items():
        if dims is not None and name in p.shardings:
            assert tuple(_cut_dim(p.shardings[name])) == dims, (name, str(p.shardings[name]))
            checked += 1
    return checked


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
    assert _cut_as_megatron(model, p) >= 8
    assert p.verify().ok


@pytest.mark.parametrize("name,per_layer", [("gptj", 1), ("apertus", 2), ("gpt_oss", 2)])
def test_more_classes_plan_megatrons_counts(name, per_layer):
    """Classes whose ops once had no rule: GPT-J (``repeat``; one all-reduce per layer: attention and
    MLP read the same input), Apertus (``log1p``/``expm1``), GPT-OSS (``max`` over a dim, gate|up split
    by interleaving: both halves stay on tp). Column weights on tp in their out dim, row in their in
    dim, grouped experts cut in their ffn dim; verified."""
    model, prog = program(name)
    p = plan(prog, TP2, style_pins(prog, TP2, "megatron"))
    assert p.counts() == {("all_reduce", ("tp",)): 2 * per_layer}
    assert _cut_as_megatron(model, p) >= 8
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


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe", "phimoe"])
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


def test_phimoe_sparsemixer_routing_costs_nothing_on_dp_and_two_all_to_alls_under_ep():
    """PhiMoE's router (a "sparsemixer": two masked arg-maxes concatenated, no ``topk``) chooses the
    experts the grouped-mm routing sorts by: read as route / einsum / unroute, megatron on dp=2,tp=2
    is one all-reduce per block and nothing on dp (the sort and the indexing once gathered the
    tokens: 6 all_gathers on dp), and ep moves each layer's rows there and back, the experts kept."""
    model, prog = program("phimoe")
    names = {op.target for op in prog.ops}
    assert {"route", "unroute"} <= names and not {"aten._grouped_mm.default", "aten.sort.default"} & names
    p = plan(prog, DPTP, style_pins(prog, DPTP, "megatron"))
    assert p.counts() == {("all_reduce", ("tp",)): 4}
    assert _cut_as_megatron(model, p) >= 8
    assert p.verify().ok
    ep = plan(prog, Mesh.parse("ep=2"), style="ep")
    assert ep.counts() == {("all_to_all", ("ep",)): 4}
    assert str(ep.shardings["model.layers.0.mlp.experts.gate_up_proj"]) == "[ep*2, 128, 32]"
    assert ep.verify().ok


def test_gpt_oss_biased_experts_are_routed_and_keep_megatrons_counts():
    """GPT-OSS's experts add a per-expert bias to their rows (``bias[sorted expert ids]``, read as the
    bias broadcast over each expert's rows): the routing is still route / einsum / unroute, the
    gate|up bias is cut with its weight, the down bias added once. Megatron on dp=2,tp=2 is one
    all-reduce per block and megatron-sp one gather and one reduce-scatter; under ep the experts and
    their biases stay on ep and only rows move: the dispatch and combine of every layer. The rows
    go back after their expert's down bias and before the routing weights scale them, so the
    weights never move (scaled on the experts' side, they cost an all_to_all a layer more)."""
    _, prog = program("gpt_oss")
    assert {"route", "unroute"} <= {op.target for op in prog.ops}
    p = plan(prog, DPTP, style_pins(prog, DPTP, "megatron"))
    assert p.counts() == {("all_reduce", ("tp",)): 4}
    pre = "model.layers.0.mlp.experts."
    assert str(p.shardings[pre + "gate_up_proj_bias"]) == "[4, tp*64]"
    assert str(p.shardings[pre + "down_proj_bias"]) == "[4, 32]"
    assert p.verify().ok
    sp = plan(prog, TP2, style_pins(prog, TP2, "megatron-sp"))
    assert sp.counts() == {("all_gather", ("tp",)): 4, ("reduce_scatter", ("tp",)): 4}
    ep = plan(prog, Mesh.parse("ep=2"), style="ep")
    assert ep.counts() == {("all_to_all", ("ep",)): 4}  # the rows out and back; the routing weights stay home
    rows = 16 * 2 * 32 * 4 // 2  # 16 tokens x top-2 rows of dim 32, float32, one device's share
    assert [c.bytes for c in ep.collectives] == [rows] * 4
    assert str(ep.shardings[pre + "down_proj_bias"]) == "[ep*2, 32]"
    assert ep.verify().ok


def test_megatron_sp_gathers_the_routed_tokens_once_per_moe_layer():
    """Under megatron-sp the tokens the router and the experts read are gathered once (not the
    router's outputs one by one): one all_gather before and one reduce_scatter after each block."""
    _, prog = program("qwen3_moe")
    p = plan(prog, TP2, style_pins(prog, TP2, "megatron-sp"))
    assert p.counts() == {("all_gather", ("tp",)): 4, ("reduce_scatter", ("tp",)): 4}
    assert p.verify().ok



def _tp(p, name) -> list:
    return _cut_dim(p.shardings[name])


@pytest.mark.parametrize("name, qkv", [("phi3_gqa", "self_attn.qkv_proj"), ("gpt_bigcode", "attn.c_attn")])
def test_megatron_keeps_a_fused_qkv_of_unequal_parts_whole(name, qkv):
    """q|k|v fused with fewer kv heads than q heads (Phi-3's GQA ``qkv_proj``, GPTBigCode's
    multi-query ``c_attn``): no layout gives each rank its q heads and their kv heads in one cut of
    the fused dim, so the weight stays whole (q, k, v sliced locally into each rank's heads), the
    output projection row-parallel, and nothing but Megatron's two all_reduces a layer moves
    (a contiguous cut cost an all_gather a layer)."""
    from shardlayout.program.blocks import find_blocks

    model, prog = program(name)
    attn = find_blocks(prog).of_kind("attention")[0]
    assert attn.first[0].pieces in ((32, 16, 16), (32, 8, 8), (32, 16))
    p = plan(prog, TP2, style="megatron")
    tied = int(bool(model.config.tie_word_embeddings))  # GPTBigCode's tied table: a vocab-parallel lookup
    assert p.counts() == {("all_reduce", ("tp",)): 4 + tied}
    for layer in (0, 1):
        pre = f"{'model.layers' if name == 'phi3_gqa' else 'transformer.h'}.{layer}."
        out = pre + ("self_attn.o_proj.weight" if name == "phi3_gqa" else "attn.c_proj.weight")
        assert _tp(p, pre + qkv + ".weight") == [] and _tp(p, out) == [_megatron_dims(model, out)[1]]
    assert p.verify().ok


def test_megatron_cuts_q_and_k_through_a_norm_of_each_head():
    """Phi's ``qk_layernorm`` (a LayerNorm over each head's features, ``native_layer_norm`` of
    [b, heads, s, hd]) is local to a head: q, k and v are column-parallel, the dense output
    row-parallel, and the parallel residual sums attention and MLP under one all_reduce a layer."""
    _, prog = program("phi")
    p = plan(prog, TP2, style_pins(prog, TP2, "megatron"))
    assert p.counts() == {("all_reduce", ("tp",)): 2}
    for leaf in ("q_proj", "k_proj", "v_proj"):
        assert _tp(p, f"model.layers.1.self_attn.{leaf}.weight") == [0]
        assert str(p.shardings[f"model.layers.1.self_attn.{leaf}.bias"]) == "[tp*16]"
    assert _tp(p, "model.layers.1.self_attn.dense.weight") == [1]
    assert p.verify().ok


def test_megatron_cuts_q_and_k_through_a_norm_of_all_heads():
    """OLMo-2 normalises all of q's features at once (RMSNorm of width heads * head_dim) before the
    split into heads: q and k stay column-parallel, their norm weights cut with them, and the norm's
    mean square — a partial sum over the cut features — is all-reduced where it is made: one
    all_reduce of a [batch, seq, 1] statistic per norm (64 bytes here, against 2 KiB for each
    block's), not a reduce_scatter and an all_gather (planned op by op, the cheaper move at the
    statistic) nor a gather of q (cheaper by one hop at tiny sizes only)."""
    _, prog = program("olmo2")
    p = plan(prog, TP2, style="megatron")
    pre = "model.layers.0.self_attn."
    assert str(p.shardings[pre + "q_proj.weight"]) == "[tp*16, 32]"
    assert str(p.shardings[pre + "k_proj.weight"]) == "[tp*8, 32]"
    assert str(p.shardings[pre + "q_norm.weight"]) == "[tp*16]" and str(p.shardings[pre + "k_norm.weight"]) == "[tp*8]"
    assert _tp(p, pre + "o_proj.weight") == [1]
    assert p.counts() == {("all_reduce", ("tp",)): 8}  # 2 layers: the blocks' 4 and the 4 norms' statistics
    small = sorted(c.tensor for c in p.collectives if c.bytes == 2 * 8 * 4)
    assert small == sorted(f"model.layers.{k}.self_attn.{qk}_norm.mean" for k in (0, 1) for qk in "qk")
    assert p.verify().ok
    sp = plan(prog, TP2, style="megatron-sp")
    assert sp.counts() == {("all_gather", ("tp",)): 4, ("reduce_scatter", ("tp",)): 4, ("all_reduce", ("tp",)): 4}
    assert sp.verify().ok


def test_megatron_cuts_the_heads_of_a_layer_norm_per_head():
    """StableLM's ``qk_layernorm`` runs a LayerNorm per head on each head split off q and k
    (``split(1)`` -> one norm per piece -> ``cat``); read at import as one LayerNorm over the head
    dim scaled by the heads' weights (``[heads, 1, head_dim]``), it is local to each head: q, k and v
    are column-parallel (each rank norms its own heads), o_proj row-parallel, Megatron's two
    all_reduces a layer; verified."""
    _, prog = program("stablelm_qk_layernorm")
    assert not any(op.target.endswith("split_with_sizes.default") for op in prog.ops)
    p = plan(prog, TP2, style="megatron")
    assert p.counts() == {("all_reduce", ("tp",)): 4}
    pre = "model.layers.1.self_attn."
    for leaf, cut in (("q_proj", "[tp*16, 32]"), ("k_proj", "[tp*8, 32]"), ("v_proj", "[tp*8, 32]")):
        assert str(p.shardings[pre + leaf + ".weight"]) == cut
    assert _tp(p, pre + "o_proj.weight") == [1]
    assert str(p.shardings[pre + "q_layernorm.cat"]) == "[2, tp*2, 8, 8]"  # each rank's 2 heads, normed
    assert p.verify().ok


def test_a_parallel_residual_added_residual_first_is_reduced_once_a_layer():
    """Cohere adds ``residual + attn + mlp``, i.e. ``(residual + attn) + mlp``: read at import as
    ``residual + (attn + mlp)`` (``program.parallel_residual``), the two branches' partial sums are
    reduced once a layer, as for GPT-J — 2 all_reduces for 2 layers and 1 for the tied lookup, not 5."""
    model, prog = program("cohere")
    p = plan(prog, TP2, style="megatron")
    assert p.counts() == {("all_reduce", ("tp",)): 3}
    assert _cut_as_megatron(model, p) >= 8
    assert p.verify().ok


def test_megatron_keeps_an_attention_whole_when_tp_does_not_divide_its_heads():
    """3 heads of 16 on tp=2: a cut of q or of the output projection's input would split a head, so
    the attention block stays whole on every rank (the MLP still Megatron: one all_reduce a layer)."""
    _, prog = program("llama_3_heads")
    p = plan(prog, TP2, style_pins(prog, TP2, "megatron"))
    assert p.counts() == {("all_reduce", ("tp",)): 2}
    for leaf in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert _tp(p, f"model.layers.0.self_attn.{leaf}.weight") == []
    assert _tp(p, "model.layers.0.mlp.down_proj.weight") == [1]


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


def test_falcon_multi_query_fused_qkv_is_kept_whole_not_gathered():
    """Falcon-7B's fused (q heads, k, v): no cut of the fused dim gives each rank whole q heads and the
    one k and v, so q|k|v is kept whole (pieces 4, 1, 1 heads: q by a slice, k and v by constant
    picks) and its output is not gathered; the dense and the MLP are Megatron, one all_reduce per
    layer (parallel attention) and one for the tied table's lookup."""
    _, prog = program("falcon_mq")
    p = plan(prog, TP2, style="megatron")
    assert p.counts() == {("all_reduce", ("tp",)): 3}
    for layer in (0, 1):
        pre = f"transformer.h.{layer}."
        assert _tp(p, pre + "self_attention.query_key_value.weight") == []
        assert str(p.shardings[pre + "self_attention.dense.weight"]) == "[32, tp*16]"
        assert str(p.shardings[pre + "mlp.dense_4h_to_h.weight"]) == "[32, tp*64]"
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


def test_the_full_simulation_draws_token_ids_the_table_can_look_up():
    """``verify(mode="full")`` simulates every rank from random inputs: token ids are drawn among the
    embedding's rows. Drawn as floats (truncated to ids, some negative) they read other rows of a
    vocab-parallel table (Gemma's tied one, 50 rows per rank) than of the whole one, and the full
    simulation refused a correct plan."""
    import numpy as np
    import torch
    import transformers as hf

    from shardlayout.execute.verify import full_input
    from shardlayout.program.torch_import import from_torch

    torch.manual_seed(0)
    cfg = hf.GemmaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=8, max_position_embeddings=64)
    prog = from_torch(hf.GemmaForCausalLM(cfg).eval(), (torch.zeros(2, 8, dtype=torch.long),))
    p = plan(prog, TP2, style="megatron")
    (lookup,) = [op for op in prog.ops if "embedding" in op.target]
    table, ids = lookup.inputs[:2]
    assert str(p.shardings[table]) == "[tp*50, 32]"
    drawn = full_input(prog, ids, np.random.default_rng(0))
    assert drawn.shape == (2, 8) and drawn.min() >= 0 and drawn.max() < 100 and len(np.unique(drawn)) > 4
    assert np.array_equal(drawn, np.round(drawn))
    assert p.verify(mode="full").ok


def test_bitnet_norms_before_the_row_linears_cost_one_statistic_all_reduce_each():
    """BitNet RMS-normalises the attention's output features before o_proj (``attn_sub_norm``) and the
    ffn features before down_proj (``ffn_sub_norm``): with those features cut on tp (the row Linears'
    input), each norm's mean square is a partial sum over the cut features, all-reduced where it is
    made — one [batch, seq, 1] statistic per norm (64 bytes here, against 2 KiB for each block's),
    as any tensor-parallel BitNet pays — and the norm weights are cut with the features. q/k/v,
    gate/up column-parallel, o/down row-parallel, Megatron's all_reduce after each block; verified,
    and the imported program run unsharded gives the module's own logits."""
    import torch

    from shardlayout.execute.verify import reference_run
    from shardlayout.run.torch_ops import torch_op

    model, prog = program("bitnet")
    p = plan(prog, TP2, style="megatron")
    assert p.counts() == {("all_reduce", ("tp",)): 8}  # 2 layers: the blocks' 4 and the 4 sub-norms' statistics
    assert _cut_as_megatron(model, p) == 14  # q, k, v, o, gate, up, down of both layers
    for k in (0, 1):
        pre = f"model.layers.{k}."
        assert str(p.shardings[pre + "self_attn.attn_sub_norm.weight"]) == "[tp*16]"
        assert str(p.shardings[pre + "mlp.ffn_sub_norm.weight"]) == "[tp*32]"
        assert str(p.shardings[pre + "self_attn.attn_sub_norm.pow"]) == "[2, 8, tp*16]"
    small = sorted(c.tensor for c in p.collectives if c.bytes == 2 * 8 * 4)
    assert small == sorted(f"model.layers.{k}.{m}_sub_norm.mean" for k in (0, 1) for m in ("self_attn.attn", "mlp.ffn"))
    assert p.verify().ok
    sp = plan(prog, TP2, style="megatron-sp")
    assert sp.counts() == {("all_gather", ("tp",)): 4, ("reduce_scatter", ("tp",)): 4, ("all_reduce", ("tp",)): 4}
    assert sp.verify().ok
    dptp = plan(prog, DPTP, style="megatron")
    assert dptp.counts() == {("all_reduce", ("tp",)): 8} and dptp.verify().ok
    values = {n: v.detach() for n, v in model.named_parameters()}
    values.update(dict(model.named_buffers()))
    (ids,) = _examples().bitnet()[1]
    values[prog.inputs("input")[0]] = ids
    got = reference_run(p, values, torch_op, torch)[prog.outputs[0]]
    with torch.no_grad():
        want = model(ids).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_bitnet_ternary_linears_are_linears_of_their_weights_and_their_statistics_all_reduced():
    """BitNet's ``AutoBitLinear`` (online, as quantization-aware training holds it) ternarises its
    weight in the forward — ``round(w * s).clamp(-1, 1) / s``, ``s = 1 / mean(|w|)`` over the whole
    weight — and quantizes its input per token (``127 / amax(|x|, -1)``). The weight's ops read the
    weight alone, so it is still the Linear of that parameter, cut where Megatron cuts it; each
    rank's mean of its slice is a partial sum: all-reduced, one 4-byte scalar per cut Linear (14 for
    2 layers), the exact global scale. The row Linears' input max over the cut features is a
    partial max, all-reduced (a [batch, seq, 1] statistic; ``max`` whose indices nobody reads is
    read as ``amax``), as are the sub-norms' mean squares: 4 + 4 + 4 + 14 all_reduces. The
    quantized input of q/k/v is one block input (the norm's output): one all_gather per block
    under megatron-sp. Verified, and the program run unsharded gives the module's own logits."""
    import torch
    import torch._dynamo

    from shardlayout.execute.verify import reference_run
    from shardlayout.program.blocks import find_blocks
    from shardlayout.run.torch_ops import torch_op

    model, prog = program("bitnet_ternary")
    attn = find_blocks(prog).of_kind("attention")
    assert [b.inputs for b in attn] == [(f"model.layers.{k}.input_layernorm.mul_1",) for k in (0, 1)]
    p = plan(prog, TP2, style="megatron")
    assert p.counts() == {("all_reduce", ("tp",)): 26}
    assert _cut_as_megatron(model, p) == 14
    leaves = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
              "mlp.up_proj", "mlp.down_proj")
    by_size = {}
    for c in p.collectives:
        by_size.setdefault(c.bytes, []).append(c.tensor)
    assert sorted(by_size[4]) == sorted(f"model.layers.{k}.{leaf}.mean" for k in (0, 1) for leaf in leaves)
    assert sorted(by_size[2 * 8 * 4]) == sorted(f"model.layers.{k}.{t}" for k in (0, 1) for t in (
        "self_attn.attn_sub_norm.mean", "mlp.ffn_sub_norm.mean", "self_attn.o_proj.max.0", "mlp.down_proj.max.0"))
    assert p.verify().ok
    sp = plan(prog, TP2, style="megatron-sp")
    assert sp.counts() == {("all_gather", ("tp",)): 4, ("reduce_scatter", ("tp",)): 4, ("all_reduce", ("tp",)): 22}
    assert sp.verify().ok
    values = {n: v.detach() for n, v in model.named_parameters()}
    values.update(dict(model.named_buffers()))
    (ids,) = _examples().bitnet_ternary()[1]
    values[prog.inputs("input")[0]] = ids
    got = reference_run(p, values, torch_op, torch)[prog.outputs[0]]
    with torch._dynamo.config.patch(disable=True), torch.no_grad():  # its quantizers are torch.compile'd
        want = model(ids).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_jetmoe_mixture_of_attention_and_experts_plan_every_style_and_equal_the_module():
    """JetMoE: the experts' two per-expert loops (gate|up, then down, over one ``expert_size.tolist()``)
    and the mixture of attention (each token's q and o projections run by its top-2 attention
    experts, the queries back one per (token, choice) and attended as 2 x 4 heads against the shared
    k|v) are read as routed rows. The imported program run unsharded equals the model's own logits,
    on the example ids and on others routed otherwise. Megatron finds an attention of expert q / o
    stacks and the shared kv_proj, and cuts them by heads (q and the k|v halves column, o row), the
    MoE experts in their ffn: one all_reduce per block and one for the tied table's lookup, on tp=2
    and dp=2,tp=2; megatron-sp a gather and a reduce-scatter each; ep keeps every expert stack on
    ep and moves rows only, out and back for the MoE and twice for the attention (each of exactly
    one device's rows). All verified."""
    import torch

    from shardlayout.execute.verify import reference_run
    from shardlayout.run.torch_ops import torch_op

    model, prog = program("jetmoe")
    from shardlayout.ops.result import canonical_op_name

    names = [canonical_op_name(op.target) for op in prog.ops]
    assert names.count("route") == 10 and names.count("unroute") == 6 and names.count("einsum") == 8
    assert not {"sort", "_local_scalar_dense", "index_put"} & set(names)  # no loop, sort nor scatter left
    assert names.count("split_with_sizes") == 4  # per layer: the experts' gate|up and the shared k|v
    inputs = {n: t.detach() for n, t in model.named_parameters(remove_duplicate=False)}
    inputs.update(model.named_buffers())
    flat = plan(prog, Mesh.parse("tp=1"))
    for ids in (_examples()._ids(), torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))):
        with torch.no_grad():
            want = model(ids).logits
            got = reference_run(flat, {**{n: inputs[n] for n in prog.inputs() if n != "input_ids"},
                                       "input_ids": ids}, torch_op, torch)[prog.outputs[0]]
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), float((got - want).abs().max())

    pre = "model.layers.0.self_attention."
    for mesh in (TP2, DPTP):
        p = plan(prog, mesh, style="megatron")
        assert p.counts() == {("all_reduce", ("tp",)): 5}
        assert str(p.shardings[pre + "experts.input_linear.weight"]) == "[4, tp*16, 32]"  # 2 of 4 heads a rank
        assert str(p.shardings[pre + "experts.output_linear.weight"]) == "[4, 32, tp*16]"
        assert str(p.shardings[pre + "kv_proj.weight"]) == "[2*tp*16, 32]"  # k and v, each by heads
        assert str(p.shardings["model.layers.0.mlp.input_linear.weight"]) == "[4, 2*tp*32, 32]"
        assert _cut_as_megatron(model, p) >= 8
        assert p.verify().ok
    sp = plan(prog, TP2, style="megatron-sp")
    assert sp.counts() == {("all_gather", ("tp",)): 5, ("reduce_scatter", ("tp",)): 5}
    assert sp.verify().ok
    ep = plan(prog, Mesh.parse("ep=2"), style="ep")
    rows = 16 * 2 * 32 * 4 // 2  # 16 tokens x top-2 rows of dim 32, float32, one device's share
    assert [c.bytes for c in ep.collectives] == [rows] * 12 and ep.counts() == {("all_to_all", ("ep",)): 12}
    assert all(str(ep.shardings[n]).startswith("[ep*2,") for n in prog.tensors
               if prog.tensors[n].kind == "param" and len(prog.tensors[n].shape) == 3)
    assert ep.verify().ok


def test_jetmoe_attention_is_kept_whole_when_tp_does_not_divide_one_experts_heads():
    """JetMoE's core attends top-2 x (kv heads) query heads, but each (token, choice) row holds one
    expert's projection of the kv heads only: with 2 kv heads on tp=4 a cut would split a head, so
    Megatron keeps the attention whole (its q / o stacks and kv_proj replicated, no all_reduce for
    it) and cuts only the MoE experts: one all_reduce per MoE block and one for the tied lookup."""
    import transformers as hf

    model, args = _examples()._build(hf.JetMoeConfig, hf.JetMoeForCausalLM, num_key_value_heads=2, kv_channels=16,
                                      num_local_experts=4, num_experts_per_tok=2)
    from shardlayout.program.torch_import import from_torch

    prog = from_torch(model, args)
    mesh = Mesh.parse("tp=4")
    p = plan(prog, mesh, style="megatron")
    assert p.counts() == {("all_reduce", ("tp",)): 3}
    pre = "model.layers.0.self_attention."
    for name in ("experts.input_linear.weight", "experts.output_linear.weight", "kv_proj.weight"):
        assert not _cut_dim(p.shardings[pre + name]), (name, str(p.shardings[pre + name]))
    assert str(p.shardings["model.layers.0.mlp.input_linear.weight"]) == "[4, 2*tp*16, 32]"
    cuts = _examples().megatron_cuts(model, tp=4)
    assert cuts[pre + "experts.input_linear.weight"] == () and cuts[pre + "kv_proj.weight"] == ()
    assert p.verify().ok


@pytest.mark.parametrize("name,kv", [("diffllama", "[2*tp*8, 32]"), ("diffllama_gqa", "[16, 32]")])
def test_megatron_cuts_differential_attention_by_head_pairs(name, kv):
    """DiffLlama pairs output head ``i`` with query heads ``i`` and ``i + H/2`` (two SDPA calls on one
    q and k over v's halves, kv heads ``j`` and ``j + kv/2``; the result chunked in two halves of
    heads, subtracted, normed per pair). Cut as ``[2*tp*8]`` each rank holds a run of each half —
    query heads {0, 2} on rank 0, {1, 3} on rank 1 — so its pairs are whole and the attention runs
    on local heads: q, k, v column-parallel (k and v whole with one kv head per half, fewer than the
    ranks), o_proj row-parallel, Megatron's one all_reduce (or reduce_scatter) per block; verified,
    and the imported program equals the module's own logits."""
    import numpy as np
    import torch

    from shardlayout.execute.verify import reference_run
    from shardlayout.run.torch_ops import torch_op

    model, prog = program(name)
    p = plan(prog, TP2, style="megatron")
    assert p.counts() == {("all_reduce", ("tp",)): 4}
    pre = "model.layers.1.self_attn."
    assert str(p.shardings[pre + "q_proj.weight"]) == "[2*tp*8, 32]"
    assert str(p.shardings[pre + "k_proj.weight"]) == str(p.shardings[pre + "v_proj.weight"]) == kv
    assert str(p.shardings[pre + "o_proj.weight"]) == "[32, tp*16]"
    assert _cut_as_megatron(model, p) >= 8
    (sdpa, *_) = [op for op in prog.ops if op.name.startswith(pre + "scaled_dot_product_attention")]
    q = p.shardings[sdpa.inputs[0]]  # [batch, heads, seq, head_dim]
    heads = np.broadcast_to(np.arange(4.0)[None, :, None, None], q.shape)
    assert [sorted(set(piece[0, :, 0, 0])) for piece in q.shard(heads).values()] == [[0, 2], [1, 3]]
    assert p.verify().ok
    sp = plan(prog, TP2, style="megatron-sp")
    assert sp.counts() == {("all_gather", ("tp",)): 4, ("reduce_scatter", ("tp",)): 4}
    assert _cut_as_megatron(model, sp) >= 8
    assert sp.verify().ok
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    inputs = {n: state[n].detach() for n in prog.inputs() if n in state}
    inputs["input_ids"] = _examples()._ids()
    with torch.no_grad():
        got = reference_run(p, inputs, torch_op, torch)[prog.outputs[0]]
        assert torch.allclose(got, model(inputs["input_ids"]).logits, atol=1e-6)


def test_megatron_keeps_a_differential_attention_whole_when_tp_splits_its_pairs():
    """4 query heads make 2 pairs: on tp=4 no cut gives each rank whole pairs, so the attention
    block stays whole (the MLP still Megatron)."""
    model, prog = program("diffllama")
    tp4 = Mesh.parse("tp=4")
    p = plan(prog, tp4, style="megatron")
    assert p.counts() == {("all_reduce", ("tp",)): 2}
    for leaf in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert _tp(p, f"model.layers.0.self_attn.{leaf}.weight") == []
    assert _examples().megatron_cuts(model, tp=4)["model.layers.0.self_attn.q_proj.weight"] == ()
    assert p.verify().ok
