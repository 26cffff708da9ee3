"""torchtitan 0.3's own model classes (``examples/titan_llama3.py``: its registry's debug Llama3 and
Qwen3-MoE; ``examples/titan_models.py``: every language-model family's debug flavor, and torchtitan's
own TP plan read off its sharding configs; maskless SDPA as AutoParallel runs them), exported and
planned as a user plans them:
Megatron's collective counts, every layer weight cut on tp in Megatron's dim, experts kept on ``ep``
with tokens moved by all_to_all, torchtitan's own TP plan translated to ``--tp-plan``; each plan
verified (index-level proof for every rank, numeric runs against the unsharded model).

torchtitan is a test extra (``make test`` installs it with ``--no-deps``, and triton, which it imports).
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

from shardlayout import Mesh  # noqa: E402
from shardlayout.plan import plan  # noqa: E402
from shardlayout.program.models import style_pins  # noqa: E402
from shardlayout.program.torch_import import from_torch  # noqa: E402
from shardlayout.program.tp_plan import apply_tp_plan, read_tp_plan  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LAYERS = 2


def _example():
    spec = importlib.util.spec_from_file_location("titan_llama3_for_tests", EXAMPLES / "titan_llama3.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def llama3():
    model, args = _example().debug(LAYERS)
    return from_torch(model, args)


def _kinds(p) -> Counter:
    return Counter(c.kind.value for c in p.collectives)


def _weights(p, layer: int) -> dict:
    pre = f"layers.{layer}."
    return {n[len(pre):]: p.shardings[n] for n in p.shardings if n.startswith(pre) and n.endswith(".weight")}


def _cut_on(s, dim: int, axis: str = "tp") -> bool:
    """Is dim ``dim`` of ``s`` (and no other dim) cut on ``axis``?"""
    return [d for d in range(s.ndim) if s.dims[d] and any(f.axis == axis for f in s.dims[d])] == [dim]


@pytest.mark.parametrize("mesh, style, want", [
    ("tp=2", "megatron", {"all_reduce": 2 * LAYERS}),
    ("dp=2,tp=2", "megatron", {"all_reduce": 2 * LAYERS}),
    ("dp=2,tp=2", "megatron-sp", {"all_gather": 2 * LAYERS, "reduce_scatter": 2 * LAYERS}),
])
def test_llama3_plans_megatrons_collectives_with_each_weight_in_its_dim(llama3, mesh, style, want):
    """Column weights (the fused ``wqkv``, ``w1``, ``w3``: torch's (out, in)) cut on their rows,
    row weights (``wo``, ``w2``) on their columns, in every layer; 2 all_reduces per layer under
    Megatron, 2 all_gathers + 2 reduce_scatters under Megatron-SP; verified."""
    m = Mesh.parse(mesh)
    p = plan(llama3, m, style_pins(llama3, m, style))
    assert _kinds(p) == want
    for layer in range(LAYERS):
        w = _weights(p, layer)
        for name in ("attention.qkv_linear.wqkv.weight", "feed_forward.w1.weight", "feed_forward.w3.weight"):
            assert _cut_on(w[name], 0), (layer, name, w[name])
        for name in ("attention.wo.weight", "feed_forward.w2.weight"):
            assert _cut_on(w[name], 1), (layer, name, w[name])
    v = p.verify()
    assert v.ok, v.first_mismatch


def test_llama3_with_torchtitans_own_tp_plan_adds_one_collective_each_for_embedding_and_head(llama3):
    """torchtitan's TP plan for Llama3 (``examples/titan_llama3_tp.json``: rowwise embedding,
    sequence-parallel norms, colwise head) gives Megatron-SP's 2 + 2 per layer plus one all_gather
    and one reduce_scatter for the embedding and the head."""
    m = Mesh.parse("dp=2,tp=2")
    p = plan(llama3, m, apply_tp_plan(llama3, m, read_tp_plan(str(EXAMPLES / "titan_llama3_tp.json"))).pins)
    assert _kinds(p) == {"all_gather": 2 * LAYERS + 1, "reduce_scatter": 2 * LAYERS + 1}
    assert p.verify().ok


def test_qwen3_moe_keeps_experts_on_ep_and_moves_tokens():
    """torchtitan's Qwen3-MoE (64 experts, top-8, grouped mm): under ``ep`` every expert weight stays
    cut on ``ep`` by experts, the only collectives are the tokens' all_to_alls (dispatch and combine),
    and the plan verifies (ragged pieces simulated with real routing)."""
    model, args = _example().qwen3_moe(1, seq=8, batch=2)
    prog = from_torch(model, args)
    m = Mesh.parse("ep=2")
    p = plan(prog, m, style_pins(prog, m, "ep"))
    experts = {n: s for n, s in p.shardings.items() if ".inner_experts.w" in n}
    assert len(experts) == 3 and all(_cut_on(s, 0, "ep") for s in experts.values()), experts
    assert _kinds(p) == {"all_to_all": 2}
    assert p.verify().ok


def _models():
    spec = importlib.util.spec_from_file_location("titan_models_for_tests", EXAMPLES / "titan_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def titan():
    return _models()


def _megatron_dims(p, model, titan) -> dict:
    """The layer weights not cut on tp in Megatron's dim (``megatron_cuts``): name -> sharding."""
    def dims(s):
        return tuple(d for d in range(s.ndim) if any(f.axis == "tp" for f in s.dims[d]))
    return {n: str(p.shardings[n]) for n, want in titan.megatron_cuts(model).items()
            if want is not None and n in p.shardings and dims(p.shardings[n]) != want}


