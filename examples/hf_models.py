"""Tiny configs of Hugging Face transformers' own model classes, called as users call them:
``model(input_ids)`` (or ``model(input_ids, attention_mask)``). Each factory returns
``(module, example_args)`` for ``shardlayout plan --module examples/hf_models.py:llama``.

The classes are the library's (``pip install transformers``); only the sizes are small. Build one
at real size on the meta device the same way (``with torch.device("meta"): LlamaForCausalLM(cfg)``).
"""

from __future__ import annotations

import torch
import transformers as hf

VOCAB, HIDDEN, FFN, LAYERS, HEADS = 128, 32, 64, 2, 4
BATCH, SEQ = 2, 8


def _ids():
    return torch.arange(BATCH * SEQ).reshape(BATCH, SEQ) % VOCAB


def _build(config_class, model_class, **extra):
    torch.manual_seed(0)
    sizes = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                 num_attention_heads=HEADS, max_position_embeddings=64)
    return model_class(config_class(**{**sizes, **extra})).eval(), (_ids(),)


def llama():
    """Llama with grouped-query attention (2 kv heads for 4 query heads)."""
    return _build(hf.LlamaConfig, hf.LlamaForCausalLM, num_key_value_heads=2)


def llama_masked():
    """Llama called with a 2-D padding mask: ``model(input_ids, attention_mask)``."""
    model, (ids,) = llama()
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    return model, (ids, mask)


def mistral():
    return _build(hf.MistralConfig, hf.MistralForCausalLM, num_key_value_heads=2)


def qwen2():
    """Qwen2: biases on q, k and v."""
    return _build(hf.Qwen2Config, hf.Qwen2ForCausalLM, num_key_value_heads=2)


def phi3():
    """Phi-3: q|k|v fused in one ``qkv_proj``, gate|up in one ``gate_up_proj``."""
    return _build(hf.Phi3Config, hf.Phi3ForCausalLM, num_key_value_heads=HEADS, pad_token_id=0, bos_token_id=0,
                  eos_token_id=0)


def phi3_gqa():
    """Phi-3 with grouped-query attention: ``qkv_proj`` fuses q|k|v of unequal sizes (4 q heads, 2 kv)."""
    return _build(hf.Phi3Config, hf.Phi3ForCausalLM, num_key_value_heads=2, pad_token_id=0, bos_token_id=0,
                  eos_token_id=0)


def gpt_bigcode():
    """GPTBigCode (StarCoder) with multi-query attention: ``c_attn`` fuses q|k|v as 32|8|8."""
    torch.manual_seed(0)
    cfg = hf.GPTBigCodeConfig(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=64,
                              multi_query=True, bos_token_id=0, eos_token_id=0)
    return hf.GPTBigCodeForCausalLM(cfg).eval(), (_ids(),)


def phi():
    """Phi (Phi-2's class) with a LayerNorm on each head's q and k (``qk_layernorm``), a parallel
    residual and a partial rotary."""
    return _build(hf.PhiConfig, hf.PhiForCausalLM, qk_layernorm=True, partial_rotary_factor=0.5)


def olmo2():
    """OLMo-2: an RMSNorm over all of q's (and k's) features before they are split into heads."""
    return _build(hf.Olmo2Config, hf.Olmo2ForCausalLM, num_key_value_heads=2, pad_token_id=0, bos_token_id=0,
                  eos_token_id=0)


def stablelm_qk_layernorm():
    """StableLM with ``qk_layernorm``: a separate LayerNorm per head, run on each head split off q
    and k (``split(1)``), the normed heads joined by ``cat``."""
    return _build(hf.StableLmConfig, hf.StableLmForCausalLM, num_key_value_heads=2, qk_layernorm=True,
                  pad_token_id=0, bos_token_id=0, eos_token_id=0)


def cohere():
    """Cohere: attention and MLP on one normed input, added as ``residual + attn + mlp``, tied embeddings."""
    return _build(hf.CohereConfig, hf.CohereForCausalLM, num_key_value_heads=2, pad_token_id=0, bos_token_id=0,
                  eos_token_id=0)


