"""Per-expert loops of an MoE layer read as one grouped computation (program/expert_loop.py, through
torch_import.from_torch and program/routing.py).

torch.export unrolls ``for e, xe in enumerate(torch.split(rows, counts.tolist())): ...; torch.cat(outs)``
(optionally torchtitan's ``rows[:sum(sizes)]`` prefix slice and ``vstack`` zero padding) into E copies
of the expert on rows of data-dependent sizes. What is tested:

1. every form of the loop written here (histc / bincount counts, with and without the prefix slice and
   padding, weights stored (E, out, in) or (E, in, out), SwiGLU or relu experts, E=4/8, top_k 1/2,
   experts that get no tokens) imports with no split / .tolist() scalar / cat / sort / counting op
   left, as route / einsum / unroute — and the imported program run unsharded equals the module;
2. the expert-parallel plan of the loop moves only all_to_alls of about the ideal bytes, verifies, and
   has the collectives of the same layer written with ``torch._grouped_mm``;
3. loops that are not one expert run E times (different ops per expert, a per-expert bias, the wrong
   expert's weight, split sizes that are not the routing's counts, values leaking out of the loop),
   and a ``.item()`` outside any loop, are refused with an error naming the problem — never imported
   as a silently different program (nor is ``torch._grouped_mm`` with offsets of another top-k);
4. the same through the ``shardlayout plan --module`` CLI.

The oracle is the torch module's own forward (the imported program run unsharded on torch through
``reference_run``), the plan's own simulation (``verify``), and byte counts derived from the sizes.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from shardlayout import Mesh  # noqa: E402
from shardlayout.cli import main  # noqa: E402
from shardlayout.errors import ShardingError, UnsupportedOp  # noqa: E402
from shardlayout.execute.verify import reference_run  # noqa: E402
from shardlayout.plan import plan  # noqa: E402
from shardlayout.program import ProgramError  # noqa: E402
from shardlayout.program.models import style_pins  # noqa: E402
from shardlayout.program.torch_import import from_torch  # noqa: E402
from tests.program.moe_oracle import run_unsharded, targets  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TITAN = ROOT / "examples" / "titan_moe.py"


def _load_titan():
    spec = importlib.util.spec_from_file_location("titan_moe_for_expert_loop_tests", TITAN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


titan = _load_titan()

# what the loop and the routing leave behind when read right: none of it may be imported
GONE = {"split_with_sizes", "split", "_local_scalar_dense", "cat", "_grouped_mm", "histc", "bincount", "sort",
        "argsort", "unbind", "select"}


@pytest.fixture(autouse=True)
def _quiet(caplog):
    caplog.set_level(logging.INFO, logger="torch.__trace")  # export's DEBUG trace: not in failure reports
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.export's deprecation chatter
        yield


# -- the layer: a token-choice router and a per-expert loop, in the forms users write ----------------
class LoopMoE(nn.Module):
    """Router ``Linear(dim, E)`` -> softmax -> ``topk(k, dim=1)``, counts by ``histc`` or ``bincount``,
    rows sorted by a stable argsort and gathered (``x[token]`` or ``gather``), the experts as a loop
    over ``torch.split(rows, counts.tolist())``, scores applied before or after the experts, the rows
    summed back by ``scatter_add`` or ``index_add``.

    ``layout``: ``"in_out"`` weights (E, in, out) used as ``xe @ w[e]``; ``"out_in"`` weights
    (E, out, in) used as ``xe @ w[e].T``; ``"out_in_t"`` the same as ``xe @ w[e].transpose(-2, -1)``.
    ``expert``: ``"swiglu"`` or ``"relu"`` (a two-matmul MLP). ``pad``: torchtitan's
    ``rows[:sum(sizes)]`` before the split and ``vstack`` of zeros after the cat. ``never``: an expert
    the router bias makes never chosen. ``bad``: a loop that is not one expert run E times over the
    routed rows (see ``BAD``)."""

    def __init__(self, dim=16, experts=4, ffn=32, top_k=2, counts="histc", gather="index", combine="scatter_add",
                 scores="after", layout="in_out", expert="swiglu", pad=True, never=None, bad=None):
        super().__init__()
        self.experts, self.top_k, self.counts, self.gather, self.combine = experts, top_k, counts, gather, combine
        self.scores, self.layout, self.expert, self.pad, self.bad = scores, layout, expert, pad, bad
        self.router = nn.Linear(dim, experts, bias=never is not None)
        if never is not None:
            with torch.no_grad():
                self.router.bias.zero_()
                self.router.bias[never] = -1e4  # its probability underflows to 0: never among the top k
        for name, (i, o) in {"w1": (dim, ffn), "w3": (dim, ffn), "w2": (ffn, dim)}.items():
            if name == "w3" and expert != "swiglu":
                continue
            shape = (experts, i, o) if layout == "in_out" else (experts, o, i)
            setattr(self, name, nn.Parameter(torch.randn(*shape) / i ** 0.5))
        if bad == "bias":
            self.b1 = nn.Parameter(torch.randn(experts, ffn))

    def mm(self, xe, name, e):
        w = getattr(self, name)
        if self.bad == "shifted":
            e = (e + 1) % self.experts
        if self.layout == "in_out":
            return xe @ w[e]
        if self.layout == "out_in":
            return xe @ w[e].T
        return xe @ w[e].transpose(-2, -1)

    def run_expert(self, xe, e):
        h = self.mm(xe, "w1", e)
        if self.bad == "bias":
            h = h + self.b1[e]
        if self.expert == "swiglu":
            act = F.relu if self.bad == "relu0" and e == 0 else F.silu
            h = act(h) * self.mm(xe, "w3", e)
        else:
            h = F.relu(h)
        if self.bad == "scale":
            h = h * (1.0 + e)
        return h, self.mm(h, "w2", e)

    def loop(self, xs, counts):
        sizes = counts.to(torch.int64).tolist()
        rows = xs[: sum(sizes)] if self.pad else xs
        outs, hidden = [], []
        for e, xe in enumerate(torch.split(rows, sizes, dim=0)):
            h, y = self.run_expert(xe, e)
            outs.append(y)
            hidden.append(h)
        out = torch.cat(outs[::-1] if self.bad == "reversed" else outs, dim=0)
        if self.pad:
            out = torch.vstack((out, out.new_zeros((xs.shape[0] - sum(sizes), out.shape[-1]))))
        if self.bad == "leak":
            out = out + hidden[0].sum()
        return out

    def forward(self, x):
        t, d = x.shape
        bad, k, experts = self.bad, self.top_k, self.experts
        probs = torch.softmax(self.router(x), dim=1)
        top, idx = torch.topk(probs, k, dim=1)
        flat = idx.view(-1)
        chosen = flat
        if bad == "other_topk":  # the counts of another top-k (of the least likely experts)
            chosen = torch.topk(-probs, k, dim=1)[1].reshape(-1)
        elif bad == "top1_counts":  # the counts of the top-1 experts of a top-k routing
            chosen = torch.topk(probs, 1, dim=1)[1].reshape(-1)
        if self.counts == "histc":
            counts = torch.histc(chosen.float(), bins=experts, min=0, max=experts)
        else:
            counts = torch.bincount(chosen, minlength=experts)
            torch._check(counts.shape[0] == experts)  # ids < E: export cannot know bincount's length
        if bad == "flipped_counts":
            counts = counts.flip(0)
        order = torch.argsort(flat, stable=True, descending=bad == "descending")
        token = order // k
        if self.gather == "index":
            xs = x[token]
            scores = top.view(-1)[order].reshape(-1, 1)
        else:
            xs = torch.gather(x, 0, token.reshape(-1, 1).expand(-1, d))
            scores = top.view(-1)[order].unsqueeze(-1)
        if bad == "unsorted":  # the tokens themselves split by the counts (top_k=1: they sum to t)
            xs = x
        if self.scores == "before":
            xs = xs * scores
        ys = self.loop(xs, counts)
        if self.scores == "after":
            ys = ys * scores
        if self.combine == "scatter_add":
            return torch.zeros_like(x).scatter_add(0, token.reshape(-1, 1).expand(-1, d), ys)
        return torch.zeros_like(x).index_add(0, token, ys)


def build(tokens=24, seed=0, **kw):
    torch.manual_seed(seed)
    m = LoopMoE(**kw)
    return m, torch.randn(tokens, m.router.in_features)


def expert_counts(m, x):
    """Rows per expert of ``m``'s routing of ``x``, counted here in plain torch."""
    with torch.no_grad():
        idx = torch.topk(torch.softmax(m.router(x), dim=1), m.top_k, dim=1).indices
    return [int((idx == e).sum()) for e in range(m.experts)]


