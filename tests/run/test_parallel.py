"""``parallelize``: a plan as the user's module with DTensor parameters, trained with torch's optimizers.

Multi-process jobs (gloo, few and small) train N steps and compare every loss and the updated
parameters with the unsharded model trained alike in the same process, and the collectives counted
at the dispatcher with the planned ones. In-process checks (torch's fake process group: shapes and
structure, no data) cover the module's form and the refusals."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}


def _weights(path):
    """Random float64 weights of the built-in 1-layer Llama in safetensors (not the run's seeded ones)."""
    from safetensors.torch import save_file

    from shardlayout.program.models import llama

    prog = llama(layers=1)
    g = torch.Generator().manual_seed(11)
    save_file({n: torch.randn(prog.tensors[n].shape, generator=g, dtype=torch.float64)
               for n in prog.inputs("param")}, str(path))
    return path


@pytest.mark.parametrize("args,tol", [
    # (Megatron-SP on dp=2,tp=2 is trained by docs/train.md's `run --steps` example and tests/run/test_train.py)
    # uneven: 4 heads and 32 features on 3 ranks, from safetensors weights (each rank reads its pieces;
    # the unsharded reference reads them whole)
    (["--mesh", "tp=3", "--style", "megatron", "--layers", "1", "--dtype", "float64", "--weights", "WEIGHTS"], 1e-9),
    # expert parallelism: routed rows through two token all-to-alls, the reverse one backward (interpreted)
    (["--model", "moe", "--size", "tokens=256,dim=64,experts=8,ffn=128", "--mesh", "ep=4", "--style", "ep",
      "--dtype", "float64"], 1e-9),
    # a user's module (torchtitan's layout) through its own tp-plan, with SGD
    (["--module", "tests/program/zoo.py:make_titan_llama", "--tp-plan", "examples/titan_sp_tp.json", "--mesh",
      "tp=2", "--optimizer", "sgd", "--dtype", "float64"], 1e-9),
    # GPT-2: a causal mask torch.export lifts out of forward as a constant; float32 (SGD: AdamW turns the
    # rounding noise of a gradient that is exactly zero in exact arithmetic, the key bias's, into steps of lr)
    (["--module", "tests/program/zoo.py:make_gpt2", "--style", "megatron", "--mesh", "tp=2", "--optimizer", "sgd"],
     1e-5),
])
def test_training_steps_equal_the_unsharded_model_and_run_the_planned_collectives(args, tol, tmp_path, run_json):
    if "WEIGHTS" in args:
        args = [str(_weights(tmp_path / "w.safetensors")) if a == "WEIGHTS" else a for a in args]
    rep = run_json(*args, "--steps", "6")
    if "--weights" in args:
        assert rep["weights"]["bytes_read"] < rep["weights"]["bytes_total"]
    assert rep["equal"], rep
    assert len(rep["losses"]) == len(rep["reference_losses"]) == 6
    assert rep["max_loss_rel_err"] <= tol and rep["max_param_rel_err"] <= tol
    assert rep["losses"][0] != rep["losses"][-1]  # the optimizer moved the parameters
    # counted at the dispatcher (functional collectives), forward and backward apart
    assert rep["collectives"] == rep["planned_collectives"]
    assert sum(rep["collectives"]["forward"].values()) > 0 and sum(rep["collectives"]["backward"].values()) > 0


STREAMED = ["--model", "llama", "--layers", "1", "--size", "dim=128,seq=512,batch=1,heads=4,ffn=256", "--mesh", "tp=2",
            "--style", "megatron-sp", "--flop-rate", "1e12", "--dtype", "float64"]  # 1 TFLOP/s: streams pay


def test_stream_choices_train_chunk_by_chunk_in_the_generated_program(run_json):
    rep = run_json(*STREAMED, "--steps", "3")
    assert rep["equal"] and rep["max_loss_rel_err"] <= 1e-9 and rep["max_param_rel_err"] <= 1e-9, rep
    assert rep["streams"] and {st["side"] for st in rep["streams"]} == {"before", "after"}
    # each chunk's collectives, forward and backward, counted at the dispatcher
    assert rep["collectives"] == rep["planned_collectives"]
    assert rep["collectives"]["forward"]["all_gather"] >= sum(st["chunks"] for st in rep["streams"]
                                                              if st["side"] == "before")


def test_compiled_training_equals_the_unsharded_model(run_json):
    # stream chunks' issue and wait as separate nodes; inductor's compile takes ~25 s on a quiet 2-core machine,
    # several times that while other jobs load it: the run's own 60 s default would stop it
    rep = run_json(*STREAMED, "--steps", "3", "--compile", "--timeout", "300")
    assert rep["equal"] and rep["compile"] and rep["streams"] and rep["max_loss_rel_err"] <= 1e-9, rep


def test_the_python_example_trains_a_meta_model_too_big_for_the_memory_limit_as_the_unsharded_one(tmp_path):
    """examples/train.py (docs/train.md) under torchrun, as a user starts it: a Llama (4 layers,
    d=1024: 160 MiB of float32 weights; unsharded AdamW training holds 4x that) built on meta, its
    weights from safetensors shards (a file per layer, each mapped while read), Megatron on tp=4;
    each rank under a 500 MiB address-space limit
    above its start allocates and reads only its pieces, and the losses equal the unsharded model's."""
    from safetensors.torch import save_file

    from shardlayout.program.torch_models import LlamaTorch

    torch.manual_seed(0)
    model = LlamaTorch(layers=4, dim=1024, heads=4, ffn=2048)
    weights, index = tmp_path / "weights", {}  # Hugging Face's layout: a shard per layer and an index
    weights.mkdir()
    for i in range(4):
        part = {n: p.detach().contiguous() for n, p in model.state_dict().items() if n.startswith(f"layers.{i}.")}
        save_file(part, str(weights / f"model-{i + 1:05d}-of-00004.safetensors"))
        index.update({n: f"model-{i + 1:05d}-of-00004.safetensors" for n in part})
    (weights / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    torchrun = Path(sys.executable).with_name("torchrun")
    limit = 500
    r = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "4", "examples/train.py", "--meta",
                        "--dim", "1024", "--layers", "4", "--mesh", "tp=4", "--style", "megatron", "--steps", "2",
                        "--weights", str(weights), "--memory-limit-mb", str(limit)],
                       capture_output=True, text=True, timeout=300, env={**ENV, "MALLOC_ARENA_MAX": "2"}, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r"parameters: ([\d.]+) MiB in all, ([\d.]+) MiB on rank 0; rank 0's peak resident memory "
                  r"([\d.]+) MiB above its start, the plan's estimate ([\d.]+) MiB per device", r.stdout)
    full, mine, peak, planned = (float(v) for v in m.groups())
    assert full == 160.0 and mine == 40.0
    assert 4 * full > limit  # weights, gradients and two AdamW moments unsharded: beyond the limit
    assert peak < limit
    assert "layers.0.wq: (1024, 1024) (Shard(dim=1),), local (1024, 256)" in r.stdout  # column-parallel
    got = [float(v) for v in re.findall(r"step \d+: loss ([-\d.e]+)", r.stdout)]
    torch.manual_seed(0)  # the example's batch after its (meta) model: the same draws
    x, cos, sin = torch.randn(4, 16, 1024), torch.randn(16, 256), torch.randn(16, 256)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    want = []
    for _ in range(2):
        loss = model(x, cos, sin).pow(2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        want.append(loss.item())
    assert len(got) == 2 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, want)), (got, want)


