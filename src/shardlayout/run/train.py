"""``shardlayout run --steps N``: train with a plan through ``parallelize``, compared with the unsharded model.

Every rank builds the same model (the user's ``--module``, or the program of a built-in model or
JSON as a :class:`ProgramModule` with seeded parameters), plans it, keeps an unsharded copy as the
reference, and turns the other copy into the parallel module (``run.parallel.parallelize``). Each
step: forward, the loss ``sum(output * G)`` for a fixed random ``G`` per output, backward, the
optimizer (``torch.optim.AdamW`` or ``SGD``) — on both, in the same process. The report holds both
loss curves, the largest relative difference of losses (relative to the sum of the loss's terms'
magnitudes, as a sum that cancels is only that exact) and of updated parameters (AdamW: over the
elements whose reference gradient float32 computes well enough to compare, ``_mark_noise``), the collectives
that ran in the first step counted at the dispatcher (functional collectives, forward and
backward apart, ``executor.count_calls``) next to the planned ones, and the steady-state step time.
"""

from __future__ import annotations

import copy
import json
import statistics
import time

import numpy as np

from ..errors import CheckpointError, RunError


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

    from ..jobs import _call_factory, build_plan, hf_source
    from .launch import _global_inputs
    from .once import made_once

    ns = argparse.Namespace(**options)
    if options.get("module") or options.get("hf"):
        module, example_args, dynamic = (hf_source(ns, "cpu") if options.get("hf")
                                         else _call_factory(options["module"]))
        if dynamic is not None:
            raise RunError("--steps trains at the example sizes: drop the factory's dynamic_shapes")
        module = module.to(dtype)
        args = tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                     for a in example_args)
        from ..program.torch_import import from_torch

        plan = build_plan(ns, program=made_once(lambda: from_torch(module, args)))
        return plan, module, args
    plan = build_plan(ns)
    values = _global_inputs(plan, options.get("seed", 0), str(dtype).replace("torch.", ""))
    module = ProgramModule(plan, values)
    return plan, module, tuple(values[n] for n in plan.program.inputs("input"))


def planned_functional(plan, reductions: dict, streams=()) -> dict:
    """The collectives one training step should run, by primitive, forward and backward apart:
    ``{"forward": {kind: n}, "backward": {kind: n}}`` (``launch._planned_counts``; ``streams``:
    the segments run chunk by chunk)."""
    from .launch import _planned_counts

    out: dict = {"forward": {}, "backward": {}}
    for k, n in _planned_counts(plan, True, reductions, streams).items():
        side = "backward" if k.startswith("backward_") else "forward"
        kind = k.removeprefix("backward_")
        kind = "all_to_all" if kind == "permute" else kind  # a ring step is one all_to_all_single (run.moves)
        out[side][kind] = out[side].get(kind, 0) + n
    return out


MARGIN = 0.1  # the sharded run's own rounding is another sample of the same size: a tenth of what is allowed


def _mark_noise(noise: dict, reference, exact, inputs, G, lr: float, tol: float) -> None:
    """Add to ``noise`` (name -> bool mask) the parameter elements whose float32 gradient in
    ``reference`` (just computed) is too inexact for the parameter check: off the same gradient
    computed in float64 from the same parameters by more than ``MARGIN * tol * max|p| / lr`` of
    itself.
    AdamW divides a gradient by its own running magnitude, so an element's step carries its
    gradient's relative error times ``lr``; where that error is the unsharded model's own rounding
    (a true gradient near zero: the unrotated part of a key bias under softmax, whose float32 sign
    is noise and whose step is +-lr either way), no two summation orders agree: the check skips
    those elements (the report counts them) and ``_align`` keeps them equal for the next step.
    ``exact``: a float64 copy of ``reference`` made once; its parameters are set to the reference's
    here."""
    import torch

    with torch.no_grad():
        for p64, p in zip(exact.parameters(), reference.parameters()):
            p64.copy_(p)
    exact.zero_grad(set_to_none=True)
    args = tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in inputs)
    was = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # tensors the forward makes (positions, masks) in float64 too
    try:
        out = _tensors(exact(*args))
        sum((o * g.double()).sum() for o, g in zip(out, G)).backward()
    finally:
        torch.set_default_dtype(was)
    want = dict(exact.named_parameters())
    for n, p in reference.named_parameters():
        if p.grad is None or want[n].grad is None or not p.numel():
            continue
        g, g64 = p.grad.detach().double(), want[n].grad
        allowed = min(0.5, MARGIN * tol * float(p.detach().abs().max()) / lr)
        m = (g - g64).abs() > allowed * g64.abs()
        noise[n] = noise[n] | m if n in noise else m