# -- 1. every form of the loop is read as route / einsum / unroute, and computes the module ---------
POSITIVE = {
    "histc-pad-in_out-swiglu-e4-k2": dict(),
    "bincount-nopad-out_in-swiglu-e8-k2": dict(counts="bincount", pad=False, layout="out_in", experts=8,
                                               gather="gather", combine="index_add", scores="before"),
    "histc-nopad-out_in_t-relu-e4-k1": dict(pad=False, layout="out_in_t", expert="relu", top_k=1),
    "bincount-pad-in_out-relu-e8-k1": dict(counts="bincount", expert="relu", experts=8, top_k=1, gather="gather",
                                           scores="before"),
    "histc-pad-out_in-swiglu-e8-k2": dict(layout="out_in", experts=8, combine="index_add"),
    "bincount-pad-out_in_t-swiglu-e4-k2": dict(counts="bincount", layout="out_in_t", scores="before"),
    # some expert receives no tokens: one the router never picks, or fewer tokens than experts
    "never-chosen-expert-e8-k2": dict(experts=8, never=5, layout="out_in"),
    "tokens-fewer-than-experts": dict(tokens=3, experts=8, top_k=1, counts="bincount", pad=False),
}
EINSUMS = {"swiglu": 3, "relu": 2}


@pytest.mark.parametrize("kw", list(POSITIVE.values()), ids=list(POSITIVE))
def test_a_per_expert_loop_becomes_route_einsum_unroute_and_equals_the_module(kw):
    m, x = build(**kw)
    prog = from_torch(m, (x,))
    names = targets(prog)
    assert not GONE & set(names), sorted(GONE & set(names))
    routes = [op for op in prog.ops if op.target == "route"]
    assert len(routes) == 2 and names.count("unroute") == 1  # the rows of x and the per-choice scores
    assert sum(op.inputs[0] == "x" and not dict(op.params).get("pairs") for op in routes) == 1
    einsums = [op for op in prog.ops if op.target == "einsum"]
    assert [dict(op.params)["equation"] for op in einsums] == ["erd,edf->erf"] * EINSUMS[m.expert]
    assert prog.tensors[prog.outputs[0]].shape == tuple(x.shape)

    # the example the loop was exported at, and other tokens routed otherwise (the program is not the
    # example's counts): both equal the module's own forward
    x2 = torch.randn(*x.shape, generator=torch.Generator().manual_seed(7))
    for xi in (x, x2):
        with torch.no_grad():
            want = m(xi)
        got = run_unsharded(m, xi, prog)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), float((got - want).abs().max())
    assert expert_counts(m, x) != expert_counts(m, x2) or x.shape[0] < 4
    if "never" in kw or x.shape[0] * m.top_k < m.experts:  # the case under test really has an empty expert
        assert 0 in expert_counts(m, x) and 0 in expert_counts(m, x2)


