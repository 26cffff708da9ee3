"""Serial vs streamed Megatron-SP MLP block on gloo (CPU), run as shardlayout runs plans: what
overlap this machine allows.

The block is a program (``x @ w1``, relu, ``@ w2``) planned with Megatron-SP's pins on ``tp=2``:
each rank's ``ROWS`` rows of ``x`` (``(ROWS, DIM)``, float32) are all-gathered, multiplied by
the column-parallel ``w1`` (``(DIM, FFN/2)`` per rank), relu, multiplied by the row-parallel
``w2`` and reduce-scattered back to the rank's rows. Every side runs the same plan through
``shardlayout.execute.walk`` with the torch.distributed executor (``shardlayout run``'s path):

* **serial** (``k = 1``): the plan's whole moves — one blocking all_gather, the matmuls, one
  blocking reduce_scatter;
* **streamed** (``k`` = 2, 4, 8): the plan's stream overlaps (``execute.stream.segments`` with
  ``chunks=k``): the rows cut into ``k`` chunks, each chunk's all_gather issued (a functional
  collective, waited for one chunk later) while the previous chunk's matmuls run, each chunk's
  reduce_scatter issued as soon as its matmul is done.

Each rank uses one torch thread (gloo's own threads do the communication). Before timing, every
streamed output is checked equal to the serial one. Then ``ROUNDS`` rounds, each timing every
side once in a rotated order, each step between two ``dist.barrier()``; the table gives rank 0's
median and p25–p75 per side and the ratio serial / side (> 1: the stream is faster). The first
two rows time the two parts alone (the plan's moves with no compute, the matmuls with no
collective), so the best a perfect overlap could reach is visible: max of the two instead of
their sum. Run: ``python benchmarks/bench_stream.py``.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import emit, spread  # noqa: E402

WORLD = 2
ROWS, DIM, FFN = 256, 512, 4096
KS = (1, 2, 4, 8)
ROUNDS = 15


def _plan():
    from shardlayout import Mesh, Sharding
    from shardlayout.plan import plan
    from shardlayout.program import ProgramBuilder

    mesh = Mesh.parse(f"tp={WORLD}")
    b = ProgramBuilder()
    x = b.input("x", (WORLD * ROWS, DIM))
    w1, w2 = b.param("w1", (DIM, FFN)), b.param("w2", (FFN, DIM))
    h = b.op("relu", [b.op("mm", [x, w1], name="h")], name="a")
    b.output(b.op("mm", [h, w2], name="y"))
    pins = {"x": f"[tp*{ROWS}, {DIM}]", "w1": f"[{DIM}, tp*{FFN // WORLD}]", "w2": f"[tp*{FFN // WORLD}, {DIM}]",
            "h": f"[{WORLD * ROWS}, tp*{FFN // WORLD}]", "a": f"[{WORLD * ROWS}, tp*{FFN // WORLD}]",
            "y": f"[tp*{ROWS}, {DIM}]"}  # Megatron-SP: the rows gathered, the ffn dim cut
    p = plan(b.build(), mesh, {k: Sharding.parse(v, mesh) for k, v in pins.items()})
    p.flop_rate = 1e13  # compute priced so that both moves are stream choices (their k is swept below)
    return p


def _rank(rank: int, path: str, q) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    from shardlayout.execute import walk
    from shardlayout.execute.stream import segments
    from shardlayout.run.executor import TorchRankExecutor, plan_groups

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=WORLD)
    p = _plan()
    groups = {}
    for pieces, members in plan_groups(p, set()):
        g = dist.new_group(list(members)) if len(members) > 1 else None
        if rank in members:
            groups[pieces] = (g, members)
    ex = TorchRankExecutor(p.mesh, rank, groups)
    rng = np.random.default_rng(0)
    glob = {n: torch.from_numpy(rng.standard_normal(p.program.tensors[n].shape).astype(np.float32))
            for n in p.program.inputs()}
    local = {n: v[tuple(torch.from_numpy(np.array(i)) for i in np.ix_(*p.shardings[n].indices(rank)))]
             for n, v in glob.items()}
    streams = {k: segments(p, chunks=k)[0] if k > 1 else () for k in KS}
    if any(len(streams[k]) != 2 for k in KS if k > 1):
        raise SystemExit(f"expected the gather and the reduce-scatter streamed, got {streams}")

    def step(k):
        with torch.no_grad():
            return dict(walk(p, ex, local, streams[k]))["y"]

    serial = step(1)
    # float32: chunked matmuls round differently; equal means within 1e-5 of the output's scale
    same = all(float((step(k) - serial).abs().max()) <= 1e-5 * float(serial.abs().max()) for k in KS)
    comm = [c for moves in p.moves.values() for c in moves if c.kind.communicates]

    def comm_only():
        with torch.no_grad():
            ex.collective(comm[0], local["x"])
            ex.collective(comm[1], serial.new_zeros((WORLD * ROWS, DIM)))

    def compute_only():
        with torch.no_grad():
            full = torch.cat([local["x"]] * WORLD)
            torch.relu(full @ local["w1"]) @ local["w2"]

    sides = [("comm only", comm_only), ("compute only", compute_only)] + [
        (f"k={k}", (lambda k=k: step(k))) for k in KS]
    times = {name: [] for name, _ in sides}
    for _, fn in sides:  # warm-up
        fn()
    for r in range(ROUNDS):
        order = sides[r % len(sides):] + sides[: r % len(sides)]
        for name, fn in order:
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            dist.barrier()
            times[name].append(time.perf_counter() - t0)
    q.put((rank, same, times))
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "store")
        procs = [ctx.Process(target=_rank, args=(r, path, q)) for r in range(WORLD)]
        for p in procs:
            p.start()
        got = {rank: (same, times) for rank, same, times in (q.get(timeout=600) for _ in procs)}
        for p in procs:
            p.join(60)
    same, times = got[0]
    if not all(s for s, _ in got.values()):
        raise SystemExit("a streamed block differs from the serial one")
    serial = statistics.median(times["k=1"])
    rows = []
    for name in ("comm only", "compute only") + tuple(f"k={k}" for k in KS):
        med = statistics.median(times[name])
        ratio = "" if name in ("comm only", "compute only") else f"{serial / med:.2f}x"
        rows.append([name, spread(times[name], 1e3), ratio])
    method = (f"Megatron-SP MLP block on {WORLD} gloo ranks (CPU, one torch thread each), planned by shardlayout "
              f"and run by its torch.distributed executor: each rank's ({ROWS}, {DIM}) float32 rows all-gathered, "
              f"@ w1 ({DIM}, {FFN // WORLD}), relu, @ w2 ({FFN // WORLD}, {DIM}), reduce-scattered; serial (k=1: the "
              "plan's whole moves) vs the plan's stream overlaps run in k chunks (`execute.stream`, each chunk's "
              f"collective issued, waited for a chunk later). {ROUNDS} rounds, sides rotated, each step between two "
              "barriers; "
              "rank 0's milliseconds, median (p25–p75); ratio = serial / streamed (> 1: faster). Every streamed "
              "output was checked equal to the serial one.")
    best = min(statistics.median(times[f"k={k}"]) for k in KS if k > 1)
    floor = max(statistics.median(times["comm only"]), statistics.median(times["compute only"]))
    notes = (f"A perfect overlap would take about max(comm, compute) = {floor * 1e3:.1f} ms instead of "
             f"their sum; the best streamed step took {best * 1e3:.1f} ms (serial {serial * 1e3:.1f} ms). On "
             "this 2-core machine gloo's communication threads compete with the two ranks' matmuls for the "
             "same cores, and each chunk pays gloo's per-call cost again, so the overlap measured here is a "
             "floor, not what NCCL on GPUs gives.")
    emit("stream", method, ["side", "ms", "ratio"], rows, notes)


if __name__ == "__main__":
    main()
