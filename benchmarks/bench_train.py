"""Training a Megatron-SP Llama on 4 gloo ranks (CPU): one steady-state train step (forward, a loss,
backward, ``torch.optim.AdamW``) through ``shardlayout.parallelize`` (eager and ``torch.compile``),
DTensor ``parallelize_module`` (eager and compiled) and hand-written local Megatron-SP, in one run.

The model is the built-in ``program.torch_models.LlamaTorch`` (what ``shardlayout run --steps``
trains for ``--model llama``), 2 layers, float32, at two sizes: the bench model (``models.llama``
defaults: batch 2, seq 8, d 16, 4 heads, ffn 32) and a larger one where matmuls dominate
(``LARGE``). Mesh ``tp=4``, style ``megatron-sp`` (our style; wq/wk/wv/w_gate/w_up
column-parallel, wo/w_down row-parallel, the residual stream sequence-sharded: an all-gather
before and a reduce-scatter after each attention and MLP block, norms on sequence shards). One
torch thread per rank on every side. Sides, each with its own copy of the same weights and its
own ``AdamW(lr=1e-3)``:

* **ours eager**: ``shardlayout.parallelize(model, "tp=4", style="megatron-sp",
  example_inputs=(x, cos, sin), outputs="local")``; inputs and outputs are this rank's pieces.
* **ours compiled**: a second ``parallelize`` of a copy with the same ``Plan``, then
  ``torch.compile(pmod, fullgraph=True)`` (forward and backward compiled; the optimizer eager on
  every side). Its first step's wall time is reported apart (the first compile).
* **DTensor eager**: a DTensor-friendly copy of ``LlamaTorch`` (``nn.Linear`` ``(out, in)`` weights
  as ``bench_run._dt_llama``, the norms and blocks as submodules so styles apply) with
  torchtitan's Megatron-SP plan: ``SequenceParallel`` norms, ``PrepareModuleInput`` (``Shard(1)``
  -> ``Replicate()``) on attention and MLP, ``ColwiseParallel`` wq/wk/wv/w_gate/w_up,
  ``RowwiseParallel(output_layouts=Shard(1))`` wo/w_down.
* **DTensor compiled**: ``torch.compile(model, fullgraph=True)`` of another such copy (a failure
  to compile is reported in the table as its error text).
* **hand-written** (the floor): plain torch on each rank's shards, Megatron-SP: norm on the local
  sequence piece, ``all_gather_into_tensor`` on the sequence before the column-parallel matmuls
  (its backward ``reduce_scatter_tensor``), ``reduce_scatter_tensor`` after the row-parallel ones
  (backward ``all_gather_into_tensor``), and after backward one ``all_reduce`` of the norm weights'
  gradients (flattened together, as Megatron does for sequence-parallel parameters).

The loss on every side is ``sum(out * G)`` over this rank's output piece (``G`` fixed, random;
the total loss is the sum over ranks): no collective for the loss. Before timing, every side takes
one step from the same weights and is checked against the unsharded model (``LlamaTorch`` in one
process, same loss, one AdamW step): the loss, every parameter's gradient and every updated
parameter, compared on each rank's piece (max over ranks of ``max|side - ref| / max|ref|``; the
updated parameters where the reference gradient is at least ``SIGN_SAFE`` of its tensor's largest,
and over all elements apart: AdamW's first step is about ``lr * sign(g)``, noise where g rounds to
0). Then
warm-up steps and ``steps`` timed steps per side, interleaved step by step (order rotated every
step), each on rank 0 between two ``dist.barrier()``; gradients are set to None outside the
window. One 4-rank job per size (ranks forked from a server that imported torch once, as
``shardlayout run`` starts them); Inductor compiles in each rank's process (``compile_threads=1``:
4 ranks share 2 cores), all four ranks at once. Run: ``python benchmarks/bench_train.py``
(``--quick``: the bench model with 1 layer, 5 steps, printed only — a smoke test).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import counts as _counts  # noqa: E402
from report import emit, median_cell, run_ranks, table  # noqa: E402

WORLD = 4
LAYERS = 2
MESH, STYLE = f"tp={WORLD}", "megatron-sp"
SMALL = {"layers": LAYERS, "batch": 2, "seq": 8, "dim": 16, "heads": 4, "ffn": 32}  # models.llama defaults
LARGE = {"layers": LAYERS, "batch": 2, "seq": 512, "dim": 512, "heads": 8, "ffn": 2048}  # ~0.6 s a step here
STEPS = {"small": 40, "large": 20}
WARMUP = 2
LR = 1e-3
CHECKS = ("loss", "grad", "param", "param_all")
# AdamW's first step moves an element by ~lr*sign(g): where |g| is within float32 rounding of 0 its sign
# (so the update) is noise; the parameter check leaves out elements with |g_ref| < SIGN_SAFE * max|g_ref|
SIGN_SAFE = 1e-3
ODD = "grad placements unlike the parameter's"
SIDES = ("ours", "ours_c", "dt", "dt_c", "hand")
NAMES = {"ours": "ours eager — `parallelize`",
         "ours_c": "ours compiled — `torch.compile(pmod, fullgraph=True)`",
         "dt": "DTensor `parallelize_module` eager",
         "dt_c": "DTensor compiled — `torch.compile(model, fullgraph=True)`",
         "hand": "hand-written local Megatron-SP (floor)"}


# --------------------------------------------------------------------------- rank side


def _dt_sp_llama(cfg):
    """``DTLlamaSP``: LlamaTorch's forward (same ops) with ``nn.Linear`` weights, the norms and the
    attention / MLP as submodules (so SequenceParallel and PrepareModuleInput apply), local heads."""
    import torch.nn.functional as F
    from torch import nn

    from shardlayout.program.torch_models import _Block

    def linear(w):  # (in, out) -> nn.Linear holding (out, in)
        lin = nn.Linear(w.shape[0], w.shape[1], bias=False)
        lin.weight = nn.Parameter(w.detach().t().contiguous())
        return lin

    class Norm(nn.Module):
        def __init__(self, w):
            super().__init__()
            self.weight = nn.Parameter(w.detach().clone())

        def forward(self, x):
            return _Block._norm(x, self.weight)

    class Attention(nn.Module):
        def __init__(self, blk):
            super().__init__()
            self.hd, self.causal = cfg["dim"] // blk.heads, blk.causal
            for n in ("wq", "wk", "wv", "wo"):
                setattr(self, n, linear(getattr(blk, n)))

        def forward(self, h, cos, sin):
            b, t, _ = h.shape
            # -1: the heads this rank holds after ColwiseParallel (heads // tp), as torchtitan
            q, k, v = (lin(h).view(b, t, -1, self.hd).transpose(1, 2) for lin in (self.wq, self.wk, self.wv))
            q, k = _Block._rope(q, cos, sin), _Block._rope(k, cos, sin)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
            return self.wo(a.transpose(1, 2).reshape(b, t, -1))

    class MLP(nn.Module):
        def __init__(self, blk):
            super().__init__()
            for n in ("w_gate", "w_up", "w_down"):
                setattr(self, n, linear(getattr(blk, n)))

        def forward(self, h):
            return self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))

    class Block(nn.Module):
        def __init__(self, blk):
            super().__init__()
            self.attn_norm, self.attn = Norm(blk.attn_norm), Attention(blk)
            self.mlp_norm, self.mlp = Norm(blk.mlp_norm), MLP(blk)

        def forward(self, x, cos, sin):
            x = x + self.attn(self.attn_norm(x), cos, sin)
            return x + self.mlp(self.mlp_norm(x))

    class DTLlamaSP(nn.Module):
        def __init__(self, ref):
            super().__init__()
            self.layers = nn.ModuleList(Block(b) for b in ref.layers)

        def forward(self, x, cos, sin):
            for blk in self.layers:
                x = blk(x, cos, sin)
            return x

    return DTLlamaSP


def _dt_name(name: str) -> tuple:
    """``(LlamaTorch name, transposed)`` of a DTLlamaSP parameter name."""
    parts = name.split(".")
    if parts[-1] == "weight" and parts[-2] in ("attn_norm", "mlp_norm"):
        return ".".join(parts[:-1]), False
    return ".".join(parts[:2] + [parts[3]]), True  # layers.i.attn.wq.weight -> layers.i.wq


def _dt_sp_plan(layers: int) -> dict:
    """torchtitan's Megatron-SP plan for DTLlamaSP."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    plan = {}
    for i in range(layers):
        p = f"layers.{i}."
        plan |= {p + "attn_norm": SequenceParallel(), p + "mlp_norm": SequenceParallel(),
                 p + "attn": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                desired_input_layouts=(Replicate(), None, None)),
                 p + "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                 p + "attn.wo": RowwiseParallel(output_layouts=Shard(1)),
                 p + "mlp.w_down": RowwiseParallel(output_layouts=Shard(1))}
        plan |= {p + n: ColwiseParallel() for n in ("attn.wq", "attn.wk", "attn.wv", "mlp.w_gate", "mlp.w_up")}
    return plan


