"""Running a tensor-parallel Llama step on 4 gloo ranks (CPU): ``shardlayout run`` vs DTensor
``parallelize_module`` vs a hand-written Megatron forward on local shards, in one invocation.

The model is the built-in 2-layer Llama (``models.llama`` defaults: batch 2, seq 8, d 16, 4 heads,
ffn 32), float32, mesh ``tp=4``, Megatron style (wq/wk/wv/w_gate/w_up column-parallel, wo/w_down
row-parallel, norm weights replicated), one torch thread per rank on every side. Sides:

* **ours, CLI**: ``python -m shardlayout run --mesh tp=4 --style megatron --layers 2 --repeat N
  --json`` (and ``--train``) exactly as shipped: 4 spawned ranks, one checked step (warm-up),
  then ``N`` steps each between two ``dist.barrier()`` (``launch._timed_steps``); rank 0's
  per-step median/min/max. Its timed ``--train`` step is forward + backward with every backward
  collective ``run.backward`` plans: the same work as the other sides.
* **ours, engine in-process**: the same plan, executor (``TorchRankExecutor``) and ``walk``,
  driven by this script in the same 4 processes as DTensor and the hand-written code, steps
  interleaved one by one; its fwd+bwd step reduces gradients where ``run.backward`` planned it
  (as ``launch._train_step`` does), so it does the same work as the other two.
* **DTensor**: ``DTLlama`` below, a DTensor-friendly copy of ``program.torch_models.LlamaTorch``
  (same ops; weights held as ``nn.Linear`` ``(out, in)`` so ``ColwiseParallel`` /
  ``RowwiseParallel`` apply, heads inferred from the local width with ``view(b, t, -1, hd)`` as
  torchtitan does) parallelized with ``parallelize_module``; collectives counted with
  ``CommDebugMode`` on one separate step.
* **hand-written**: plain torch on each rank's shards, Megatron's f/g: one ``all_reduce`` after
  attention and one after the MLP per layer in forward; in backward one ``all_reduce`` of the
  gradient entering each block's column-parallel matmuls (the floor: the fewest collectives).

Every in-process side gets the same untimed steps first (one checked forward, one checked
forward + backward, one counted of each), then ``STEPS`` timed steps per mode, interleaved
(ours, DTensor, hand, rotated each step), each between two ``dist.barrier()`` like ``_timed_steps``;
an empty step (the two barriers alone) is timed in the same rotation to show the window's fixed
cost; gradients are reset to None outside the timed window on all sides, the backward seed (a ones
tensor) is made outside it too. The three in-process sides are checked to compute the same
output and the same gradients before timing. ``ROUNDS`` rounds alternate: CLI forward, CLI
train, in-process trio (order rotated per round). Run: ``python benchmarks/bench_run.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import counts as _counts  # noqa: E402
from report import emit, run_ranks, table  # noqa: E402
from report import median_cell as _cell  # noqa: E402
from report import ms as _ms  # noqa: E402

ROUNDS = 3
STEPS = 30
WORLD = 4
LAYERS = 2
BATCH, SEQ, DIM, HEADS, FFN = 2, 8, 16, 4, 32  # models.llama defaults
SIDES = ("ours", "dtensor", "hand")


# --------------------------------------------------------------------------- rank side


def _dt_llama():
    """``DTLlama``: LlamaTorch's forward with ``nn.Linear`` weights and local head count."""
    import torch.nn.functional as F
    from torch import nn

    from shardlayout.program.torch_models import _Block

    class DTBlock(nn.Module):
        """DTensor-friendly copy of ``torch_models._Block`` (same ops, same order)."""

        def __init__(self, blk):
            super().__init__()
            self.hd, self.causal = DIM // blk.heads, blk.causal
            self.attn_norm = nn.Parameter(blk.attn_norm.detach().clone())
            self.mlp_norm = nn.Parameter(blk.mlp_norm.detach().clone())
            for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
                w = getattr(blk, n).detach()  # (in, out)
                lin = nn.Linear(w.shape[0], w.shape[1], bias=False)
                lin.weight = nn.Parameter(w.t().contiguous())  # (out, in)
                setattr(self, n, lin)

        _norm = staticmethod(_Block._norm)  # the model's own ops, not a copy
        _rope = staticmethod(_Block._rope)

        def forward(self, x, cos, sin):
            b, t, d = x.shape
            h = self._norm(x, self.attn_norm).view(b * t, d)
            # -1: the heads this rank holds after ColwiseParallel (HEADS // tp), as torchtitan
            q, k, v = (lin(h).view(b, t, -1, self.hd).transpose(1, 2) for lin in (self.wq, self.wk, self.wv))
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
            x = x + self.wo(a.transpose(1, 2).reshape(b * t, -1)).view(b, t, d)
            h = self._norm(x, self.mlp_norm).view(b * t, d)
            return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h)).view(b, t, d)

    class DTLlama(nn.Module):
        def __init__(self, ref):
            super().__init__()
            self.layers = nn.ModuleList(DTBlock(b) for b in ref.layers)

        def forward(self, x, cos, sin):
            for blk in self.layers:
                x = blk(x, cos, sin)
            return x

    return DTLlama