def llama_3_heads():
    """Llama with 3 heads of 16: a tp=2 cut would split a head."""
    return _build(hf.LlamaConfig, hf.LlamaForCausalLM, hidden_size=48, intermediate_size=96, num_attention_heads=3,
                  num_key_value_heads=1)


def gemma():
    """Gemma: multi-query attention (one kv head), tied embeddings."""
    return _build(hf.GemmaConfig, hf.GemmaForCausalLM, num_key_value_heads=1, head_dim=HIDDEN // HEADS)


def gpt2():
    """GPT-2: Conv1D weights (in, out), q|k|v fused in ``c_attn``, tied embeddings."""
    torch.manual_seed(0)
    cfg = hf.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=64,
                        bos_token_id=0, eos_token_id=0)
    return hf.GPT2LMHeadModel(cfg).eval(), (_ids(),)


def mixtral():
    """Mixtral: a sparse MoE of 4 experts, top-2, experts as grouped weights."""
    return _build(hf.MixtralConfig, hf.MixtralForCausalLM, num_key_value_heads=2, num_local_experts=4,
                  num_experts_per_tok=2)


def phimoe():
    """PhiMoE: 4 experts, top-2 chosen by a "sparsemixer" router (two masked arg-maxes, the second
    with the first expert's score set to -inf, concatenated), experts as grouped weights."""
    return _build(hf.PhimoeConfig, hf.PhimoeForCausalLM, num_key_value_heads=2, num_local_experts=4,
                  num_experts_per_tok=2)


def qwen2_moe():
    """Qwen2-MoE: 4 routed experts, top-2, and a shared expert gated by ``sigmoid(x W)``, every layer sparse."""
    return _build(hf.Qwen2MoeConfig, hf.Qwen2MoeForCausalLM, num_key_value_heads=2, num_experts=4,
                  num_experts_per_tok=2, moe_intermediate_size=48, shared_expert_intermediate_size=FFN,
                  decoder_sparse_step=1, mlp_only_layers=[])


def falcon():
    """Falcon's new decoder architecture: q|k|v fused per kv group (2 groups), k and v picked out by
    a constant index, attention and MLP in parallel, tied embeddings."""
    torch.manual_seed(0)
    cfg = hf.FalconConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                          max_position_embeddings=64, new_decoder_architecture=True, num_kv_heads=2,
                          parallel_attn=True, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    return hf.FalconForCausalLM(cfg).eval(), (_ids(),)


def falcon_mq():
    """Falcon-7B's layout: multi-query attention with q|k|v fused as (q heads, k, v) and k, v picked
    out by a constant index, attention and MLP in parallel, tied embeddings."""
    torch.manual_seed(0)
    cfg = hf.FalconConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                          max_position_embeddings=64, new_decoder_architecture=False, multi_query=True,
                          parallel_attn=True, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    return hf.FalconForCausalLM(cfg).eval(), (_ids(),)


