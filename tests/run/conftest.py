"""Fixtures of the run tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def fake_world():
    """``start(world, rank=0)``: torch's fake process group in this process (shapes and structure, no
    data: collectives return uninitialised values), torn down after the test."""
    pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def start(world: int, rank: int = 0):
        if dist.is_initialized():  # another module's (tests/ops' DTensor checks keep theirs up)
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def run_json():
    """``run_json(*argv) -> report``: ``shardlayout run ... --json`` in this process (its ranks fork
    from this process's forkserver, which imported torch once for the whole session, instead of a
    fresh interpreter importing it twice per job); fails the test with the output unless it exits 0."""
    import contextlib
    import io
    import json

    from shardlayout.cli import main

    def go(*argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["run", *argv, "--json"])
        assert code == 0, (out.getvalue() + err.getvalue())[-2000:]
        return json.loads(out.getvalue())

    return go
