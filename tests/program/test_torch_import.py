"""from_torch: the exported Llama block plans like the builder model and verifies on every rank."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shardlayout import Mesh, Sharding, UnsupportedOp  # noqa: E402
from shardlayout.plan import plan  # noqa: E402
from shardlayout.program.models import llama, style_pins  # noqa: E402
from shardlayout.program.torch_import import from_torch  # noqa: E402
from shardlayout.program.torch_models import LlamaTorch  # noqa: E402


@pytest.fixture(scope="module")
def exported():
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    return from_torch(LlamaTorch(2), (torch.randn(2, 8, 16), torch.randn(8, 4), torch.randn(8, 4)))


def test_parameters_keep_their_qualified_names(exported):
    params = exported.inputs("param")
    assert "layers.0.wq" in params and "layers.1.w_down" in params
    assert exported.inputs("input") == ["x", "cos", "sin"]


@pytest.mark.parametrize("style", ["megatron", "megatron-sp", "dp", "fsdp"])
def test_exported_and_builder_models_plan_the_same_collectives(exported, style):
    m = Mesh.parse("dp=2,tp=4")
    built = llama(layers=2)
    a = plan(exported, m, style_pins(exported, m, style))
    b = plan(built, m, style_pins(built, m, style))
    assert a.counts() == b.counts()
    assert sorted((c.kind, c.axes, c.bytes) for c in a.collectives) == sorted(
        (c.kind, c.axes, c.bytes) for c in b.collectives)
    # the same plan JSON for everything a user sets up and pays for (the full graphs differ:
    # torch.export decomposes SDPA into some twenty ops)
    assert a.summary_json() == b.summary_json()
    assert a.verify().ok


def test_unsupported_op_names_the_node():
    class Odd(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.qr(x)[0]

    with pytest.raises(UnsupportedOp, match="has no sharding rule"):
        from_torch(Odd(), (torch.randn(4, 4),))


def test_a_clamp_by_tensor_bounds_imports_and_plans_as_torch_computes_it():
    """``clamp(x, min=tensor, max=tensor)`` (PhiMoE's router) is read through torch's own
    decomposition (where / ge / le): planned on a row cut with no collective, and the whole
    program's simulation equals torch's clamp."""
    from shardlayout import Sharding
    from shardlayout.execute.verify import reference_run

    class Clamped(torch.nn.Module):
        def forward(self, x, lo, hi):
            return torch.clamp(x, min=lo, max=hi) * 2

    x, lo, hi = torch.randn(4, 8), torch.randn(4, 1) - 0.5, torch.randn(1, 8) + 0.5
    prog = from_torch(Clamped(), (x, lo, hi))
    assert "clamp" not in {op.target.split(".")[-2] for op in prog.ops if op.target.startswith("aten.")}
    m = Mesh.parse("tp=2")
    p = plan(prog, m, {"x": Sharding.parse("[tp*2, 8]", m), "lo": Sharding.parse("[tp*2, 1]", m)})
    assert p.collectives == [] and p.verify().ok
    names = [t for t in prog.inputs()]  # x, lo, hi as torch.export names them
    got = reference_run(p, dict(zip(names, (x.numpy(), lo.numpy(), hi.numpy()))))
    assert np.allclose(got[prog.outputs[0]], (torch.clamp(x, min=lo, max=hi) * 2).numpy())


def test_exported_moe_plans_expert_parallel_and_verifies():
    from shardlayout.program.torch_models import MoETorch

    prog = from_torch(MoETorch(), (torch.randn(16, 16),))
    m = Mesh.parse("ep=4")
    p = plan(prog, m, style_pins(prog, m, "ep"))
    assert p.verify().ok and p.shardings["experts.w1"].dims[0][0].axis == "ep"


def test_a_forward_torch_export_cannot_trace_is_one_line_naming_the_models_line(tmp_path, capsys):
    """torchtitan's FlexAttention models assert on a block mask export cannot build: exit 2, one line
    naming the module class and the model's own source line, never an internal error."""
    from shardlayout.cli import main

    f = tmp_path / "needs_mask.py"
    f.write_text("import torch\n\nclass NeedsMask(torch.nn.Module):\n    def forward(self, x, mask=None):\n"
                 "        assert mask is not None, 'mask must be a BlockMask'\n        return x\n\n"
                 "def make():\n    return NeedsMask(), (torch.ones(2, 4),)\n")
    assert main(["plan", "--module", f"{f}:make", "--mesh", "tp=2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torch.export could not trace the module (NeedsMask)" in err, err
    assert f"{f}:5" in err and "mask must be a BlockMask" in err, err


def test_grouped_query_attention_imports_as_the_call_torch_computes():
    """``scaled_dot_product_attention(..., enable_gqa=True)`` (k and v with fewer heads, as
    torchtitan calls it) becomes k and v repeated to the query heads, then the plain call: run on
    torch, the program gives the module's own output."""
    import torch

    from shardlayout import Mesh
    from shardlayout.execute.verify import reference_run
    from shardlayout.ops import canonical_op_name
    from shardlayout.plan import plan
    from shardlayout.run.torch_ops import torch_op

    from .zoo import make_titan3_llama

    model, (tokens,) = make_titan3_llama(1)
    prog = from_torch(model, (tokens,))
    sdpa = [op for op in prog.ops if canonical_op_name(op.target) == "scaled_dot_product_attention"]
    assert sdpa and not any(dict(op.params).get("enable_gqa") for op in sdpa)
    q, k = (prog.tensors[n].shape for n in sdpa[0].inputs[:2])
    assert q[1] == k[1] == 4  # the kv heads repeated to the query heads
    p = plan(prog, Mesh.parse("dp=1"))
    values = {n: v.detach() for n, v in model.named_parameters()}
    values.update({n: v for n, v in model.named_buffers()})
    values[prog.inputs("input")[0]] = tokens
    got = reference_run(p, values, torch_op, torch)[prog.outputs[0]]
    with torch.no_grad():
        want = model(tokens)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_grouped_query_attention_on_3d_tensors_is_one_error_naming_the_node():
    import torch
    import torch.nn.functional as F

    from shardlayout.program import ProgramError

    class ThreeD(torch.nn.Module):
        def forward(self, q, k):
            return F.scaled_dot_product_attention(q, k, k, enable_gqa=True)

    with pytest.raises(ProgramError, match=r"node 'scaled_dot_product_attention'.*must be \[batch, heads, seq"):
        from_torch(ThreeD(), (torch.randn(4, 6, 2), torch.randn(2, 6, 2)))


def _flat(p):
    from shardlayout.program import Program

    return Program(p.tensors, p.ops, p.outputs, p.symbols, p.sym_shapes, p.facts, p.notes)


@pytest.mark.parametrize("style,mesh", [("megatron-sp", "dp=2,tp=4"), ("fsdp", "dp=4")])
def test_an_imported_models_layers_are_one_block_planned_as_every_op(style, mesh):
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    model = LlamaTorch(7)
    prog = from_torch(model, (torch.randn(2, 8, 16), torch.randn(8, 4), torch.randn(8, 4)))
    cp, rep = prog.repeated  # found after the fact: ops named by module path, layers.{i}.…
    assert "ops" not in prog.__dict__  # nothing expanded by the import
    assert rep.prefix == "layers" and rep.count == 7 and len(cp.ops) < len(prog.ops)
    assert set(prog.inputs("param")) == {n for n, _ in model.named_parameters()}
    m = Mesh.parse(mesh)
    pins = style_pins(prog, m, style)
    got = plan(prog, m, pins)
    assert got.repeated is not None
    want = plan(_flat(prog), m, pins)  # the oracle: every op planned
    assert got.to_json(include_timing=False) == want.to_json(include_timing=False)
    assert got.verify().ok


def test_an_imported_model_with_one_layer_unlike_the_others_is_planned_op_by_op():
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    model = LlamaTorch(7)
    model.layers[5].causal = False  # layer 5 attends without the causal mask
    prog = from_torch(model, (torch.randn(2, 8, 16), torch.randn(8, 4), torch.randn(8, 4)))
    assert prog.repeated is None
    m = Mesh.parse("tp=2")
    assert plan(prog, m, style_pins(prog, m, "megatron")).verify().ok


def test_dropout_in_training_mode_is_a_draw_each_rank_keeps_its_piece_of():
    """A module in training mode (dropout on, as ``Model(config)`` leaves it): each dropout's mask is
    a uniform draw, a program input of kind ``rand`` of the global shape (attention's ``[b, h, s, t]``
    inside SDPA); Megatron plans the collectives of the module in eval mode, and the plan verifies
    (every rank's piece of one global draw)."""
    from .zoo import BATCH, HEADS, SEQ, make_dropout

    module, args = make_dropout()
    prog = from_torch(module, args)
    draws = {n: prog.tensors[n].shape for n in prog.inputs("rand")}
    assert len(draws) == 1 + 3 * 2  # the embeddings' sum, and per layer two branches and the attention
    assert sorted(draws.values()).count((BATCH, HEADS, SEQ, SEQ)) == 2
    mesh = Mesh.parse("tp=2")
    p = plan(prog, mesh, style_pins(prog, mesh, "megatron"))
    v = p.verify()
    assert v.ok, v.message
    eval_prog = from_torch(module.eval(), args)
    want = plan(eval_prog, mesh, style_pins(eval_prog, mesh, "megatron"))
    assert [c.kind for c in p.collectives] == [c.kind for c in want.collectives]
    for n, shape in draws.items():
        if len(shape) == 4:  # attention's draw is cut as its heads are
            assert p.shardings[n].local_shape(0) == (BATCH, HEADS // 2, SEQ, SEQ)


def test_dropout_draws_keep_the_symbolic_batch():
    """Exported with a dynamic batch, every draw (attention's written out too) is symbolic in it."""
    from torch.export import Dim

    from .zoo import make_dropout

    module, args = make_dropout()
    prog = from_torch(module, args, {"ids": {0: Dim("batch", min=2, max=64)}})
    draws = prog.inputs("rand")
    assert len(draws) == 7 and all(str(prog.sym_shape(n)[0]) == "batch" for n in draws)
    mesh = Mesh.parse("dp=2")
    p = plan(prog, mesh, style_pins(prog, mesh, "dp"))
    assert p.verify().ok


@pytest.mark.parametrize("causal", [False, True])
def test_a_dropout_program_keeping_every_element_is_the_module_without_dropout(causal):
    """The draws' reading checked against torch: with every draw 1 (every element kept) and p tiny
    (scale 1 / (1 - p) ~ 1), the unsharded program computes the module's eval-mode output (SDPA
    with a boolean mask, or with ``is_causal=True``: the mask written out)."""
    from shardlayout.execute.verify import reference_run

    from .zoo import make_dropout

    module, (ids,) = make_dropout(p=1e-9, causal=causal)
    prog = from_torch(module, (ids,))
    mesh = Mesh.parse("tp=1")
    p = plan(prog, mesh, {})
    params = dict(module.named_parameters()) | dict(module.named_buffers())
    inputs = {}
    for n in prog.inputs():
        t = prog.tensors[n]
        inputs[n] = np.ones(t.shape) if t.kind == "rand" else \
            ids.numpy().astype(np.float64) if t.kind == "input" else params[n].detach().double().numpy()
    got = reference_run(p, inputs)[prog.outputs[0]]
    module.eval()
    with torch.no_grad():
        want = module(ids).double().numpy()
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(AssertionError):  # every element dropped instead: another output
        inputs = {n: (np.zeros(v.shape) if prog.tensors[n].kind == "rand" else v) for n, v in inputs.items()}
        assert np.allclose(reference_run(p, inputs)[prog.outputs[0]], want, rtol=1e-4, atol=1e-5)


def test_a_jitter_drawn_in_place_is_a_rescaled_draw():
    """``torch.empty_like(x).uniform_(lo, hi)`` (Mixtral's router jitter in training mode) is
    ``lo + (hi - lo) * draw``: with the draw at 0.5 the factor is 1 and the program computes the
    module without jitter; at 0 it is ``lo``."""
    from shardlayout.execute.verify import reference_run

    class Jitter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(8, 8, bias=False)

        def forward(self, x):
            x = x * torch.empty_like(x).uniform_(0.8, 1.2)
            return self.w(x)

    torch.manual_seed(0)
    module, x = Jitter().train(), torch.randn(4, 8)
    prog = from_torch(module, (x,))
    (draw,) = prog.inputs("rand")
    assert prog.tensors[draw].shape == (4, 8)
    p = plan(prog, Mesh.parse("dp=2"), {prog.inputs("input")[0]: Sharding.parse("[dp*2, 8]", Mesh.parse("dp=2"))})
    assert p.verify().ok
    w = module.w.weight.detach().double().numpy()
    for level, factor in ((0.5, 1.0), (0.0, 0.8)):
        got = reference_run(p, {prog.inputs("input")[0]: x.double().numpy(), "w.weight": w,
                                draw: np.full((4, 8), level)})[prog.outputs[0]]
        assert np.allclose(got, factor * x.double().numpy() @ w.T)