def gptj():
    """GPT-J: attention and MLP read the same input (parallel residual), rotary on the first 4 dims of
    each head as interleaved pairs (``repeat`` of the sin/cos tables)."""
    torch.manual_seed(0)
    cfg = hf.GPTJConfig(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, rotary_dim=4, n_positions=64,
                        bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return hf.GPTJForCausalLM(cfg).eval(), (_ids(),)


def apertus():
    """Apertus: the xIELU activation (``log1p``, ``expm1``) and q/k RMSNorm per head."""
    return _build(hf.ApertusConfig, hf.ApertusForCausalLM, num_key_value_heads=2, pad_token_id=0, bos_token_id=0,
                  eos_token_id=0)


def gpt_oss():
    """GPT-OSS: attention sinks, sliding and full layers, 4 experts top-2 whose fused gate|up is split
    by interleaving (``x[..., ::2]``, ``x[..., 1::2]``), a router of ``topk`` then ``max``."""
    return _build(hf.GptOssConfig, hf.GptOssForCausalLM, num_key_value_heads=2, head_dim=HIDDEN // HEADS,
                  num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                  layer_types=["sliding_attention", "full_attention"], pad_token_id=0, bos_token_id=0,
                  eos_token_id=0)


def qwen3():
    """Qwen3: RMSNorm on each head's q and k."""
    return _build(hf.Qwen3Config, hf.Qwen3ForCausalLM, num_key_value_heads=2, head_dim=HIDDEN // HEADS)


def jetmoe():
    """JetMoE: a mixture of attention (each token's query and output projections run by its top-2 of 4
    attention experts, k|v shared: the queries come back one per (token, choice) and are attended
    as 2 x 4 heads) and a mixture of experts whose per-expert loops split the rows by
    ``expert_size.tolist()``, the experts' gate|up and down in two loops over the same counts; tied
    embeddings."""
    return _build(hf.JetMoeConfig, hf.JetMoeForCausalLM, num_key_value_heads=4, kv_channels=HIDDEN // HEADS,
                  num_local_experts=4, num_experts_per_tok=2)


def diffllama():
    """DiffLlama: differential attention — two attention calls on one q and k over the two halves of
    v (kv heads ``j`` and ``j + kv/2``), the result's heads chunked in two and subtracted (head ``i``
    minus lambda times head ``i + H/2``), an RMSNorm of each head pair."""
    return _build(hf.DiffLlamaConfig, hf.DiffLlamaForCausalLM, num_key_value_heads=HEADS, head_dim=HIDDEN // HEADS)


def diffllama_gqa():
    """DiffLlama with 2 kv heads for 4 query heads: one kv head per half of v."""
    return _build(hf.DiffLlamaConfig, hf.DiffLlamaForCausalLM, num_key_value_heads=2, head_dim=HIDDEN // HEADS)


def qwen3_moe():
    """Qwen3-MoE: 4 experts, top-2, every layer sparse."""
    return _build(hf.Qwen3MoeConfig, hf.Qwen3MoeForCausalLM, num_key_value_heads=2, head_dim=HIDDEN // HEADS,
                  num_experts=4, num_experts_per_tok=2, moe_intermediate_size=FFN, decoder_sparse_step=1,
                  mlp_only_layers=[])


def bitnet():
    """BitNet: Llama's layer with an RMSNorm over the attention's output features before o_proj
    (``attn_sub_norm``) and over the ffn features before down_proj (``ffn_sub_norm``), ReLU² gate.
    Built from its config as ``--hf`` builds it, its Linears are ``nn.Linear`` (the ternary
    ``AutoBitLinear`` is swapped in by ``from_pretrained`` with a ``quantization_config`` only)."""
    return _build(hf.BitNetConfig, hf.BitNetForCausalLM, num_key_value_heads=2, pad_token_id=0, bos_token_id=0,
                  eos_token_id=0)


def bitnet_ternary():
    """BitNet with its Linears (lm_head aside) as transformers' ``AutoBitLinear`` in ``online`` mode,
    as a quantization-aware run holds them: each forward ternarises the weight (``round(w / m)``
    clamped to [-1, 1], times ``m``, ``m`` the mean of ``|w|`` over the whole weight) and quantizes
    the input per token to 8 bits (scaled by its absolute max over the features)."""
    from transformers.integrations.bitnet import replace_with_bitnet_linear
    from transformers.utils.quantization_config import BitNetQuantConfig

    model, args = bitnet()
    weights = model.state_dict()
    replace_with_bitnet_linear(model, modules_to_not_convert=["lm_head"], quantization_config=BitNetQuantConfig(
        linear_class="autobitlinear", quantization_mode="online"))
    model.load_state_dict(weights, assign=True)
    return model.eval(), args


make = llama


COLUMN = ("q_proj", "k_proj", "v_proj", "qkv_proj", "gate_proj", "up_proj", "gate_up_proj", "c_attn", "c_fc",
          "query_key_value", "dense_h_to_4h", "fc_in", "fc1", "Wqkv", "w1", "w3", "input_linear", "kv_proj")
"""Leaf names of the Linears Megatron cuts column-parallel (their out features), across the classes."""
ROW = ("o_proj", "down_proj", "c_proj", "dense", "dense_4h_to_h", "fc_out", "fc2", "out_proj", "w2", "output_linear")
"""Leaf names of the Linears Megatron cuts row-parallel (their in features)."""
KV = ("k_proj", "v_proj", "kv_proj")
FUSED_QKV = ("qkv_proj", "c_attn", "query_key_value", "Wqkv")


def megatron_cuts(model, tp: int = 2) -> dict:
    """Where Megatron cuts each layer weight (a parameter of the model's layer list) on ``tp``: its
    name -> the weight dims cut, ``()`` for a weight Megatron keeps whole — k/v of fewer kv heads
    than ``tp`` divides (MQA; Megatron-LM replicates them), a fused [q heads | k | v] of unequal
    pieces, an attention whose heads ``tp`` does not divide (differential attention: whose head
    pairs, ``head_runs``; k/v whose kv pairs ``j, j + kv/2``) — and
    None for one it does not place (norms, routers, biases). ``nn.Linear`` holds (out, in),
    GPT-2's Conv1D (in, out); grouped experts ``(experts, a, b)`` are cut in their ffn dim (the one
    that is not the hidden size; when both are, as in JetMoE's mixture of attention, whose q and o
    projections per expert are ``(experts, heads * head_dim, hidden)`` and ``(experts, hidden, heads *
    head_dim)`` with ``heads * head_dim == hidden``, a column stack its out features, dim 1, a row
    stack its in features, dim 2: stored ``(experts, out, in)`` as nn.Linear, so cut by heads; kept
    whole when ``tp`` does not divide the heads of one expert's rows).
    ``megatron_cuts(llama()[0])["model.layers.0.mlp.down_proj.weight"] -> (1,)``"""
    import re

    cfg = model.config
    hidden = cfg.hidden_size
    runs = head_runs(model)  # differential attention: Megatron keeps head pairs (i, i + H/2) on one rank
    heads = getattr(cfg, "num_attention_heads", None)
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    if hasattr(cfg, "multi_query") and not getattr(cfg, "new_decoder_architecture", False):
        kv = 1 if cfg.multi_query else heads  # GPTBigCode, Falcon-7B: a stale num_key_value_heads is not read
    out = {}
    for name, p in model.named_parameters():
        if not re.search(r"\.(layers|h|blocks)\.\d+\.", name):
            continue
        parts = name.split(".")
        leaf = parts[-2] if parts[-1] in ("weight", "bias") else parts[-1]
        attention = re.search(r"\.(self_)?(attn|attention)\.", name) is not None
        if p.dim() == 3:  # grouped experts (experts, a, b): the ffn dim
            dims = tuple(d for d in (1, 2) if p.shape[d] != hidden)
            if not dims and leaf in COLUMN + ROW:  # both the hidden size: (experts, out, in), by its role
                dims = (1,) if leaf in COLUMN else (2,)
            head_dim = getattr(cfg, "head_dim", None) or hidden // heads
            per_row = p.shape[1 if leaf in COLUMN else 2] // head_dim  # heads of one expert's q (or o) rows
            out[name] = () if attention and (heads % tp or per_row % tp) else dims
            continue
        if p.dim() != 2 or not name.endswith("weight") or leaf not in COLUMN + ROW:
            out[name] = None
            continue
        module = model.get_submodule(name.rsplit(".", 1)[0])
        col, row = (0, 1) if isinstance(module, torch.nn.Linear) else (1, 0)
        grouped = getattr(cfg, "new_decoder_architecture", False)  # Falcon's q|k|v fused per kv group: cut by groups
        if attention and heads % (tp * runs):  # a cut would split a head (or a pair): the attention block whole
            out[name] = ()
        elif leaf in KV and kv % (tp * runs) or leaf in FUSED_QKV and kv != heads and not grouped:
            out[name] = ()
        else:
            out[name] = (col,) if leaf in COLUMN else (row,)
    return out


def head_runs(model) -> int:
    """2 for differential attention (DiffLlama: its attention modules hold the lambdas
    ``lambda_q1`` ...), whose output head ``i`` is query head ``i`` minus lambda times query head
    ``i + H/2`` over kv heads ``j`` and ``j + kv/2``: a rank must hold both heads of its pairs, so
    Megatron cuts each half of the heads on tp (``2 * tp`` must divide the heads); else 1.
    ``head_runs(diffllama()[0]) -> 2``"""
    return 2 if any(n.endswith(".lambda_q1") for n, _ in model.named_parameters()) else 1
