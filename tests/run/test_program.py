"""The generated per-rank program (``run.program``): its graph, built in one process (no ranks run)."""

from __future__ import annotations

import math

import pytest

from shardlayout import Mesh
from shardlayout.execute.stream import chunk_moves, segments
from shardlayout.plan import plan
from shardlayout.program.models import llama, style_pins

torch = pytest.importorskip("torch")


def _program(streams: bool):
    from shardlayout.run.backward import gradient_reductions, training_pieces
    from shardlayout.run.moves import plan_groups
    from shardlayout.run.program import rank_program, stream_pieces

    prog = llama(layers=1, dim=128, seq=512, batch=1, heads=4, ffn=256)
    mesh = Mesh.parse("tp=2")
    p = plan(prog, mesh, style_pins(prog, mesh, "megatron-sp"))
    segs = segments(p, flop_rate=1e12, ring=False)[0] if streams else ()  # torch runs no rings yet
    reductions = gradient_reductions(p)
    # group names only: the graph is built, never run
    groups = {ps: (f"g{i}", members) for i, (ps, members) in
              enumerate(plan_groups(p, training_pieces(p, reductions) | stream_pieces(p, segs))) if 0 in members}
    examples = [torch.empty(1) for _ in p.program.inputs()]
    return p, segs, rank_program(p, 0, groups, examples, reductions, segs)


def _calls(gm):
    nodes = list(gm.graph.nodes)
    return nodes, [(i, n) for i, n in enumerate(nodes) if n.op == "call_module" and n.target.startswith("move_")]


def test_stream_chunks_are_issued_a_chunk_ahead_of_their_wait():
    p, segs, gm = _program(streams=True)
    assert segs and any(s.before for s in segs) and any(s.after for s in segs)
    nodes, moves = _calls(gm)
    issued = {n.target: i for i, n in moves if n.kwargs.get("part") == "issue"}
    waited = {n.target: i for i, n in moves if n.kwargs.get("part") == "finish"}
    assert issued.keys() == waited.keys()
    chunked = sum(s.k for s in segs for c in chunk_moves(p, s) if c.kind.communicates)
    assert len(issued) == chunked  # every chunk's collective, in two nodes
    mms = [i for i, n in enumerate(nodes) if n.op == "call_function" and "mm" in str(n.target)]
    overlapped = sum(any(issued[m] < i < waited[m] for i in mms) for m in issued)
    # a gather's first chunk has nothing to overlap, a reduce-scatter's last one neither: every other
    # chunk's collective is in flight while a matmul of another chunk runs
    assert overlapped >= sum(s.k - 1 for s in segs)
    assert all(issued[m] < waited[m] for m in issued)


def test_a_ring_runs_each_step_as_one_send_to_the_next_rank():
    """A ring segment (``--ring``): rank 0 computes its own shard first, then ``k - 1`` steps each one
    whole ``permute`` Move (an all_to_all_single sending only to the next rank: nothing to issue
    ahead), between the chunks' matmuls."""
    from shardlayout.run.moves import Move, ring_map
    from shardlayout.run.program import rank_program

    prog, mesh = llama(layers=1, dim=128, seq=512, batch=1, heads=4, ffn=256), Mesh.parse("tp=2")
    p = plan(prog, mesh, style_pins(prog, mesh, "megatron-sp"))
    p.ring = True
    segs = segments(p, flop_rate=1e12)[0]
    rings = [s for s in segs if s.order is not None]
    assert rings and all(s.k == 2 for s in rings)
    groups = {ps: (f"g{i}", members) for i, (ps, members) in enumerate(plan_groups_of(p, segs)) if 0 in members}
    gm = rank_program(p, 0, groups, [torch.empty(1) for _ in p.program.inputs()], None, segs)
    steps = [n for n in gm.graph.nodes if n.op == "call_module" and "permute" in gm.get_submodule(n.target).label]
    assert len(steps) == sum(s.k - 1 for s in rings) and all("part" not in n.kwargs for n in steps)
    (c,) = chunk_moves(p, rings[0])
    step = gm.get_submodule(steps[0].target)
    shard = p.shardings[rings[0].before[0]].local_shape(0)  # rank 0's shard: what each step passes on
    n = math.prod(shard)
    assert isinstance(step, Move) and step.shape == tuple(shard)
    assert (step.send_sizes, step.recv_sizes) == ((0, n), (0, n))
    assert ring_map(c, 1, (0, 1, 2)) == ((0, 0, n), (n, 0, 0))  # to the next member, from the one before


def plan_groups_of(p, segs):
    from shardlayout.run.backward import gradient_reductions, training_pieces
    from shardlayout.run.moves import plan_groups
    from shardlayout.run.program import stream_pieces

    return plan_groups(p, training_pieces(p, gradient_reductions(p)) | stream_pieces(p, segs))


def test_without_streams_every_move_is_one_node():
    p, _, gm = _program(streams=False)
    _, moves = _calls(gm)
    assert moves and all("part" not in n.kwargs for _, n in moves)
    assert len(moves) == sum(1 for cs in p.moves.values() for c in cs)
