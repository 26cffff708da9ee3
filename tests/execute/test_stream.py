"""A plan's stream choices run chunk by chunk (execute/stream.py).

Oracles: a reshape's chunk positions against brute force over index arrays; each chunk's global
positions against the rank-local positions ``plan.stream.chunk_positions`` already tested; and
every streamed walk against the whole walk of the same plan on the numpy simulator (every rank,
every tensor), with the streamed run's collectives counted (k per streamed move: the chunks
really ran)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardlayout import Mesh, Sharding
from shardlayout.execute import NumpySimulator, walk
from shardlayout.execute.stream import carry_view, chunk_moves, chunk_positions_global, local_positions, segments
from shardlayout.plan import plan
from shardlayout.program.models import llama, style_pins
from shardlayout.sharding.cost import CostModel

# collectives without latency on a slow link: every Megatron(-SP) collective is worth streaming
CHEAP_CALLS = CostModel(latency=1e-12, default_hop_latency=1e-12, default_bandwidth=1e7)


def _brute_view(pos, a, da, b):
    """The chunk's positions after reshaping ``a`` to ``b``, found over index arrays: ``(dim,
    positions)`` when the chunk is some positions along one dim of ``b`` times everything else."""
    ids = np.arange(math.prod(a)).reshape(a)
    out, dim = [], None
    for p in pos:
        chosen = set(np.take(ids, p, axis=da).reshape(-1).tolist())
        mask = np.isin(ids.reshape(b), list(chosen))
        found = None
        for k in sorted(range(len(b)), key=lambda k: b[k] <= 1):
            sel = np.nonzero(mask.any(axis=tuple(x for x in range(len(b)) if x != k)))[0]
            if np.take(mask, sel, axis=k).all() and mask.sum() == np.take(mask, sel, axis=k).size:
                found = (k, sel)
                break
        if found is None or (dim is not None and found[0] != dim):
            return None
        dim = found[0]
        out.append(found[1])
    return dim, out


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_carry_view_matches_brute_force(data):
    a = tuple(data.draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=4), label="a"))
    n = math.prod(a)
    # b: a's sizes regrouped (merged neighbours or split by a divisor)
    b = list(a)
    for _ in range(data.draw(st.integers(0, 2), label="steps")):
        if len(b) > 1 and data.draw(st.booleans(), label="merge"):
            i = data.draw(st.integers(0, len(b) - 2), label="i")
            b[i: i + 2] = [b[i] * b[i + 1]]
        else:
            i = data.draw(st.integers(0, len(b) - 1), label="j")
            divs = [d for d in range(2, b[i]) if b[i] % d == 0]
            if divs:
                d = data.draw(st.sampled_from(divs), label="d")
                b[i: i + 1] = [d, b[i] // d]
    b = tuple(b)
    assert math.prod(b) == n
    cut = [d for d in range(len(a)) if a[d] > 1]  # a stream cuts a dim of 2 or more into k >= 2 chunks
    assume(cut)
    da = data.draw(st.sampled_from(cut), label="da")
    k = data.draw(st.sampled_from([d for d in (2, 3, 4, 6) if a[da] % d == 0]), label="k")
    step = a[da] // k  # chunks of contiguous positions, or strided ones (every k-th)
    if data.draw(st.booleans(), label="strided"):
        pos = tuple(np.arange(j, a[da], k) for j in range(k))
    else:
        pos = tuple(np.arange(j * step, (j + 1) * step) for j in range(k))
    got, want = carry_view(pos, a, da, b), _brute_view(pos, a, da, b)
    assert (got is None) == (want is None), (a, b, da, pos, got, want)
    if got is not None:  # each chunk is exactly its positions along got's dim, everything else whole
        ids = np.arange(n).reshape(a)
        for p, q in zip(pos, got[1]):
            assert sorted(np.take(ids, p, axis=da).reshape(-1).tolist()) == \
                sorted(np.take(ids.reshape(b), q, axis=got[0]).reshape(-1).tolist())


@pytest.mark.parametrize("text,mesh,dim,k", [("[tp*16, 4]", "tp=4", 0, 4), ("[2, dp*tp*8]", "dp=2,tp=2", 1, 2),
                                              ("[32, 4]", "tp=2", 0, 8), ("[tp*2*8, 3]", "tp=2", 0, 2)])
def test_chunk_positions_are_each_ranks_stream_chunk(text, mesh, dim, k):
    m = Mesh.parse(mesh)
    s = Sharding.parse(text, m)
    pos = chunk_positions_global(s.with_stream(dim, k))
    assert sorted(np.concatenate(pos).tolist()) == list(range(s.shape[dim]))  # a partition of the dim
    for j in range(k):
        for r in m.ranks():
            held = np.asarray(s.indices(r)[dim])
            mine = held[local_positions(s, dim, pos[j], r)]
            assert sorted(mine.tolist()) == sorted(set(held.tolist()) & set(pos[j].tolist()))
            if any(f.axis is not None for f in s.dims[dim]):  # every rank takes part in every chunk
                assert len(mine) == len(held) // k


class _Counting(NumpySimulator):
    def __init__(self, mesh):
        super().__init__(mesh)
        self.calls = 0

    def collective(self, c, value):
        self.calls += c.kind.communicates
        return super().collective(c, value)


def _streamed_equals_whole(p, allow_skipped=False, **kw):
    segs, skipped = segments(p, **kw)
    assert segs and (allow_skipped or not skipped)
    rng = np.random.default_rng(0)
    pieces = {n: p.shardings[n].shard(rng.standard_normal(p.program.tensors[n].shape)) for n in p.program.inputs()}
    whole, streamed = _Counting(p.mesh), _Counting(p.mesh)
    a = dict(walk(p, whole, pieces))
    b = dict(walk(p, streamed, pieces, streams=segs))
    assert a.keys() == b.keys()
    for name in a:
        for r in p.mesh.ranks():
            assert a[name][r].shape == b[name][r].shape
            assert np.allclose(a[name][r], b[name][r], rtol=1e-12, atol=1e-12), (name, r)
    per_chunk = sum(sum(c.kind.communicates for c in chunk_moves(p, s)) * (s.k - (s.order is not None))
                    for s in segs)  # a ring: its own shard, then k - 1 steps
    moved = sum(sum(c.kind.communicates for c in p.moves[s.before or s.after]) for s in segs)
    assert streamed.calls == whole.calls - moved + per_chunk  # every streamed move ran as its k chunks
    return segs


@pytest.mark.parametrize("batch,mesh,style", [(1, "tp=4", "megatron-sp"), (2, "tp=2", "megatron-sp"),
                                              (2, "dp=2,tp=2", "megatron-sp"), (2, "tp=2", "megatron"),
                                              (1, "tp=4", "megatron")])
def test_a_streamed_walk_equals_the_whole_walk_on_every_rank(batch, mesh, style):
    prog = llama(layers=2, batch=batch, seq=32, dim=32, heads=4, ffn=64)
    m = Mesh.parse(mesh)
    p = plan(prog, m, style_pins(prog, m, style), cost_model=CHEAP_CALLS)
    p.flop_rate = 1e9
    segs = _streamed_equals_whole(p)
    sides = {"before" if s.before else "after" for s in segs}
    # Megatron streams its all_reduces (after the row-parallel matmuls), Megatron-SP its gathers at least
    assert sides == {"after"} if style == "megatron" else "before" in sides


@pytest.mark.parametrize("k", [2, 4, 8])
def test_every_chunk_count_gives_the_whole_result(k):
    prog = llama(layers=1, batch=1, seq=64, dim=32, heads=4, ffn=64)
    m = Mesh.parse("tp=2")
    p = plan(prog, m, style_pins(prog, m, "megatron-sp"), cost_model=CHEAP_CALLS)
    p.flop_rate = 1e9
    segs = _streamed_equals_whole(p, chunks=k)
    assert {s.k for s in segs} == {k}


@settings(max_examples=12, deadline=None)
@given(seq=st.sampled_from([16, 32, 48]), batch=st.integers(1, 3), tp=st.sampled_from([2, 4]),
       style=st.sampled_from(["megatron", "megatron-sp"]), rate=st.sampled_from([1e8, 1e9, 1e10]))
def test_streamed_walks_equal_whole_walks_on_random_llamas(seq, batch, tp, style, rate):
    prog = llama(layers=1, batch=batch, seq=seq, dim=16, heads=4, ffn=32)
    m = Mesh.parse(f"tp={tp}")
    p = plan(prog, m, style_pins(prog, m, style), cost_model=CHEAP_CALLS)
    p.flop_rate = rate
    segs, skipped = segments(p)
    if not segs:
        return  # no stream pays here: nothing to compare
    _streamed_equals_whole(p)


def test_no_stream_choice_no_segment():
    prog = llama(layers=1, batch=1, seq=16, dim=16, heads=4, ffn=32)
    m = Mesh.parse("tp=2")
    p = plan(prog, m, style_pins(prog, m, "megatron-sp"))  # default cost model and rate: nothing pays
    assert segments(p) == ((), ())


def test_a_gather_that_is_its_producers_output_move_runs_chunk_by_chunk_too():
    # attn_norm.n pinned replicated: its gather is the mul's output move (as transformers' RMSNorm
    # in float64 or bf16 plans it, a cast before the weight); the segment runs it chunk by chunk from
    # the sharding the mul makes, and the walk yields attn_norm.n once the segment has moved it
    prog = llama(layers=1, batch=1, seq=32, dim=32, heads=4, ffn=64)
    m = Mesh.parse("tp=2")
    pins = {**style_pins(prog, m, "megatron-sp"), "layers.0.attn_norm.n": Sharding.parse("[1, 32, 32]", m)}
    p = plan(prog, m, pins, cost_model=CHEAP_CALLS)
    p.flop_rate = 1e9
    assert "layers.0.attn_norm.n" in [c.tensor for c in p.stream_choices()]
    segs = _streamed_equals_whole(p)
    (seg,) = [s for s in segs if s.before and s.before[0] == "layers.0.attn_norm.n"]
    assert seg.before[1] == p.shardings["layers.0.attn_norm.n"]  # the output move itself
    from shardlayout.execute.stream import source_sharding

    made = next(po.outputs[0] for op, po in zip(prog.ops, p.ops) if op.outputs == ("layers.0.attn_norm.n",))
    assert source_sharding(p, seg) == made != seg.before[1]


def test_a_segment_reading_a_tensor_made_after_its_first_op_runs_that_op_ahead():
    # torch.export orders a weight's transpose after the norm that starts the MLP's segment: the
    # transpose reads only the weight, so it runs ahead of the segment (its prelude)
    pytest.importorskip("torch")
    import importlib.util
    from pathlib import Path

    from shardlayout.program.torch_import import from_torch

    spec = importlib.util.spec_from_file_location("zoo_for_streams", Path(__file__).parents[1] / "program" / "zoo.py")
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    prog = from_torch(*zoo.make_titan_llama())
    m = Mesh.parse("tp=2")
    p = plan(prog, m, style_pins(prog, m, "megatron-sp"), cost_model=CHEAP_CALLS)
    p.flop_rate = 1e9
    segs, _ = segments(p)
    index = {op.name: i for i, op in enumerate(prog.ops)}
    made = {o: index[op.name] for op in prog.ops for o in op.outputs}
    assert any(seg.prelude for seg in segs)
    for seg in segs:  # what a segment reads from outside exists when it starts, or its prelude makes it
        inside = {o for i in seg.ops for o in prog.ops[i].outputs}
        ahead = {o for j in seg.prelude for o in prog.ops[j].outputs}
        for j in seg.prelude:
            assert j > seg.first and all(made.get(x, -1) < seg.first or x in ahead
                                         for x in prog.ops[j].inputs if isinstance(x, str))
        for i in seg.ops:
            outside = [x for x in prog.ops[i].inputs if isinstance(x, str) and x not in inside]
            assert all(made.get(x, -1) < seg.first or x in ahead for x in outside)
    _streamed_equals_whole(p, allow_skipped=True)


def test_training_through_a_ring_sums_each_shard_at_its_owner_not_each_chunk():
    """``ring_backward``: the gradient sums of a ring's chunk readers are left to the ring's reverse
    (chunk j is another shard on every rank), and the replicated weights the ops before those readers
    read whole get their sum over the ring's axis instead; a chunk-count stream keeps its sums."""
    from shardlayout.execute.stream import ring_backward
    from shardlayout.plan.backward import gradient_reductions, reduction_at

    prog, m = llama(layers=1, batch=2, seq=512, dim=128, heads=4, ffn=256), Mesh.parse("tp=2")
    p = plan(prog, m, style_pins(prog, m, "megatron-sp"))
    p.flop_rate, p.ring = 1e12, True
    at = reduction_at(gradient_reductions(p))
    rings = [s for s in segments(p)[0] if s.order is not None]
    assert rings
    for seg in rings:
        unsummed, whole = ring_backward(p, seg, at)
        ops = [p.program.ops[i] for i in seg.ops]
        # every reader whose gradient the plan sums over tp reads the chunked activation (the projections)
        assert unsummed and {r for r in at if r[0] in seg.ops} == unsummed
        assert {p.program.ops[i].target for i, _ in unsummed} <= {"mm", "linear", "matmul"}
        # the norm's weight (a parameter read by the ops before the projections) is summed over tp
        params = {n for n in prog.inputs("param") if any(n in op.inputs for op in ops)}
        assert {name for name, _, _ in whole.values()} == {n for n in params if n.endswith("norm")}
        assert all(pieces == chunk_moves(p, seg)[0].axes for _, _, pieces in whole.values())
    plain = [s for s in segments(p, ring=False)[0]]
    assert plain and all(ring_backward(p, s, at) == (set(), {}) for s in plain)
    assert ring_backward(p, rings[0], {}) == (set(), {})  # no training: nothing to change


