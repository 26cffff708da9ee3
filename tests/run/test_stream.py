"""Streamed collectives on gloo (run/stream.py): 2 real ranks, each chunked pipeline equal to
the serial collective + compute, for every chunk count."""

from __future__ import annotations

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")


def _rank(rank: int, world: int, path: str, q) -> None:
    import torch.distributed as dist

    from shardlayout.run.stream import compute_reduce_scatter, gather_compute, gather_compute_reduce_scatter

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(0)
        w1, w2 = torch.randn(6, 10, generator=g, dtype=torch.float64), torch.randn(10, 6, generator=g,
                                                                                  dtype=torch.float64)
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(rank + 1), dtype=torch.float64)

        def mlp(a):
            return torch.relu(a @ w1) @ w2

        ok = []
        full = gather_compute(x, lambda a: a, None, 1)
        for k in (1, 2, 4, 8):
            ok.append(torch.allclose(gather_compute(x, mlp, None, k), mlp(full)))
            want = compute_reduce_scatter(full, mlp, None, 1)
            ok.append(torch.allclose(compute_reduce_scatter(full, mlp, None, k), want))
            ok.append(torch.allclose(gather_compute_reduce_scatter(x, mlp, None, k), want))
        q.put((rank, ok))
    finally:
        dist.destroy_process_group()


def test_streamed_pipelines_equal_the_serial_ones_on_gloo():
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "store")
        procs = [ctx.Process(target=_rank, args=(r, 2, path, q)) for r in range(2)]
        for p in procs:
            p.start()
        got = dict(q.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(60)
    assert sorted(got) == [0, 1] and all(all(v) for v in got.values()), got
