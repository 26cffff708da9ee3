"""Train your own module with a plan: ``torchrun --standalone --nproc-per-node 4 examples/train.py``.

``shardlayout.parallelize`` plans the module (here the Megatron sequence-parallel style on a 2x2
mesh), gives back the same module with DTensor parameters, and its forward runs the plan's per-rank
program; the optimizer, ``clip_grad_norm_`` and ``torch.compile`` are torch's own. ``--meta`` builds
the model on the meta device: each rank allocates and initialises only its own pieces
(``--memory-limit-mb`` caps each rank's address space to prove it); ``--weights FILE`` starts from
safetensors weights, each rank reading only its pieces.
"""

import argparse
import importlib
import resource

import torch
import torch.distributed as dist

import shardlayout
from shardlayout.program.torch_models import LlamaTorch


def vm_bytes() -> int:
    """This process's address space now (Linux)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mesh", default="dp=2,tp=2")
    ap.add_argument("--style", default="megatron-sp")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--meta", action="store_true", help="build on the meta device; ranks allocate only their pieces")
    ap.add_argument("--weights", default=None, help="start from these safetensors weights (each rank reads its pieces)")
    ap.add_argument("--memory-limit-mb", type=int, default=None,
                    help="cap each rank's address space at what it has once torch is up, plus this")
    args = ap.parse_args()

    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE and the rendezvous
    torch.manual_seed(0)  # every rank builds the same model and batch
    d = args.dim
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if args.memory_limit_mb is not None:  # (MALLOC_ARENA_MAX=2 keeps glibc from reserving 64 MiB per thread)
        # torch imports torch._dynamo on first use of the meta device, and with it triton where installed
        # (~190 MiB of address space): part of "torch is up", not of the run
        importlib.import_module("torch._dynamo")
        limit = vm_bytes() + args.memory_limit_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if args.meta:
        with torch.device("meta"):
            model = LlamaTorch(layers=args.layers, dim=d, heads=4, ffn=2 * d)
        full = sum(p.numel() * p.element_size() for p in model.parameters())

        def init(m):  # runs on the DTensor pieces: no rank ever holds a whole weight
            for p in m.parameters():
                torch.nn.init.normal_(p, std=d ** -0.5)
        init = None if args.weights else init
    else:
        model = LlamaTorch(layers=args.layers, dim=d, heads=4, ffn=2 * d)
        init = None
    x, cos, sin = torch.randn(4, 16, d), torch.randn(16, d // 4), torch.randn(16, d // 4)

    pmod = shardlayout.parallelize(model, args.mesh, style=args.style, example_inputs=(x, cos, sin),
                                   init_weights=init, weights=args.weights)
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
        if args.meta:
            mine = sum(p.to_local().numel() * p.element_size() for p in pmod.parameters())
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            from shardlayout.plan.estimate import estimate

            planned = estimate(pmod.plan, "adam").memory  # parameters, gradients, AdamW moments, activations
            print(f"parameters: {full / 2**20:.1f} MiB in all, {mine / 2**20:.1f} MiB on rank 0; rank 0's peak "
                  f"resident memory {(peak - start_rss) / 2**20:.1f} MiB above its start, the plan's estimate "
                  f"{planned / 2**20:.1f} MiB per device")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
