"""torchtitan 0.3's language models at their debug flavors: ``--module examples/titan_models.py:qwen3``.

Each factory builds a family's registry flavor ``debugmodel`` (dim 256, vocab 2048) cut to
``layers`` layers, with the maskless ``ScaledDotProductAttention`` inner attention (torchtitan's
language models default to FlexAttention or varlen attention, whose masks torch.export cannot
take; AutoParallel runs them the same way), and returns ``(model, (token ids,))``. Needs
``torchtitan==0.3.0`` and triton, which it imports.

    llama3, llama3_gqa      Llama3 (q|k|v fused per kv group in ``wqkv``), 4 kv groups for gqa
    qwen3, qwen3_split_qkv  Qwen3 dense (q/k RMSNorm per head, tied embeddings), fused or separate q, k|v
    qwen3_moe               Qwen3-MoE (grouped mm), cut to 8 experts, top-2, 96 features each
    deepseek_v3, kimi_k2_7  multi-head latent attention, a dense first layer, then MoE with shared experts
    gpt_oss                 attention sinks and biases, MoE with biased experts (8, 96 features; bfloat16,
                            as torchtitan runs them)
    qwen3_5                 Gated DeltaNet layers (needs ``fla``, flash-linear-attention: triton kernels)
    muse_glimmer            gain-centred RMSNorms, sliding-window layers (windows of 128: causal at 16 tokens)

``tp_plan(factory)`` is torchtitan's own TP plan for a factory's model, read off torchtitan's code
path (each model's ``update_from_config`` sets every module config's ``sharding_config``, which
``Module.parallelize`` applies) and written in ``--tp-plan`` JSON; ``python
examples/titan_models.py`` writes them to ``examples/titan_tp/FACTORY.json``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import sys
from pathlib import Path

import torch

VOCAB = 2048  # every debug flavor's


def _maskless(cfg):
    """Every ``inner_attention`` of a config tree set to torchtitan's SDPA (causal, no masks)."""
    from torchtitan.models.common.attention import ScaledDotProductAttention

    if dataclasses.is_dataclass(cfg):
        for f in dataclasses.fields(cfg):
            v = getattr(cfg, f.name)
            if f.name == "inner_attention" and v is not None:
                setattr(cfg, f.name, ScaledDotProductAttention.Config())
            elif isinstance(v, list):
                for x in v:
                    _maskless(x)
            elif dataclasses.is_dataclass(v):
                _maskless(v)
    return cfg


def config(family: str, flavor: str = "debugmodel", layers: int = 2, **registry):
    """The model config of ``torchtitan.models.<family>``'s ``flavor``, cut to ``layers``, maskless."""
    cfg = importlib.import_module(f"torchtitan.models.{family}").model_registry(flavor, **registry).model
    cfg.layers = cfg.layers[:layers]
    if getattr(cfg, "mtp_layers", None):
        cfg.mtp_layers = []
    return _maskless(cfg)


def _built(cfg, seq: int, batch: int, dtype=None):
    torch.manual_seed(0)
    model = cfg.build()
    if hasattr(model, "init_states"):
        model.init_states()
    if dtype is not None:
        model = model.to(dtype)
    return model.eval(), (torch.arange(batch * seq).reshape(batch, seq) % VOCAB,)


CONFIGS = {}  # factory name -> its config builder (layers) -> config; tp_plan reads them


def _factory(name: str, family: str, flavor: str = "debugmodel", dtype=None, edit=None, **registry):
    def build_config(layers: int = 2):
        cfg = config(family, flavor, layers, **registry)
        return edit(cfg) if edit else cfg

    def make(layers: int = 2, seq: int = 16, batch: int = 2):
        return _built(build_config(layers), seq, batch, dtype)

    make.__name__ = make.__qualname__ = name
    make.__doc__ = f"torchtitan's {family} ``{flavor}`` cut to ``layers`` layers, maskless SDPA."
    CONFIGS[name] = build_config
    return make


def _gqa(cfg, kv_heads: int = 4):
    from torchtitan.models.llama3 import _build_llama3_layers

    cfg.layers = _build_llama3_layers(n_layers=len(cfg.layers), dim=256, n_heads=16, n_kv_heads=kv_heads,
                                      hidden_dim=768, rope=cfg.layers[0].attention.rope, attn_backend="flex")
    return _maskless(cfg)