# ------------------------------------------------------------------------------------------
# in one process: torch's fake process group (shapes, no data)
# ------------------------------------------------------------------------------------------


def _llama():
    from shardlayout.program.torch_models import LlamaTorch

    torch.manual_seed(0)
    return LlamaTorch(layers=1, dim=16, heads=4, ffn=32), (torch.randn(4, 8, 16), torch.randn(8, 4),
                                                           torch.randn(8, 4))


@pytest.mark.parametrize("rank", [0, 3])
def test_parameters_are_dtensors_with_the_plans_placements_under_the_users_names(fake_world, rank):
    from torch.distributed.tensor import DTensor

    import shardlayout
    from shardlayout.sharding.placements import to_dtensor

    fake_world(4, rank)
    model, args = _llama()
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    pmod = shardlayout.parallelize(model, "dp=2,tp=2", style="megatron-sp", example_inputs=args)
    assert isinstance(pmod, shardlayout.ParallelModule)
    assert list(pmod.state_dict()) == list(full)  # the user's FQNs, nothing added
    plan = pmod.plan
    for name, p in pmod.named_parameters():
        s = plan.shardings[name]
        assert isinstance(p, torch.nn.Parameter) and isinstance(p, DTensor)
        assert tuple(p.placements) == tuple(to_dtensor(s)) and tuple(p.shape) == s.shape
        local = p.to_local()
        assert tuple(local.shape) == s.local_shape(rank)
        assert torch.equal(local, full[name][torch.meshgrid(*[torch.tensor(list(i)) for i in s.indices(rank)],
                                                            indexing="ij")])
    # the per-rank program: one module per planned collective, one per planned gradient sum
    mods = dict(pmod.program.named_children())
    moves = [m for n, m in mods.items() if n.startswith("move_")]
    comm = [c for c in plan.collectives if c.kind.communicates]
    assert sorted(m.kind.value for m in moves if m.kind.communicates) == sorted(c.kind.value for c in comm)
    from shardlayout.run.backward import gradient_reductions

    assert sum(n.startswith("grad_sum_") for n in mods) == len(gradient_reductions(plan))
    out = pmod(*args)
    assert isinstance(out, DTensor) and tuple(out.shape) == plan.program.tensors[plan.program.outputs[0]].shape


