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

from ..errors import RunError, ShardingError
from ..execute import walk
from ..jobs import build_plan
from .backward import grad_tensors, gradient_reductions, training_pieces
from .once import PeerFailed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference(plan, inputs: dict) -> dict:
    """The unsharded program in one process, on torch (the oracle every rank compares with);
    ragged tensors routed from the plan's sources (``execute.verify.reference_run``)."""
    import torch

    from ..execute.verify import reference_run
    from .torch_ops import torch_op

    return reference_run(plan, inputs, torch_op, torch)


def _global_inputs(plan, seed: int, dtype: str = "float32") -> dict:
    import torch

    rng = np.random.default_rng(seed)
    out = {}
    for name in plan.program.inputs():
        t = plan.program.tensors[name]
        if t.dtype.startswith(("int", "uint")):  # token ids: valid rows of every table they index
            out[name] = torch.from_numpy(rng.integers(0, _index_bound(plan.program, name), t.shape))
        elif t.dtype == "bool":  # masks
            out[name] = torch.from_numpy(rng.integers(0, 2, t.shape).astype(bool))
        elif t.kind == "rand":  # a uniform draw (dropout's), one over the global shape
            out[name] = torch.from_numpy(rng.random(t.shape).astype(dtype))
        else:
            out[name] = torch.from_numpy(rng.standard_normal(t.shape).astype(dtype))
    return out


def _index_bound(prog, name: str) -> int:
    """The rows of the smallest embedding table ``name`` indexes (2 when it indexes none)."""
    from ..ops.result import canonical_op_name

    rows = [prog.tensors[op.inputs[0]].shape[0] for op in prog.ops
            if canonical_op_name(op.target) == "embedding" and len(op.inputs) > 1 and op.inputs[1] == name]
    return min(rows, default=2)