def _small_moe(cfg, experts: int = 8, top_k: int = 2, hidden: int = 96):
    """Every MoE of a config tree cut to ``experts`` experts (its router's gate too), ``top_k``
    (when it chose more) and experts of ``hidden`` features: the debug flavors' 64 experts, top-8
    (Qwen3-MoE) or 2880 features (GPT-OSS) make a run take minutes, not seconds."""
    if dataclasses.is_dataclass(cfg):
        old = getattr(cfg, "num_experts", None)
        for f in dataclasses.fields(cfg):
            v = getattr(cfg, f.name)
            if f.name == "num_experts" and isinstance(v, int):
                setattr(cfg, f.name, experts)
            elif f.name == "top_k" and isinstance(v, int) and v > top_k:
                setattr(cfg, f.name, top_k)
            elif f.name == "hidden_dim" and hasattr(cfg, "num_experts"):
                setattr(cfg, f.name, hidden)
            elif f.name == "gate" and old is not None and getattr(v, "out_features", None) == old:
                v.out_features = experts
            elif isinstance(v, list):
                for x in v:
                    _small_moe(x, experts, top_k, hidden)
            elif dataclasses.is_dataclass(v):
                _small_moe(v, experts, top_k, hidden)
    return cfg


llama3 = _factory("llama3", "llama3")
llama3_gqa = _factory("llama3_gqa", "llama3", edit=_gqa)
qwen3 = _factory("qwen3", "qwen3")
qwen3_split_qkv = _factory("qwen3_split_qkv", "qwen3", "debugmodel_non_fused_qkv")
qwen3_moe = _factory("qwen3_moe", "qwen3", "debugmodel_moe", edit=_small_moe)
deepseek_v3 = _factory("deepseek_v3", "deepseek_v3")
kimi_k2_7 = _factory("kimi_k2_7", "kimi_k2_7")
gpt_oss = _factory("gpt_oss", "gpt_oss", dtype=torch.bfloat16, edit=_small_moe)
qwen3_5 = _factory("qwen3_5", "qwen3_5")
_muse_glimmer = _factory("muse_glimmer", "muse_glimmer")


def muse_glimmer(layers: int = 2, seq: int = 16, batch: int = 2):
    """torchtitan's muse_glimmer ``debugmodel`` cut to ``layers`` layers, maskless SDPA, under
    torchtitan's ``partial_dtensor`` SPMD backend: its forward asserts spmd types on the mesh axes
    under the default ``spmd_types`` backend, which needs a device mesh (one process has none)."""
    from torchtitan.distributed.utils import set_spmd_backend

    set_spmd_backend("partial_dtensor")
    return _muse_glimmer(layers, seq, batch)
FACTORIES = tuple(CONFIGS)


# --- torchtitan's own TP plan, read off its code path -------------------------------------------


def tp_plan(name: str, sequence_parallel: bool = True, tp: int = 2) -> dict:
    """torchtitan's TP plan for factory ``name`` in ``--tp-plan`` JSON: each model config's
    ``update_from_config`` (what torchtitan's trainer calls) fills every module's
    ``sharding_config``; a module whose ``weight`` is ``Shard(0)`` on tp is ``colwise`` (a Linear)
    or ``rowwise`` (an Embedding: vocab-parallel), ``Shard(1)`` ``rowwise``; a norm reading
    sequence shards ``sequence_parallel``; any other parameter sharded on tp (grouped experts,
    attention sinks) an explicit sharding like ``"[8, tp*96, 256]"``, which holds for ``tp`` ranks
    (the files in ``examples/titan_tp`` are for tp=2).
    ``tp_plan("llama3")["layers.*.attention.wo"] -> 'rowwise'``"""
    import spmd_types as spmd
    from torchtitan.distributed.parallel_dims import MeshAxisName

    cfg = CONFIGS[name](2)
    _set_sharding(cfg, sequence_parallel)
    with torch.device("meta"):
        model = cfg.build()
    TP = MeshAxisName.TP
    plan: dict = {}
    for path, module in model.named_modules():
        sc = getattr(module, "_sharding_config", None)
        if sc is None or not path:
            continue
        key = ".".join("*" if a.isdigit() else a for a in path.split("."))
        on_tp = {p: sc.state_shardings[p].per_axis_spmd_types().get(TP) for p in sc.state_shardings
                 if hasattr(module, p) and isinstance(getattr(module, p), torch.Tensor)}
        shard = {p: t.dim for p, t in on_tp.items() if isinstance(t, spmd.Shard)}
        weight = getattr(module, "weight", None)
        has_bias = getattr(module, "bias", None) is not None
        if "weight" in shard and isinstance(module, torch.nn.Embedding):
            value = "rowwise" if shard["weight"] == 0 else "colwise"
        elif isinstance(module, torch.nn.Linear) and shard.get("weight") == 0 and \
                (not has_bias or shard.get("bias") == 0):
            value = "colwise"
        elif isinstance(module, torch.nn.Linear) and shard.get("weight") == 1 and "bias" not in shard:
            value = "rowwise"
        elif shard:
            value = {p: _text(getattr(module, p).shape, d, tp) for p, d in shard.items()}
        elif weight is not None and weight.dim() == 1 and sc.in_src_shardings and \
                _sequence(sc.in_src_shardings.get("input")):
            value = "sequence_parallel"
        else:
            continue
        if plan.setdefault(key, value) != value:
            raise ValueError(f"{name}: torchtitan shards {path} unlike the other {key}: {value} vs {plan[key]}")
    return plan


