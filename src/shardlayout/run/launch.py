"""Start the ranks of a ``shardlayout run`` job and run one rank (see the package docstring)."""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
import warnings
from datetime import timedelta

import numpy as np

from ..errors import ShardingError
from ..execute import walk
from ..jobs import build_plan


class RunError(ShardingError):
    """A distributed run that could not start or did not finish (a rank died, a timeout)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference(plan, inputs: dict) -> dict:
    """The unsharded program in one process, on torch (the oracle every rank compares with)."""
    from ..ops.registry import get_op
    from .torch_ops import torch_op

    prog, ref = plan.program, dict(inputs)
    for op, po in zip(prog.ops, plan.ops):
        args = [ref[i] if isinstance(i, str) else i for i in op.inputs]
        ref.update(zip(op.outputs, torch_op(get_op(op.target), args, po.params,
                                            [prog.tensors[o].shape for o in op.outputs])))
    return ref


def _global_inputs(plan, seed: int, dtype: str = "float32") -> dict:
    import torch

    rng = np.random.default_rng(seed)
    out = {}
    for name in plan.program.inputs():
        t = plan.program.tensors[name]
        out[name] = torch.from_numpy(rng.standard_normal(t.shape).astype(dtype))
    return out


def rank_main(rank: int, world: int, build, options: dict, init_method: str | None = None,
              result_path: str | None = None) -> dict | None:
    """Run one rank: ``build()`` returns the plan; ``options`` holds backend, timeout, seed.
    Returns rank 0's report (None on the other ranks)."""
    import torch
    import torch.distributed as dist

    from .executor import TorchRankExecutor, plan_groups

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64 if options.get("dtype") == "float64" else torch.float32)
    t0 = time.perf_counter()
    kw = {"init_method": init_method} if init_method else {}
    dist.init_process_group(options.get("backend", "gloo"), rank=rank, world_size=world,
                            timeout=timedelta(seconds=options.get("timeout", 60)), **kw)
    try:
        plan = build()
        if plan.mesh.size != world:
            raise RunError(f"the mesh {plan.mesh} has {plan.mesh.size} devices but {world} ranks run; "
                           f"give --nproc {plan.mesh.size} (or a mesh of {world} devices)")
        groups = {}
        for pieces, members in plan_groups(plan):
            g = dist.new_group(list(members)) if len(members) > 1 else None
            if rank in members:
                groups[pieces] = (g, members)
        fail = os.environ.get("SHARDLAYOUT_FAIL_RANK")

        def after(c):
            if fail is not None and int(fail) == rank:
                os._exit(1)

        ex = TorchRankExecutor(plan.mesh, rank, groups, after)
        glob = _global_inputs(plan, options.get("seed", 0), options.get("dtype", "float32"))
        ref = _reference(plan, glob)
        local = {n: glob[n][_ix(plan.shardings[n].indices(rank))] for n in plan.program.inputs()}
        err, rel, compared, ok, first_bad = 0.0, 0.0, 0, True, None
        tight = options.get("dtype") == "float64"
        rtol, atol = (1e-10, 1e-12) if tight else (1e-4, 1e-5)
        with torch.no_grad():
            for name, value in walk(plan, ex, local):
                s = plan.shardings[name]
                if s.partial:
                    continue  # a partial sum is compared once reduced, where the plan reduces it
                want = ref[name][_ix(s.indices(rank))]
                if tuple(value.shape) != tuple(want.shape):
                    ok, err = False, float("inf")
                    break
                if value.numel():
                    err = max(err, float((value.double() - want.double()).abs().max()))
                    # float32 tolerance relative to the tensor's scale: a sharded sum adds in
                    # another order than the unsharded one
                    diff = float((value.double() - want.double()).abs().max())
                    scale = float(want.double().abs().max())
                    rel = max(rel, diff / scale if scale else diff)
                    close = diff <= atol + rtol * scale
                    if not close and ok:
                        first_bad = name
                    ok = ok and close
                compared += 1
        worst = torch.tensor([err if err == err else float("inf"), 0.0 if ok else 1.0, rel], dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        planned: dict = {}  # SPMD: every rank takes part in every planned collective, in its group
        for c in plan.collectives:
            planned[c.kind.value] = planned.get(c.kind.value, 0) + 1
        report = {
            "ranks": world, "mesh": str(plan.mesh), "backend": options.get("backend", "gloo"),
            "equal": worst[1].item() == 0.0, "max_abs_err": worst[0].item(), "max_rel_err": worst[2].item(),
            "grads_max_abs_err": None, "collectives": dict(sorted(ex.counts.items())),
            "planned_collectives": dict(sorted(planned.items())), "tensors_compared": compared,
            "first_mismatch_on_rank0": first_bad,
            "seconds": time.perf_counter() - t0,
        }
        if rank == 0 and result_path:
            with open(result_path, "w") as f:
                json.dump(report, f)
        return report if rank == 0 else None
    finally:
        dist.destroy_process_group()


def _ix(idx):
    import torch

    return tuple(torch.from_numpy(np.asarray(i, dtype=np.int64)) for i in np.ix_(*idx))


def _child(rank, world, args_dict, init_method, result_path):
    """Entry point of a spawned rank (module level: picklable)."""
    import argparse

    ns = argparse.Namespace(**args_dict)
    try:
        rank_main(rank, world, lambda: build_plan(ns), args_dict, init_method, result_path)
    except ShardingError as e:
        print(f"shardlayout: error: rank {rank}: {e}", file=sys.stderr)
        sys.exit(2)
    except Exception as e:  # noqa: BLE001 - one line naming the rank, never a traceback
        print(f"shardlayout: error: rank {rank}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
              file=sys.stderr)
        sys.exit(1)


def launch(args_dict: dict, nproc: int) -> dict:
    """Spawn ``nproc`` ranks of ``run`` on this machine and return rank 0's report. Raises
    ``RunError`` naming the first rank that failed; no rank is left running."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="shardlayout-run-") as tmp:
        init = f"tcp://127.0.0.1:{_free_port()}"
        result = os.path.join(tmp, "rank0.json")
        procs = [ctx.Process(target=_child, args=(r, nproc, args_dict, init, result), daemon=True)
                 for r in range(nproc)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + args_dict.get("timeout", 60) + 60  # + start-up (import torch)
        failed = None
        try:
            while time.monotonic() < deadline:
                alive = [p for p in procs if p.is_alive()]
                for r, p in enumerate(procs):
                    if not p.is_alive() and p.exitcode not in (0, None) and failed is None:
                        failed = (r, p.exitcode)
                if failed is not None or not alive:
                    break
                time.sleep(0.05)
            else:
                failed = failed or (-1, None)
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join()
        if failed is not None:
            r, code = failed
            if r < 0:
                raise RunError(f"the run did not finish within --timeout {args_dict.get('timeout', 60)} s "
                               "(+60 s start-up); every rank was stopped")
            raise RunError(f"rank {r} exited with code {code}; every other rank was stopped")
        if not os.path.exists(result):
            raise RunError("rank 0 finished without a report")
        with open(result) as f:
            return json.load(f)


__all__ = ["RunError", "launch", "rank_main"]