class _Compare:
    """Running comparison of local values with the reference: float tolerance relative to each
    tensor's scale (a sharded sum adds in another order than the unsharded one)."""

    def __init__(self, tight: bool, loose_rtol: float = 1e-4):
        self.rtol, self.atol = (1e-10, 1e-12) if tight else (loose_rtol, 1e-5)
        self.err, self.rel, self.count, self.ok, self.first_bad = 0.0, 0.0, 0, True, None

    def add(self, name: str, value, want) -> None:
        if tuple(value.shape) != tuple(want.shape):
            self.ok, self.err = False, float("inf")
            self.first_bad = self.first_bad or name
            return
        if value.numel():
            diff = float((value.detach().double() - want.detach().double()).abs().max())
            scale = float(want.detach().double().abs().max())
            self.err = max(self.err, diff)
            self.rel = max(self.rel, diff / scale if scale else diff)
            if diff > self.atol + self.rtol * scale:
                self.first_bad = self.first_bad or name
                self.ok = False
        self.count += 1

    def add_nested(self, name: str, value, want) -> None:
        """A nested piece: the same extents, then the rows compared as ``add`` does."""
        if not np.array_equal(value.extents, want.extents):
            self.ok, self.err = False, float("inf")
            self.first_bad = self.first_bad or name
            return
        self.add(name, value.data, want.data)

    def worst(self, torch, dist):
        """(max abs error, any mismatch, max relative error) over every rank."""
        t = torch.tensor([self.err if self.err == self.err else float("inf"), 0.0 if self.ok else 1.0, self.rel],
                         dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t[0].item(), t[1].item() == 0.0, t[2].item()


HALF_RTOL = 2e-2
"""Relative tolerance of a program that computes in bfloat16 or float16 (a few units of bfloat16's
2**-8 rounding, which a sharded sum reaches in another order than the unsharded one)."""


def _half_precision(prog) -> str | None:
    """The half-precision dtype some tensor of ``prog`` has (``"bfloat16"``, ``"float16"``), or None."""
    return next((t.dtype for t in prog.tensors.values() if t.dtype in ("bfloat16", "float16")), None)


def _tight(prog, options: dict) -> bool:
    """Compare to float64's 1e-10: a float64 run of a program computing in float64 alone (a model
    that casts to float32 inside, as transformers' RMSNorm does, rounds there as float32 does: a
    sum of partials in another order differs by float32's rounding)."""
    return options.get("dtype") == "float64" and not any(
        t.dtype in ("bfloat16", "float16", "float32") for t in prog.tensors.values())


def check_trainable(plan, train: bool) -> None:
    """Raise RunError when ``train`` is asked of a plan this runner cannot train: a ragged
    collective whose routed rows sit on two ranks of its group (``run.ragged.untrainable``)."""
    if not train or not any(t.ragged is not None for t in plan.program.tensors.values()):
        return
    from .ragged import untrainable

    why = untrainable(plan)
    if why is not None:
        raise RunError(f"--train: {why}")


def rank_main(rank: int, world: int, build, options: dict, init_method: str | None = None,
              result_path: str | None = None) -> dict | None:
    """Run one rank: ``build()`` returns the plan; ``options`` holds backend, timeout, seed,
    dtype and train. Returns rank 0's report (None on the other ranks)."""
    import torch
    import torch.distributed as dist

    from ..sharding.ragged import nested_piece
    from .executor import TorchRankExecutor, count_calls, plan_groups
    from .program import stream_pieces

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64 if options.get("dtype") == "float64" else torch.float32)
    train, lr = bool(options.get("train")), 0.1
    t0 = time.perf_counter()
    kw = {"init_method": init_method} if init_method else {}
    dist.init_process_group(options.get("backend", "gloo"), rank=rank, world_size=world,
                            timeout=timedelta(seconds=options.get("timeout", 60)), **kw)
    try:
        plan = build()
        if plan.mesh.size != world:
            raise RunError(f"the mesh {plan.mesh} has {plan.mesh.size} devices but {world} ranks run; "
                           f"give --nproc {plan.mesh.size} (or a mesh of {world} devices)")
        check_trainable(plan, train)
        reductions = gradient_reductions(plan) if train else {}
        streams, whole = _streams(plan, options)
        groups = {}
        for pieces, members in plan_groups(plan, training_pieces(plan, reductions) | stream_pieces(plan, streams)):
            g = dist.new_group(list(members)) if len(members) > 1 else None
            if rank in members:
                groups[pieces] = (g, members)
        fail = os.environ.get("SHARDLAYOUT_FAIL_RANK")

        def after(c):
            if fail is not None and int(fail) == rank:
                os._exit(1)

        ex = TorchRankExecutor(plan.mesh, rank, groups, after, reductions)
        prog = plan.program
        glob = _global_inputs(plan, options.get("seed", 0), options.get("dtype", "float32"))
        params = set(prog.inputs("param")) if train else set()
        for n in params:
            glob[n].requires_grad_(True)
        ref = _reference(plan, glob)
        local = {}
        for n in prog.inputs():
            piece = glob[n].detach()[_ix(plan.shardings[n].indices(rank))].clone()
            local[n] = piece.requires_grad_(True) if n in params else piece
        half = _half_precision(prog)  # ops computed in bfloat16/float16 round differently per summation order
        forward = _Compare(_tight(prog, options), HALF_RTOL if half else 1e-4)
        values = {}
        fwd_calls: dict = {}  # functional collectives that reached the dispatcher, by primitive
        with torch.enable_grad() if train else torch.no_grad(), count_calls(fwd_calls):
            for name, value in walk(plan, ex, local, streams):
                values[name] = value
                s = plan.shardings[name]
                if s.partial:  # a partial sum is compared once reduced, where the plan reduces it
                    continue
                ragged = prog.tensors[name].ragged
                if ragged is not None:  # this rank's blocks of the routed reference
                    forward.add_nested(name, value, nested_piece(s, ragged, ref[name], rank,
                                                                 plan.ragged_sources(name)))
                else:
                    forward.add(name, value, ref[name][_ix(s.indices(rank))])
        grads, bwd_calls = None, {}
        if train:
            with count_calls(bwd_calls):
                grads = _train_step(plan, rank, ex, glob, ref, local, values, lr, options)
        for calls in (fwd_calls, bwd_calls):
            for k, n in calls.items():
                ex.primitives[k] = ex.primitives.get(k, 0) + n
        for k, n in bwd_calls.items():  # the backward's collectives, as the dispatcher saw them
            ex.counts[f"backward_{k}"] = ex.counts.get(f"backward_{k}", 0) + n
        steps = _timed_steps(plan, rank, ex, local, options, streams) if options.get("repeat") else None
        err, equal, rel = forward.worst(torch, dist)
        g_err = g_equal = g_rel = None
        if grads is not None:
            g_err, g_equal, g_rel = grads.worst(torch, dist)
        planned = _planned_counts(plan, train, reductions, streams)
        report = {
            "ranks": world, "mesh": str(plan.mesh), "backend": options.get("backend", "gloo"),
            "equal": bool(equal and (g_equal is None or g_equal)), "max_abs_err": err, "max_rel_err": rel,
            "grads_max_abs_err": g_err, "grads_max_rel_err": g_rel, "collectives": dict(sorted(ex.counts.items())),
            "planned_collectives": dict(sorted(planned.items())), "tensors_compared": forward.count,
            "torch_calls": dict(sorted(ex.primitives.items())),
            "first_mismatch_on_rank0": forward.first_bad or (grads.first_bad if grads else None),
            "step_seconds": steps,
            "tolerance": (f"{_half_precision(prog)}: relative {HALF_RTOL}" if _half_precision(prog) else
                          "float64: 1e-10 relative" if _tight(prog, options) else
                          "float64 with float32 ops: float32's" if options.get("dtype") == "float64" else "float32"),
            "streams": stream_report(plan, streams),
            "streams_whole": whole,
            "seconds": time.perf_counter() - t0,
        }
        if rank == 0 and result_path:
            with open(result_path, "w") as f:
                json.dump(report, f)
        return report if rank == 0 else None
    finally:
        dist.destroy_process_group()


