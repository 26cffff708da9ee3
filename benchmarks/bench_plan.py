"""Planning a 32-layer Llama forward: shardlayout's ``plan`` vs DTensor running the same model on
meta tensors over a fake process group with the same placements (its sharding propagation is
the cost there). Same run; prints both and the ratio. Run: ``python benchmarks/bench_plan.py``.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from shardlayout import Mesh
from shardlayout.plan import plan
from shardlayout.program.models import llama, style_pins
from shardlayout.program.torch_models import LlamaTorch

LAYERS = 32
STYLE = "megatron"  # every pin DTensor can express (megatron-sp pins Shard on seq too)


def run_dtensor(pins, mesh_shape, names):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=int(torch.tensor(mesh_shape).prod()))
    dm = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    with torch.device("meta"):
        # DTensor 2.13 on CPU decomposes causal SDPA with a plain-tensor mask and refuses to mix
        # it with DTensors; the non-causal model has the same ops and shardings
        model = LlamaTorch(layers=LAYERS, causal=False)
    for name, p in model.named_parameters():
        placements = pins[name].to_dtensor() if name in pins else [torch.distributed.tensor.Replicate()] * len(names)
        local = torch.empty(pins[name].local_shape(0) if name in pins else p.shape, device="meta")
        mod, attr = name.rsplit(".", 1)
        setattr(model.get_submodule(mod), attr, torch.nn.Parameter(
            DTensor.from_local(local, dm, placements, run_check=False, shape=p.shape, stride=p.stride())))
    x_pl = pins["x"].to_dtensor()
    x = DTensor.from_local(torch.empty(pins["x"].local_shape(0), device="meta"), dm, x_pl, run_check=False,
                           shape=(2, 8, 16), stride=(128, 16, 1))
    warm = LlamaTorch(layers=1)  # noqa: F841 - the first forward pays one-time set-up, not propagation
    rep = [torch.distributed.tensor.Replicate()] * len(names)
    cos = DTensor.from_local(torch.empty(8, 4, device="meta"), dm, rep, run_check=False)
    sin = DTensor.from_local(torch.empty(8, 4, device="meta"), dm, rep, run_check=False)
    t0 = time.perf_counter()
    with torch.no_grad():
        model(x, cos, sin)
    return time.perf_counter() - t0


def main() -> int:
    # tp only: on dp=2,tp=4 DTensor 2.13 raises inside its own SDPA decomposition ("would reshape
    # sharded dimension 0" viewing [B*H, T, T] back to [B, H, T, T]); shardlayout plans it exactly
    mesh = Mesh.parse(sys.argv[1] if len(sys.argv) > 1 else "tp=4")
    t0 = time.perf_counter()
    prog = llama(layers=LAYERS)
    t_build = time.perf_counter() - t0
    pins = style_pins(prog, mesh, STYLE)
    t0 = time.perf_counter()
    p = plan(prog, mesh, pins)
    t_plan = time.perf_counter() - t0
    t_dt = run_dtensor(pins, mesh.shape, mesh.names)
    print(f"{LAYERS}-layer Llama forward ({len(prog.ops)} ops) on mesh {mesh}, style {STYLE}")
    print(f"shardlayout plan:                     {t_plan:.3f} s  (+ {t_build:.3f} s building the program)")
    print(f"DTensor forward on meta, fake PG:     {t_dt:.3f} s")
    print(f"ratio: shardlayout plans {t_dt / t_plan:.1f}x faster; collectives {p.counts()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
