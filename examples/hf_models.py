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


def qwen3_moe():
    """Qwen3-MoE: 4 experts, top-2, every layer sparse."""
    return _build(hf.Qwen3MoeConfig, hf.Qwen3MoeForCausalLM, num_key_value_heads=2, head_dim=HIDDEN // HEADS,
                  num_experts=4, num_experts_per_tok=2, moe_intermediate_size=FFN, decoder_sparse_step=1,
                  mlp_only_layers=[])
make = llama