def _timed_steps(plan, rank, ex, local, options, streams=()) -> dict:
    """Steady state: ``repeat`` more steps (forward, or with ``train`` forward + backward, every
    collective of a training step) after the checked one, each between barriers; the median, min
    and max seconds of a step."""
    import statistics

    import torch
    import torch.distributed as dist

    counts, calls = dict(ex.counts), dict(ex.primitives)
    times = []
    for _ in range(int(options["repeat"])):
        inputs = {n: (v.detach().clone().requires_grad_(v.requires_grad)) for n, v in local.items()}
        dist.barrier()
        t = time.perf_counter()
        with torch.enable_grad() if options.get("train") else torch.no_grad():
            values = dict(walk(plan, ex, inputs, streams))
            if options.get("train"):
                outs = [values[n] for n in plan.program.outputs]
                torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        dist.barrier()
        times.append(time.perf_counter() - t)
    ex.counts, ex.primitives = counts, calls  # the report counts the checked step only
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "steps": len(times)}


def _train_step(plan, rank, ex, glob, ref, local, values, lr, options) -> _Compare:
    """Backward through the planned collectives and one SGD step, compared with the unsharded run.

    The loss is ``sum(output * G)`` for a fixed random G per program output; each rank seeds its
    piece with ``G``'s elements (complete gradients: a replicated value's gradient is replicated),
    and the partial gradients are summed where ``run.backward`` planned it."""
    import torch

    prog = plan.program
    rng = np.random.default_rng(options.get("seed", 0) + 1)
    outs, seeds, ref_loss = [], [], 0
    for name in prog.outputs:
        s = plan.shardings[name]
        if s.partial:
            raise RunError(f"--train: output {name} is a partial sum ({s}); pin it reduced to train")
        G = torch.from_numpy(rng.standard_normal(prog.tensors[name].shape)).to(torch.get_default_dtype())
        outs.append(values[name])
        seeds.append(G[_ix(s.indices(rank))])
        ref_loss = ref_loss + (ref[name] * G).sum()
    ref_loss.backward()
    torch.autograd.backward(outs, seeds)
    half = _half_precision(prog)
    cmp = _Compare(_tight(prog, options),  # float32 gradients: 1e-3 of scale
                   loose_rtol=HALF_RTOL if half else 1e-3)
    for name in prog.inputs("param"):
        s = plan.shardings[name]
        g = local[name].grad if local[name].grad is not None else torch.zeros_like(local[name])
        ref_g = glob[name].grad if glob[name].grad is not None else torch.zeros_like(glob[name])
        idx = _ix(s.indices(rank))
        cmp.add(f"grad of {name}", g, ref_g[idx])
        updated = local[name].detach() - lr * g
        cmp.add(f"updated {name}", updated, (glob[name].detach() - lr * ref_g)[idx])
    return cmp


