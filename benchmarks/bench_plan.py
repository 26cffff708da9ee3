"""Planning a Llama: shardlayout's build + plan vs DTensor's cold sharding propagation of the same
model under ``parallelize_module``, in the same run, for 1, 8, 32 and 80 layers.

Method (printed in the header too):

* Every measurement is a fresh Python process (imports paid before timing), and the processes
  alternate ours, DTensor, ours, DTensor ... ``ROUNDS`` times per layer count; medians with p25–p75.
* **ours**: a warm-up plan of a differently sized model pays one-time set-up, then
  ``shardlayout.caches.clear_caches()`` empties every memo; then timed: ``llama(layers=L)``
  (building the program: shape inference of every op) and ``plan(program, mesh, pins)`` with the
  ``megatron-sp`` pins on ``dp=2,tp=4`` (style_pins is not timed, like DTensor's
  ``parallelize_module``). From 6 layers on, the Llama's layers are a repeated block
  (``ProgramBuilder.repeat``): program and plan are made from instances 0-3 and the last, and
  the other layers' per-op records (ops, shardings, collectives, moves) are made the first time
  they are read; the column *first read* times reading all of them once, after the plan
  (DTensor's analogue, its per-op cache hits during the forward, is not timed on its side).
* **DTensor** (torch 2.13, fake process group of 8 ranks, meta tensors): the same Llama written
  as torchtitan writes it for DTensor (``nn.Linear`` weights, heads inferred locally with
  ``view(b, t, -1, hd)``), ``parallelize_module`` on the ``tp`` sub-mesh with torchtitan's
  sequence-parallel plan (``SequenceParallel`` norms, ``PrepareModuleInput`` Shard(1) -> Replicate,
  ``ColwiseParallel`` wq/wk/wv/w_gate/w_up, ``RowwiseParallel(output_layouts=Shard(1))`` wo/w_down),
  the batch split over ``dp`` as FSDP/DDP do (each dp rank runs batch / dp). A warm-up forward of a
  differently sized model, then both of DTensor's sharding-propagation caches are cleared
  (``torch._C._clear_DTensor_sharding_propagator_cache`` and the Python LRU). Timed: the time spent
  inside ``ShardingPropagator.propagate_op_sharding_non_cached`` (its strategy search and its
  fake-tensor shape inference) during one forward: DTensor's propagation only, not its kernels,
  redistributions or wrapping; its C++ cache hits cost nothing in this column (to its advantage).
  The whole meta forward is shown beside it for scale.
* Slope: (time at 80 layers - time at 8 layers) / 72, per side; ours also with the first read.
  Medians over fresh processes are noisy at this scale, so one more process measures ours at 8
  and 80 layers as the minimum of 10 cold runs each, repeated and with every layer materialised.

Run: ``python benchmarks/bench_plan.py [ROUNDS]`` (writes ``benchmarks/results/plan.md``).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import emit, spread  # noqa: E402

LAYERS = (1, 8, 32, 80)
ROUNDS = 5
MESH = "dp=2,tp=4"
STYLE = "megatron-sp"
B, T, D, HEADS, FFN = 2, 8, 16, 4, 32

OURS = f"""
import json, time
from shardlayout import Mesh
from shardlayout.caches import clear_caches
from shardlayout.plan import plan
from shardlayout.program.models import llama, style_pins
mesh = Mesh.parse({MESH!r})
warm = llama(layers=1, dim=32, heads=2, ffn=64)
plan(warm, mesh, style_pins(warm, mesh, {STYLE!r}))
clear_caches()
t0 = time.perf_counter()
prog = llama(layers=LAYERS, batch={B}, seq={T}, dim={D}, heads={HEADS}, ffn={FFN})
t1 = time.perf_counter()
pins = style_pins(prog, mesh, {STYLE!r})
t2 = time.perf_counter()
p = plan(prog, mesh, pins)
t3 = time.perf_counter()
n = len(p.collectives) + len(p.ops) + len(p.shardings) + len(p.moves) + len(prog.ops)  # every per-op record
t4 = time.perf_counter()
planned = len(p.repeated[0].ops) if p.repeated is not None else len(prog.ops)  # ops the planner visited
print(json.dumps({{"build": t1 - t0, "plan": t3 - t2, "read": t4 - t3, "collectives": len(p.collectives),
                  "planned": planned}}))
