"""Styles and TP plans on five model families written in plain torch (tests/program/zoo.py): the
expected collectives per layer, the expected weight shardings, verified by simulation; a model
with none of the blocks is refused, naming what was looked for and what the model has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardlayout import Mesh, Sharding, ShardingError, UnmatchedStyle
from shardlayout.cli import main
from shardlayout.plan import plan
from shardlayout.program.blocks import derived, find_blocks
from shardlayout.program.styles import apply_style, style_pins
from shardlayout.program.tp_plan import TpPlanError, apply_tp_plan, matches, modules

torch = pytest.importorskip("torch")

from .zoo import program  # noqa: E402

MESH = Mesh.parse("dp=2,tp=2")
L = 2  # layers of the layered families
ZOO = str(Path(__file__).with_name("zoo.py"))


def _plan(family, style, mesh=MESH):
    prog = program(family)
    p = plan(prog, mesh, style_pins(prog, mesh, style))
    assert p.verify().ok, (family, style)
    return p


TP = ("tp",)
DP = ("dp",)
PER_LAYER = {  # (family, style): counts; 2 layers, each one attention and one MLP block
    "megatron": {("all_reduce", TP): 2 * L},  # one after each block
    # one all_gather before and one reduce_scatter after each block (the embedding's or the patch
    # convolution's output is replicated, so the first block's gather is free; the head pays one)
    "megatron-sp": {("all_gather", TP): 2 * L, ("reduce_scatter", TP): 2 * L},
    "dp": {},
}


@pytest.mark.parametrize("family", ["hf_llama", "titan_llama", "titan3_llama", "gpt2", "vit", "phi3"])
@pytest.mark.parametrize("style", sorted(PER_LAYER))
def test_collectives_per_layer(family, style):
    assert _plan(family, style).counts() == PER_LAYER[style]


@pytest.mark.parametrize("style,counts", [
    ("megatron", {("all_reduce", TP): 2}),
    ("megatron-sp", {("all_gather", TP): 2, ("reduce_scatter", TP): 2}),  # float input: seq-sharded from the start
    ("dp", {}),
])
def test_mlp_only_stack(style, counts):
    assert _plan("mlp_stack", style).counts() == counts


@pytest.mark.parametrize("family", ["hf_llama", "gpt2", "mlp_stack", "convnet"])
def test_fsdp_gathers_each_parameter_once(family):
    """Every parameter (all divide by dp=2) is sharded on dp and moved once before its use (an
    all_gather, or an all_to_all when the weight is expanded over the batch: each rank then gets
    the whole weight for its own batch rows); no activation moves."""
    prog = program(family)
    p = _plan(family, "fsdp")
    params = [n for n, t in prog.tensors.items() if t.kind == "param"]
    assert sum(p.counts().values()) == len(params)
    assert all(axes == DP for _, axes in p.counts())
    batch = derived(prog, prog.inputs("input"))
    assert not [c.tensor for c in p.collectives if c.tensor in batch]


def _shardings(p, names):
    return {n: str(p.shardings[n]) for n in names}


def test_weight_shardings_hf_llama():
    p = _plan("hf_llama", "megatron")
    pre = "layers.0."
    assert _shardings(p, [pre + n for n in ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                            "self_attn.o_proj.weight", "mlp.gate_proj.weight",
                                            "mlp.down_proj.weight", "input_layernorm.weight")]
                      + ["embed_tokens.weight", "lm_head.weight", "input_ids"]) == {
        pre + "self_attn.q_proj.weight": "[tp*8, 16]",  # column-parallel: out features (dim 0 of nn.Linear)
        pre + "self_attn.k_proj.weight": "[tp*4, 16]",  # GQA: 2 kv heads, one per rank
        pre + "self_attn.o_proj.weight": "[16, tp*8]",  # row-parallel: in features
        pre + "mlp.gate_proj.weight": "[tp*16, 16]",
        pre + "mlp.down_proj.weight": "[16, tp*16]",
        pre + "input_layernorm.weight": "[16]",
        "embed_tokens.weight": "[32, 16]",
        "lm_head.weight": "[tp*16, 16]",  # the head: vocabulary on tp, logits left sharded
        "input_ids": "[dp, 8]",
    }
    assert str(p.shardings[program("hf_llama").outputs[0]]) == "[dp, 8, tp*16]"


@pytest.mark.parametrize("style", ["megatron", "megatron-sp"])
def test_differential_attention_cuts_each_half_of_the_heads(style):
    """Differential attention (zoo ``DiffLlama``) pairs head ``i`` with ``i + H/2``: q, k and v are
    cut on tp in each half of their heads (``[2*tp*4]``: a rank holds its run of both halves, its
    pairs whole), the output projection row-parallel on the pairs' features; Megatron's collectives
    per layer, no more; verified (``_plan``)."""
    p = _plan("diff_llama", style)
    assert p.counts() == PER_LAYER[style]
    pre = "layers.1.self_attn."
    assert _shardings(p, [pre + n + ".weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj")]) == {
        pre + "q_proj.weight": "[2*tp*4, 16]", pre + "k_proj.weight": "[2*tp*4, 16]",
        pre + "v_proj.weight": "[2*tp*4, 16]", pre + "o_proj.weight": "[16, tp*8]"}


def test_differential_attention_is_kept_whole_when_tp_would_split_its_pairs():
    """4 heads make 2 pairs: tp=4 cannot give every rank whole pairs, so the attention block stays
    whole on every rank (its o_proj not reduced); the MLP is still Megatron."""
    mesh = Mesh.parse("tp=4")
    p = _plan("diff_llama", "megatron", mesh)
    assert p.counts() == {("all_reduce", TP): L}
    assert str(p.shardings["layers.0.self_attn.q_proj.weight"]) == "[16, 16]"
    why = "4 heads in 2 runs paired run with run: 2 per run do not divide over tp=4"
    assert dict(apply_style(program("diff_llama"), mesh, "megatron").whole) == {
        f"layers.{k}.self_attn": why for k in range(L)}


def test_weight_shardings_gpt2_fused_qkv_and_conv1d():
    """Conv1D weights are (in, out): column-parallel shards dim 1. The fused q|k|v weight is
    strided, each rank holding its slice of q, of k and of v, and the split carves it: no extra
    collective, the biases of the row-parallel projections added once."""
    p = _plan("gpt2", "megatron")
    pre = "h.0."
    assert _shardings(p, [pre + n for n in ("attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                                            "attn.c_proj.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                                            "mlp.c_proj.weight")]) == {
        pre + "attn.c_attn.weight": "[16, 3*tp*8]",
        pre + "attn.c_attn.bias": "[3*tp*8]",
        pre + "attn.c_proj.weight": "[tp*8, 16]",
        pre + "attn.c_proj.bias": "[16]",
        pre + "mlp.c_fc.weight": "[16, tp*32]",
        pre + "mlp.c_fc.bias": "[tp*32]",
        pre + "mlp.c_proj.weight": "[tp*32, 16]",
    }
    split = [op for op in p.ops if op.target.startswith("aten.split")]
    assert [str(o) for o in split[0].outputs] == ["[dp, 8, tp*8]"] * 3
    assert not any(c.op.startswith("split") for c in p.collectives)


def test_phi3_slices_of_the_fused_qkv_move_nothing():
    """Phi-3 cuts its fused q|k|v output with slices: the strided weight keeps each rank's slice
    of q, of k and of v, and each slice keeps the shards (ops.resize), proven for every rank."""
    p = _plan("phi3", "megatron")
    assert str(p.shardings["layers.0.self_attn.qkv_proj.weight"]) == "[3*tp*8, 16]"
    slices = [op for op in p.ops if op.target.startswith("aten.slice") and op.local]
    assert len(slices) == 3 * L and all(str(op.outputs[0]) == "[dp, 8, tp*8]" for op in slices)
    assert p.verify().proven


def test_titan3_wqkv_fused_per_kv_group_is_cut_by_whole_groups():
    """torchtitan 0.3's ``wqkv`` holds each kv group's q heads, k and v side by side: a plain column
    cut keeps whole groups (each rank's q heads with the k and v they read), so it is the column
    weight; with fewer groups than ranks every rank holds them all and wo alone is cut."""
    p = _plan("titan3_llama", "megatron")
    assert _shardings(p, ["layers.0.attention.wqkv.weight", "layers.0.attention.wo.weight"]) == {
        "layers.0.attention.wqkv.weight": "[tp*16, 16]", "layers.0.attention.wo.weight": "[16, tp*8]"}
    tp4 = _plan("titan3_llama", "megatron", Mesh.parse("tp=4"))  # 2 kv groups on 4 ranks
    assert _shardings(tp4, ["layers.0.attention.wqkv.weight", "layers.0.attention.wo.weight"]) == {
        "layers.0.attention.wqkv.weight": "[32, 16]", "layers.0.attention.wo.weight": "[16, tp*4]"}
    assert tp4.counts() == {("all_reduce", TP): 2 * L}


def test_weight_shardings_vit_fused_qkv_unbound():
    p = _plan("vit", "megatron")
    assert _shardings(p, ["blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "blocks.0.attn.proj.weight",
                          "patch_embed.weight", "head.weight"]) == {
        "blocks.0.attn.qkv.weight": "[3*tp*8, 16]", "blocks.0.attn.qkv.bias": "[3*tp*8]",
        "blocks.0.attn.proj.weight": "[16, tp*8]", "patch_embed.weight": "[16, 3, 2, 2]",
        "head.weight": "[tp*5, 16]"}


def test_weight_shardings_fused_gate_up():
    p = _plan("mlp_stack", "megatron")
    assert _shardings(p, ["blocks.1.w12.weight", "blocks.1.w3.weight", "blocks.0.fc1.bias", "blocks.0.fc2.bias"]) == {
        "blocks.1.w12.weight": "[2*tp*16, 16]", "blocks.1.w3.weight": "[16, tp*16]",
        "blocks.0.fc1.bias": "[tp*16]", "blocks.0.fc2.bias": "[16]"}


def test_megatron_sp_residuals_are_sequence_sharded():
    prog = program("titan_llama")
    p = _plan("titan_llama", "megatron-sp")
    for b in find_blocks(prog).of_kind("attention", "mlp"):
        assert str(p.shardings[b.output]) == "[dp, tp*4, 16]"
        assert all(str(p.shardings[x]) == "[dp, 8, 16]" for x in b.inputs)  # gathered once per block


def test_full_simulation_of_a_fused_model():
    p = _plan("gpt2", "megatron-sp")
    assert p.verify(mode="full").ok


def test_names_are_the_modules_own_and_casts_pass_through():
    gpt = program("gpt2")
    consts = [n for n, t in gpt.tensors.items() if t.kind == "buffer"]
    assert "h.0.attn.lifted_tensor_0" in consts and not [n for n in gpt.tensors if n.startswith(("p_", "c_h_"))]
    hf = program("hf_llama")  # RMSNorm's .float() / .to(dtype): runtime checks pass through
    assert any(op.target.endswith("_assert_tensor_metadata.default") for op in hf.ops)


def test_matched_blocks_are_reported():
    got = apply_style(program("gpt2"), MESH, "megatron")
    kinds = [m["kind"] for m in got.matched_json()]
    assert kinds.count("attention") == L and kinds.count("mlp") == L and "head" in kinds
    attn = next(m for m in got.matched_json() if m["kind"] == "attention")
    assert attn == {"block": "h.0.attn", "kind": "attention",
                    "tensors": ["h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.attn.c_proj.weight",
                                "h.0.attn.c_proj.bias"]}


def test_attention_whose_heads_do_not_divide_is_kept_whole_and_said(capsys):
    """4 heads over tp=3: a cut would split a head, so Megatron keeps each attention block whole on
    every rank (its weights replicated, no collective) and says so, block by block; the MLPs are
    still cut (one all_reduce each)."""
    mesh = Mesh.parse("tp=3")
    got = apply_style(program("hf_llama"), mesh, "megatron")
    attention = [m["block"] for m in got.matched_json() if m["kind"] == "attention"]
    assert dict(got.whole) == {b: "4 heads do not divide over tp=3" for b in attention} and len(attention) == L
    assert all(got.pins[n] == Sharding.replicated(mesh, got.pins[n].shape)
               for m in got.matched_json() if m["kind"] == "attention" for n in m["tensors"])
    assert main(["plan", "--module", f"{ZOO}:make_hf_llama", "--mesh", "tp=3", "--style", "megatron", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "(kept whole: 4 heads do not divide over tp=3)" in out and f"{L} x all_reduce on tp" in out


@pytest.mark.parametrize("style", ["megatron", "megatron-sp"])
def test_a_model_without_blocks_is_refused(style):
    with pytest.raises(UnmatchedStyle) as e:
        apply_style(program("convnet"), MESH, style)
    msg = str(e.value)
    assert "attention blocks" in msg and "MLP blocks" in msg  # what was looked for
    assert "1 head" in msg and "fc.weight" in msg and "convolution x2" in msg  # what the model has
    assert "--allow-unmatched" in msg
    got = apply_style(program("convnet"), MESH, style, allow_unmatched=True)
    assert got.matched == () and plan(program("convnet"), MESH, got.pins).verify().ok


def test_styles_need_their_mesh_axis():
    with pytest.raises(ShardingError, match="shards on mesh axis 'tp'"):
        apply_style(program("mlp_stack"), Mesh.parse("dp=2"), "megatron")


# ------------------------------------------------------------------------------------------
# torchtitan-style TP plans
# ------------------------------------------------------------------------------------------

TITAN = {f"layers.*.{k}": v for k, v in {
    "attention.wq": "colwise", "attention.wk": "colwise", "attention.wv": "colwise", "attention.wo": "rowwise",
    "feed_forward.w1": "colwise", "feed_forward.w3": "colwise", "feed_forward.w2": "rowwise"}.items()}
TITAN_SP = {**TITAN, "tok_embeddings": "rowwise", "norm": "sequence_parallel", "output": "colwise",
            "layers.*.attention_norm": "sequence_parallel", "layers.*.ffn_norm": "sequence_parallel"}


def _tp(family, tp_plan, mesh=MESH):
    prog = program(family)
    got = apply_tp_plan(prog, mesh, tp_plan)
    p = plan(prog, mesh, got.pins, keep=got.kept)  # as the CLI and parallelize plan it
    assert p.verify().ok
    return p, got


def test_tp_plan_megatron():
    p, got = _tp("titan_llama", TITAN)
    assert p.counts() == {("all_reduce", TP): 2 * L}
    assert str(p.shardings["layers.1.attention.wq.weight"]) == "[tp*8, 16]"
    assert str(p.shardings["layers.1.attention.wo.weight"]) == "[16, tp*8]"
    assert [m["block"] for m in got.matched_json()][:2] == ["layers.0.attention.wq", "layers.1.attention.wq"]


def test_tp_plan_sequence_parallel():
    """torchtitan's plan: a rowwise embedding shards the vocabulary (each rank looks up its rows,
    zeros elsewhere: the output is a partial sum, reduce-scattered to sequence shards as torchtitan's
    ``output_layouts=Shard(1)``), each block gathers its input once and reduce-scatters its output;
    the head gathers its input once. Proven for every rank."""
    p, _ = _tp("titan_llama", TITAN_SP)
    assert p.counts() == {("all_gather", TP): 2 * L + 1, ("reduce_scatter", TP): 2 * L + 1}
    emb = next(op for op in p.ops if op.target.startswith("aten.embedding"))
    assert str(emb.outputs[0]).endswith("+sum(tp)") and emb.local
    assert p.verify().proven
    assert str(p.shardings["tok_embeddings.weight"]) == "[tp*16, 16]"
    assert str(p.shardings["output.weight"]) == "[tp*16, 16]"


@pytest.mark.parametrize("mesh", ["tp=2", "dp=2,tp=2"])  # tp=2: the batch (2) equals the tp size
@pytest.mark.parametrize("sequence", [True, False])
def test_tp_plan_with_a_vocab_parallel_embedding_pays_megatron_plus_one_each(mesh, sequence):
    """Megatron's count per layer, plus one collective for the embedding's partial output (reduced where
    it is made: onto the sequence under sequence parallelism, whole otherwise) and, under sequence
    parallelism, one gather before the head; the norms read the residual stream where it is, whatever
    the batch size (no all-gather of an rsqrt and reduce-scatter of its product, no weight moved)."""
    plan_ = {**TITAN, "tok_embeddings": "rowwise", "output": "colwise"}
    if sequence:
        plan_.update({"norm": "sequence_parallel", "layers.*.attention_norm": "sequence_parallel",
                      "layers.*.ffn_norm": "sequence_parallel"})
    p, got = _tp("titan_llama", plan_, Mesh.parse(mesh))
    want = ({("all_gather", TP): 2 * L + 1, ("reduce_scatter", TP): 2 * L + 1} if sequence
            else {("all_reduce", TP): 2 * L + 1})
    assert p.counts() == want
    assert not [c for c in p.collectives if c.tensor in got.kept]


def test_tp_plan_on_a_tied_table_gain_norms_and_a_module_never_run():
    """torchtitan's plan on a tied model (Qwen3's): torch.export reads the table by the head's name,
    ``tok_embeddings.weight`` is unread, so ``tok_embeddings: rowwise`` is the lookup run in that
    module (vocab-parallel, reduce-scattered where made) and ``output: colwise`` the same rows; norms
    scaling by ``weight + 1.0`` (muse_glimmer's) run sequence-parallel; a ``vision`` encoder the forward
    never runs is listed ``unread`` and pins nothing. Megatron-SP's count plus one each; verified."""
    p, got = _tp("titan_tied_llama", {**TITAN_SP, "vision.*": "colwise"})
    assert p.counts() == {("all_gather", TP): 2 * L + 1, ("reduce_scatter", TP): 2 * L + 1}
    assert str(p.shardings["output.weight"]) == "[tp*16, 16]"
    kinds = {m["block"]: m["kind"] for m in got.matched_json()}
    assert kinds["tok_embeddings"] == "rowwise" and kinds["layers.1.ffn_norm"] == "sequence_parallel"
    assert kinds["vision.0"] == kinds["vision.1"] == "unread" and not any(n.startswith("vision") for n in got.pins)


def test_tp_plan_on_hf_and_fused_gpt2():
    hf = {"layers.*.self_attn.[qkv]_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
          "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise"}
    assert _tp("hf_llama", hf)[0].counts() == {("all_reduce", TP): 2 * L}
    gpt = {"h.*.attn.c_attn": "colwise", "h.*.attn.c_proj": "rowwise", "h.*.mlp.c_fc": "colwise",
           "h.*.mlp.c_proj": "rowwise"}
    p, _ = _tp("gpt2", gpt)
    assert p.counts() == {("all_reduce", TP): 2 * L}
    assert str(p.shardings["h.1.attn.c_attn.weight"]) == "[16, 3*tp*8]"


def test_tp_plan_explicit_placements():
    p, _ = _tp("hf_llama", {"lm_head.weight": ["Replicate()", "Shard(0)"],
                            "layers.0.mlp.down_proj": {"weight": "[16, tp*16]"},
                            "layers.0.mlp.gate_proj": ["Replicate()", "Shard(0)"]})
    assert str(p.shardings["lm_head.weight"]) == "[tp*16, 16]"
    assert str(p.shardings["layers.0.mlp.down_proj.weight"]) == "[16, tp*16]"
    assert str(p.shardings["layers.0.mlp.gate_proj.weight"]) == "[tp*16, 16]"


def test_tp_plan_errors():
    prog = program("titan_llama")
    with pytest.raises(UnmatchedStyle, match=r"'layers\.\*\.attn\.wq' matches no module.*layers\.0\.attention\.wq"):
        apply_tp_plan(prog, MESH, {"layers.*.attn.wq": "colwise"})
    assert apply_tp_plan(prog, MESH, {"layers.*.attn.wq": "colwise"}, allow_unmatched=True).matched == ()
    with pytest.raises(TpPlanError, match="holds no Linear or Embedding weight: norm.weight"):
        apply_tp_plan(prog, MESH, {"norm": "colwise"})
    with pytest.raises(TpPlanError, match="holds no norm"):
        apply_tp_plan(prog, MESH, {"layers.*.attention.wq": "sequence_parallel"})
    with pytest.raises(TpPlanError, match="is not one of colwise, rowwise"):
        apply_tp_plan(prog, MESH, {"layers.*.attention.wq": "columnwise"})
    with pytest.raises(TpPlanError, match="shards on mesh axis 'tp'"):
        apply_tp_plan(prog, Mesh.parse("dp=4"), TITAN)


def test_module_paths_and_patterns():
    assert "layers.0.attention.wq" in modules(program("titan_llama"))
    assert matches("layers.*.attention.wq", "layers.1.attention.wq")
    assert not matches("layers.*", "layers.1.attention")  # '*' never spans a dot (parallelize_module)
    assert matches("layers.*.self_attn.[qk]_proj", "layers.0.self_attn.k_proj")


# ------------------------------------------------------------------------------------------
# the command line
# ------------------------------------------------------------------------------------------


def test_cli_style_reports_matched_blocks_and_fqns(capsys):
    assert main(["plan", "--module", f"{ZOO}:make_gpt2", "--mesh", "tp=2", "--style", "megatron", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "style megatron matched 2 embedding, 5 norm, 2 attention, 2 mlp, 1 head:" in out
    assert "attention  h.0.attn: c_attn.weight, c_attn.bias, c_proj.weight, c_proj.bias" in out
    assert "h.0.attn.c_attn.weight" in out and "p_h_0" not in out  # module names, not placeholders
    assert "4 x all_reduce on tp" in out and "verified" in out


def test_cli_json_matched_tp_plan_and_refusal(capsys, tmp_path):
    (tmp_path / "tp.json").write_text(json.dumps({"blocks.*.fc1": "colwise", "blocks.*.fc2": "rowwise"}))
    assert main(["plan", "--module", f"{ZOO}:make_mlp_stack", "--mesh", "tp=2", "--tp-plan",
                 str(tmp_path / "tp.json"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["matched"] == [{"block": "blocks.0.fc1", "kind": "colwise",
                                "tensors": ["blocks.0.fc1.weight", "blocks.0.fc1.bias"]},
                               {"block": "blocks.0.fc2", "kind": "rowwise",
                                "tensors": ["blocks.0.fc2.weight", "blocks.0.fc2.bias"]}]
    assert main(["plan", "--module", f"{ZOO}:make_convnet", "--mesh", "tp=2", "--style", "megatron"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardlayout: error: style megatron found nothing to shard") and err.count("\n") == 1
    assert main(["plan", "--module", f"{ZOO}:make_convnet", "--mesh", "tp=2", "--style", "megatron",
                 "--allow-unmatched"]) == 0
    assert "style megatron matched nothing" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text("{nope")
    assert main(["plan", "--mesh", "tp=2", "--tp-plan", str(tmp_path / "bad.json")]) == 2
    assert "malformed JSON" in capsys.readouterr().err


def test_equal_pins_are_one_object():
    """A style pins every layer's weights alike with one Sharding object per distinct pin (the
    planner's memo then compares them by identity); the plan is the one of equal copies."""
    from shardlayout.program.models import llama

    prog, m = llama(layers=3), Mesh.parse("dp=2,tp=4")
    pins = style_pins(prog, m, "megatron-sp")
    for n, s in pins.items():
        if n.startswith("layers.2."):
            assert s is pins["layers.0." + n[len("layers.2."):]]
    copies = {n: Sharding.parse(str(s), m) for n, s in pins.items()}
    assert plan(prog, m, pins).to_json(False) == plan(prog, m, copies).to_json(False)


def _tied_lm(vocab: int):
    """ids -> embedding(table) -> one MLP block (residual) -> logits = h @ table^T: one table for the
    lookup and the head, as tie_word_embeddings writes it."""
    from shardlayout.program import ProgramBuilder

    b = ProgramBuilder()
    ids = b.input("ids", (2, 8), "int64")
    table, up, down = b.param("embed.weight", (vocab, 16)), b.param("mlp.up", (32, 16)), b.param("mlp.down", (16, 32))
    x = b.op("embedding", [table, ids], name="embed")
    h = b.op("view", [x], name="rows", shape=(16, 16))
    u = b.op("mm", [h, b.op("permute", [up], name="up_t", dims=(1, 0))], name="up")
    d = b.op("mm", [b.op("relu", [u], name="act"), b.op("permute", [down], name="down_t", dims=(1, 0))], name="down")
    y = b.op("add", [x, b.op("view", [d], name="down3", shape=(2, 8, 16))], name="resid")
    logits = b.op("mm", [b.op("view", [y], name="last", shape=(16, 16)),
                         b.op("permute", [table], name="head_t", dims=(1, 0))], name="logits")
    b.output(logits)
    return b.build()


@pytest.mark.parametrize("style,counts", [
    ("megatron", {("all_reduce", TP): 2}),  # the lookup's partial sum, the MLP block's
    ("megatron-sp", {("reduce_scatter", TP): 2, ("all_gather", TP): 2}),
])
def test_a_tied_table_is_cut_on_its_vocabulary_for_the_lookup_and_the_head(style, counts):
    prog = _tied_lm(64)
    mesh = Mesh.parse("tp=2")
    got = apply_style(prog, mesh, style)
    assert str(got.pins["embed.weight"]) == "[tp*32, 16]" and "embed.weight" in got.kept
    p = plan(prog, mesh, style=style)
    assert p.counts() == counts
    assert str(p.shardings["logits"]) == "[16, tp*32]"  # vocab-sharded logits
    assert p.verify().ok


def test_a_tied_table_with_an_uneven_vocabulary_stays_whole():
    """A vocab-parallel lookup needs equal row blocks: 63 rows on tp=2 keep the table (and the head) whole."""
    prog = _tied_lm(63)
    mesh = Mesh.parse("tp=2")
    p = plan(prog, mesh, style="megatron")
    assert str(p.shardings["embed.weight"]) == "[63, 16]" and p.counts() == {("all_reduce", TP): 1}
    assert p.verify().ok