class TwoLayers(nn.Module):
    """Two loop MoE layers, residual: two loops in one graph, each with its own counts."""

    def __init__(self):
        super().__init__()
        self.a = LoopMoE()
        self.b = LoopMoE(counts="bincount", layout="out_in", pad=False, experts=8, top_k=1)

    def forward(self, x):
        h = self.a(x) + x
        return self.b(h) + h


def test_two_loops_in_one_graph_are_each_read_with_their_own_counts():
    torch.manual_seed(0)
    m, x = TwoLayers(), torch.randn(24, 16)
    prog = from_torch(m, (x,))
    names = targets(prog)
    assert not GONE & set(names), sorted(GONE & set(names))
    assert names.count("route") == 4 and names.count("unroute") == 2 and names.count("einsum") == 6
    with torch.no_grad():
        want = m(x)
    got = run_unsharded(m, x, prog)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), float((got - want).abs().max())


def _jetmoe_moe(seed=0, experts=4, top_k=2, dim=16, ffn=24):
    """transformers' own JetMoE MoE layer (router top-k, counts by a one-hot summed and
    ``.tolist()``, the rows sorted by an unstable ``sort`` and gathered by ``// k`` with trunc, then
    two loops over ``split(expert_size)``: gate|up, SwiGLU, down; ``index_add`` back, a bias), its
    parameters drawn at a scale that gives every term weight (the bias too)."""
    tf = pytest.importorskip("transformers")
    from transformers.models.jetmoe.modeling_jetmoe import JetMoeMoE

    cfg = tf.JetMoeConfig(hidden_size=dim, intermediate_size=ffn, num_local_experts=experts,
                          num_experts_per_tok=top_k, activation_function="silu")
    torch.manual_seed(seed)
    m = _Called(JetMoeMoE(cfg)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.3)
    return m