def test_inputs_are_taken_global_local_or_as_dtensors(fake_world):
    import shardlayout

    fake_world(2)
    model, (x, cos, sin) = _llama()
    pmod = shardlayout.parallelize(model, "dp=2", style="dp", example_inputs=(x, cos, sin), outputs="local")
    assert tuple(pmod(x, cos, sin).shape) == (2, 8, 16)  # the global batch: this rank's half
    assert tuple(pmod(x[:2], cos, sin).shape) == (2, 8, 16)  # this rank's half already
    with pytest.raises(shardlayout.ParallelizeError, match=r"input 'x' has shape \(3, 8, 16\).*\(4, 8, 16\)"):
        pmod(x[:3], cos, sin)


def test_refusals_name_what_is_wrong_and_the_fix(fake_world):
    import shardlayout
    from shardlayout import Mesh
    from shardlayout.plan import plan as make_plan
    from shardlayout.program.torch_import import from_torch

    fake_world(4)
    model, args = _llama()
    err = shardlayout.ParallelizeError
    with pytest.raises(err, match="mesh tp=2 has 2 devices but torch.distributed runs 4 ranks"):
        shardlayout.parallelize(model, "tp=2", style="megatron", example_inputs=args)
    with pytest.raises(err, match="needs example_inputs"):
        shardlayout.parallelize(model, "tp=4", style="megatron")
    with pytest.raises(err, match="takes an nn.Module"):
        shardlayout.parallelize(object(), "tp=4", style="megatron", example_inputs=args)
    with pytest.raises(err, match="streams='yes': give True"):
        shardlayout.parallelize(model, "tp=4", style="megatron", example_inputs=args, streams="yes")
    m = Mesh.parse("tp=4")
    p = make_plan(from_torch(model, args), m, {})
    with pytest.raises(err, match="either a plan or style"):
        shardlayout.parallelize(model, m, p, style="megatron", example_inputs=args)
    with pytest.raises(err, match="pins\\['layers.0.wq'\\]: give a Sharding"):
        shardlayout.parallelize(model, m, pins={"layers.0.wq": 5}, example_inputs=args)
    # pieces of one mesh axis in two dims: DTensor has no placements for it
    with pytest.raises(err, match=r"parameter 'layers.0.wq'.*no DTensor placements"):
        shardlayout.parallelize(model, m, pins={"layers.0.wq": "[tp:(1)2*8, tp:(2)2*8]"}, example_inputs=args)


