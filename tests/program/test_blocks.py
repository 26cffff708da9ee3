"""find_blocks: the blocks of five model families written in plain torch (tests/program/zoo.py),
found by the structure of their exported graphs — whatever their weights are called."""

from __future__ import annotations

import pytest

from shardlayout.program import Op
from shardlayout.program.blocks import find_blocks, find_linears, module_of, track_dims
from shardlayout.program.models import llama, moe

torch = pytest.importorskip("torch")

from .zoo import program  # noqa: E402


def _blocks(name):
    return [(b.kind, b.name) for b in find_blocks(program(name)).blocks]


def _weights(block, which):
    return [lin.weight.rsplit(".", 2)[-2] for lin in getattr(block, which)]


EXPECTED = {  # family -> (attention/mlp blocks in order, their first and last Linears' module names)
    "hf_llama": [("attention", "layers.0.self_attn", ["q_proj", "k_proj", "v_proj"], ["o_proj"]),
                 ("mlp", "layers.0.mlp", ["gate_proj", "up_proj"], ["down_proj"]),
                 ("attention", "layers.1.self_attn", ["q_proj", "k_proj", "v_proj"], ["o_proj"]),
                 ("mlp", "layers.1.mlp", ["gate_proj", "up_proj"], ["down_proj"])],
    "titan_llama": [("attention", "layers.0.attention", ["wq", "wk", "wv"], ["wo"]),
                    ("mlp", "layers.0.feed_forward", ["w1", "w3"], ["w2"]),
                    ("attention", "layers.1.attention", ["wq", "wk", "wv"], ["wo"]),
                    ("mlp", "layers.1.feed_forward", ["w1", "w3"], ["w2"])],
    "gpt2": [("attention", "h.0.attn", ["c_attn"], ["c_proj"]), ("mlp", "h.0.mlp", ["c_fc"], ["c_proj"]),
             ("attention", "h.1.attn", ["c_attn"], ["c_proj"]), ("mlp", "h.1.mlp", ["c_fc"], ["c_proj"])],
    "mlp_stack": [("mlp", "blocks.0", ["fc1"], ["fc2"]), ("mlp", "blocks.1", ["w12"], ["w3"])],
    "vit": [("attention", "blocks.0.attn", ["qkv"], ["proj"]), ("mlp", "blocks.0.mlp", ["fc1"], ["fc2"]),
            ("attention", "blocks.1.attn", ["qkv"], ["proj"]), ("mlp", "blocks.1.mlp", ["fc1"], ["fc2"])],
    "convnet": [],
}


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_attention_and_mlp_blocks_are_found_by_structure(family):
    s = find_blocks(program(family))
    got = [(b.kind, b.name, _weights(b, "first"), _weights(b, "last")) for b in s.of_kind("attention", "mlp")]
    assert got == EXPECTED[family]


@pytest.mark.parametrize("family,summary", [
    ("hf_llama", "2 attention, 2 mlp, 1 embedding, 5 norm, 1 head"),
    ("titan_llama", "2 attention, 2 mlp, 1 embedding, 5 norm, 1 head"),
    ("gpt2", "2 attention, 2 mlp, 2 embedding, 5 norm, 1 head"),
    ("mlp_stack", "2 mlp, 2 norm"),
    ("vit", "2 attention, 2 mlp, 5 norm, 1 head"),
    ("convnet", "1 head"),
])
def test_embeddings_norms_and_heads(family, summary):
    assert find_blocks(program(family)).summary() == summary


def test_heads_and_embeddings_name_their_modules():
    s = find_blocks(program("hf_llama"))
    assert [b.name for b in s.of_kind("embedding", "head")] == ["embed_tokens", "lm_head"]
    assert [b.name for b in s.of_kind("norm")][-1] == "norm"
    assert [b.name for b in find_blocks(program("gpt2")).of_kind("embedding")] == ["wte", "wpe"]