class _Called(nn.Module):
    """``layer(x)``: a transformers layer whose forward names its input otherwise, called on ``x``."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)


def test_jetmoes_two_loops_over_one_counts_list_are_one_expert_and_equal_the_module():
    """JetMoE runs the experts' gate|up in one loop and their down in another, both over the same
    ``expert_size.tolist()``: the second loop's rows are the first loop's output, whose size is the
    sum of the counts (no static size at export); read as that sum, i.e. the rows of the first loop,
    both loops become einsums on the routed rows. Equal to the module on the example and on other
    tokens routed otherwise; ep moves the rows out and back once (two all_to_alls of the ideal
    bytes), verified."""
    m = _jetmoe_moe()
    x = torch.randn(2, 12, 16)
    prog = from_torch(m, (x,))
    names = targets(prog)
    assert not (GONE - {"split_with_sizes"}) & set(names), sorted(GONE & set(names))
    assert names.count("split_with_sizes") == 1  # the gate|up chunk of the routed rows' features, no loop's
    assert names.count("route") == 2 and names.count("unroute") == 1 and names.count("einsum") == 2, names
    for xi in (x, torch.randn(2, 12, 16, generator=torch.Generator().manual_seed(5))):
        with torch.no_grad():
            want = m(xi)
        got = run_unsharded(m, xi, prog)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), float((got - want).abs().max())
    p = plan(prog, Mesh.parse("ep=2"), style="ep")
    rows = 24 * 2 * 16 * 4 // 2  # 24 tokens x top-2 rows of dim 16, float32, one device's share
    assert [c.kind.value for c in p.collectives] == ["all_to_all"] * 2
    assert [c.bytes for c in p.collectives] == [rows, rows]
    assert str(p.shardings["layer.input_linear.weight"]) == "[ep*2, 48, 16]"
    assert p.verify().ok


class LoopOnOtherCounts(nn.Module):
    """Two loops, the second splitting the first one's output by the counts of another routing:
    its rows' size (the first counts' sum) is not the sum of its own counts."""

    def __init__(self, dim=8, experts=4):
        super().__init__()
        self.experts = experts
        self.r1, self.r2 = nn.Linear(dim, experts, bias=False), nn.Linear(dim, experts, bias=False)
        self.w1, self.w2 = nn.Parameter(torch.randn(experts, dim, dim)), nn.Parameter(torch.randn(experts, dim, dim))

    def forward(self, x):
        _, i1 = torch.topk(self.r1(x), 1, dim=1)
        _, i2 = torch.topk(self.r2(x), 1, dim=1)
        c1 = torch.histc(i1.view(-1).float(), bins=self.experts, min=0, max=self.experts).long().tolist()
        c2 = torch.histc(i2.view(-1).float(), bins=self.experts, min=0, max=self.experts).long().tolist()
        order = torch.argsort(i1.view(-1), stable=True)
        h = torch.cat([xe @ self.w1[e] for e, xe in enumerate(torch.split(x[order], c1))])
        y = torch.cat([he @ self.w2[e] for e, he in enumerate(torch.split(h, c2))])
        return torch.zeros_like(x).index_add(0, order, y)


def test_a_loop_over_rows_summed_from_other_counts_is_refused_by_name():
    torch.manual_seed(0)
    msg = assert_refused(LoopOnOtherCounts(), torch.randn(16, 8), "per-expert loop at node", "no static size",
                         "nor the sum of the counts of an earlier loop")
    assert "\n" not in msg


# -- 2. expert parallel: the loop plans to the two all_to_alls of the grouped layer ------------------
PAYS = dict(tokens=256, dim=128, experts=8, ffn=256, top_k=2)


@pytest.mark.parametrize("kw", [dict(), dict(counts="bincount", layout="out_in", pad=False, combine="index_add")],
                         ids=["titan-loop", "bincount-out_in-nopad"])
def test_the_ep_plan_of_a_loop_moves_only_about_the_ideal_all_to_all_bytes(kw):
    sizes = dict(PAYS)
    m, x = build(tokens=sizes.pop("tokens"), **sizes, **kw)
    prog = from_torch(m, (x,))
    mesh = Mesh.parse("ep=4")
    p = plan(prog, mesh, style_pins(prog, mesh, "ep"))
    kinds = [c.kind.value for c in p.collectives]
    assert kinds and set(kinds) == {"all_to_all"}, kinds
    ideal = 2 * (PAYS["tokens"] // 4) * PAYS["top_k"] * PAYS["dim"] * 4  # dispatch + combine, float32
    assert ideal <= p.total_bytes <= 1.3 * ideal, (p.total_bytes, ideal)
    assert p.verify().ok

    # the same layer with torch._grouped_mm (bfloat16 there): the same collectives
    g, (gx,) = titan.make(**PAYS)
    gprog = from_torch(g, (gx,))
    gp = plan(gprog, mesh, style_pins(gprog, mesh, "ep"))
    assert [c.kind.value for c in gp.collectives] == kinds
    assert gp.total_bytes * 2 == p.total_bytes  # bf16 rows there, float32 here


# -- 3. loops that are not one expert run E times over the routed rows are refused, by name ----------
def assert_refused(m, x, *words, error=ProgramError):
    """Importing ``m`` raises ``error`` whose message has every one of ``words``; when it does not
    raise, the failure says how far the program it silently imported is from the module."""
    try:
        prog = from_torch(m, (x,))
    except error as e:
        msg = str(e)
        assert isinstance(e, ShardingError)
        missing = [w for w in words if w not in msg]
        assert not missing, (missing, msg)
        return msg
    with torch.no_grad():
        want = m(x)
    try:
        diff = float((run_unsharded(m, x, prog) - want).abs().max())
    except Exception as e:  # noqa: BLE001 - the import is already wrong; say how it ran
        diff = f"(run failed: {type(e).__name__}: {e})"
    pytest.fail(f"imported without an error: ops {targets(prog)}; unsharded run vs module: max |diff| {diff}")


BAD = {
    # (a) expert 0 runs relu where the others run silu
    "relu-in-expert-0": (dict(bad="relu0"), ["every expert must run the same ops", "relu", "sigmoid"]),
    # a constant that differs per expert
    "per-expert-constant": (dict(bad="scale", expert="relu"), ["differs from expert 0", "arguments"]),
    # (b) a per-expert bias xe @ w[e] + b[e]
    "per-expert-bias": (dict(bad="bias"), ["per-expert", "bias"]),
    # (c) expert e reads w[(e + 1) % E]
    "shifted-weights": (dict(bad="shifted"), ["w[e]", "expert 0 reads", "row 1"]),
    "shifted-weights-transposed": (dict(bad="shifted", layout="out_in"), ["w[e]", "expert 0 reads", "row 1"]),
    # (d) split sizes that are not the counts of these rows: cut at the wrong places
    "flipped-counts": (dict(bad="flipped_counts"), ["routed rows", "split sizes"]),
    "flipped-counts-nopad": (dict(bad="flipped_counts", pad=False, counts="bincount"), ["routed rows"]),
    "rows-sorted-descending": (dict(bad="descending"), ["routed rows"]),
    "counts-of-another-topk": (dict(bad="other_topk"), ["routed rows"]),
    "top1-counts-of-a-top2-routing": (dict(bad="top1_counts"), ["routed rows"]),
    "tokens-not-routed-rows": (dict(bad="unsorted", top_k=1), ["routed rows"]),
    # the outputs joined out of expert order
    "cat-in-reverse": (dict(bad="reversed"), ["torch.cat", "expert order"]),
    # (f) an expert's hidden rows used after the loop
    "hidden-rows-leak": (dict(bad="leak"), ["used outside the loop", "expert 0"]),
    "hidden-rows-leak-nopad": (dict(bad="leak", pad=False, expert="relu"), ["used outside the loop"]),
}


@pytest.mark.parametrize("kw,words", list(BAD.values()), ids=list(BAD))
def test_a_loop_that_is_not_one_expert_over_the_routed_rows_is_refused_by_name(kw, words):
    m, x = build(**kw)
    msg = assert_refused(m, x, "per-expert loop at node", *words)
    assert "split_with_sizes" in msg  # the loop's node
    assert "\n" not in msg


class GroupedOtherCounts(titan.TitanMoE):
    """The grouped form (``torch._grouped_mm``) with offsets from the counts of another top-k (the
    least likely experts) than the one the rows are sorted by: program.routing must not read them as
    this routing's offsets (its docstring: "left as it is")."""

    def forward(self, x):
        probs = torch.softmax(self.router(x), dim=1)
        top, idx = torch.topk(probs, self.top_k, dim=1)
        flat = idx.view(-1)
        other = torch.topk(-probs, self.top_k, dim=1)[1].reshape(-1)
        counts = torch.histc(other.float(), bins=self.experts, min=0, max=self.experts)
        order = torch.argsort(flat, stable=True)
        token = order // self.top_k
        offs = torch.cumsum(counts.to(torch.int32), dim=0, dtype=torch.int32)
        h = F.silu(torch._grouped_mm(x[token].bfloat16(), self.w1.bfloat16(), offs=offs))
        ys = torch._grouped_mm(h, self.w2.bfloat16(), offs=offs).float() * top.view(-1)[order].unsqueeze(-1)
        return torch.zeros_like(x).index_add(0, token, ys)