def _hand_fns(counter):
    """Megatron's f (identity forward, all_reduce backward) and g (all_reduce forward,
    identity backward); ``counter`` tallies the all_reduces they run."""
    import torch
    import torch.distributed as dist

    class F_(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            g = g.contiguous()
            counter["backward_all_reduce"] = counter.get("backward_all_reduce", 0) + 1
            dist.all_reduce(g)
            return g

    class G_(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            counter["all_reduce"] = counter.get("all_reduce", 0) + 1
            dist.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    return F_.apply, G_.apply


def _hand_forward(w, x, cos, sin, f, g):
    """The hand-written Megatron forward on local shards (same ops as LlamaTorch)."""
    import torch.nn.functional as F

    from shardlayout.program.torch_models import _Block

    norm = _Block._norm

    def rope(z):
        return _Block._rope(z, cos, sin)

    b, t, d = x.shape
    hd = DIM // HEADS
    for i in range(LAYERS):
        p = f"layers.{i}."
        h = f(norm(x, w[p + "attn_norm"]).view(b * t, d))
        q, k, v = ((h @ w[p + n]).view(b, t, -1, hd).transpose(1, 2) for n in ("wq", "wk", "wv"))
        a = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        x = x + g(a.transpose(1, 2).reshape(b * t, -1) @ w[p + "wo"]).view(b, t, d)
        h = f(norm(x, w[p + "mlp_norm"]).view(b * t, d))
        x = x + g((F.silu(h @ w[p + "w_gate"]) * (h @ w[p + "w_up"])) @ w[p + "w_down"]).view(b, t, d)
    return x


def _rank(rank: int, init: str, out_path: str, steps: int, seed: int) -> None:
    import warnings

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from shardlayout.execute import walk
    from shardlayout.jobs import build_plan
    from shardlayout.program.torch_models import LlamaTorch
    from shardlayout.run.backward import gradient_reductions
    from shardlayout.run.executor import TorchRankExecutor, plan_groups
    from shardlayout.run.launch import _ix, training_pieces  # the exact helpers `run` uses

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, init_method=init, timeout=timedelta(seconds=120))
    try:
        torch.manual_seed(seed)  # the same global weights and inputs on every rank, for every side
        ref = LlamaTorch(layers=LAYERS, dim=DIM, heads=HEADS, ffn=FFN)
        x, cos, sin = torch.randn(BATCH, SEQ, DIM), torch.randn(SEQ, DIM // HEADS), torch.randn(SEQ, DIM // HEADS)
        glob = {n: p.detach().clone() for n, p in ref.named_parameters()} | {"x": x, "cos": cos, "sin": sin}

        # ---- ours: the plan `shardlayout run` builds, its groups in its order, its executor
        plan = build_plan(argparse.Namespace(model="llama", program=None, module=None, export=None, layers=LAYERS,
                                             mesh=f"tp={WORLD}", style="megatron", pin=None))
        reductions = gradient_reductions(plan)
        groups = {}
        for pieces, members in plan_groups(plan, training_pieces(plan, reductions)):
            grp = dist.new_group(list(members)) if len(members) > 1 else None
            if rank in members:
                groups[pieces] = (grp, members)
        ex = TorchRankExecutor(plan.mesh, rank, groups, None, reductions)
        prog = plan.program
        params = list(prog.inputs("param"))  # a list: every rank all-reduces in the same order
        local = {n: glob[n][_ix(plan.shardings[n].indices(rank))].clone() for n in prog.inputs()}
        out_name = prog.outputs[0]
        # complete gradients: every rank seeds the whole gradient of the replicated output, as _train_step
        ours_seed = torch.ones(BATCH, SEQ, DIM)
        ours_state: dict = {}

        def ours_prep(train):
            ours_state["in"] = {n: v.detach().clone().requires_grad_(train and n in params) for n, v in local.items()}

        def ours_run(train):
            inputs = ours_state["in"]
            with torch.enable_grad() if train else torch.no_grad():
                y = dict(walk(plan, ex, inputs))[out_name]
                if train:
                    torch.autograd.backward([y], [ours_seed])  # gradient sums where run.backward planned them
            return y

        # ---- DTensor: parallelize_module, Colwise for wq/wk/wv/w_gate/w_up, Rowwise for wo/w_down
        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",))
        model = _dt_llama()(ref)
        tp_plan = {}
        for i in range(LAYERS):
            tp_plan |= {f"layers.{i}.{n}": ColwiseParallel() for n in ("wq", "wk", "wv", "w_gate", "w_up")}
            tp_plan |= {f"layers.{i}.{n}": RowwiseParallel() for n in ("wo", "w_down")}
        parallelize_module(model, mesh, tp_plan)
        dt_seed = torch.ones(BATCH, SEQ, DIM)

        def dt_prep(train):
            model.zero_grad(set_to_none=True)

        def dt_run(train):
            with torch.enable_grad() if train else torch.no_grad():
                y = model(x, cos, sin)
                if train:
                    y.backward(dt_seed)
            return y

        # ---- hand-written: local shards, Megatron f/g
        hand_counts: dict = {}
        f, g = _hand_fns(hand_counts)
        hw = {n: local[n].clone() for n in params}
        for v in hw.values():
            v.requires_grad_(True)

        def hand_prep(train):
            for v in hw.values():
                v.grad = None

        def hand_run(train):
            with torch.enable_grad() if train else torch.no_grad():
                y = _hand_forward(hw, x, cos, sin, f, g)
                if train:
                    y.backward(dt_seed)
            return y

        sides = {"ours": (ours_prep, ours_run), "dtensor": (dt_prep, dt_run), "hand": (hand_prep, hand_run)}
        timed = dict(sides, empty=(lambda train: None, lambda train: None))  # the window's own cost

        # ---- same work: the same output and the same gradients on every side (checked, untimed)
        checks = {}
        ys = {}
        for s, (prep, run) in sides.items():
            prep(True)
            ys[s] = run(True).detach()
        wq_local = {"ours": ours_state["in"]["layers.0.wq"].grad, "hand": hw["layers.0.wq"].grad,
                    "dtensor": model.layers[0].wq.weight.grad.to_local().t()}
        wd_local = {"ours": ours_state["in"]["layers.1.w_down"].grad, "hand": hw["layers.1.w_down"].grad,
                    "dtensor": model.layers[1].w_down.weight.grad.to_local().t()}
        norm_g = {"ours": ours_state["in"]["layers.0.attn_norm"].grad, "hand": hw["layers.0.attn_norm"].grad,
                  "dtensor": model.layers[0].attn_norm.grad}
        for what, d in (("output", ys), ("grad layers.0.wq", wq_local), ("grad layers.1.w_down", wd_local),
                        ("grad layers.0.attn_norm", norm_g)):
            scale = float(d["hand"].abs().max())
            checks[what] = max(float((d[s] - d["hand"]).abs().max()) / scale for s in ("ours", "dtensor"))
        for prep, run in sides.values():  # one checked forward as well
            prep(False)
            run(False)

        # ---- collectives per step (one counted step per side and mode, untimed)
        counts = {}
        for train in (False, True):
            mode = "fwdbwd" if train else "fwd"
            ex.counts = {}
            ours_prep(train)
            ours_run(train)
            counts[("ours", mode)] = dict(ex.counts)
            hand_counts.clear()
            hand_prep(train)
            hand_run(train)
            counts[("hand", mode)] = dict(hand_counts)
            dt_prep(train)
            comm = CommDebugMode()
            with comm:
                dt_run(train)
            counts[("dtensor", mode)] = {str(k).split(".")[-1]: v for k, v in comm.get_comm_counts().items()}

        # ---- timed steps: interleaved one by one, order rotated each step
        order = (*SIDES, "empty")
        times = {(s, m): [] for s in order for m in ("fwd", "fwdbwd")}
        for train in (False, True):
            mode = "fwdbwd" if train else "fwd"
            for i in range(steps):
                for s in order[i % 4:] + order[: i % 4]:
                    prep, run = timed[s]
                    prep(train)
                    dist.barrier()
                    t0 = time.perf_counter()
                    run(train)
                    dist.barrier()
                    times[(s, mode)].append(time.perf_counter() - t0)
        if rank == 0:
            with open(out_path, "w") as fh:
                json.dump({"times": {f"{s}|{m}": v for (s, m), v in times.items()},
                           "counts": {f"{s}|{m}": v for (s, m), v in counts.items()}, "checks": checks}, fh)
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- driver side


def run_inprocess(seed: int) -> dict:
    import multiprocessing as mp

    return run_ranks(mp.get_context("spawn"), _rank, (STEPS, seed), WORLD, 150, "in-process run")


def run_cli(train: bool) -> dict:
    cmd = [sys.executable, "-m", "shardlayout", "run", "--mesh", f"tp={WORLD}", "--style", "megatron",
           "--layers", str(LAYERS), "--repeat", str(STEPS), "--json"] + (["--train"] if train else [])
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()[-500:]}")
    rep = json.loads(res.stdout.strip().splitlines()[-1])
    if not rep["equal"]:
        raise SystemExit(f"shardlayout run is not equal to the unsharded run: {rep}")
    return rep


def main() -> int:
    t_start = time.perf_counter()
    cli = {"fwd": [], "fwdbwd": []}  # per round: the CLI's step_seconds dict
    cli_counts = {}
    inproc = []  # per round: the rank-0 JSON
    for r in range(ROUNDS):
        jobs = [("cli", False), ("cli", True), ("inproc", None)]
        jobs = jobs[r % 3:] + jobs[: r % 3]  # alternate which side runs first
        for kind, train in jobs:
            if kind == "cli":
                rep = run_cli(train)
                mode = "fwdbwd" if train else "fwd"
                cli[mode].append(rep["step_seconds"])
                cli_counts[mode] = rep["collectives"]
            else:
                inproc.append(run_inprocess(seed=r))
        print(f"round {r + 1}/{ROUNDS} done at {time.perf_counter() - t_start:.0f} s", file=sys.stderr)

    pooled = {}
    for key in inproc[0]["times"]:
        pooled[key] = [t for rnd in inproc for t in rnd["times"][key]]
    counts = inproc[0]["counts"]
    worst_check = {k: max(rnd["checks"][k] for rnd in inproc) for k in inproc[0]["checks"]}

    def med(key, rnd=None):
        return statistics.median(rnd["times"][key] if rnd else pooled[key])

    def cli_med(mode):
        return statistics.median(st["median"] for st in cli[mode])

    def cli_range(mode):
        return min(st["min"] for st in cli[mode]), max(st["max"] for st in cli[mode])

    method = (f"**bench_run** — `shardlayout run` vs DTensor vs hand-written: a {LAYERS}-layer Llama (b={BATCH}, "
              f"s={SEQ}, d={DIM}, {HEADS} heads, ffn={FFN}), tp={WORLD}, Megatron, gloo CPU, float32, 1 thread per "
              f"rank. {ROUNDS} rounds × {STEPS} timed steps per side and mode (rank 0, each step between two "
              "barriers), sides interleaved step by step in one process group; median (min–max) over all "
              "rounds' steps, ms. CLI: median of its per-run medians, min–max over its runs. All sides are "
              "checked to compute the same output and gradients before timing.")
    header = ["side", "forward ms", "fwd+bwd ms", "collectives / fwd step", "collectives / fwd+bwd step"]
    lo, hi = cli_range("fwd")
    lo2, hi2 = cli_range("fwdbwd")
    rows = [["ours — `shardlayout run --repeat` CLI", f"{_ms(cli_med('fwd'))} ({_ms(lo)}–{_ms(hi)})",
             f"{_ms(cli_med('fwdbwd'))} ({_ms(lo2)}–{_ms(hi2)})", _counts(cli_counts["fwd"]),
             _counts(dict(cli_counts["fwdbwd"]))]]
    names = {"ours": "ours — same engine, in-process, interleaved",
             "dtensor": "DTensor `parallelize_module`", "hand": "hand-written local shards (floor)"}
    for s in SIDES:
        rows.append([names[s], _cell(pooled[s + "|fwd"]), _cell(pooled[s + "|fwdbwd"]), _counts(counts[s + "|fwd"]),
                     _counts(counts[s + "|fwdbwd"])])
    rows.append(["empty step: the two barriers alone (in every row above)", _cell(pooled["empty|fwd"]),
                 _cell(pooled["empty|fwdbwd"]), "0", "0"])
    ratio_rows = []
    for peer in ("dtensor", "hand"):
        for who in ("cli", "ours"):
            cells, ranges, net = [], [], []
            for mode in ("fwd", "fwdbwd"):
                ours_all = cli_med(mode) if who == "cli" else med(f"ours|{mode}")
                cells.append(f"{ours_all / med(f'{peer}|{mode}'):.2f}")
                base = med(f"empty|{mode}")
                net.append(f"{(ours_all - base) / (med(f'{peer}|{mode}') - base):.2f}")
                per = [((cli[mode][i]["median"]) if who == "cli" else med(f"ours|{mode}", rnd))
                       / med(f"{peer}|{mode}", rnd) for i, rnd in enumerate(inproc)]
                ranges.append(f"{min(per):.2f}–{max(per):.2f}")
            label = "ours CLI" if who == "cli" else "ours in-process"
            ratio_rows.append([f"{label} / {names[peer].split(' ')[0]}", cells[0], cells[1], ranges[0], ranges[1],
                               f"{net[0]}, {net[1]}"])
    notes = (table(["ratio (> 1: ours slower)", "forward", "fwd+bwd", "per-round range fwd",
                    "per-round range fwd+bwd", "fwd, fwd+bwd net of the empty step"], ratio_rows)
             + "\n\nSame work, checked before timing (max over rounds; |side − hand| / max|hand|): "
             + ", ".join(f"{k} {v:.1e}" for k, v in worst_check.items()) + ".")
    emit("run", method, header, rows, notes)
    print(f"total {time.perf_counter() - t_start:.0f} s", file=sys.stderr)
    bad = [k for k, v in worst_check.items() if not v < 1e-4]
    if bad:
        print(f"MISMATCH: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
