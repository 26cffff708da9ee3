"""torchtitan 0.3's own model classes (``examples/titan_llama3.py``: its registry's debug Llama3 and
Qwen3-MoE, maskless SDPA as AutoParallel runs them), exported and planned as a user plans them:
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