def _factor_list_ring(src, tgt, moves, d):
    """The ring read off the factor lists alone (the oracle): the gathered factor's blocks as the
    stream, when both sides take that stream and only the source keeps it on the axis."""
    from shardlayout.errors import ShardingSpecError

    if len(moves) != 1 or moves[0].kind.value != "all_gather" or moves[0].dims != (d,) or len(moves[0].axes) != 1:
        return None
    piece = moves[0].axes[0]
    fs = src.dims[d]
    at = next((i for i, f in enumerate(fs) if (f.axis, f.size, f.pre) == (piece.axis, piece.size, piece.pre)), None)
    if at is None:
        return None
    outer = math.prod(f.size for f in fs[:at])
    try:
        ring, gathered = src.with_stream(d, piece.size, outer), tgt.with_stream(d, piece.size, outer)
    except ShardingSpecError:
        return None
    return ring if ring.stream_axis is not None and gathered.stream_axis is None else None


def _text(dims, sizes) -> str:
    return "[" + ", ".join("*".join([*f, str(n)]) for f, n in zip(dims, sizes)) + "]"


def test_the_ring_decision_by_nvfusers_rule_agrees_with_the_factor_lists():
    """``ring_sharding`` asks the domain layer (``ring_of`` on the two loop domains) whether a
    gather is a ring; on random gathers of one axis factor it agrees with the factor lists."""
    import random

    from shardlayout.execute.stream import ring_sharding
    from shardlayout.sharding.move import plan_move

    rng = random.Random(0)
    seen = rings = 0
    for _ in range(400):
        m = Mesh.parse(rng.choice(["tp=2", "tp=4", "dp=2,tp=4", "dp=3,tp=2", "a=2,b=2,c=2"]))
        axes = list(m.names)
        rng.shuffle(axes)
        dims = [[] for _ in range(rng.randint(1, 3))]
        for ax in axes:
            if rng.random() < 0.7:
                dims[rng.randrange(len(dims))].append(ax)
        d = rng.randrange(len(dims))
        if not dims[d]:
            continue
        locals_ = [rng.choice([1, 2, 3, 4, 8]) for _ in dims]
        g = rng.choice(dims[d])
        src = Sharding.parse(_text(dims, locals_), m)
        gathered = [list(f) for f in dims]
        gathered[d].remove(g)
        locals_[d] *= m.axis_size(g)
        tgt = Sharding.parse(_text(gathered, locals_), m)
        moves = tuple(c for c in plan_move(src, tgt) if c.kind.communicates)
        want = _factor_list_ring(src, tgt, moves, d)
        assert ring_sharding(src, tgt, moves, d) == want, (str(src), str(tgt), d)
        seen, rings = seen + 1, rings + (want is not None)
    assert seen > 200 and 0 < rings < seen