def test_linear_forms_mm_bmm_addmm_and_conv1d_weights():
    """torch.export gives permute+mm, permute+expand+bmm (a non-contiguous input), or
    permute+addmm with a bias; GPT-2's Conv1D weights are (in, out) and need no permute."""
    prog = program("hf_llama")
    lins = {lin.weight: lin for lin in find_linears(prog)}
    kinds = {n: prog.ops[lin.op].target.split(".")[1] for n, lin in lins.items()}
    assert kinds["layers.0.self_attn.q_proj.weight"] == "mm"
    # attention kept whole (sdpa): its output is contiguous, so o_proj is a plain mm too; the bmm form
    # (permute + expand + bmm of a non-contiguous input) comes from written-out attention:
    assert kinds["layers.0.self_attn.o_proj.weight"] == "mm"
    gpt_kinds = {lin.weight: program("gpt2").ops[lin.op].target.split(".")[1] for lin in find_linears(program("gpt2"))}
    assert set(gpt_kinds.values()) <= {"mm", "addmm", "bmm"}
    assert (lins["layers.0.self_attn.q_proj.weight"].in_dim, lins["layers.0.self_attn.q_proj.weight"].out_dim) == (1, 0)
    gpt = {lin.weight: lin for lin in find_linears(program("gpt2"))}
    c_attn = gpt["h.0.attn.c_attn.weight"]
    assert (c_attn.in_dim, c_attn.out_dim, c_attn.bias, c_attn.parts) == (0, 1, "h.0.attn.c_attn.bias", 3)
    stack = {lin.weight: lin for lin in find_linears(program("mlp_stack"))}
    assert stack["blocks.0.fc1.weight"].bias == "blocks.0.fc1.bias"  # permute + addmm
    assert stack["blocks.1.w12.weight"].parts == 2  # gate|up, chunked
    vit = {lin.weight: lin for lin in find_linears(program("vit"))}
    assert vit["blocks.0.attn.qkv.weight"].parts == 3  # reshape, permute, unbind (core ATen: slices)


def test_block_inputs_and_outputs():
    """A block's input is the tensor its projections share before their own views (the norm's
    output); its output is the residual add that closes it."""
    prog = program("hf_llama")
    attn = find_blocks(prog).of_kind("attention")[0]
    norm = find_blocks(prog).of_kind("norm")[0]
    assert attn.inputs == (norm.output,)
    close = next(op for op in prog.ops if attn.output in op.outputs)
    assert close.target == "aten.add.Tensor"


def test_builder_models():
    s = find_blocks(llama(layers=2))
    assert s.summary() == "2 attention, 2 mlp, 4 norm"
    attn = s.of_kind("attention")[0]
    assert [lin.weight for lin in attn.first] == ["layers.0.wq", "layers.0.wk", "layers.0.wv"]
    assert attn.inputs == ("layers.0.attn_norm.out",) and attn.output == "layers.0.resid1"
    assert find_blocks(moe()).of_kind("experts")[0].params == ("experts.w1", "experts.w2")


def test_exported_moe_experts_are_found():
    from shardlayout.program.torch_import import from_torch
    from shardlayout.program.torch_models import MoETorch

    s = find_blocks(from_torch(MoETorch(), (torch.randn(16, 16),)))
    assert s.of_kind("experts")[0].params == ("experts.w1", "experts.w2")
    assert not s.of_kind("attention", "mlp")  # the router's softmax is no attention: its matmul is a Linear


def test_track_dims_and_module_of():
    perm = Op("aten.permute.default", ("w",), (("dims", (1, 0)),), ("p",))
    assert track_dims(perm, (0, 1), (4, 8), (8, 4)) == (1, 0)
    expand = Op("aten.expand.default", ("p",), (("size", (2, 8, 4)),), ("e",))
    assert track_dims(expand, (1, 0), (8, 4), (2, 8, 4)) == (None, 1, 0)
    view = Op("aten.view.default", ("e",), (("size", (32, 2)),), ("v",))
    assert track_dims(view, (None, 1, 0), (2, 8, 4), (32, 2)) is None  # merges named dims
    assert module_of(["a.b.q.weight", "a.b.o.weight"]) == "a.b"
    assert module_of(["lm_head.weight"]) == "lm_head"


def _gated_pair():
    """x -> rows h; y = mlp_a(h) + sigmoid(h @ g) * mlp_b(h) (a shared expert gated beside another
    MLP, as Qwen2-MoE adds it to the routed experts); x + y, then a statistic of it (a norm's)."""
    from shardlayout.program import ProgramBuilder

    b = ProgramBuilder()
    x = b.input("x", (2, 8, 16))
    h = b.op("view", [x], name="rows", shape=(16, 16))

    def mlp(p):
        up, down = b.param(f"{p}.up", (16, 32)), b.param(f"{p}.down", (32, 16))
        return b.op("mm", [b.op("relu", [b.op("mm", [h, up], name=f"{p}.u")], name=f"{p}.act"), down], name=f"{p}.d")

    a, c = mlp("a"), mlp("b")
    gate = b.op("sigmoid", [b.op("mm", [h, b.param("g", (16, 1))], name="g.mm")], name="gate")
    y = b.op("add", [a, b.op("mul", [gate, c], name="gated")], name="combine")
    resid = b.op("add", [x, b.op("view", [y], name="y3", shape=(2, 8, 16))], name="resid")
    b.output(b.op("mean", [resid], name="stat", dim=-1, keepdim=True))
    return b.build()


