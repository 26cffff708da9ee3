"""What a style pins stays there (plan(..., keep=...), StylePins.kept): EP keeps the experts on ep
and moves tokens; Megatron keeps its column and row weights; views of a kept weight are kept; a
plan that cannot read a kept weight where it is is a StyleConflict, never a silent move."""

from __future__ import annotations

import pytest

from shardlayout import Mesh, Sharding
from shardlayout.errors import ShardingSpecError, StyleConflict
from shardlayout.plan import plan
from shardlayout.program import ProgramBuilder
from shardlayout.program.models import llama, moe
from shardlayout.program.styles import apply_style


def _moves(p, names) -> list:
    return [c for c in p.collectives if c.tensor in names]


@pytest.mark.parametrize("sizes,ep", [({}, 4), (dict(tokens=256, dim=64, experts=8, ffn=128, top_k=2), 4),
                                      (dict(tokens=64, dim=32, experts=8, ffn=48, top_k=2), 8)])
def test_ep_keeps_the_experts_and_moves_the_tokens(sizes, ep):
    prog = moe(**sizes)
    mesh = Mesh.parse(f"ep={ep}")
    got = apply_style(prog, mesh, "ep")
    assert got.kept == {"experts.w1", "experts.w2"}
    p = plan(prog, mesh, style="ep")
    assert p.options["keep"] == got.kept
    kinds = [c.kind.value for c in p.collectives]
    assert kinds == ["all_to_all", "all_to_all"], kinds  # dispatch there, results back: no weight moves
    tokens, dim, top_k = (sizes.get(k, d) for k, d in (("tokens", 16), ("dim", 16), ("top_k", 2)))
    ideal = tokens * top_k * dim * 4 // ep  # float32 routed rows one device sends and receives
    assert all(c.bytes <= 1.3 * ideal for c in p.collectives), [(c.bytes, ideal) for c in p.collectives]
    assert p.verify().ok


def test_megatron_keeps_column_and_row_weights_of_every_layer():
    prog = llama(layers=8)  # repeated: instances 0-3 and the last planned, the middle ones renamed
    mesh = Mesh.parse("dp=2,tp=2")
    got = apply_style(prog, mesh, "megatron")
    weights = {f"layers.{k}.{w}" for k in range(8) for w in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")}
    assert got.kept == weights
    p = plan(prog, mesh, style="megatron")
    assert p.counts() == {("all_reduce", ("tp",)): 16}
    assert not _moves(p, weights)


def _program_with_a_transposed_weight():
    b = ProgramBuilder()
    x = b.input("x", (64, 16))
    w = b.param("w", (32, 16))
    wt = b.op("t", [w], name="wt")
    b.output(b.op("mm", [x, wt], name="y"))
    return b.build()


def test_a_view_of_a_kept_weight_is_kept():
    """x's rows and w's rows both on tp: gathering the weight (2 KiB) is cheaper than gathering x
    (4 KiB), so without ``keep`` the plan moves the transposed weight; with it, x moves."""
    prog, mesh = _program_with_a_transposed_weight(), Mesh.parse("tp=4")
    pins = {"x": Sharding.parse("[tp*16, 16]", mesh), "w": Sharding.parse("[tp*8, 16]", mesh)}
    assert _moves(plan(prog, mesh, pins), {"w", "wt"})  # the case is real: the cheapest move is the weight's
    p = plan(prog, mesh, pins, keep={"w"})
    assert p.collectives and not _moves(p, {"w", "wt"})
    assert p.verify().ok


def test_a_kept_weight_no_strategy_reads_in_place_is_a_style_conflict():
    b = ProgramBuilder()
    w = b.param("w", (16, 16))
    b.output(b.op("mm", [w, w], name="y"))  # w @ w: column-cut w cannot be both operands' layout
    mesh = Mesh.parse("tp=4")
    pins = {"w": Sharding.parse("[16, tp*4]", mesh)}
    assert plan(b.build(), mesh, pins).collectives  # without keep it moves w
    with pytest.raises(StyleConflict, match=r"op y \(mm\) cannot read w \[16, tp\*4\] where the style keeps it"):
        plan(b.build(), mesh, pins, keep={"w"})


def test_keep_names_pinned_tensors():
    prog, mesh = _program_with_a_transposed_weight(), Mesh.parse("tp=4")
    with pytest.raises(ShardingSpecError, match="'w', which is not pinned"):
        plan(prog, mesh, {"x": "[tp*16, 16]"}, keep={"w"})
    with pytest.raises(ShardingSpecError, match="keep must be tensor names"):
        plan(prog, mesh, {"w": "[tp*8, 16]"}, keep="w")
