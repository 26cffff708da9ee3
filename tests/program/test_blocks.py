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


def _rms_norm(b, x, weight, name):
    """``weight * x * rsqrt(mean(x**2, -1) + eps)`` as torch.export decomposes an RMSNorm."""
    ms = b.op("mean", [b.op("pow", [x, 2], name=f"{name}.pow")], name=f"{name}.mean", dim=(-1,), keepdim=True)
    r = b.op("rsqrt", [b.op("add", [ms, 1e-5], name=f"{name}.add")], name=f"{name}.rsqrt")
    return b.op("mul", [weight, b.op("mul", [x, r], name=f"{name}.mul")], name=f"{name}.out")


def _sub_norm_mlp(sub_norm: bool = True):
    """x -> up -> relu -> [RMSNorm of the 32 ffn features] -> down -> + x -> RMSNorm -> head."""
    from shardlayout.program import ProgramBuilder

    b = ProgramBuilder()
    x = b.input("x", (2, 8, 16))
    up, down, head = b.param("mlp.up", (16, 32)), b.param("mlp.down", (32, 16)), b.param("head", (16, 24))
    rows = b.op("view", [x], name="rows", shape=(16, 16))
    h = b.op("view", [b.op("relu", [b.op("mm", [rows, up], name="up.mm")], name="act")], name="h", shape=(2, 8, 32))
    if sub_norm:
        h = _rms_norm(b, h, b.param("mlp.sub_norm.weight", (32,)), "mlp.sub_norm")
    d = b.op("view", [b.op("mm", [b.op("view", [h], name="h_rows", shape=(16, 32)), down], name="down.mm")],
             name="d", shape=(2, 8, 16))
    resid = b.op("add", [x, d], name="resid")
    normed = _rms_norm(b, resid, b.param("norm.weight", (16,)), "norm")
    b.output(b.op("mm", [b.op("view", [normed], name="n_rows", shape=(16, 16)), head], name="logits"))
    return b.build()


def test_a_norm_of_the_ffn_features_before_the_down_linear_stays_in_the_mlp():
    """BitNet's ``ffn_sub_norm``: the mean square of the features the down Linear reads is inside the
    MLP block (``input_statistics``, its weight ``input_scales``); megatron all-reduces the
    statistic where it is made (one more all_reduce of [2, 8, 1]) and cuts the weight with the
    features; the head past the last residual add and its norm is no MLP's down. Verified."""
    from shardlayout import Mesh
    from shardlayout.plan import plan
    from shardlayout.program.blocks import input_scales, input_statistics

    prog = _sub_norm_mlp()
    s = find_blocks(prog)
    assert [b.describe() for b in s.of_kind("mlp", "head")] == ["mlp mlp: up -> down", "head (root): head"]
    (mlp,) = s.of_kind("mlp")
    assert input_statistics(prog, mlp.last[0]) == (("mlp.sub_norm.pow", "mlp.sub_norm.mean"),)
    assert input_scales(prog, mlp.last[0]) == ("mlp.sub_norm.weight",)
    assert input_statistics(prog, mlp.first[0]) == () and input_scales(prog, mlp.first[0]) == ()
    p = plan(prog, Mesh.parse("tp=2"), style="megatron")
    assert p.counts() == {("all_reduce", ("tp",)): 2}
    assert sorted(c.tensor for c in p.collectives) == ["d", "mlp.sub_norm.mean"]
    assert str(p.shardings["mlp.sub_norm.weight"]) == "[tp*16]" and str(p.shardings["mlp.down"]) == "[tp*16, 16]"
    assert p.verify().ok
    plain = _sub_norm_mlp(sub_norm=False)  # the same without the norm: no statistic, Megatron's one all_reduce
    assert input_statistics(plain, find_blocks(plain).of_kind("mlp")[0].last[0]) == ()


def test_a_linear_before_the_last_norm_and_the_head_is_no_mlp():
    """x -> A -> + x -> RMSNorm -> head: the head's input is a norm of the residual stream A's output
    joins; read as an MLP (A up, head down), the logits would be a partial sum. No MLP is found."""
    from shardlayout.program import ProgramBuilder

    b = ProgramBuilder()
    x = b.input("x", (2, 8, 16))
    a, head = b.param("a", (16, 16)), b.param("head", (16, 24))
    y = b.op("view", [b.op("mm", [b.op("view", [x], name="rows", shape=(16, 16)), a], name="a.mm")], name="y",
             shape=(2, 8, 16))
    normed = _rms_norm(b, b.op("add", [x, y], name="resid"), b.param("norm.weight", (16,)), "norm")
    b.output(b.op("mm", [b.op("view", [normed], name="n_rows", shape=(16, 16)), head], name="logits"))
    s = find_blocks(b.build())
    assert s.of_kind("mlp") == () and [blk.describe() for blk in s.of_kind("head")] == ["head (root): head"]


def _ternary(weight_alone: bool = True):
    """x @ q(w).T with q(w) = round(w * s).clamp(-1, 1) / s, s = 1 / mean(|w|) (BitNet's ternary
    weight); not ``weight_alone``: s also scaled by a statistic of the input x."""
    from shardlayout.program import ProgramBuilder

    b = ProgramBuilder()
    x, w = b.input("x", (16, 32)), b.param("lin.weight", (8, 32))
    s = b.op("reciprocal", [b.op("clamp", [b.op("mean", [b.op("abs", [w], name="a")], name="m")], name="c",
                                 min=1e-5)], name="s")
    if not weight_alone:
        s = b.op("mul", [s, b.op("mean", [x], name="xm")], name="sx")
    q = b.op("div", [b.op("clamp", [b.op("round", [b.op("mul", [w, s], name="ws")], name="r")], name="t", min=-1,
                          max=1), s], name="q")
    b.output(b.op("mm", [x, b.op("permute", [q], name="qt", dims=(1, 0))], name="y"))
    return b.build()


def test_a_weight_through_ops_of_itself_alone_is_still_its_linear():
    """Ternarised in the forward, the weight is still the Linear of its parameter (in features dim 1,
    out features dim 0); scaled by a statistic of the input too, it is no Linear of it."""
    (lin,) = find_linears(_ternary())
    assert (lin.weight, lin.in_dim, lin.out_dim, lin.output, lin.activation) == ("lin.weight", 1, 0, "y", "x")
    assert find_linears(_ternary(weight_alone=False)) == ()


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