"""

DTENSOR = f"""
import json, time
import torch, torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)
from torch.distributed.tensor._sharding_prop import ShardingPropagator

class Norm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2.0).mean(-1, keepdim=True) + 1e-6) * self.weight

def rope(z, cos, sin):
    hd = z.shape[-1]
    rot = torch.cat([-z[..., hd // 2:], z[..., : hd // 2]], dim=3)
    return z * cos + rot * sin

class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.hd = d // heads
        for n in ("wq", "wk", "wv", "wo"):
            setattr(self, n, nn.Linear(d, d, bias=False))
    def forward(self, h, cos, sin):
        b, t, _ = h.shape
        q, k, v = (w(h).view(b, t, -1, self.hd).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=False)
        return self.wo(a.transpose(1, 2).reshape(b, t, -1))

class FeedForward(nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.w_gate, self.w_up = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False)
        self.w_down = nn.Linear(ffn, d, bias=False)
    def forward(self, h):
        return self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))

class Block(nn.Module):
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.attention_norm, self.attention = Norm(d), Attention(d, heads)
        self.ffn_norm, self.feed_forward = Norm(d), FeedForward(d, ffn)
    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))

class Llama(nn.Module):
    def __init__(self, layers, d, heads, ffn):
        super().__init__()
        self.layers = nn.ModuleList(Block(d, heads, ffn) for _ in range(layers))
    def forward(self, x, cos, sin):
        for blk in self.layers:
            x = blk(x, cos, sin)
        return x

dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
tp = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))["tp"]

