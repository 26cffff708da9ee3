"""Train your own module with a plan: ``torchrun --standalone --nproc-per-node 4 examples/train.py``.

``shardlayout.parallelize`` plans the module (here the Megatron sequence-parallel style on a 2x2
mesh), gives back the same module with DTensor parameters, and its forward runs the plan's per-rank
program; the optimizer, ``clip_grad_norm_`` and ``torch.compile`` are torch's own.
"""

import argparse

import torch
import torch.distributed as dist

import shardlayout
from shardlayout.program.torch_models import LlamaTorch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mesh", default="dp=2,tp=2")
    ap.add_argument("--style", default="megatron-sp")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()

    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE and the rendezvous
    torch.manual_seed(0)  # every rank builds the same model and batch
    model = LlamaTorch(layers=2, dim=32, heads=4, ffn=64)
    x, cos, sin = torch.randn(4, 16, 32), torch.randn(16, 8), torch.randn(16, 8)

    pmod = shardlayout.parallelize(model, args.mesh, style=args.style, example_inputs=(x, cos, sin))
    step_fn = torch.compile(pmod, fullgraph=True) if args.compile else pmod
    opt = torch.optim.AdamW(pmod.parameters(), lr=1e-3)
    for step in range(args.steps):
        out = step_fn(x, cos, sin)  # a DTensor with the plan's output placements
        loss = out.full_tensor().pow(2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(pmod.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step}: loss {loss.item():.8f}")
    if dist.get_rank() == 0:
        wq = pmod.layers[0].wq
        print(f"layers.0.wq: {tuple(wq.shape)} {wq.placements}, local {tuple(wq.to_local().shape)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