def test_a_transformers_llama_streams_its_gathers_through_weight_times_x():
    """transformers' RMSNorm ends in ``weight * x`` (the gathered tensor the second operand) and
    torch.export places each projection's weight transpose after it: both pass, so Megatron-SP's
    gathers of a real HF Llama stream into its projections, equal to the whole walk."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import importlib.util
    from pathlib import Path

    from shardlayout.program.torch_import import from_torch

    spec = importlib.util.spec_from_file_location("hf_for_streams", Path(__file__).parents[2] / "examples" /
                                                  "hf_models.py")
    examples = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(examples)
    prog = from_torch(*examples.llama())  # transformers' LlamaForCausalLM, 2 layers, called with input_ids
    m = Mesh.parse("tp=2")
    p = plan(prog, m, style_pins(prog, m, "megatron-sp"), cost_model=CHEAP_CALLS)
    p.flop_rate = 1e9
    segs = _streamed_equals_whole(p, allow_skipped=True)
    gathers = [s for s in segs if s.before]
    assert len(gathers) >= 2 and any(s.prelude for s in gathers)
    # the chunked tensor reaches the projections as the second operand of weight * x
    assert any(prog.ops[i].target == "aten.mul.Tensor" and prog.ops[i].inputs[1] in seg.dims
               and prog.ops[i].inputs[0] not in seg.dims for seg in gathers for i in seg.ops)