def _set_sharding(cfg, sequence_parallel: bool) -> None:
    """What the model config's ``update_from_config`` does for a trainer's parallelism (tp > 1, no
    ep): its family's ``set_<family>_sharding_config(cfg, enable_sp=..., enable_ep=False)``.
    (``update_from_config`` itself imports torchtitan's trainer, which needs torchdata.)"""
    import inspect

    family = type(cfg).__module__.split(".")[2]
    sharding = importlib.import_module(f"torchtitan.models.{family}.sharding")
    setters = [f for n, f in vars(sharding).items() if n.startswith("set_") and n.endswith("_sharding_config")
               and inspect.isfunction(f) and f.__module__ == sharding.__name__ and "vision" not in n]
    if len(setters) != 1:
        raise ValueError(f"torchtitan.models.{family}.sharding: {len(setters)} sharding setters, want one")
    params = inspect.signature(setters[0]).parameters
    setters[0](cfg, **{k: v for k, v in (("enable_sp", sequence_parallel), ("enable_ep", False)) if k in params})


def _sequence(layout) -> bool:
    spec = getattr(layout, "partition_spec", None)
    return spec is not None and len(spec) > 1 and spec[1] is not None


def _text(shape, dim: int, tp: int) -> str:
    """A sharding's text with dim ``dim`` cut on ``tp`` ranks: ``_text((8, 96), 1, 2) -> "[8, tp*48]"``."""
    return "[" + ", ".join(f"tp*{n // tp}" if d == dim else str(n) for d, n in enumerate(shape)) + "]"


# --- where Megatron cuts each layer weight ------------------------------------------------------

COLUMN = ("wq", "wk", "wv", "wkv", "wqkv", "wq_b", "wkv_b", "w1", "w3")
"""torchtitan's leaf names of the Linears Megatron cuts column-parallel (their out features)."""
ROW = ("wo", "w2")
"""... and row-parallel (their in features)."""
LOW_RANK = ("wq_a", "wkv_a")
"""Multi-head latent attention's down projections: Megatron keeps them whole (duplicated)."""


def megatron_cuts(model, tp: int = 2) -> dict:
    """Where Megatron cuts each layer weight of a torchtitan model on ``tp``: name -> the weight dims
    cut, ``()`` kept whole (MLA's down projections; q|k|v fused per kv group when ``tp`` does not
    divide the groups), None for one it does not place (norms, routers, biases, sinks). Grouped
    experts ``(experts, a, b)`` are cut in their ffn dim (``F`` or ``G`` of the dims torchtitan
    names, ``w1_EFD``; else the one that is not the model dim).
    ``megatron_cuts(llama3()[0])["layers.0.feed_forward.w2.weight"] -> (1,)``"""
    dim = next(m.embedding_dim for m in model.modules() if isinstance(m, torch.nn.Embedding))
    out = {}
    for name, p in model.named_parameters():
        if not name.startswith("layers."):
            continue
        leaf = name.split(".")[-2]
        if p.dim() == 3:  # torchtitan names its dims: w1_EFD, mlp2_weight_EDF (F, or G = 2F, the ffn features)
            dims = re.search(r"_([A-Z]{3})$", name)
            out[name] = tuple(d for d in (1, 2) if (dims.group(1)[d] in "FG" if dims else p.shape[d] != dim))
        elif p.dim() != 2 or not name.endswith(".weight") or ".moe.router" in name:
            out[name] = None
        elif leaf in LOW_RANK:
            out[name] = ()
        elif leaf in COLUMN:
            attention = model.get_submodule(name.rsplit(".", 3)[0]) if leaf == "wqkv" else None
            groups = getattr(attention, "n_kv_heads", None) or getattr(attention, "n_heads", tp)
            out[name] = () if leaf == "wqkv" and groups % tp else (0,)
        else:
            out[name] = (1,) if leaf in ROW else None
    return out


def main(argv=None) -> int:
    """Write ``examples/titan_tp/FACTORY.json``: torchtitan's TP plan (sequence parallel) of each
    factory whose model builds."""
    out = Path(__file__).resolve().parent / "titan_tp"
    out.mkdir(exist_ok=True)
    for name in argv or FACTORIES:
        try:
            plan = tp_plan(name)
        except ImportError as e:
            print(f"{name}: skipped ({e})", file=sys.stderr)
            continue
        (out / f"{name}.json").write_text(json.dumps(plan, indent=2) + "\n")
        print(f"{name}: {len(plan)} entries", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
