"""Work a job does once, not once per rank: rank 0 makes a value, every other rank receives it.

Every rank of a job plans the same module, and planning a user's module starts with
``torch.export`` and its decompositions: seconds of CPU that N ranks on one host would otherwise pay
N times over (and a torchrun job on 8 GPUs of a node, 8 times). ``made_once(build)`` runs ``build``
on rank 0 and broadcasts the pickled value over the default process group; every rank, rank 0
included, returns the unpickled copy, so all ranks plan from identical bytes. A failure on rank 0
is raised there and reaches the others as ``PeerFailed`` (the launcher names rank 0's error).
"""

from __future__ import annotations

import pickle

from ..errors import RunError


class PeerFailed(RunError):
    """Rank 0 failed making a value every rank needed; this rank stops (rank 0 reports why)."""


def made_once(build):
    """``build()``'s value, made on rank 0 only and received by every rank. Collective (every rank
    of the default group calls it at the same point); without a process group, with one rank, or
    on torch's fake process group, it is ``build()``. ``program = made_once(lambda: from_torch(module, (x,)))``"""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1 or dist.get_backend() == "fake":
        return build()  # (torch's fake process group moves no data: each process is alone)
    box, failed = [None], None
    if dist.get_rank() == 0:
        try:
            box = [pickle.dumps(build(), protocol=pickle.HIGHEST_PROTOCOL)]
        except Exception as e:  # noqa: BLE001 - the other ranks are told before rank 0 raises it
            failed = e
    dist.broadcast_object_list(box, src=0)
    if failed is not None:
        raise failed
    if box[0] is None:
        raise PeerFailed("rank 0 failed making the job's program; its error says why")
    return pickle.loads(box[0])


__all__ = ["PeerFailed", "made_once"]