def test_grouped_mm_offsets_of_another_topk_are_not_read_as_the_routings():
    torch.manual_seed(0)
    m, x = GroupedOtherCounts(dim=16, experts=4, ffn=32, top_k=2), torch.randn(32, 16)
    with torch.no_grad():
        want = m(x).numpy()
    prog = from_torch(m, (x,))
    mesh = Mesh.parse("ep=1")
    p = plan(prog, mesh, style_pins(prog, mesh, "ep"))
    inputs = {n: t.detach().numpy() for n, t in m.named_parameters()}
    inputs["x"] = x.numpy()
    got = reference_run(p, inputs)[prog.outputs[0]]  # numpy, float32 where the module rounds to bf16
    ok = np.allclose(got, want, rtol=2e-2, atol=2e-2)
    assert ok, f"unsharded run vs module: max |diff| {float(np.abs(got - want).max())}; ops {targets(prog)}"
    assert "route" not in targets(prog) and "_grouped_mm" in targets(prog)


class ItemSlice(nn.Module):
    """A plain ``.item()`` outside any loop: rows cut to a data-dependent length."""

    def forward(self, x, k):
        n = k.sum().item()
        torch._check(n >= 0)
        torch._check(n <= x.shape[0])
        return x[:n] * 2


def test_an_item_outside_any_loop_is_unsupported_naming_item():
    with pytest.raises(UnsupportedOp) as err:
        from_torch(ItemSlice(), (torch.randn(8, 4), torch.tensor([1, 2])))
    msg = str(err.value)
    assert ".item()" in msg and "_local_scalar_dense" in msg and "per-expert loop" in msg
    assert "test_expert_loop.py" in msg  # the source line