def stream_report(plan, segs) -> list:
    """The report's ``streams``: per segment run chunk by chunk, the moved tensor, the side of
    the ops its move is on, the chunks and the ops."""
    return [{"tensor": (sg.before or sg.after)[0], "side": "before" if sg.before else "after", "chunks": sg.k,
             "ops": [plan.program.ops[i].name for i in sg.ops]} for sg in segs]


def _streams(plan, options: dict) -> tuple:
    """``(segments, why not)``: the plan's stream choices this run executes chunk by chunk
    (``execute.stream``), forward and backward, and what runs whole instead: every choice under
    ``--no-streams``, the choices whose path a chunk cannot follow. Ring-style streams run when the
    plan was made with ``--ring``: ``k - 1`` send/recv steps to the next rank of the ring."""
    from ..execute.stream import segments

    if not options.get("streams", True):
        return (), "--no-streams"
    segs, skipped = segments(plan)
    return segs, (f"not chunkable: {', '.join(skipped)}" if skipped else None)


def _planned_counts(plan, train: bool, reductions=None, streams=()) -> dict:
    """Collectives every rank runs: the plan's (SPMD: each in its own group), a streamed move's
    chunk collectives ``k`` times instead of its whole ones; with training, the backward ones
    ``run.backward`` plans: one all-reduce per gradient reduction (per chunk where its readers
    read a stream's chunks), the adjoint of each forward collective that needs one (a
    reduce-scatter's all-gather, an all-to-all's reverse), and one all-reduce per local slice
    whose gradient must be completed."""
    from ..execute.stream import chunk_moves, chunked_reads, ring_backward
    from ..sharding.collective import CollectiveKind
    from .backward import reduction_at, slice_completions

    streamed = {seg.before or seg.after: seg for seg in streams}
    ran = []  # (tensor, collective, times) of every move the forward runs
    for (tensor, tgt), moves in plan.moves.items():
        seg = streamed.get((tensor, tgt))
        times = (seg.k - (seg.order is not None)) if seg else 1  # a ring's first chunk is the rank's own shard
        ran.extend((tensor, c, times) for c in (chunk_moves(plan, seg) if seg else moves))
    planned: dict = {}
    for _, c, times in ran:
        if c.kind.communicates:
            planned[c.kind.value] = planned.get(c.kind.value, 0) + times
    if train:
        needs = grad_tensors(plan.program)
        adjoint = {"reduce_scatter": "backward_all_gather", "all_to_all": "backward_all_to_all",
                   "permute": "backward_all_to_all"}
        n = 0
        for tensor, c, times in ran:
            if tensor in needs and c.kind.value in adjoint:
                planned[adjoint[c.kind.value]] = planned.get(adjoint[c.kind.value], 0) + times
            if tensor in needs and c.kind is CollectiveKind.LOCAL and slice_completions(c):
                n += times
        chunked = [(seg.k, chunked_reads(plan, seg)) for seg in streams]
        at = reduction_at(reductions or {})
        ringed = [ring_backward(plan, seg, at) for seg in streams]  # rings: summed by their backward
        unsummed = set().union(*(u for u, _ in ringed))
        n += sum(1 for _, whole in ringed for name, _, _ in whole.values() if name in needs)
        for readers in (reductions or {}).values():
            readers = set(readers) - unsummed
            n += sum(k for k, reads in chunked if readers & reads)
            n += bool(readers - set().union(*(reads for _, reads in chunked)))
        if n:
            planned["backward_all_reduce"] = n
    return {k: v for k, v in planned.items() if v}


