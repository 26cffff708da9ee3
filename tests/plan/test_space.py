"""The search space's tables (``plan.space``): a block of the kind of an earlier one, whose
tensors have the same domains, takes that block's tables renamed (``twin_tables``), and the
stream options follow (``plan.overlap.segment_options`` with ``twins``). The oracle is the
plain path: ``op_table`` resolving every combination of every op, and ``stream_options`` asking
every question again in every block."""

from __future__ import annotations

from shardlayout import Mesh
from shardlayout.plan.auto import _tables
from shardlayout.plan.chain import segments, slot_groups
from shardlayout.plan.overlap import segment_options
from shardlayout.plan.space import Context, domains, op_table, seed_plans, twin_tables, unify
from shardlayout.program.models import llama


def _space(prog, mesh, **ctx):
    segs = segments(prog)
    doms = unify(domains(prog, seed_plans(prog, mesh, {})), slot_groups(segs))
    return segs, doms, Context.of(prog, mesh, **ctx)


def _combo_fields(c):
    return c.shardings, c.own, c.moves, c.reductions, c.targets, c.made, c.params


def test_twin_blocks_take_an_earlier_blocks_tables_renamed_equal_to_resolving_every_combination():
    prog, mesh = llama(layers=4, dim=256, seq=256, batch=4, heads=4, ffn=512), Mesh.parse("dp=2,tp=2")
    segs, doms, ctx = _space(prog, mesh)
    tabs, twins = twin_tables(prog, segs, doms, ctx, _tables(prog))
    assert len(twins) >= len(segs) // 2  # the middle layers' blocks are twins of layer 1's
    for k, (r, rename) in twins.items():
        assert segs[k].key == segs[r].key and r < k and rename
    for i, tb in enumerate(tabs):
        fresh = op_table(prog, i, doms, ctx)
        assert (tb.index, tb.tensors) == (fresh.index, fresh.tensors)
        assert [_combo_fields(c) for c in tb.combos] == [_combo_fields(c) for c in fresh.combos]


def test_twin_blocks_stream_options_equal_asking_every_question_again():
    prog, mesh = llama(layers=3, dim=1024, seq=1024, batch=2, heads=8, ffn=4096), Mesh.parse("tp=2")
    segs, doms, ctx = _space(prog, mesh, training="inference")
    tabs, twins = twin_tables(prog, segs, doms, ctx, _tables(prog))
    assert twins
    fresh = tuple(op_table(prog, i, doms, ctx) for i in range(len(prog.ops)))
    got = segment_options(prog, tabs, segs, ctx, twins)
    want = segment_options(prog, fresh, segs, ctx)
    assert got, "the wide layers stream"

    def key(v):
        return v.tensor, v.target, v.move, v.conditions, v.sites, v.saving, v.choice, v.source

    assert [key(v) for v in got] == [key(v) for v in want]
    assert {v.tensor for v in got if v.sites[0] >= segs[min(twins)].lo}  # options in the twin blocks too


def test_blocks_whose_domains_differ_are_not_twins():
    prog, mesh = llama(layers=4, dim=256, seq=256, batch=4, heads=4, ffn=512), Mesh.parse("dp=2,tp=2")
    segs, doms, ctx = _space(prog, mesh)
    _, twins = twin_tables(prog, segs, doms, ctx, _tables(prog))
    k = max(twins)
    r, rename = twins[k]
    own = next(t for t in segs[k].slots if len(doms[t]) > 1)
    narrowed = {**doms, own: doms[own][:1]}  # one tensor of block k restricted: not the earlier block's space
    _, again = twin_tables(prog, segs, narrowed, ctx, _tables(prog))
    assert k not in again
