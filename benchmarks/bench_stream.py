"""Serial vs streamed Megatron-SP MLP block on gloo (CPU): what overlap this machine allows.

The block, on each of ``WORLD`` ranks: the rank's ``ROWS`` rows of the sequence (``(ROWS, DIM)``,
float32) are all-gathered, multiplied by the column-parallel ``w1`` (``(DIM, FFN/WORLD)``), relu,
multiplied by the row-parallel ``w2`` (``(FFN/WORLD, DIM)``) and reduce-scattered back to the
rank's rows — Megatron-SP's all_gather and reduce_scatter around its MLP. Sides, both through
``shardlayout.run.stream.gather_compute_reduce_scatter`` (same collectives, same FLOPs):

* **serial** (``k = 1``): one blocking all_gather, the matmuls, one blocking reduce_scatter;
* **streamed** (``k`` = 2, 4, 8): the rows cut into ``k`` chunks (the ``~k`` factor after the mesh
  axis), each chunk's all_gather and reduce_scatter issued with ``async_op=True``, so gather
  ``j+1`` and reduce-scatter ``j-1`` run while the matmuls work on chunk ``j``.

Each rank uses one torch thread (gloo's own threads do the communication). Before timing, every
streamed output is checked equal to the serial one. Then ``ROUNDS`` rounds, each timing every
side once in a rotated order, each step between two ``dist.barrier()``; the table gives rank 0's
median and p25–p75 per side and the ratio serial / side (> 1: the stream is faster). The first
two columns time the two parts alone (the gather + reduce-scatter with no compute, and the
matmuls with no collective), so the best a perfect overlap could reach is visible: max of the two
instead of their sum. Run: ``python benchmarks/bench_stream.py``.
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
ROWS, DIM, FFN = 1024, 1024, 512
KS = (1, 2, 4, 8)
ROUNDS = 15


def _rank(rank: int, path: str, q) -> None:
    import torch
    import torch.distributed as dist

    from shardlayout.run.stream import gather_compute_reduce_scatter

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=WORLD)
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(DIM, FFN // WORLD, generator=g) / DIM ** 0.5
    w2 = torch.randn(FFN // WORLD, DIM, generator=g) / FFN ** 0.5
    x = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(rank + 1))

    def mlp(a):
        return torch.relu(a @ w1) @ w2

    serial = gather_compute_reduce_scatter(x, mlp, None, 1)
    same = all(torch.allclose(gather_compute_reduce_scatter(x, mlp, None, k), serial, atol=1e-4) for k in KS)

    def comm_only():
        gather_compute_reduce_scatter(x, lambda a: a, None, 1)

    def compute_only():
        mlp(torch.cat([x] * WORLD))

    sides = [("comm only", comm_only), ("compute only", compute_only)] + [
        (f"k={k}", (lambda k=k: gather_compute_reduce_scatter(x, mlp, None, k))) for k in KS]
    times = {name: [] for name, _ in sides}
    for name, fn in sides:  # warm-up
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
    method = (f"Megatron-SP MLP block on {WORLD} gloo ranks (CPU, one torch thread each): each rank's "
              f"({ROWS}, {DIM}) float32 rows all-gathered, @ w1 ({DIM}, {FFN // WORLD}), relu, @ w2 "
              f"({FFN // WORLD}, {DIM}), reduce-scattered; serial (k=1) vs the same block streamed in k "
              f"chunks with asynchronous collectives (`shardlayout.run.stream`). {ROUNDS} rounds, sides "
              "rotated, each step between two barriers; rank 0's milliseconds, median (p25–p75); ratio = "
              "serial / streamed (> 1: faster). Every streamed output was checked equal to the serial one.")
    best = min(statistics.median(times[f"k={k}"]) for k in KS)
    floor = max(statistics.median(times["comm only"]), statistics.median(times["compute only"]))
    notes = (f"A perfect overlap would take about max(comm, compute) = {floor * 1e3:.1f} ms instead of "
             f"their sum; the best streamed step took {best * 1e3:.1f} ms (serial {serial * 1e3:.1f} ms). On "
             "this 2-core machine gloo's communication threads compete with the two ranks' matmuls for the "
             "same cores, so the overlap measured here is a floor, not what NCCL on GPUs gives.")
    emit("stream", method, ["side", "ms", "ratio"], rows, notes)


if __name__ == "__main__":
    main()