def _ix(idx):
    import torch

    return tuple(torch.from_numpy(np.asarray(i, dtype=np.int64)) for i in np.ix_(*idx))


def rank_plan(ns):
    """The plan a rank runs (``jobs.build_plan``), a model that ``torch.export`` imports (``--module``,
    ``--hf``, ``--export``) imported by rank 0 alone (``once.made_once``). Collective."""
    from ..jobs import load_program
    from .once import made_once

    if any(getattr(ns, k, None) for k in ("module", "hf", "export")):
        return build_plan(ns, program=made_once(lambda: load_program(ns)))
    return build_plan(ns)


def _child(rank, world, args_dict, init_method, result_path, job=None):
    """Entry point of a rank (module level: picklable); ``job``: another rank function with
    ``rank_main``'s call (``run.train.train_rank``), else ``rank_main`` on the options' plan."""
    import argparse

    ns = argparse.Namespace(**args_dict)
    try:
        if job is not None:
            job(rank, world, args_dict, init_method, result_path)
        else:
            rank_main(rank, world, lambda: rank_plan(ns), args_dict, init_method, result_path)
    except PeerFailed:
        sys.exit(_PEER_LOST)
    except ShardingError as e:
        print(f"shardlayout: error: rank {rank}: {e}", file=sys.stderr)
        sys.exit(2)
    except Exception as e:  # noqa: BLE001 - one line naming the rank, never a traceback
        text = str(e).splitlines()[0] if str(e) else ""
        if "gloo/transport" in text:  # a peer's connection broke: the launcher names the rank that died first
            print(f"shardlayout: error: rank {rank}: lost its connection to another rank ({text[:160]})",
                  file=sys.stderr)
            sys.exit(_PEER_LOST)
        print(f"shardlayout: error: rank {rank}: {type(e).__name__}: {text}", file=sys.stderr)
        sys.exit(1)


_PEER_LOST = 3  # a rank's exit code when it failed only because another rank went away


def launch(args_dict: dict, nproc: int, job=None) -> dict:
    """Start ``nproc`` ranks of ``run`` on this machine (forked from a server process that imported
    torch once, not each importing it) and return rank 0's report; ``job``: the rank function
    (a module-level function: ``run.train.train_rank``; default ``rank_main``). Raises
    ``RunError`` naming the first rank that failed; no rank is left running."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")  # ranks fork from one server that imported torch once
    # what most jobs import (DTensor for parallelize; torch.export and dynamo for a module's import), once
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch.distributed.tensor", "torch.export",
                                "torch._dynamo", "shardlayout.run.executor", "shardlayout.run.launch",
                                "shardlayout.run.train"])
    with tempfile.TemporaryDirectory(prefix="shardlayout-run-") as tmp:
        init = f"tcp://127.0.0.1:{_free_port()}"
        result = os.path.join(tmp, "rank0.json")
        procs = [ctx.Process(target=_child, args=(r, nproc, args_dict, init, result, job), daemon=True)
                 for r in range(nproc)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + args_dict.get("timeout", 60) + 60  # + start-up (import torch)
        failed = None
        grace = None  # when only ranks that lost a peer have failed: how long to wait for the cause
        try:
            while time.monotonic() < deadline:
                alive = [p for p in procs if p.is_alive()]
                dead = [(r, p.exitcode) for r, p in enumerate(procs)
                        if not p.is_alive() and p.exitcode not in (0, None)]
                cause = [d for d in dead if d[1] != _PEER_LOST]
                if cause:
                    failed = cause[0]
                    break
                if dead:
                    failed = failed or dead[0]
                    grace = grace or time.monotonic() + 2.0
                    if time.monotonic() > grace:
                        break
                if not alive:
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


__all__ = ["RunError", "launch", "rank_main", "rank_plan"]