def build(layers, d, heads, ffn, batch, seq):
    with torch.device("meta"):
        model = Llama(layers, d, heads, ffn)
    plan = {{}}
    for i in range(layers):
        p = f"layers.{{i}}"
        plan[f"{{p}}.attention_norm"] = SequenceParallel()
        plan[f"{{p}}.attention"] = PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                      desired_input_layouts=(Replicate(), None, None),
                                                      use_local_output=LOCAL)
        plan[f"{{p}}.ffn_norm"] = SequenceParallel()
        plan[f"{{p}}.feed_forward"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                         desired_input_layouts=(Replicate(),),
                                                         use_local_output=LOCAL)
        for n in ("wq", "wk", "wv"):
            plan[f"{{p}}.attention.{{n}}"] = ColwiseParallel(use_local_output=LOCAL)
        plan[f"{{p}}.attention.wo"] = RowwiseParallel(output_layouts=Shard(1), use_local_output=LOCAL)
        plan[f"{{p}}.feed_forward.w_gate"] = ColwiseParallel(use_local_output=LOCAL)
        plan[f"{{p}}.feed_forward.w_up"] = ColwiseParallel(use_local_output=LOCAL)
        plan[f"{{p}}.feed_forward.w_down"] = RowwiseParallel(output_layouts=Shard(1), use_local_output=LOCAL)
    parallelize_module(model, tp, plan)
    hd = d // heads
    x = torch.empty(batch, seq // 4, d, device="meta")  # this rank's sequence shard, as torchtitan's residual
    cos = torch.empty(seq, hd, device="meta")  # plain, as torchtitan passes freqs_cis
    sin = torch.empty(seq, hd, device="meta")
    if not LOCAL:  # every op on DTensors: the residual stream Shard(1), the rotary tables replicated
        x = DTensor.from_local(x, tp, [Shard(1)], run_check=False)
        cos = DTensor.from_local(cos, tp, [Replicate()], run_check=False)
        sin = DTensor.from_local(sin, tp, [Replicate()], run_check=False)
    return model, (x, cos, sin)

spent = [0.0, 0]
orig = ShardingPropagator.propagate_op_sharding_non_cached
def timed(self, schema):
    t0 = time.perf_counter()
    try:
        return orig(self, schema)
    finally:
        spent[0] += time.perf_counter() - t0
        spent[1] += 1
ShardingPropagator.propagate_op_sharding_non_cached = timed

warm, wargs = build(1, 32, 4, 64, {B // 2}, {T})
with torch.no_grad():
    warm(*wargs)
torch._C._clear_DTensor_sharding_propagator_cache()
DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
model, args = build(LAYERS, {D}, {HEADS}, {FFN}, {B // 2}, {T})
spent[:] = [0.0, 0]
t0 = time.perf_counter()
with torch.no_grad():
    model(*args)
t1 = time.perf_counter()
print(json.dumps({{"propagation": spent[0], "misses": spent[1], "forward": t1 - t0}}))
"""


def _run(code: str, layers: int, local: bool = False) -> dict:
    code = code.replace("LAYERS", str(layers)).replace("LOCAL", str(local))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"benchmark child failed ({layers} layers):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


STEADY = f"""
import json, time
from shardlayout import Mesh
from shardlayout.caches import clear_caches
from shardlayout.plan import plan
from shardlayout.program import Program
from shardlayout.program.models import llama, style_pins
mesh = Mesh.parse({MESH!r})
warm = llama(layers=1, dim=32, heads=2, ffn=64)
plan(warm, mesh, style_pins(warm, mesh, {STYLE!r}))
res = {{}}
for r in range(10):
    for layers in (8, 80):
        for whole in (False, True):
            prog = llama(layers=layers, batch={B}, seq={T}, dim={D}, heads={HEADS}, ffn={FFN})
            if whole:  # every layer materialised: planned op by op
                prog = Program(prog.tensors, prog.ops, prog.outputs)
            pins = style_pins(prog, mesh, {STYLE!r})
            clear_caches()
            t0 = time.perf_counter()
            p = plan(prog, mesh, pins)
            t1 = time.perf_counter()
            n = len(p.collectives) + len(p.ops) + len(p.shardings) + len(p.moves) + len(prog.ops)
            t2 = time.perf_counter()
            res.setdefault(f"{{layers}} {{whole}}", []).append((t1 - t0, t2 - t1))
print(json.dumps({{k: [min(x[0] for x in v), min(x[1] for x in v)] for k, v in res.items()}}))
"""

IMPORTED = f"""
import json, time, warnings
warnings.filterwarnings("ignore")
import torch
from shardlayout import Mesh
from shardlayout.caches import clear_caches
from shardlayout.plan import plan
from shardlayout.program import Program
from shardlayout.program.models import llama, style_pins
from shardlayout.program.torch_import import export_module, from_exported
from shardlayout.program.torch_models import LlamaTorch
mesh = Mesh.parse({MESH!r})
warm = llama(layers=1, dim=32, heads=2, ffn=64)
plan(warm, mesh, style_pins(warm, mesh, {STYLE!r}))
with torch.device("meta"):
    model = LlamaTorch(LAYERS, dim={D}, heads={HEADS}, ffn={FFN})
args = tuple(torch.empty(s, device="meta") for s in (({B}, {T}, {D}), ({T}, {D // HEADS}), ({T}, {D // HEADS})))
t0 = time.perf_counter()
ep = export_module(model, args)
t1 = time.perf_counter()
prog = from_exported(ep)
t2 = time.perf_counter()
pins = style_pins(prog, mesh, {STYLE!r})
clear_caches()
t3 = time.perf_counter()
p = plan(prog, mesh, pins)
t4 = time.perf_counter()
flat = Program(prog.tensors, prog.ops, prog.outputs)  # every op: the plan without the repeated block
clear_caches()
t5 = time.perf_counter()
q = plan(flat, mesh, pins)
t6 = time.perf_counter()
print(json.dumps({{"export": t1 - t0, "import": t2 - t1, "plan": t4 - t3, "every_op": t6 - t5, "ops": len(prog.ops),
                  "repeated": prog.repeated is not None,
                  "same": p.to_json(include_timing=False) == q.to_json(include_timing=False)}}))
"""
IMPORT_LAYERS = (8, 32, 80)

# Llama-3-8B's config through `plan --hf` (transformers' own class on meta), as a user runs it
HF8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)


def _hf_8b() -> dict:
    """Wall seconds of ``shardlayout plan --hf`` on Llama-3-8B's config (dp=8,tp=8, megatron, batch 8 x
    seq 2048): a fresh process with the import cache off, then two with it on (the first fills it)."""
    import os
    import tempfile
    import time

    out = {}
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-c", "import sys, json, transformers; "
                        "transformers.LlamaConfig(**json.loads(sys.argv[1])).save_pretrained(sys.argv[2])",
                        json.dumps(HF8B), d + "/llama3-8b"], check=True, capture_output=True)
        argv = [sys.executable, "-m", "shardlayout", "plan", "--hf", d + "/llama3-8b", "--mesh", "dp=8,tp=8",
                "--style", "megatron", "--size", "batch=8,seq=2048", "--json"]
        for name, cache in (("cold", "off"), ("fill", d + "/cache"), ("warm", d + "/cache")):
            t0 = time.perf_counter()
            r = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "SHARDLAYOUT_CACHE_DIR": cache})
            out[name] = time.perf_counter() - t0
            if r.returncode != 0:
                raise SystemExit(f"plan --hf failed:\n{r.stderr[-2000:]}")
            out[f"{name}_collectives"] = len(json.loads(r.stdout)["collectives"])
    return out

SIDES = (("ours", OURS, False), ("dt", DTENSOR, False), ("tt", DTENSOR, True))


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else ROUNDS
    res: dict = {L: {s: [] for s, _, _ in SIDES} for L in LAYERS}
    for r in range(rounds):
        for L in LAYERS:
            order = SIDES[r % 3:] + SIDES[:r % 3]  # rotate which side runs first
            for side, code, local in order:
                res[L][side].append(_run(code, L, local))
    rows, med = [], {}
    for L in LAYERS:
        ours, dt, tt = res[L]["ours"], res[L]["dt"], res[L]["tt"]
        pl = [o["plan"] for o in ours]
        tot = [o["build"] + o["plan"] for o in ours]
        full = [o["build"] + o["plan"] + o["read"] for o in ours]
        prop = [d["propagation"] for d in dt]
        med[L] = {k: statistics.median(v) for k, v in
                  (("tot", tot), ("plan", pl), ("dt", prop), ("tt", [d["propagation"] for d in tt]),
                   ("fwd", [d["forward"] for d in dt]), ("full", full))}
        rows.append([L, 50 * L, ours[0]["planned"], spread([o["build"] for o in ours], 1e3),
                     spread(pl, 1e3), spread(tot, 1e3), spread([o["read"] for o in ours], 1e3),
                     f"{spread(prop, 1e3)} [{dt[0]['misses']}]",
                     f"{med[L]['dt'] / med[L]['tot']:.2f}x", f"{med[L]['dt'] / med[L]['plan']:.2f}x",
                     f"{spread([d['propagation'] for d in tt], 1e3)} [{tt[0]['misses']}]",
                     spread([d["forward"] for d in dt], 1e3), ours[0]["collectives"]])

    def slope(k):
        return (med[80][k] - med[8][k]) / 72 * 1e3

    method = (f"**bench_plan** — a Llama (b={B}, s={T}, d={D}, {HEADS} heads, ffn {FFN}), `{STYLE}` on `{MESH}`, "
              f"50 ops per layer. Each cell: {rounds} fresh processes per side, the sides rotating; median "
              "(p25–p75), ms. Ours: `llama(layers)` (build: shape inference) + `plan(...)`, after a warm-up "
              "on another model and `clear_caches()`; from 6 layers the layers are one repeated block, "
              "program and plan made from instances 0-3 and the last (*ops planned*: the ops the planner visits), "
              "the other layers' per-op records "
              "made when first read (*first read*: reading every op's record of program and plan once, "
              "after the plan; not in the ratios, as DTensor's per-op cache hits are not). DTensor 2.13: time inside "
              "`propagate_op_sharding_non_cached` (strategy search + fake-tensor shape inference) during one "
              "meta forward of the same model under `parallelize_module` (torchtitan's sequence-parallel "
              "plan on the tp sub-mesh, batch split over dp), both its propagation caches cleared after a "
              "warm-up on another model; [n] = its cache misses; its C++ cache hits are free in this "
              "column. *Every op*: all activations stay DTensors, so DTensor decides every op's sharding "
              "as we do (the same work; the ratio columns). *torchtitan idiom*: `use_local_output=True`, "
              "attention and the MLP's inside run on plain local tensors, so DTensor propagates only the "
              "Linears and norms (less work than ours: the user placed the rest by hand). Ratios: "
              "DTensor (every op) ÷ ours, > 1 means we are faster.")
    header = ["layers", "ops", "ops planned", "ours build", "ours plan", "ours build+plan", "ours first read",
              "DTensor every op [misses]",
              "DTensor ÷ ours build+plan", "DTensor ÷ ours plan", "DTensor torchtitan idiom [misses]",
              "DTensor whole meta forward (every op)", "our collectives"]
    notes = (f"Slope per layer (80 vs 8 layers): ours build+plan {slope('tot'):.3f} ms, plan alone "
             f"{slope('plan'):.3f} ms, build+plan+first read {slope('full'):.3f} ms; "
             f"DTensor propagation {slope('dt'):.3f} ms (every op), "
             f"{slope('tt'):.3f} ms (torchtitan idiom); DTensor's whole meta forward {slope('fwd'):.2f} ms.")
    steady = _run(STEADY, 0)
    per = lambda a, b: (b - a) / 72 * 1e3  # noqa: E731 - ms per layer, 8 -> 80 layers
    notes += (f" In one process, minimum of 10 cold runs each (clear_caches() before each): our plan "
              f"{steady['8 False'][0] * 1e3:.1f} ms at 8 layers, {steady['80 False'][0] * 1e3:.1f} ms at 80 "
              f"({per(steady['8 False'][0], steady['80 False'][0]):.3f} ms per layer); the first read "
              f"{per(steady['8 False'][1], steady['80 False'][1]):.2f} ms per layer; the same Llama with every "
              f"layer materialised, planned op by op: {steady['8 True'][0] * 1e3:.1f} ms and "
              f"{steady['80 True'][0] * 1e3:.1f} ms ({per(steady['8 True'][0], steady['80 True'][0]):.2f} ms per "
              "layer).")
    imported = {L: [_run(IMPORTED, L) for _ in range(3)] for L in IMPORT_LAYERS}
    if not all(r["repeated"] and r["same"] for rs in imported.values() for r in rs):
        raise SystemExit("an imported Llama was not found to be one repeated block, or its plan differs from "
                         "planning every op")
    im = {L: {k: statistics.median(r[k] for r in rs) for k in ("export", "import", "plan", "every_op")}
          for L, rs in imported.items()}
    notes += (" Imported (a user module, not our builder: `torch_models.LlamaTorch` at the same sizes, built on "
              "meta, `torch.export` then `from_exported`; 3 fresh processes each, medians): "
              + "; ".join(f"{L} layers ({imported[L][0]['ops']} ops): export {im[L]['export']:.2f} s, import "
                          f"{im[L]['import']:.2f} s, plan {im[L]['plan'] * 1e3:.1f} ms (every op planned: "
                          f"{im[L]['every_op'] * 1e3:.1f} ms)" for L in IMPORT_LAYERS)
              + f". Plan slope per layer (8 -> 80 layers): {per(im[8]['plan'], im[80]['plan']):.3f} ms as one "
              f"repeated block (`program.repeat.compress` finds it), "
              f"{per(im[8]['every_op'], im[80]['every_op']):.3f} ms op by op; the plans are byte-identical. "
              "Import is torch's `run_decompositions` (re-tracing every op) almost entirely.")
    hf = _hf_8b()
    notes += (f" `shardlayout plan --hf` on Llama-3-8B's config (transformers' LlamaForCausalLM on meta, dp=8,tp=8, "
              f"megatron, batch 8 x seq 2048, {hf['cold_collectives']} collectives), wall time of the whole command "
              f"in a fresh process: {hf['cold']:.1f} s with the import cache off (export + decomposition + import), "
              f"{hf['warm']:.2f} s once the cache holds the import (`program.cache`; the run that filled it: "
              f"{hf['fill']:.1f} s).")
    emit("plan", method, header, rows, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
