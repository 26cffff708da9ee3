"""``made_once``: rank 0 alone builds the value every rank of a job receives, and a failure there
stops every rank with rank 0's error named (two gloo ranks, forked from the session's server)."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("torch")

JOB = '''
import json
from datetime import timedelta

import torch.distributed as dist

from shardlayout.run.once import PeerFailed, made_once


def job(rank, world, options, init_method, result_path):
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=init_method,
                            timeout=timedelta(seconds=30))
    built = []

    def build():
        built.append(rank)
        if options["fail"]:
            raise ValueError("rank 0 cannot build it")
        return {"made_by": rank, "rows": list(range(5))}

    try:
        got = made_once(build)
        out = {"got": got, "built": built}
    except PeerFailed as e:
        out = {"peer_failed": str(e), "built": built}
    except ValueError as e:
        out = {"own_error": str(e), "built": built}
    everyone = [None] * world
    dist.all_gather_object(everyone, out)
    dist.destroy_process_group()
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(everyone, f)
'''


@pytest.fixture
def job(tmp_path, monkeypatch):
    (tmp_path / "once_job.py").write_text(JOB)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("once_job", None)
    import once_job

    return once_job.job


def test_rank_0_builds_and_every_rank_gets_its_value(job):
    from shardlayout.run import launch

    got = launch({"fail": False, "timeout": 30}, 2, job)
    assert [r["built"] for r in got] == [[0], []]  # built on rank 0 only
    assert [r["got"] for r in got] == [{"made_by": 0, "rows": [0, 1, 2, 3, 4]}] * 2


def test_a_failure_on_rank_0_is_raised_there_and_stops_the_others(job):
    from shardlayout.run import launch

    got = launch({"fail": True, "timeout": 30}, 2, job)
    assert got[0] == {"own_error": "rank 0 cannot build it", "built": [0]}
    assert "rank 0 failed" in got[1]["peer_failed"] and got[1]["built"] == []