def test_a_meta_device_module_gets_only_its_pieces_initialised_or_is_refused(fake_world):
    import shardlayout
    from shardlayout.program.torch_models import LlamaTorch

    fake_world(4, 1)
    args = (torch.randn(4, 8, 16), torch.randn(8, 4), torch.randn(8, 4))
    with torch.device("meta"):
        model = LlamaTorch(layers=1, dim=16, heads=4, ffn=32)
    with pytest.raises(shardlayout.ParallelizeError, match="meta device and has no way to initialise"):
        shardlayout.parallelize(model, "tp=4", style="megatron", example_inputs=args)
    seen = []

    def init(m):
        for p in m.parameters():
            seen.append(tuple(p.to_local().shape))
            p.fill_(0.5)

    pmod = shardlayout.parallelize(model, "tp=4", style="megatron", example_inputs=args, init_weights=init)
    wq = pmod.layers[0].wq
    assert wq.to_local().device.type == "cpu" and tuple(wq.to_local().shape) == (16, 4)
    assert (16, 4) in seen and bool((wq.to_local() == 0.5).all())


def test_the_forwards_output_structure_and_tied_weights_are_kept(fake_world):
    from torch import nn
    from torch.distributed.tensor import DTensor

    import shardlayout

    class Tied(nn.Module):  # an embedding tied to the output head, a dict returned (as Hugging Face models)
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 16)
            self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)
            self.head = nn.Linear(16, 32, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids):
            h = self.emb(ids)
            h = h + self.down(torch.relu(self.up(h)))
            return {"logits": self.head(h), "hidden": h, "note": None}

    fake_world(2)
    torch.manual_seed(0)
    model, ids = Tied(), torch.randint(0, 32, (4, 8))
    pmod = shardlayout.parallelize(model, "tp=2", style="megatron", example_inputs=(ids,),
                                   allow_unmatched=True)
    assert pmod.head.weight is pmod.emb.weight and isinstance(pmod.emb.weight, DTensor)
    assert "head.weight" not in dict(pmod.named_parameters())  # one parameter, as in the module
    out = pmod(ids)
    assert set(out) == {"logits", "hidden", "note"} and out["note"] is None
    assert tuple(out["logits"].shape) == (4, 8, 32) and isinstance(out["hidden"], DTensor)


def test_dropout_draws_agree_on_replicas_and_differ_between_pieces(fake_world):
    """A module in training mode: each dropout draw is made on every rank from the job's seed, the
    call and the piece the rank holds, so ranks holding the same piece (replicas, the residual
    stream's dropout on tp) draw the same mask and others (attention's, cut by heads) their own;
    a second call draws again."""
    import shardlayout
    from shardlayout.run.parallel import draws, local_draw

    sys.path.insert(0, str(ROOT / "tests" / "program"))
    from zoo import make_dropout

    fake_world(2)
    model, (ids,) = make_dropout()
    pmod = shardlayout.parallelize(model, "tp=2", style="megatron", example_inputs=(ids,), outputs="local")
    plan = pmod.plan
    d0, d1 = draws(plan, 0), draws(plan, 1)
    assert set(d0) == set(plan.program.inputs("rand")) and len(d0) == 7
    cut = {n for n in d0 if plan.shardings[n].local_shape(0) != plan.shardings[n].shape}
    assert len(cut) == 2  # the two attention draws, cut by heads
    for n in d0:
        assert (d0[n][3] == d1[n][3]) == (n not in cut)  # the same piece, the same key
        a, b = local_draw(d0[n], 7, 1), local_draw(d1[n], 7, 1)
        assert torch.equal(a, b) == (n not in cut) and tuple(a.shape) == plan.shardings[n].local_shape(0)
        assert 0 <= float(a.min()) and float(a.max()) < 1
        assert not torch.equal(a, local_draw(d0[n], 7, 2))  # every call draws again
    assert tuple(pmod(ids).shape) == plan.program.tensors[plan.program.outputs[0]].shape[:-1] + (16,)
    pmod.eval()  # the program holds the draws: refused, not silently still dropping
    with pytest.raises(shardlayout.ParallelizeError, match="eval mode but its plan was made in training mode"):
        pmod(ids)