def test_qwen3_tied_embedding_with_torchtitans_own_plan(titan):
    """Qwen3 ties its table: torch.export reads it by one name (``lm_head.weight``), so
    ``tok_embeddings`` holds only an unread parameter; its ``rowwise`` entry is the lookup run in
    the module (vocab-parallel, reduce-scattered where made), ``lm_head``'s ``colwise`` the same
    table's rows. 2 + 2 per layer, one more each for the lookup and the head; verified."""
    plan_json = titan.tp_plan("qwen3")
    assert plan_json["tok_embeddings"] == "rowwise" and plan_json["lm_head"] == "colwise"
    model, args = titan.qwen3(1, seq=8)
    prog = from_torch(model, args)
    m = Mesh.parse("dp=2,tp=2")
    p = plan(prog, m, apply_tp_plan(prog, m, plan_json).pins)
    assert _kinds(p) == {"all_gather": 3, "reduce_scatter": 3}
    assert _cut_on(p.shardings["lm_head.weight"], 0) and not _megatron_dims(p, model, titan)
    assert p.verify().ok


@pytest.fixture(scope="module")
def qwen3_moe(titan):
    model, args = titan.qwen3_moe(1, seq=8)
    return model, from_torch(model, args)


def test_moe_under_megatron_sp_gathers_the_tokens_once_for_router_and_experts(qwen3_moe, titan):
    """torchtitan's router reads ``x`` (batch, seq, dim), its experts ``x.view(-1, dim)``: the
    tokens are gathered once, at ``x``, not at the view (which would leave the router on sequence
    shards and gather its scores and choices too): one all_gather and one reduce_scatter per
    block, experts cut in their ffn dim; verified."""
    model, prog = qwen3_moe
    m = Mesh.parse("tp=2")
    p = plan(prog, m, style_pins(prog, m, "megatron-sp"))
    assert _kinds(p) == {"all_gather": 2, "reduce_scatter": 2}
    assert not _megatron_dims(p, model, titan)
    assert p.verify().ok


def test_moe_with_torchtitans_own_plan_gathers_at_the_moe_boundary(qwen3_moe, titan):
    """torchtitan's plan gives the experts as explicit shardings (``[8, tp*48, 256]``); the MoE's
    input is gathered once, as its ``sharding_config`` says, and its output reduce-scattered."""
    model, prog = qwen3_moe
    plan_json = titan.tp_plan("qwen3_moe")
    assert plan_json["layers.*.moe.routed_experts.inner_experts"]["w2_EDF"] == "[8, 256, tp*48]"
    m = Mesh.parse("dp=2,tp=2")
    p = plan(prog, m, apply_tp_plan(prog, m, plan_json).pins)
    assert _kinds(p) == {"all_gather": 3, "reduce_scatter": 3}
    assert not _megatron_dims(p, model, titan)
    assert p.verify().ok


@pytest.mark.parametrize("mesh, style, want", [("tp=2", "megatron", {"all_reduce": 2}),
                                               ("ep=2", "ep", {"all_to_all": 2})])
def test_gpt_oss_expert_biases_and_sinks(titan, mesh, style, want):
    """GPT-OSS (bfloat16, as torchtitan runs its experts): attention sinks, q|k|v and expert biases
    (each expert's row repeated over its rows by ``repeat_interleave`` of the routing's counts):
    Megatron's one all_reduce per block, every weight in Megatron's dim (the gate|up bias with its
    weight); under ep the experts and their biases on ep and only the tokens move; verified."""
    model, args = titan.gpt_oss(1)
    prog = from_torch(model, args)
    m = Mesh.parse(mesh)
    p = plan(prog, m, style_pins(prog, m, style))
    assert _kinds(p) == want
    inner = "layers.0.moe.routed_experts.inner_experts."
    if style == "megatron":
        assert not _megatron_dims(p, model, titan)
        assert _cut_on(p.shardings[inner + "mlp1_bias_EG"], 1)
    else:
        assert all(_cut_on(p.shardings[inner + n], 0, "ep") for n in ("mlp1_weight_EGD", "mlp1_bias_EG",
                                                                     "mlp2_weight_EDF", "mlp2_bias_ED"))
    assert p.verify().ok


def test_deepseek_v3_latent_attention_dense_then_moe_layer(titan):
    """DeepSeek-V3's debug flavor, 2 layers (dense, then MoE with shared experts), multi-head latent
    attention: the down projection ``wkv_a`` kept whole, ``wq`` and ``wkv_b`` column, ``wo`` row;
    one all_reduce per block (the shared and routed experts' partial sums reduced together)."""
    model, args = titan.deepseek_v3(2, seq=8)
    prog = from_torch(model, args)
    m = Mesh.parse("tp=2")
    p = plan(prog, m, style_pins(prog, m, "megatron"))
    assert _kinds(p) == {"all_reduce": 4}
    assert not _megatron_dims(p, model, titan)
    assert not any(f.axis for fs in p.shardings["layers.1.attention.wkv_a.weight"].dims for f in fs)
    assert p.verify().ok


def test_torchtitans_plan_read_off_its_sharding_configs_is_the_hand_written_one(titan):
    """``tp_plan`` reads torchtitan's own sharding configs (what ``Module.parallelize`` applies): for
    Llama3 it is the plan written by hand from torchtitan's code (``examples/titan_llama3_tp.json``),
    and without sequence parallelism the norms drop out."""
    import json

    assert titan.tp_plan("llama3") == json.loads((EXAMPLES / "titan_llama3_tp.json").read_text())
    plain = titan.tp_plan("llama3", sequence_parallel=False)
    assert not [k for k, v in plain.items() if v == "sequence_parallel"] and plain["layers.*.attention.wo"] == "rowwise"
