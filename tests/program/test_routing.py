"""recognise_routing on torch-exported MoE layers (program/routing.py): torchtitan-style token-choice
routing written in aten ops becomes route / per-expert einsum / unroute, the rewritten program run
unsharded equals the torch module itself, the ep plan moves exactly the ideal all_to_all bytes, a
program without the pattern is left alone, and a partial pattern is not rewritten into something
else. The oracle everywhere is the module's own forward (or the plan's full simulation)."""

from __future__ import annotations

import importlib.util
import itertools
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from shardlayout import Mesh  # noqa: E402
from shardlayout.execute.verify import reference_run  # noqa: E402
from shardlayout.ops.result import canonical_op_name  # noqa: E402
from shardlayout.plan import plan  # noqa: E402
from shardlayout.program import ProgramBuilder  # noqa: E402
from shardlayout.program.models import llama, moe, style_pins  # noqa: E402
from shardlayout.program.routing import recognise_routing  # noqa: E402
from shardlayout.program.torch_import import from_torch  # noqa: E402
from shardlayout.run.torch_ops import torch_op  # noqa: E402
from tests.program.moe_oracle import run_unsharded, targets  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _load_titan():
    spec = importlib.util.spec_from_file_location("titan_moe_for_routing_tests", ROOT / "examples" / "titan_moe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


titan = _load_titan()

SMALL = dict(tokens=64, dim=32, ffn=64, experts=8, top_k=2)
VARIANTS = list(itertools.product(("histc", "bincount"), ("index", "gather"), ("scatter_add", "index_add"),
                                  ("after", "before")))
# what the rewrite replaces: nothing of the counting / sorting / offsets / grouped matmul may stay
GONE = {"_grouped_mm", "sort", "argsort", "histc", "bincount", "cumsum", "div", "floor_divide"}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.export's deprecation chatter
        yield


# -- 1. every variant of the torchtitan layer is recognised, and still computes the module ----------
@pytest.mark.parametrize("counts,gather,combine,scores", VARIANTS)
def test_every_titan_variant_becomes_route_einsum_unroute_and_equals_the_module(counts, gather, combine, scores):
    m, (x,) = titan.make(**SMALL, counts=counts, gather=gather, combine=combine, scores=scores)
    prog = from_torch(m, (x,))
    names = targets(prog)
    assert not GONE & set(names), sorted(GONE & set(names))
    # the rows of x and the per-choice scores are routed, three grouped matmuls become per-expert einsums
    routes = [op for op in prog.ops if op.target == "route"]
    assert len(routes) == 2 and names.count("unroute") == 1
    assert any(op.inputs[0] == "x" and not dict(op.params).get("pairs") for op in routes)
    assert any(dict(op.params).get("pairs") for op in routes)
    assert all(dict(op.params)["experts"] == SMALL["experts"] for op in routes)
    einsums = [op for op in prog.ops if op.target == "einsum"]
    assert [dict(op.params)["equation"] for op in einsums] == ["erd,edf->erf"] * 3
    assert prog.tensors[prog.outputs[0]].shape == (SMALL["tokens"], SMALL["dim"])
    assert recognise_routing(prog) is prog  # nothing left to recognise

    with torch.no_grad():
        want = m(x)
    got = run_unsharded(m, x, prog)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got, want), float((got - want).abs().max())


# -- 2. the ep plan: two all_to_alls of the ideal bf16 bytes --------------------------------------------
BIG = dict(tokens=256, dim=128, ffn=256, experts=8, top_k=2)


@pytest.fixture(scope="module")
def titan_big():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m, (x,) = titan.make(**BIG)
        return from_torch(m, (x,))


