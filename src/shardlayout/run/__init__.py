"""Run a plan on torch.distributed: ``shardlayout run`` (forward pass).

Every rank rebuilds the same plan, builds the same random global inputs from ``--seed``, keeps
only its own shards, and executes the plan with :class:`TorchRankExecutor` through
``execute.walk`` — the same walk the numpy simulator uses. Each rank also runs the unsharded
program in one process (the reference) and compares every tensor it holds; rank 0 reports the
maximum error over all ranks and the collectives it executed next to the planned ones.

Started from a plain shell, ``run`` starts ``--nproc`` ranks itself (gloo on CPU, forked from a
server process that imported torch once); under
``torchrun`` it uses the launcher's ``RANK`` / ``WORLD_SIZE``. A rank that dies makes the
launcher stop every other rank and exit 1 naming it; collectives time out after ``--timeout``.
"""

from .executor import TorchRankExecutor, plan_groups
from .launch import RunError, launch, rank_main

__all__ = ["RunError", "TorchRankExecutor", "launch", "plan_groups", "rank_main"]
