"""``shardlayout run --steps N``: train with a plan through ``parallelize``, compared with the unsharded model.

Every rank builds the same model (the user's ``--module``, or the program of a built-in model or
JSON as a :class:`ProgramModule` with seeded parameters), plans it, keeps an unsharded copy as the
reference, and turns the other copy into the parallel module (``run.parallel.parallelize``). Each
step: forward, the loss ``sum(output * G)`` for a fixed random ``G`` per output, backward, the
optimizer (``torch.optim.AdamW`` or ``SGD``) — on both, in the same process. The report holds both
loss curves, the largest relative difference of losses and updated parameters, the collectives
that ran in the first step counted at the dispatcher (functional collectives, forward and
backward apart, ``executor.count_calls``) next to the planned ones, and the steady-state step time.
"""

from __future__ import annotations

import copy
import json
import statistics
import time

import numpy as np

from ..errors import RunError


def _module_base():
    import torch

    return torch.nn.Module


class ProgramModule(_module_base()):
    """A Program as an ``nn.Module``: its parameters and buffers registered under their program
    names (``layers.0.wq`` is ``self.layers[0].wq``), its forward the program's ops on torch, one
    by one (the unsharded reference). ``ProgramModule(plan, values)``; forward takes the program's
    inputs in order."""

    def __init__(self, plan, values: dict):
        import torch

        super().__init__()
        object.__setattr__(self, "_plan", plan)
        prog = plan.program
        self._inputs = prog.inputs("input")
        for name in prog.inputs():
            kind = prog.tensors[name].kind
            if kind not in ("param", "buffer"):
                continue
            owner, _, leaf = name.rpartition(".")
            mod = self
            for part in owner.split(".") if owner else ():
                if part not in mod._modules:
                    mod.add_module(part, torch.nn.Module())
                mod = mod._modules[part]
            if kind == "param":
                mod.register_parameter(leaf, torch.nn.Parameter(values[name]))
            else:
                mod.register_buffer(leaf, values[name])

    def forward(self, *inputs):
        from ..execute.verify import reference_run
        from .torch_ops import torch_op

        state = dict(self.named_parameters())
        state.update(self.named_buffers())
        ref = reference_run(self._plan, {**state, **dict(zip(self._inputs, inputs))}, torch_op, _torch())
        outs = tuple(ref[n] for n in self._plan.program.outputs)
        return outs[0] if len(outs) == 1 else outs


def _torch():
    import torch

    return torch


def _model(options: dict, dtype):
    """``(plan, module, global inputs)`` every rank builds alike from the run's options."""
    import argparse

    import torch

    from ..jobs import _call_factory, build_plan
    from .launch import _global_inputs

    ns = argparse.Namespace(**options)
    if options.get("module"):
        module, example_args, dynamic = _call_factory(options["module"])
        if dynamic is not None:
            raise RunError("--steps trains at the example sizes: drop the factory's dynamic_shapes")
        module = module.to(dtype)
        args = tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                     for a in example_args)
        from ..program.torch_import import from_torch

        plan = build_plan(ns, program=from_torch(module, args))
        return plan, module, args
    plan = build_plan(ns)
    values = _global_inputs(plan, options.get("seed", 0), str(dtype).replace("torch.", ""))
    module = ProgramModule(plan, values)
    return plan, module, tuple(values[n] for n in plan.program.inputs("input"))


def planned_functional(plan, reductions: dict) -> dict:
    """The collectives one training step should run, by primitive, forward and backward apart:
    ``{"forward": {kind: n}, "backward": {kind: n}}`` (``launch._planned_counts``)."""
    from .launch import _planned_counts

    out: dict = {"forward": {}, "backward": {}}
    for k, n in _planned_counts(plan, True, reductions).items():
        side = "backward" if k.startswith("backward_") else "forward"
        kind = k.removeprefix("backward_")
        out[side][kind] = out[side].get(kind, 0) + n
    return out


def _rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    scale = float(b.abs().max()) if b.numel() else 0.0
    diff = float((a - b).abs().max()) if b.numel() else 0.0
    return diff / scale if scale else diff


def train_rank(rank: int, world: int, options: dict, init_method: str | None = None,
               result_path: str | None = None) -> dict | None:
    """One rank of a training run: joins the process group, trains (``train_main``), leaves."""
    import warnings
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    kw = {"init_method": init_method} if init_method else {}
    dist.init_process_group(options.get("backend", "gloo"), rank=rank, world_size=world,
                            timeout=timedelta(seconds=options.get("timeout", 60)), **kw)
    try:
        return train_main(rank, world, options, result_path)
    finally:
        dist.destroy_process_group()