@pytest.mark.parametrize("mesh,shards", [("ep=4", 4), ("ep=8", 8), ("dp=2,ep=4", 8)])
def test_expert_parallel_plan_moves_exactly_the_ideal_all_to_all_bytes(titan_big, mesh, shards):
    prog = titan_big
    m = Mesh.parse(mesh)
    p = plan(prog, m, style_pins(prog, m, "ep"))
    tokens, dim, k = BIG["tokens"], BIG["dim"], BIG["top_k"]
    ideal = (tokens // shards) * k * dim * 2  # each rank's own tokens' top-k rows, bf16
    assert [c.kind.value for c in p.collectives] == ["all_to_all", "all_to_all"]
    assert p.counts() == {("all_to_all", ("ep",)): 2}
    assert [c.bytes for c in p.collectives] == [ideal, ideal]
    assert p.total_bytes / (2 * ideal) == 1.0
    assert all(prog.tensors[c.tensor].dtype == "bfloat16" for c in p.collectives)  # moved before the cast back
    assert not any(c.kind.value == "all_gather" for c in p.collectives)
    # tokens stay sharded (on dp x ep when both: data parallel around EP), experts where the style put them
    cut = "dp*ep" if "dp" in m.names else "ep"
    assert str(p.shardings["x"]) == str(p.shardings[prog.outputs[0]]) == f"[{cut}*{tokens // shards}, {dim}]"
    for w in ("w1", "w3", "w2"):
        assert str(p.shardings[w]).startswith("[ep") and p.shardings[w].dims[0][0].axis == "ep"
    assert p.verify().ok


# -- 3. no pattern: the program comes back as it is ------------------------------------------------
def test_an_exported_dense_topk_moe_is_left_as_it_is(monkeypatch):
    from shardlayout.program import routing
    from shardlayout.program.torch_models import MoETorch

    # the import without the rewrite (from_exported imports recognise_routing when it runs)
    monkeypatch.setattr(routing, "recognise_routing", lambda p: p)
    raw = from_torch(MoETorch(), (torch.randn(16, 16),))
    monkeypatch.undo()
    assert "topk" in targets(raw) and "route" not in targets(raw)
    assert recognise_routing(raw) is raw
    assert from_torch(MoETorch(), (torch.randn(16, 16),)).ops == raw.ops


@pytest.mark.parametrize("build", [lambda: llama(layers=1), lambda: moe()], ids=["llama", "moe"])
def test_builder_models_are_left_as_they_are(build):
    prog = build()
    assert recognise_routing(prog) is prog


def test_a_sort_of_the_chosen_experts_that_gathers_nothing_is_kept():
    b = ProgramBuilder()
    p = b.input("p", (8, 3))
    _, i = b.op("topk", [p], name="topk", n_out=2, dtypes=("float32", "int64"), k=2, dim=1)
    o = b.op("sort", [b.op("view", [i], name="flat", size=(-1,))], name="sort", n_out=2,
             dtypes=("int64", "int64"), stable=True)
    b.output(o[1])
    prog = b.build()
    got = recognise_routing(prog)
    assert got is prog or (got.ops == prog.ops and got.outputs == prog.outputs)
    assert targets(got) == ["topk", "view", "sort"]


# -- 4. partial patterns: no route unless the whole pattern is there -------------------------------
class Partial(titan.TitanMoE):
    """The torchtitan layer (histc counts, index gather) with one part written otherwise:
    ``descending``: experts sorted high to low (offsets of the flipped counts);
    ``divisor``: rows gathered by ``order // (2 * top_k)`` instead of ``order // top_k``;
    ``unsort``: the expert rows put back into pair order (``out[order] = ys``) and summed over the
    choices (Megatron's unpermute); ``overwrite``: ``out[token] = ys`` (top_k=1: no duplicates);
    ``half``: ``scatter_add`` of (rows, dim/2) outputs into the first half of a (tokens, dim) zeros;
    ``flipped``: ascending order but the offsets of the flipped counts (not the routing's)."""

    def __init__(self, variant: str, **kw):
        super().__init__(**kw)
        self.variant = variant
        if variant == "half":
            e, f, d = self.w2.shape
            self.w2 = torch.nn.Parameter(torch.randn(e, f, d // 2) / f ** 0.5)

    def forward(self, x):
        v, k = self.variant, self.top_k
        t, d = x.shape
        probs = torch.softmax(self.router(x), dim=1)
        top, idx = torch.topk(probs, k, dim=1)
        flat = idx.view(-1)
        counts = torch.histc(flat.float(), bins=self.experts, min=0, max=self.experts)
        order = torch.argsort(flat, stable=True, descending=v == "descending")
        token = order // (2 * k if v == "divisor" else k)
        xs = x[token]
        if v in ("descending", "flipped"):
            counts = counts.flip(0)
        offs = torch.cumsum(counts.to(torch.int32), dim=0, dtype=torch.int32)
        h = F.silu(torch._grouped_mm(xs.bfloat16(), self.w1.bfloat16(), offs=offs))
        ys = torch._grouped_mm(h, self.w2.bfloat16(), offs=offs).float()
        ys = ys * top.view(-1)[order].unsqueeze(-1)
        if v == "unsort":
            out = torch.zeros_like(ys)
            out[order] = ys
            return out.view(t, k, d).sum(1)
        if v == "overwrite":
            out = torch.zeros_like(x)
            out[token] = ys
            return out
        if v == "half":
            return torch.zeros_like(x).scatter_add(0, token.unsqueeze(1).expand(-1, d // 2), ys)
        return torch.zeros_like(x).index_add(0, token, ys)


# every partial form is left as it was (all or nothing) and plans op by op to the module's output
@pytest.mark.parametrize("variant,top_k", [("descending", 2), ("divisor", 2), ("unsort", 2), ("overwrite", 1),
                                           ("half", 2), ("flipped", 2)])
def test_a_partial_pattern_is_not_mis_rewritten_and_plans_to_the_module_output(variant, top_k):
    torch.manual_seed(0)
    m = Partial(variant, dim=16, experts=4, ffn=32, top_k=top_k)
    x = torch.randn(32, 16)
    with torch.no_grad():
        want = m(x).numpy()
    prog = from_torch(m, (x,))
    if variant in ("descending", "divisor", "flipped"):  # not the routing's rows or offsets: nothing routed
        assert "route" not in targets(prog) and "sort" in targets(prog)
    assert prog.tensors[prog.outputs[0]].shape == want.shape
    # the unsharded run (numpy: float32/64 where the module rounds to bf16) is the module's output ...
    mesh = Mesh.parse("ep=1")
    p1 = plan(prog, mesh, style_pins(prog, mesh, "ep"))
    inputs = {n: t.detach().numpy() for n, t in m.named_parameters()}
    inputs["x"] = x.numpy()
    got = reference_run(p1, inputs)[prog.outputs[0]]
    assert got.shape == want.shape
    assert np.allclose(got, want, rtol=2e-2, atol=2e-2), float(np.abs(got - want).max())
    # ... and every rank of the ep plan, simulated, computes the unsharded run
    mesh = Mesh.parse("ep=2")
    p = plan(prog, mesh, style_pins(prog, mesh, "ep"))
    v = p.verify(mode="full")
    assert v.ok, v


class SortedRows(torch.nn.Module):
    """Rows gathered by a stable argsort // 2 (an int tensor divided by a Python int), no topk."""

    def forward(self, x, i):
        return x[torch.argsort(i, stable=True) // 2]


def test_an_int_floor_division_by_a_python_int_stays_int_on_torch():
    x, i = torch.randn(8, 4), torch.randint(0, 4, (16,))
    prog = from_torch(SortedRows(), (x, i))
    div = next(op for op in prog.ops if canonical_op_name(op.target) == "div")
    assert prog.tensors[div.outputs[0]].dtype == "int64"
    p = plan(prog, Mesh.parse("dp=1"))
    ref = reference_run(p, {"x": x, "i": i}, torch_op, torch)
    assert ref[div.outputs[0]].dtype == torch.int64
    assert torch.equal(ref[prog.outputs[0]], SortedRows()(x, i))


# -- 5. transformers' grouped-mm MoE: sorted ids counted by histc(max=E-1), a fused gate|up split on the
# rows, and the combine as an inverse permutation (inv[order] = arange), index, view (T, k, D), sum(1)
class HFStyle(torch.nn.Module):
    def __init__(self, dim=16, experts=4, ffn=24, top_k=2, combine="inverse", router="topk"):
        super().__init__()
        self.k, self.experts, self.combine, self.router = top_k, experts, combine, router
        self.gate = torch.nn.Linear(dim, experts, bias=False)
        self.gate_up = torch.nn.Parameter(torch.randn(experts, 2 * ffn, dim) / dim ** 0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, dim, ffn) / ffn ** 0.5)

    def forward(self, x):
        t, d = x.shape
        if self.router == "topk":
            top, idx = torch.topk(torch.softmax(self.gate(x), dim=-1), self.k, dim=-1)
            top = top / top.sum(-1, keepdim=True)
        else:
            top, idx = _masked_argmaxes(self.gate(x), self.k, self.router)
        ids, order = torch.sort(idx.view(-1))
        xs = x[order // self.k]
        scores = top.view(-1)[order]
        offs = torch.cumsum(torch.histc(ids.float(), bins=self.experts, min=0, max=self.experts - 1), 0,
                            dtype=torch.int32)
        h = torch._grouped_mm(xs.bfloat16(), self.gate_up.bfloat16().transpose(1, 2), offs=offs)  # (CPU: bf16)
        gate, up = h.split([self.gate_up.shape[1] // 2] * 2, dim=-1)
        ys = torch._grouped_mm(F.silu(gate) * up, self.down.bfloat16().transpose(1, 2), offs=offs).float()
        ys = ys * scores.unsqueeze(-1)
        if self.combine == "inverse":
            inv = torch.empty_like(order)
            inv[order] = torch.arange(order.numel())
            back = ys[inv]
        else:  # the same un-permutation written as a scatter of the rows: left as it is
            back = torch.zeros_like(ys)
            back[order] = ys
        return back.view(t, self.k, d).sum(1)


def test_transformers_style_moe_becomes_route_einsum_unroute_and_equals_the_module():
    torch.manual_seed(0)
    m, x = HFStyle(), torch.randn(32, 16)
    prog = from_torch(m, (x,))
    names = targets(prog)
    assert names.count("route") == 2 and names.count("unroute") == 1, names
    assert not {"_grouped_mm", "sort", "histc", "cumsum", "index_put"} & set(names)
    assert "split_with_sizes" in names  # the gate|up split runs on the routed rows
    with torch.no_grad():
        want = m(x)
    got = run_unsharded(m, x, prog)
    assert torch.equal(got, want), float((got - want).abs().max())
    mesh = Mesh.parse("ep=4")
    p = plan(prog, mesh, style="ep")
    ideal = 32 * 2 * 16 * 2 // 4  # tokens x k rows of dim 16 in bf16 (moved before their casts), one device's
    assert [c.kind.value for c in p.collectives] == ["all_to_all"] * 2, p.collectives
    assert [c.bytes for c in p.collectives] == [ideal, ideal]
    assert p.verify().ok


def _masked_argmaxes(logits, k: int, how: str):
    """PhiMoE's sparsemixer at inference: k arg-maxes (``max`` or ``argmax``, keepdim), each after the
    experts already chosen are masked to -inf, clamped and masked by a threshold; concatenated."""
    scores, idx, masked = [], [], logits
    for _ in range(k):
        if how == "max":
            top, i = masked.max(dim=-1, keepdim=True)
        else:
            i = masked.argmax(dim=-1, keepdim=True)
            top = masked.gather(-1, i)
        factor = logits.abs().clamp(min=top)
        gates = torch.softmax(masked.masked_fill((top - logits) / factor > 0.02, float("-inf")), dim=-1)
        scores.append(gates.gather(-1, i))
        idx.append(i)
        masked = torch.scatter(masked, -1, i, float("-inf"))
    return torch.cat(scores, dim=-1), torch.cat(idx, dim=-1)


@pytest.mark.parametrize("how", ["max", "argmax"])
def test_concatenated_masked_argmaxes_route_like_a_topk(how):
    """A top-k index written as k arg-maxes over (T, E) scores concatenated on the choices
    (PhiMoE's sparsemixer router) is read as the routing's index: route / einsum / unroute, equal to
    the module, two all_to_alls under ep."""
    torch.manual_seed(0)
    m, x = HFStyle(router=how), torch.randn(32, 16)
    prog = from_torch(m, (x,))
    names = targets(prog)
    assert names.count("route") == 2 and names.count("unroute") == 1, names
    assert not {"_grouped_mm", "sort", "histc", "cumsum", "index_put"} & set(names)
    with torch.no_grad():
        want = m(x)
    assert torch.equal(run_unsharded(m, x, prog), want)
    p = plan(prog, Mesh.parse("ep=4"), style="ep")
    assert [c.kind.value for c in p.collectives] == ["all_to_all"] * 2 and p.verify().ok


def test_an_unsorting_scatter_is_left_as_it_is():
    torch.manual_seed(0)
    m, x = HFStyle(combine="scatter"), torch.randn(32, 16)
    prog = from_torch(m, (x,))
    assert "route" not in targets(prog) and "sort" in targets(prog)


def test_torchtitans_deterministic_scatter_add_combine_is_read_as_the_unroute():
    # torchtitan's MoE combines with its custom op torchtitan::deterministic_scatter_add (out, index, src)
    m, (x,) = titan.make(**SMALL, combine="deterministic")
    prog = from_torch(m, (x,))
    assert "deterministic_scatter_add" not in " ".join(targets(prog)) and targets(prog).count("unroute") == 1
    with torch.no_grad():
        want = m(x)
    assert torch.equal(run_unsharded(m, x, prog), want)
    p = plan(prog, Mesh.parse("ep=4"), style="ep")  # the experts kept on ep: the tokens move
    assert [c.kind.value for c in p.collectives] == ["all_to_all"] * 2 and p.verify().ok


@pytest.mark.parametrize("batched", [True, False])
def test_torchtitan_qwen3_moe_routing_batched_router_one_hot_counts_casts_per_matmul(batched):
    # torchtitan 0.3's Qwen3-MoE: top-k on (1, T, E), counts = zeros.scatter(-1, idx, 1).sum(...), the rows
    # cast to bf16 once per expert matmul (one cast, one move), deterministic_scatter_add back
    m, (x,) = titan.make_qwen3() if batched else titan.make(**SMALL, counts="onehot")
    prog = from_torch(m, (x,))
    names = targets(prog)
    assert not GONE & set(names) and names.count("route") == 2 and names.count("unroute") == 1
    with torch.no_grad():
        want = m(x)
    assert torch.equal(run_unsharded(m, x, prog), want)
    p = plan(prog, Mesh.parse("ep=4"), style="ep")
    assert [c.kind.value for c in p.collectives] == ["all_to_all"] * 2 and p.verify().ok


# -- 8. rows kept one per (token, choice): JetMoE's mixture of attention ----------------------------
class MixtureOfAttention(torch.nn.Module):
    """transformers' JetMoE ``JetMoeMoA`` as its attention uses it: ``map`` routes the tokens, runs
    each expert's query projection (a per-expert loop) and puts the rows back one per (token,
    choice) with ``index_add`` by the sort order (none summed); a per-token op over the k choices
    stands in for the attention; ``reduce`` gathers the (token, choice) rows by the sort order
    again, runs each expert's output projection, scales by the gates and sums into the tokens."""

    def __init__(self, dim=16, heads=4, head_dim=4, experts=4, top_k=2):
        super().__init__()
        tf = pytest.importorskip("transformers")
        from transformers.models.jetmoe.modeling_jetmoe import JetMoeMoA

        cfg = tf.JetMoeConfig(hidden_size=dim, kv_channels=head_dim, num_key_value_heads=heads,
                              num_local_experts=experts, num_experts_per_tok=top_k)
        self.moa = JetMoeMoA(cfg)
        with torch.no_grad():
            for p in self.moa.parameters():
                p.normal_(0.0, 0.3)

    def forward(self, x):
        q, _, topo = self.moa.map(x)  # (B, S, k, heads * head_dim)
        mixed = q * torch.softmax(q.sum(-1, keepdim=True), dim=2)  # mixes each token's k choices
        return self.moa.reduce(mixed, topo)


def test_jetmoe_mixture_of_attention_keeps_rows_per_pair_and_equals_the_module():
    """The rows put back by the sort order (``index_add`` into ``zeros(T*k, H)``) are read as
    ``unroute(pairs=True)``: dense (token, choice) rows any op may read; gathered again by the sort
    order from a ``(..., k, H)`` view they are ``route(pairs=True)``. Equal to the module on two
    inputs routed differently; under ep each pass through the experts moves its rows out and back
    (four all_to_alls of exactly one device's rows), the experts kept on ep; verified."""
    torch.manual_seed(0)
    m, x = MixtureOfAttention(), torch.randn(2, 8, 16)
    prog = from_torch(m, (x,))
    names = targets(prog)
    assert not {"sort", "index_put", "index_add", "split_with_sizes", "_local_scalar_dense"} & set(names), names
    routes = [op for op in prog.ops if op.target == "route"]
    unroutes = [op for op in prog.ops if op.target == "unroute"]
    assert sorted(bool(dict(op.params).get("pairs")) for op in routes) == [False, True, True]  # tokens, gates, q
    assert sorted(bool(dict(op.params).get("pairs")) for op in unroutes) == [False, True]
    for xi in (x, torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(3))):
        with torch.no_grad():
            want = m(xi)
        got = run_unsharded(m, xi, prog)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), float((got - want).abs().max())
    p = plan(prog, Mesh.parse("ep=2"), style="ep")
    rows = 16 * 2 * 16 * 4 // 2  # 16 tokens x top-2 rows of 16 features, float32, one device's share
    assert [c.kind.value for c in p.collectives] == ["all_to_all"] * 4
    assert [c.bytes for c in p.collectives] == [rows] * 4
    assert str(p.shardings["moa.input_linear.weight"]) == "[ep*2, 16, 16]"
    assert p.verify().ok


@pytest.mark.parametrize("counts", ["histc", "onehot"])
def test_torchtitan_gpt_oss_expert_biases_repeated_by_the_padded_counts_are_per_expert_rows(counts):
    # torchtitan 0.3's GPT-OSS: cat([b, zeros(1, F)]).repeat_interleave(cat([counts, slack]), output_size=R)
    # added to the grouped matmul's rows: each routed row's expert's bias, read as b per expert
    m, (x,) = titan.make(**SMALL, counts=counts, biases=True, combine="deterministic")
    prog = from_torch(m, (x,))
    names = targets(prog)
    assert not (GONE | {"repeat_interleave", "index_select"}) & set(names), names
    assert names.count("route") == 2 and names.count("unroute") == 1
    with torch.no_grad():
        want = m(x)
    assert torch.equal(run_unsharded(m, x, prog), want)
    p = plan(prog, Mesh.parse("ep=4"), style="ep")  # the experts and their biases kept on ep: the tokens move
    assert [c.kind.value for c in p.collectives] == ["all_to_all"] * 2 and p.verify().ok
    assert all(p.shardings[n].dims[0][0].axis == "ep" for n in ("b1", "b2"))


def test_a_bias_repeated_by_other_counts_is_left_as_it_is():
    # repeat_interleave of counts that are not the routing's (here: reversed) is no per-expert row: not rewritten
    m, (x,) = titan.make(**SMALL, biases=True)
    real = titan.per_expert_rows
    titan.per_expert_rows = lambda b, counts, offs, rows: real(b, counts.flip(0), offs, rows)
    try:
        prog = from_torch(m, (x,))
    finally:
        titan.per_expert_rows = real
    assert "route" not in targets(prog) and "repeat_interleave" in targets(prog)