def _align(reference, pmod, noise: dict) -> None:
    """Set the reference's ``noise`` elements to the parallel module's values: their step is
    undetermined in float32, and left apart they would feed every later gradient two different
    models; the parameter check skips them. Which parameters to gather is decided by every rank
    together (one all-reduce of the flags), so no rank waits in a gather another skips."""
    import torch
    import torch.distributed as dist

    ref = dict(reference.named_parameters())
    names = [n for n, _ in pmod.named_parameters()]
    flags = torch.tensor([float(n in noise and bool(noise[n].any())) for n in names], dtype=torch.float64)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    with torch.no_grad():
        for (n, p), flag in zip(pmod.named_parameters(), flags.tolist()):
            if flag:
                m = noise.get(n)
                if m is not None:
                    ref[n][m] = p.full_tensor()[m]
                else:
                    p.full_tensor()  # this rank marked nothing here; the gather is collective


def _rel(a, b, skip=None) -> float:
    """Largest difference of ``a`` and ``b`` relative to ``b``'s largest element, over the
    elements ``skip`` (a bool mask) does not mark."""
    a, b = a.detach().double(), b.detach().double()
    if skip is not None and bool(skip.any()):
        a, b = a[~skip], b[~skip]
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
    pmod = parallelize(module, plan.mesh, plan, example_inputs=inputs, streams=options.get("streams", True))
    setup = time.perf_counter() - t0
    steps, lr = int(options.get("steps") or 1), options.get("lr")
    kind = options.get("optimizer") or "adamw"
    make_opt = {"adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3 if lr is None else lr),
                "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-2 if lr is None else lr)}[kind]
    weights = None
    if options.get("weights"):  # each rank reads its own pieces; the reference reads whole tensors
        from .weights import load_safetensors

        weights = load_safetensors(pmod, options["weights"])
        load_safetensors(reference, options["weights"])
    opt, ref_opt = make_opt(pmod.parameters()), make_opt(reference.parameters())
    loaded = None
    if options.get("resume"):  # both sides from the checkpoint: the parallel one resharded by DCP
        loaded = load_checkpoint(options["checkpoint"], pmod, opt)
        load_checkpoint(options["checkpoint"], reference, ref_opt)
    rng = np.random.default_rng(options.get("seed", 0) + 1)
    G = [torch.from_numpy(rng.standard_normal(plan.program.tensors[n].shape)).to(dtype) for n in plan.program.outputs]
    run = torch.compile(pmod, fullgraph=True) if options.get("compile") else pmod
    counted: dict = {"forward": {}, "backward": {}}
    losses, ref_losses, times = [], [], []
    scales = []  # sum |output * G| of each reference step: the size of the loss's terms
    noise: dict = {}  # parameter -> elements whose reference gradient is too inexact to compare steps
    exact = None  # float64 copy of the reference (float32 AdamW runs), made at the first step; False: none runs
    no_exact = None  # why the float64 reference could not run (every rank alike: the same model)
    from .launch import HALF_RTOL, _half_precision, stream_report

    half = _half_precision(plan.program)  # ops computed in bfloat16/float16 round per summation order
    tol = HALF_RTOL if half else 1e-9 if dtype == torch.float64 else 1e-5
    for step in range(steps):
        dist.barrier()
        t = time.perf_counter()
        count = step == 0 and not options.get("compile")  # the first eager step, at the dispatcher
        with count_calls(counted["forward"]) if count else _null():
            out = run(*inputs)
        outs = _tensors(out)
        loss = sum((o.full_tensor() * g).sum() for o, g in zip(outs, G))
        with count_calls(counted["backward"]) if count else _null():
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        times.append(time.perf_counter() - t)
        losses.append(float(loss.detach()))
        ref_out = reference(*inputs)
        ref_outs = _tensors(ref_out)
        ref_loss = sum((o * g).sum() for o, g in zip(ref_outs, G))
        ref_loss.backward()
        if dtype != torch.float64 and kind == "adamw" and exact is not False:
            if exact is None:
                exact = copy.deepcopy(reference).double()
            try:
                _mark_noise(noise, reference, exact, inputs, G, ref_opt.param_groups[0]["lr"], tol)
            except (RuntimeError, NotImplementedError) as e:  # an op with no float64 kernel (CPU _grouped_mm)
                exact, no_exact = False, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        if noise:
            _align(reference, pmod, noise)
        ref_losses.append(float(ref_loss.detach()))
        scales.append(float(sum((o.detach() * g).abs().sum() for o, g in zip(ref_outs, G))))
        if options.get("progress") and rank == 0:
            print(f"step {step + 1}/{steps}: loss {losses[-1]:.6g}", flush=True)
    saved = save_checkpoint(options["checkpoint"], pmod, opt, (loaded or {}).get("steps", 0) + steps) \
        if options.get("checkpoint") else None
    ref_params = dict(reference.named_parameters())
    errs = sorted(((_rel(p.full_tensor(), ref_params[n], noise.get(n)), n) for n, p in pmod.named_parameters()),
                  reverse=True)
    skipped = int(sum(int(m.sum()) for m in noise.values()))
    param_rel, worst_param = errs[0] if errs else (0.0, None)
    # relative to the size of the loss's terms (sum |o * G| >= |loss|): a sum of random-signed terms can cancel
    loss_rel = max((abs(a - b) / max(c, 1e-300) for a, b, c in zip(losses, ref_losses, scales)), default=0.0)
    worst = torch.tensor([loss_rel, param_rel], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    loss_rel, param_rel = float(worst[0]), float(worst[1])
    planned = planned_functional(plan, gradient_reductions(plan), pmod.streams)
    steady = times[1:] or times
    report = {
        "streams": stream_report(plan, pmod.streams),
        "ranks": world, "mesh": str(plan.mesh), "backend": options.get("backend", "gloo"), "steps": steps,
        "optimizer": options.get("optimizer") or "adamw", "compile": bool(options.get("compile")),
        "losses": losses, "reference_losses": ref_losses, "max_loss_rel_err": loss_rel,
        "max_param_rel_err": param_rel, "worst_param_on_rank0": worst_param,
        "param_elements_skipped": skipped, "float64_reference": no_exact is None and exact is not None,
        "float64_reference_missing": no_exact,
        "tolerance": f"{half or str(dtype).replace('torch.', '')}: {tol:g} relative",
        "equal": bool(loss_rel <= tol and param_rel <= tol),
        "collectives": None if options.get("compile") else counted, "planned_collectives": planned,
        "step_seconds": {"median": statistics.median(steady), "min": min(steady), "max": max(steady),
                         "steps": len(steady)},
        "checkpoint": {"saved": saved, "loaded": loaded}, "weights": weights,
        "first_step_seconds": times[0], "setup_seconds": setup, "seconds": time.perf_counter() - t0,
    }
    if rank == 0 and result_path:
        with open(result_path, "w") as f:
            json.dump(report, f)
    return report if rank == 0 else None


def save_checkpoint(path: str, module, optimizer, steps: int) -> dict:
    """Save ``module``'s and ``optimizer``'s state with ``torch.distributed.checkpoint`` (every rank
    writes its own shards; DTensor placements are kept, so any plan or mesh can load it);
    ``{"path", "tensors", "steps"}``. Collective. Written to ``path + ".saving"`` and swapped in
    once every rank has written: a job that dies while saving leaves the previous checkpoint whole."""
    import os
    import shutil

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = os.path.abspath(path)
    staging, old = path + ".saving", path + ".old"
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)  # a save that died before
    dist.barrier()
    msd, osd = get_state_dict(module, optimizer)
    dcp.save({"model": msd, "optim": osd, "trained_steps": steps}, checkpoint_id=staging)
    if os.environ.get("SHARDLAYOUT_FAIL_SAVE_RANK") == str(rank):  # tests: die after writing, before the swap
        os._exit(1)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(path):
            os.replace(path, old)
        os.replace(staging, path)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return {"path": path, "tensors": len(msd), "steps": steps}


def check_checkpoint(path: str, shapes: dict, exact: bool = True) -> None:
    """Raise ``CheckpointError`` unless ``path`` holds a ``save_checkpoint`` of a model whose state
    is exactly ``shapes`` (``{name: shape}``; ``exact=False``: at least those, as the parameters
    alone are known before the model is built): read from its metadata alone, before any rank loads.
    ``check_checkpoint("ck", {"layers.0.wq": (16, 16), ...})``"""
    import os

    import torch.distributed.checkpoint as dcp

    if not os.path.isdir(path) or not os.path.exists(os.path.join(path, ".metadata")):
        raise CheckpointError(f"--resume: {path} holds no checkpoint (no .metadata file); save one with "
                              "--checkpoint DIR first")
    try:
        meta = dcp.FileSystemReader(path).read_metadata()
    except Exception as e:  # noqa: BLE001 - a damaged metadata file: one line
        raise CheckpointError(f"--resume: {path}/.metadata cannot be read ({type(e).__name__}): a damaged "
                              "checkpoint") from None
    ends: dict = {}  # every file the metadata reads from, and how far into it
    for index, info in (getattr(meta, "storage_data", None) or {}).items():
        f = getattr(info, "relative_path", None)
        end = int(info.offset) + int(info.length)
        if f is not None and (f not in ends or end > ends[f][0]):
            ends[f] = (end, index.fqn)
    for f, (end, fqn) in sorted(ends.items()):
        full = os.path.join(path, f)
        if not os.path.isfile(full):
            raise CheckpointError(f"--resume: the checkpoint in {path} misses its file {f} (it holds {fqn}); the "
                                  "checkpoint is incomplete")
        if os.path.getsize(full) < end:
            raise CheckpointError(f"--resume: the checkpoint file {full} is truncated ({os.path.getsize(full)} of at "
                                  f"least {end} bytes; it holds {fqn}); the checkpoint is damaged")
    saved = {k.removeprefix("model."): v for k, v in meta.state_dict_metadata.items() if k.startswith("model.")}
    missing, extra = sorted(set(shapes) - set(saved)), sorted(set(saved) - set(shapes)) if exact else []
    if missing or extra:
        raise CheckpointError(f"--resume: the checkpoint in {path} is of another model: "
                              + (f"it has no {', '.join(missing[:3])}" if missing else "")
                              + ("; " if missing and extra else "")
                              + (f"it has {', '.join(extra[:3])}, which this model has not" if extra else ""))
    for k, shape in shapes.items():
        got = tuple(getattr(saved[k], "size", ()))
        if got != tuple(shape):
            raise CheckpointError(f"--resume: tensor {k} is {got} in the checkpoint in {path}, {tuple(shape)} "
                                  "in this model")


def load_checkpoint(path: str, module, optimizer) -> dict:
    """Load a ``save_checkpoint`` directory into ``module`` and ``optimizer`` (a parallel module
    under any plan, or the unsharded model), resharded by DCP; a checkpoint of another model, a
    missing or damaged file is a ``CheckpointError`` naming the tensor, before any state changes."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.utils._pytree import tree_map

    msd, osd = get_state_dict(module, optimizer)
    check_checkpoint(path, {k: tuple(v.shape) for k, v in msd.items()})
    # read into copies: a load that fails half-way leaves the module and optimizer as they were
    fresh = lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
    state = {"model": tree_map(fresh, msd), "optim": tree_map(fresh, osd), "trained_steps": 0}
    try:
        dcp.load(state, checkpoint_id=path)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - a truncated or missing shard file: one line
        raise CheckpointError(f"--resume: reading the checkpoint in {path} failed ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:200]}); the files are damaged or incomplete") from None
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return {"path": path, "tensors": len(msd), "steps": int(state["trained_steps"])}


def _tensors(out) -> list:
    """The tensors of a forward's output (a tensor, tuple, dict or ``ModelOutput``), in order."""
    import torch
    from torch.utils._pytree import tree_leaves

    return [v for v in tree_leaves(out) if isinstance(v, torch.Tensor)]


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


__all__ = ["ProgramModule", "planned_functional", "train_main", "train_rank"]