def _hand_fns():
    """Megatron-SP's sequence moves on dim 1 of ``[b, s, d]``: gather (all-gather forward,
    reduce-scatter backward) and scatter (reduce-scatter forward, all-gather backward)."""
    import torch
    import torch.distributed as dist

    def all_gather(x):  # [b, s, d] -> [b, W*s, d]
        b, s, d = x.shape
        buf = x.new_empty((WORLD * b, s, d))  # the pieces stacked on dim 0, as c10d concatenates
        dist.all_gather_into_tensor(buf, x.contiguous())
        return buf.view(WORLD, b, s, d).movedim(0, 1).reshape(b, WORLD * s, d)

    def reduce_scatter(y):  # [b, W*s, d] -> [b, s, d], summed
        b, t, d = y.shape
        src = y.reshape(b, WORLD, t // WORLD, d).movedim(1, 0).reshape(WORLD * b, t // WORLD, d)
        out = y.new_empty((b, t // WORLD, d))
        dist.reduce_scatter_tensor(out, src)
        return out

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return all_gather(x)

        @staticmethod
        def backward(ctx, g):
            return reduce_scatter(g)

    class Scatter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            return reduce_scatter(y)

        @staticmethod
        def backward(ctx, g):
            return all_gather(g)

    return Gather.apply, Scatter.apply


def _hand_forward(w, x, cos, sin, cfg, gather, scatter):
    """Megatron-SP forward on local shards (same ops as LlamaTorch): ``x`` is this rank's
    sequence piece, so is the result."""
    import torch.nn.functional as F

    from shardlayout.program.torch_models import _Block

    norm = _Block._norm
    b, s, d = x.shape
    t = s * WORLD
    hd = cfg["dim"] // cfg["heads"]
    for i in range(cfg["layers"]):
        p = f"layers.{i}."
        h = gather(norm(x, w[p + "attn_norm"])).view(b * t, d)
        q, k, v = ((h @ w[p + n]).view(b, t, -1, hd).transpose(1, 2) for n in ("wq", "wk", "wv"))
        q, k = _Block._rope(q, cos, sin), _Block._rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + scatter((a.transpose(1, 2).reshape(b * t, -1) @ w[p + "wo"]).view(b, t, d))
        h = gather(norm(x, w[p + "mlp_norm"])).view(b * t, d)
        x = x + scatter(((F.silu(h @ w[p + "w_gate"]) * (h @ w[p + "w_up"])) @ w[p + "w_down"]).view(b, t, d))
    return x


def _piece(full, dim, rank):
    """``rank``'s piece of ``full`` cut evenly on ``dim`` (None: the whole tensor)."""
    return full if dim is None else full.chunk(WORLD, dim)[rank]


def _shard_dim(p):
    """The sharded dim of a DTensor on a 1-D mesh (None: replicated)."""
    pl = p.placements[0]
    return pl.dim if pl.is_shard() else None


def _rank(rank: int, init: str, out_path: str, cfg: dict, steps: int, seed: int) -> None:
    import warnings

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module

    import shardlayout
    from shardlayout.program.torch_models import LlamaTorch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    import torch._inductor.config

    torch._inductor.config.compile_threads = 1  # no pool of compile workers per rank: 4 ranks share 2 cores
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, init_method=init, timeout=timedelta(seconds=600))
    res: dict = {"cfg": cfg, "seconds": {}}
    t_job = time.perf_counter()

    def say(what):  # progress on stderr (rank 0)
        if rank == 0:
            print(f"  [{time.perf_counter() - t_job:6.1f} s] {what}", file=sys.stderr, flush=True)
    try:
        b, t, d, heads = cfg["batch"], cfg["seq"], cfg["dim"], cfg["heads"]
        torch.manual_seed(seed)  # the same global weights and inputs on every rank, for every side
        ref = LlamaTorch(layers=cfg["layers"], dim=d, heads=heads, ffn=cfg["ffn"])
        with torch.no_grad():  # norm weights away from 1, so their gradients matter
            for blk in ref.layers:
                blk.attn_norm.add_(0.1 * torch.randn(d))
                blk.mlp_norm.add_(0.1 * torch.randn(d))
        x, cos, sin = torch.randn(b, t, d), torch.randn(t, d // heads), torch.randn(t, d // heads)
        G = torch.randn(b, t, d)
        x_loc, G_loc = _piece(x, 1, rank), _piece(G, 1, rank).contiguous()

        # ---- the unsharded reference: one step of the same loss and AdamW, in this process
        t0 = time.perf_counter()
        unsharded = copy.deepcopy(ref)
        ref_opt = torch.optim.AdamW(unsharded.parameters(), lr=LR)
        ref_loss = (unsharded(x, cos, sin) * G).sum()
        ref_loss.backward()
        ref_grad = {n: p.grad.detach().clone() for n, p in unsharded.named_parameters()}
        ref_opt.step()
        ref_after = {n: p.detach().clone() for n, p in unsharded.named_parameters()}
        del unsharded, ref_opt
        res["seconds"]["reference step"] = time.perf_counter() - t0
        say("reference step done")

        sides: dict = {}  # name -> {"step": fwd+bwd -> local loss, "opt", "params": {ref name: (tensor, dim, T)}}

        # ---- ours: parallelize (plans with the style), eager; a second module of the same plan, compiled
        t0 = time.perf_counter()
        pmod = shardlayout.parallelize(copy.deepcopy(ref), MESH, style=STYLE, example_inputs=(x, cos, sin),
                                       outputs="local")
        res["seconds"]["ours parallelize (export + plan + program)"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        pmod_c = shardlayout.parallelize(copy.deepcopy(ref), pmod.plan.mesh, pmod.plan, example_inputs=(x, cos, sin),
                                         outputs="local")
        res["seconds"]["ours parallelize with the plan given (program only)"] = time.perf_counter() - t0
        say("ours parallelized")
        res["x sharding"] = str(pmod.plan.shardings["x"])
        res["output sharding"] = str(pmod.plan.shardings[pmod.plan.program.outputs[0]])
        compiled_ours = torch.compile(pmod_c, fullgraph=True)
        for name, mod, fn in (("ours", pmod, pmod), ("ours_c", pmod_c, compiled_ours)):
            sides[name] = {
                "step": (lambda fn=fn: fn(x_loc, cos, sin)),
                "opt": torch.optim.AdamW(mod.parameters(), lr=LR),
                "params": {n: (p, _shard_dim(p), False) for n, p in mod.named_parameters()},
            }

        # ---- DTensor: parallelize_module with torchtitan's Megatron-SP plan, eager and compiled
        t0 = time.perf_counter()
        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",))
        DT = _dt_sp_llama(cfg)
        dt_plan = _dt_sp_plan(cfg["layers"])
        dts = {}
        for name in ("dt", "dt_c"):
            model = DT(ref)
            parallelize_module(model, mesh, dt_plan)
            dts[name] = model
        res["seconds"]["DTensor parallelize_module (two copies)"] = time.perf_counter() - t0
        compiled_dt = torch.compile(dts["dt_c"], fullgraph=True)
        for name, fn in (("dt", dts["dt"]), ("dt_c", compiled_dt)):
            mod = dts[name]
            params = {}
            for n, p in mod.named_parameters():
                rn, tr = _dt_name(n)
                dim = _shard_dim(p)
                params[rn] = (p, None if dim is None else (1 - dim if tr else dim), tr)
            sides[name] = {"step": (lambda fn=fn: fn(x_loc, cos, sin)),
                           "opt": torch.optim.AdamW(mod.parameters(), lr=LR), "params": params}

        # ---- hand-written Megatron-SP on local shards
        gather, scatter = _hand_fns()
        col = {"wq", "wk", "wv", "w_gate", "w_up"}
        hw, hdims = {}, {}
        for n, p in ref.named_parameters():
            leaf = n.rsplit(".", 1)[1]
            hdims[n] = 1 if leaf in col else 0 if leaf in ("wo", "w_down") else None
            hw[n] = _piece(p.detach(), hdims[n], rank).clone().requires_grad_(True)
        norms = [hw[n] for n in hw if hdims[n] is None]

        def hand_step():
            return _hand_forward(hw, x_loc, cos, sin, cfg, gather, scatter)

        def hand_after_backward():  # the norm weights saw only this rank's sequence piece: sum them
            flat = torch.cat([w.grad.reshape(-1) for w in norms])
            dist.all_reduce(flat)
            for w, g in zip(norms, flat.split([w.numel() for w in norms])):
                w.grad.copy_(g.view_as(w))

        sides["hand"] = {"step": hand_step, "after": hand_after_backward,
                         "opt": torch.optim.AdamW(list(hw.values()), lr=LR),
                         "params": {n: (v, hdims[n], False) for n, v in hw.items()}}

        def fwd_bwd(s):
            side = sides[s]
            loss = (side["step"]() * G_loc).sum()
            loss.backward()
            if "after" in side:
                side["after"]()
            return loss

        def train_step(s):
            loss = fwd_bwd(s)
            sides[s]["opt"].step()
            return loss

        def local(v):
            return v.to_local() if isinstance(v, DTensor) else v

        def rel(a, full, dim, tr, grad=None):
            """max|a - ref| / max|ref| on this rank's piece (``grad``: only where it is not ~0)."""
            want = _piece(full, dim, rank)
            a = local(a).detach()
            diff = ((a.t() if tr else a) - want).abs()
            if grad is not None:
                diff = diff[_piece(grad, dim, rank).abs() >= SIGN_SAFE * grad.abs().max()]
            return float(diff.max()) / max(float(want.abs().max()), 1e-30) if diff.numel() else 0.0

        n_all = sum(g.numel() for g in ref_grad.values())
        res["sign-ambiguous fraction"] = sum(int((g.abs() < SIGN_SAFE * g.abs().max()).sum())
                                             for g in ref_grad.values()) / n_all

        # ---- first step of every side from the same weights: checked against the unsharded model
        checks, failed, first = {}, {}, {}
        for s in SIDES:
            say(f"first step of {s}")
            dist.barrier()
            t0 = time.perf_counter()
            try:
                loss = fwd_bwd(s)
            except Exception as e:  # noqa: BLE001 - a side that fails to compile is reported, not hidden
                failed[s] = f"{type(e).__name__}: {e}"
                res.setdefault("tracebacks", {})[s] = traceback.format_exc()[-4000:]
                sides[s]["opt"].zero_grad(set_to_none=True)
                continue
            grads = {}
            for n, (p, _dim, _tr) in sides[s]["params"].items():
                g = p.grad
                if isinstance(g, DTensor) and tuple(g.placements) != tuple(p.placements):
                    grads.setdefault("_grad placements", set()).add(f"{n}: {g.placements}")
                    g = g.redistribute(g.device_mesh, p.placements)
                grads[n] = g
            sides[s]["opt"].step()
            dist.barrier()
            first[s] = time.perf_counter() - t0
            if s.endswith("_c"):  # where the first compile went (stderr only)
                from torch._dynamo.utils import compile_times, counters

                res.setdefault("compile", {})[s] = {"phases": compile_times(repr="str", aggregate=True),
                                                   "inductor": dict(counters["inductor"]),
                                                   "aot_autograd": dict(counters["aot_autograd"])}
                counters.clear()
            total = loss.detach().clone()
            dist.all_reduce(total)
            odd = grads.pop("_grad placements", None)
            c = {"loss": abs(float(total) - float(ref_loss)) / abs(float(ref_loss)),
                 "grad": max(rel(g, ref_grad[n], *sides[s]["params"][n][1:]) for n, g in grads.items()),
                 "param": max(rel(p, ref_after[n], dim, tr, ref_grad[n])
                              for n, (p, dim, tr) in sides[s]["params"].items()),
                 "param_all": max(rel(p, ref_after[n], dim, tr) for n, (p, dim, tr) in sides[s]["params"].items())}
            if odd:
                c[ODD] = sorted(odd)
            checks[s] = c
            sides[s]["opt"].zero_grad(set_to_none=True)
        failed_all = [None] * WORLD
        dist.all_gather_object(failed_all, sorted(failed))
        if any(f != failed_all[0] for f in failed_all):
            raise RuntimeError(f"ranks disagree on which sides failed: {failed_all}")
        worst = torch.tensor([[checks[s][k] for k in CHECKS] for s in SIDES if s in checks],
                             dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        for i, s in enumerate(s for s in SIDES if s in checks):
            checks[s].update(zip(CHECKS, worst[i].tolist()))
        live = [s for s in SIDES if s not in failed]

        # ---- collectives in one step of each eager side, at the dispatcher (untimed)
        counts = {}
        for s in ("ours", "dt", "hand"):
            if s in failed:
                continue
            counts[s] = {}
            for phase, run in (("fwd+bwd", lambda s=s: fwd_bwd(s)), ("AdamW", lambda s=s: sides[s]["opt"].step())):
                comm = CommDebugMode()
                with comm:
                    run()
                counts[s][phase] = {str(k).split(".")[-1]: v for k, v in comm.get_comm_counts().items()}
            sides[s]["opt"].zero_grad(set_to_none=True)

        say("timing")
        # ---- warm-up, then timed steps interleaved one by one, order rotated each step
        times = {s: [] for s in live}
        for i in range(WARMUP + steps):
            k = i % len(live)
            for s in live[k:] + live[:k]:
                sides[s]["opt"].zero_grad(set_to_none=True)
                dist.barrier()
                t0 = time.perf_counter()
                train_step(s)
                dist.barrier()
                if i >= WARMUP:
                    times[s].append(time.perf_counter() - t0)
        res.update(times=times, checks=checks, failed=failed, first=first, counts=counts)
        res["seconds"]["job"] = time.perf_counter() - t_job
        if rank == 0:
            with open(out_path, "w") as fh:
                json.dump(res, fh)
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- driver side


def run_size(cfg: dict, steps: int, seed: int, timeout: float) -> dict:
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")  # ranks fork from one server that imported torch once (as `run` does)
    ctx.set_forkserver_preload(["__main__", "torch", "torch.distributed", "torch.distributed.tensor.parallel",
                                "shardlayout", "shardlayout.run.parallel", "shardlayout.program.torch_models"])
    return run_ranks(ctx, _rank, (cfg, steps, seed), WORLD, timeout, f"bench_train job {cfg}")


def _ms(v):
    return f"{v * 1e3:.2f}" if v < 1 else f"{v * 1e3:.0f}"


def _cell(xs):
    return median_cell(xs, _ms)


def _size_label(cfg):
    return (f"{cfg['layers']} layer{'s' if cfg['layers'] > 1 else ''}, b={cfg['batch']}, s={cfg['seq']}, "
            f"d={cfg['dim']}, {cfg['heads']} heads, ffn={cfg['ffn']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="a smoke test: the bench model with 1 layer, 5 steps; prints, does not write results/")
    ap.add_argument("--large", default=None, help="the larger size as batch,seq,dim,heads,ffn (default %s)"
                    % ",".join(str(LARGE[k]) for k in ("batch", "seq", "dim", "heads", "ffn")))
    ap.add_argument("--steps", type=int, default=None, help="timed steps per side (each size's default otherwise)")
    ap.add_argument("--only", choices=("small", "large"), default=None, help="one size (development)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds a size's job may take")
    args = ap.parse_args()
    large = LARGE if args.large is None else \
        dict(LARGE, **dict(zip(("batch", "seq", "dim", "heads", "ffn"), map(int, args.large.split(",")))))
    sizes = {"small": dict(SMALL, layers=1)} if args.quick else {"small": SMALL, "large": large}
    if args.only:
        sizes = {args.only: sizes[args.only]}
    t_start = time.perf_counter()
    got = {}
    for key, cfg in sizes.items():
        steps = args.steps or (5 if args.quick else STEPS[key])
        got[key] = run_size(cfg, steps, seed=0, timeout=args.timeout or (300 if args.quick else 3600))
        print(f"{key} ({_size_label(cfg)}) done at {time.perf_counter() - t_start:.0f} s: "
              + json.dumps(got[key]["seconds"]), file=sys.stderr)
        for s, c in got[key].get("compile", {}).items():
            print(f"--- {s} first compile at {key}: {json.dumps(c['inductor'])} {json.dumps(c['aot_autograd'])}\n"
                  f"{c['phases']}", file=sys.stderr)
        for s, tb in got[key].get("tracebacks", {}).items():
            print(f"--- {s} failed at {key}:\n{tb}", file=sys.stderr)

    def med(key, s):
        return statistics.median(got[key]["times"][s])

    def step_cell(key, s):
        r = got[key]
        if s in r["failed"]:
            return "**fails**: " + r["failed"][s].splitlines()[0][:300].replace("|", "\\|")
        return _cell(r["times"][s])

    def first_cell(key, s):
        r = got[key]
        return "—" if s in r["failed"] else f"{r['first'][s]:.2f}"

    n_steps = {k: len(next(iter(r["times"].values()))) for k, r in got.items()}
    method = (f"**bench_train** — one training step (forward, loss, backward, `torch.optim.AdamW`) of a "
              f"Llama (`LlamaTorch`, float32) with the Megatron-SP plan on mesh `{MESH}` (style "
              f"`{STYLE}`), 4 gloo ranks on CPU, 1 torch thread per rank; ours (`shardlayout.parallelize`, eager "
              "and `torch.compile(fullgraph=True)`), DTensor `parallelize_module` (torchtitan's SequenceParallel / "
              "Colwise / Rowwise plan; eager and compiled) and hand-written Megatron-SP on local shards, each with "
              "its own weights and AdamW, interleaved step by step in one process group (order rotated every "
              "step), each step timed on rank 0 between two barriers; median (min–max) in ms over "
              + ", ".join(f"{n_steps[k]} steps ({k}: {_size_label(sizes[k])})" for k in got)
              + f" after {WARMUP} warm-up steps. First step: the wall time of each side's first step (for the "
              "compiled sides: the first compile of forward and backward, the 4 ranks compiling at once on "
              "2 cores, Inductor in-process; torch 2.13's FX graph cache misses on every run here — its key "
              "holds the DeviceMesh objects' addresses — so this is a cold compile). Every side's first step "
              "is checked against the unsharded model before timing (below). Collectives: one eager step "
              "(forward, backward, AdamW) under `CommDebugMode`.")
    header = ["side"]
    for k in got:
        header += [f"{k} step ms", f"{k} first step s"]
    header.append("collectives per eager step (`CommDebugMode`)")
    rows = []
    for s in SIDES:
        row = [NAMES[s]]
        for k in got:
            row += [step_cell(k, s), first_cell(k, s)]
        first_size = next(iter(got.values()))
        row.append("; ".join(f"{ph}: {_counts(c)}" for ph, c in first_size["counts"][s].items())
                   if s in first_size["counts"] else "—")
        rows.append(row)

    ratio_rows = []
    for a, b_ in (("ours_c", "hand"), ("ours", "hand"), ("ours", "dt"), ("ours_c", "dt"), ("ours_c", "dt_c")):
        label = f"{NAMES[a].split(' — ')[0]} / {NAMES[b_].split(' — ')[0].replace(' (floor)', '')}"
        cells = []
        for k, r in got.items():
            if a in r["failed"] or b_ in r["failed"]:
                cells.append("— (a side failed)")
                continue
            # the same ratio over each third of the run: how steady it is
            ta, tb = r["times"][a], r["times"][b_]
            n = len(ta) // 3
            thirds = [statistics.median(ta[i * n:(i + 1) * n]) / statistics.median(tb[i * n:(i + 1) * n])
                      for i in range(3)] if n >= 2 else []
            rng = f" ({min(thirds):.2f}–{max(thirds):.2f})" if thirds else ""
            cells.append(f"{med(k, a) / med(k, b_):.2f}{rng}")
        ratio_rows.append([label] + cells)
    compile_line = "First compile (wall time of the first compiled step, rank 0): " + "; ".join(
        f"{k}: ours {first_cell(k, 'ours_c')} s, DTensor {first_cell(k, 'dt_c')} s" for k in got) + "."
    check_rows = [[NAMES[s].split(" — ")[0]] + [
        "fails" if s not in r["checks"] else
        " · ".join(f"{r['checks'][s][c]:.1e}" for c in CHECKS[:3]) + f" ({r['checks'][s]['param_all']:.1e})"
        for r in got.values()] for s in SIDES]
    check_line = ("Same work, checked before timing: each side's first step against the unsharded model in one "
                  "process (same weights, loss and AdamW step), max over ranks of max\\|side − ref\\| / "
                  "max\\|ref\\| on each rank's piece: loss · gradients · updated parameters (in brackets: all "
                  "elements; outside them the elements whose reference gradient is at least "
                  f"{SIGN_SAFE:g} of its tensor's largest — AdamW's first step moves an element by about "
                  "lr·sign(g), so where g is within float32 rounding of 0 the update's sign is noise: "
                  + ", ".join(f"{r['sign-ambiguous fraction']:.1%} of the elements at {k}" for k, r in got.items())
                  + ").\n\n" + table(["side"] + [f"{k}: loss · grads · params (all)" for k in got], check_rows))
    odd = sorted({f"{NAMES[s].split(' — ')[0]}: {len(c[ODD])} ({', '.join(sorted({o.split(': ')[1] for o in c[ODD]}))})"
                  for r in got.values() for s, c in r["checks"].items() if ODD in c})
    notes = table(["ratio of medians (> 1: first slower); per third of the run"] + list(got), ratio_rows)
    notes += "\n\n" + compile_line + "\n\n" + check_line
    if odd:
        notes += ("\n\nGradients whose placements differ from their (Replicate) parameter's after backward "
                  "(redistributed for the check; DTensor reduces them inside the AdamW step: its all_reduces "
                  "above): " + "; ".join(odd) + ".")
    if args.quick:  # a smoke test: the docs' figures stay those of the last full run
        print(f"{method}\n\n{table(header, rows)}\n\n{notes}\n")
    else:
        emit("train", method, header, rows, notes)
    print(f"total {time.perf_counter() - t_start:.0f} s", file=sys.stderr)
    bad = [(k, s) for k, r in got.items() for s, c in r["checks"].items()
           if not max(c["loss"], c["grad"], c["param"]) < 1e-4]  # float32, summation order
    if bad:
        print(f"MISMATCH: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
