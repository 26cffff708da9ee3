"""torchtitan 0.3's own Llama3 and Qwen3-MoE classes, for ``shardlayout plan --module examples/titan_llama3.py:debug``.

torchtitan's language models default to FlexAttention, whose block masks torch.export cannot take
(``flex`` here shows the one-line refusal). AutoParallel runs them with the maskless
``ScaledDotProductAttention`` inner attention instead; every other factory does the same. Needs
``torchtitan==0.3.0`` (``pip install --no-deps torchtitan==0.3.0 spmd_types tyro``) and triton,
which torchtitan imports.

    debug(layers, seq, batch)     the debug flavor (dim 256, 16 heads), its 6 layers cut to ``layers``
    gqa(layers, kv_heads, ...)    the same with grouped-query attention (4 kv groups by default)
    flavor(name, seq, batch)      a registry flavor ("8B", "70B") built on the meta device
    flex(layers, ...)             the default FlexAttention model (refused in one line)
    qwen3_moe(layers, seq, batch) torchtitan's Qwen3-MoE debug flavor (64 experts, top-8), cut to ``layers``
"""

from __future__ import annotations

import dataclasses

import torch
from torchtitan.models import qwen3
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.llama3 import _build_llama3_layers, model_registry

VOCAB = 2048  # the debug flavor's


def _maskless(cfg):
    """Every ``inner_attention`` of a config tree set to torchtitan's SDPA (causal, no masks)."""
    if dataclasses.is_dataclass(cfg):
        for f in dataclasses.fields(cfg):
            v = getattr(cfg, f.name)
            if f.name == "inner_attention":
                setattr(cfg, f.name, ScaledDotProductAttention.Config())
            elif isinstance(v, list):
                for x in v:
                    _maskless(x)
            elif dataclasses.is_dataclass(v):
                _maskless(v)
    return cfg


def _built(cfg, seq: int, batch: int):
    torch.manual_seed(0)
    model = cfg.build()
    if hasattr(model, "init_states"):
        model.init_states()
    return model, (torch.arange(batch * seq).reshape(batch, seq) % VOCAB,)


def debug(layers: int = 2, seq: int = 16, batch: int = 2):
    cfg = model_registry("debugmodel").model
    cfg.layers = cfg.layers[:layers]
    return _built(_maskless(cfg), seq, batch)


def gqa(layers: int = 2, kv_heads: int = 4, seq: int = 16, batch: int = 2):
    cfg = model_registry("debugmodel").model
    cfg.layers = _build_llama3_layers(n_layers=layers, dim=256, n_heads=16, n_kv_heads=kv_heads, hidden_dim=768,
                                      rope=cfg.layers[0].attention.rope, attn_backend="flex")
    return _built(_maskless(cfg), seq, batch)


def flavor(name: str = "8B", seq: int = 2048, batch: int = 8):
    cfg = _maskless(model_registry(name).model)
    with torch.device("meta"):
        model = cfg.build()
    return model, (torch.zeros(batch, seq, dtype=torch.long),)


def flex(layers: int = 2, seq: int = 16, batch: int = 2):
    cfg = model_registry("debugmodel").model
    cfg.layers = cfg.layers[:layers]
    return _built(cfg, seq, batch)


def qwen3_moe(layers: int = 2, seq: int = 16, batch: int = 2):
    cfg = qwen3.model_registry("debugmodel_moe").model
    cfg.layers = cfg.layers[:layers]
    return _built(_maskless(cfg), seq, batch)