def test_a_gated_sum_of_two_results_of_the_block_input_ends_at_the_residual_add():
    """Both MLPs' outputs reach the residual add through the gate's mul and the add that combines
    them (its other operand is made from the same input: inside the block): one reduction for both."""
    from shardlayout import Mesh
    from shardlayout.plan import plan

    prog = _gated_pair()
    mlps = find_blocks(prog).of_kind("mlp")
    assert [b.output for b in mlps] == ["resid", "resid"]
    p = plan(prog, Mesh.parse("tp=2"), style="megatron")
    assert p.counts() == {("all_reduce", ("tp",)): 1} and str(p.shardings["combine"]) == "[16, 16] +sum(tp)"
    assert p.verify().ok


def test_an_index_by_a_constant_is_a_pick_inside_an_attention_block():
    """q|k|v fused per kv group, k and v picked by constant index tensors (Falcon's ``qkv[..., [-2]]``,
    a lifted constant, cloned on CPU): the attention block is found through the index ops."""
    from shardlayout.program import ProgramBuilder

    b = ProgramBuilder()
    x = b.input("x", (2, 8, 16))
    w, wo = b.param("attn.qkv", (16, 32)), b.param("attn.o", (16, 16))
    qkv = b.op("view", [b.op("mm", [b.op("view", [x], name="rows", shape=(16, 16)), w], name="qkv.mm")],
               name="groups", shape=(2, 8, 2, 4, 4))  # 2 kv groups of (2 q heads, k, v), head_dim 4
    q = b.op("slice", [qkv], name="q", dim=3, start=0, end=2)
    picks = []
    for n in ("k", "v"):  # the index values (2, 3) are the buffers': not read by the structure
        idx = b.op("clone", [b._tensor(f"attn.{n}_index", (1,), "int64", "buffer")], name=f"{n}_idx")
        picks.append(b.op("expand", [b.op("index", [qkv, idx], name=n, indexed=[3])], name=f"{n}_e",
                          size=(2, 8, 2, 2, 4)))
    heads = [b.op("transpose", [b.op("reshape", [t], name=f"{t}_h", shape=(2, 8, 4, 4))], name=f"{t}_t", dim0=1,
                  dim1=2) for t in (q, *picks)]
    a = b.op("scaled_dot_product_attention", heads, name="sdpa")
    a = b.op("reshape", [b.op("transpose", [a], name="a_t", dim0=1, dim1=2)], name="a_rows", shape=(16, 16))
    b.output(b.op("add", [x, b.op("view", [b.op("mm", [a, wo], name="o"), ], name="o3", shape=(2, 8, 16))],
                  name="resid"))
    att = find_blocks(b.build()).of_kind("attention")
    assert [(blk.describe(), blk.output) for blk in att] == [("attention attn: qkv -> o", "resid")]


def test_differential_attention_is_one_block_whose_heads_pair_in_two_runs():
    """DiffLlama's form (zoo ``DiffLlama``): two SDPA calls on one q and k over v's halves are one
    attention block; the result's heads chunked in two halves and subtracted pair head ``i`` with
    ``i + H/2`` (``runs`` 2); v, chunked into halves of its own heads that both feed SDPA's v, is
    no fused Linear. Halves of the heads scaled apart and joined again (``halves_llama``) pair
    nothing: ``runs`` 1."""
    for family, runs in (("diff_llama", 2), ("halves_llama", 1)):
        att = find_blocks(program(family)).of_kind("attention")
        assert [(b.kind, b.name, _weights(b, "first"), _weights(b, "last")) for b in att] == [
            ("attention", f"layers.{k}.self_attn", ["q_proj", "k_proj", "v_proj"], ["o_proj"]) for k in (0, 1)]
        assert [(b.runs, b.heads, [lin.parts for lin in b.first]) for b in att] == [(runs, 4, [1, 1, 1])] * 2
        assert [b.output for b in att] == ["layers.0.add", "layers.1.add"]  # the residual add