# -- 4. the CLI --------------------------------------------------------------------------------------
MODULE = '''
import importlib.util

_spec = importlib.util.spec_from_file_location("titan_moe_cli_{tag}", {titan!r})
titan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(titan)


class Bad(titan.TitanMoE):
    """The loop with relu in expert 0 and silu in the others."""

    def forward(self, x):
        import torch
        import torch.nn.functional as F

        probs = torch.softmax(self.router(x), dim=1)
        top, idx = torch.topk(probs, self.top_k, dim=1)
        flat = idx.view(-1)
        counts = torch.histc(flat.float(), bins=self.experts, min=0, max=self.experts)
        order = torch.argsort(flat, stable=True)
        token = order // self.top_k
        xs = x[token]
        outs = []
        for e, xe in enumerate(torch.split(xs, counts.to(torch.int64).tolist())):
            act = F.relu if e == 0 else F.silu
            outs.append((act(xe @ self.w1[e]) * (xe @ self.w3[e])) @ self.w2[e])
        ys = torch.cat(outs) * top.view(-1)[order].reshape(-1, 1)
        return torch.zeros_like(x).scatter_add(0, token.reshape(-1, 1).expand(-1, x.shape[1]), ys)


SIZES = {sizes!r}


def make_small():
    return titan.make_loop(**SIZES)


def make_bad():
    import torch

    torch.manual_seed(0)
    sizes = dict(SIZES)
    tokens = sizes.pop("tokens")
    m = Bad(**sizes)
    return m, (torch.randn(tokens, sizes["dim"]),)
'''


def _module_file(tmp_path, tag: str) -> Path:
    path = tmp_path / f"loop_moe_{tag}.py"
    path.write_text(textwrap.dedent(MODULE.format(tag=tag, titan=str(TITAN), sizes=PAYS)))
    return path


def test_cli_plans_the_loop_with_only_all_to_alls(tmp_path, capsys):
    path = _module_file(tmp_path, "ok")
    assert main(["plan", "--module", f"{path}:make_small", "--mesh", "ep=4", "--style", "ep", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    kinds = [c["kind"] for c in out["collectives"]]
    assert kinds and set(kinds) == {"all_to_all"}, kinds
    ideal = 2 * (PAYS["tokens"] // 4) * PAYS["top_k"] * PAYS["dim"] * 4
    assert ideal <= out["total_bytes"] <= 1.3 * ideal, (out["total_bytes"], ideal)


def test_cli_refuses_a_bad_loop_with_one_error_line(tmp_path, capsys):
    path = _module_file(tmp_path, "bad")
    assert main(["plan", "--module", f"{path}:make_bad", "--mesh", "ep=4", "--style", "ep"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardlayout: error:"), err
    assert "every expert must run the same ops" in lines[0] and "split_with_sizes" in lines[0]