def train_main(rank: int, world: int, options: dict, result_path: str | None = None) -> dict | None:
    """One rank of a training run (the process group is up); rank 0's report."""
    import torch
    import torch.distributed as dist

    from .backward import gradient_reductions
    from .executor import count_calls
    from .parallel import parallelize

    dtype = torch.float64 if options.get("dtype") == "float64" else torch.float32
    torch.set_default_dtype(dtype)
    t0 = time.perf_counter()
    plan, module, inputs = _model(options, dtype)
    if plan.mesh.size != world:
        raise RunError(f"the mesh {plan.mesh} has {plan.mesh.size} devices but {world} ranks run")
    reference = copy.deepcopy(module)
    pmod = parallelize(module, plan.mesh, plan, example_inputs=inputs)
    setup = time.perf_counter() - t0
    steps, lr = int(options.get("steps") or 1), options.get("lr")
    kind = options.get("optimizer") or "adamw"
    make_opt = {"adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3 if lr is None else lr),
                "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-2 if lr is None else lr)}[kind]
    opt, ref_opt = make_opt(pmod.parameters()), make_opt(reference.parameters())
    rng = np.random.default_rng(options.get("seed", 0) + 1)
    G = [torch.from_numpy(rng.standard_normal(plan.program.tensors[n].shape)).to(dtype) for n in plan.program.outputs]
    run = torch.compile(pmod, fullgraph=True) if options.get("compile") else pmod
    counted: dict = {"forward": {}, "backward": {}}
    losses, ref_losses, times = [], [], []
    for step in range(steps):
        dist.barrier()
        t = time.perf_counter()
        count = step == 0 and not options.get("compile")  # the first eager step, at the dispatcher
        with count_calls(counted["forward"]) if count else _null():
            out = run(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        loss = sum((o.full_tensor() * g).sum() for o, g in zip(outs, G))
        with count_calls(counted["backward"]) if count else _null():
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        times.append(time.perf_counter() - t)
        losses.append(float(loss.detach()))
        ref_out = reference(*inputs)
        ref_outs = ref_out if isinstance(ref_out, tuple) else (ref_out,)
        ref_loss = sum((o * g).sum() for o, g in zip(ref_outs, G))
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        ref_losses.append(float(ref_loss.detach()))
        if options.get("progress") and rank == 0:
            print(f"step {step + 1}/{steps}: loss {losses[-1]:.6g}", flush=True)
    ref_params = dict(reference.named_parameters())
    errs = sorted(((_rel(p.full_tensor(), ref_params[n]), n) for n, p in pmod.named_parameters()), reverse=True)
    param_rel, worst_param = errs[0] if errs else (0.0, None)
    loss_rel = max((abs(a - b) / max(abs(b), 1e-300) for a, b in zip(losses, ref_losses)), default=0.0)
    worst = torch.tensor([loss_rel, param_rel], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    loss_rel, param_rel = float(worst[0]), float(worst[1])
    tol = 1e-9 if dtype == torch.float64 else 1e-5
    planned = planned_functional(plan, gradient_reductions(plan))
    steady = times[1:] or times
    report = {
        "ranks": world, "mesh": str(plan.mesh), "backend": options.get("backend", "gloo"), "steps": steps,
        "optimizer": options.get("optimizer") or "adamw", "compile": bool(options.get("compile")),
        "losses": losses, "reference_losses": ref_losses, "max_loss_rel_err": loss_rel,
        "max_param_rel_err": param_rel, "worst_param_on_rank0": worst_param,
        "tolerance": f"{str(dtype).replace('torch.', '')}: {tol:g} relative",
        "equal": bool(loss_rel <= tol and param_rel <= tol),
        "collectives": None if options.get("compile") else counted, "planned_collectives": planned,
        "step_seconds": {"median": statistics.median(steady), "min": min(steady), "max": max(steady),
                         "steps": len(steady)},
        "first_step_seconds": times[0], "setup_seconds": setup, "seconds": time.perf_counter() - t0,
    }
    if rank == 0 and result_path:
        with open(result_path, "w") as f:
            json.dump(report, f)
    return report if rank == 0 else None


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


__all__ = ["ProgramModule", "planned_functional", "train_main", "train_rank"]
