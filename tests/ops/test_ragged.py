"""Token routing (``ops.ragged``) against independent oracles: plain Python loops over tokens for
``route_values`` / ``unroute_values``, numpy per component for ``run_nested``, and a dense
per-token mixture of experts in numpy (softmax, top-k, SiLU experts) for the routed ``moe``
planned and simulated on every rank. The expected values never come from the code under test:
nested storage is read through offsets computed here from the documented layout (component-major,
then source)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlayout.errors import ShardingError
from shardlayout.execute import NumpySimulator, walk
from shardlayout.execute.proof import check_wiring
from shardlayout.execute.verify import verify_full
from shardlayout.mesh import Mesh
from shardlayout.ops.ragged import route_values, run_nested, unroute_values
from shardlayout.ops.registry import get_op
from shardlayout.plan import plan
from shardlayout.program.models import moe, style_pins
from shardlayout.sharding import Sharding
from shardlayout.sharding.move import plan_move
from shardlayout.sharding.nested import Nested, RaggedError

N = settings.default.max_examples


# -- the oracle's view of nested storage -------------------------------------------------------------
def storage_blocks(data: np.ndarray, counts: np.ndarray) -> dict:
    """``{(component, source): rows}`` of storage ``data`` (flat dim first) whose ``counts[s, c]``
    are laid out component-major, then source (the documented layout), sliced here by hand."""
    out, off = {}, 0
    sources, components = counts.shape
    for c in range(components):
        for s in range(sources):
            n = int(counts[s, c])
            out[(c, s)] = data[off:off + n]
            off += n
    assert off == data.shape[0]
    return out


def stored(blocks: dict, sources: int, components: int, rest: tuple) -> np.ndarray:
    """The storage the documented layout gives for ``blocks``."""
    parts = [np.asarray(blocks[(c, s)]).reshape((-1,) + rest) for c in range(components) for s in range(sources)]
    return np.concatenate(parts, axis=0) if parts else np.zeros((0,) + rest)


# -- random routings ----------------------------------------------------------------------------------
@st.composite
def routings(draw, max_tokens=12, max_experts=6):
    """(x (T, D), index (T, k) with distinct experts per row, drawn from a subset of the experts so
    some get no token, experts, source block sizes (consecutive, zero-size allowed), seed)."""
    experts = draw(st.integers(1, max_experts))
    k = draw(st.integers(1, min(3, experts)))
    allowed = sorted(draw(st.sets(st.integers(0, experts - 1), min_size=k, max_size=experts)))
    t = draw(st.integers(0, max_tokens))
    rows = [draw(st.permutations(allowed))[:k] for _ in range(t)]
    index = np.asarray(rows, dtype=np.int64).reshape(t, k)
    cuts = sorted(draw(st.lists(st.integers(0, t), max_size=2)))
    bounds = [0] + cuts + [t]
    sources = tuple(b - a for a, b in zip(bounds, bounds[1:]))
    d = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    x = np.random.default_rng(seed).standard_normal((t, d))
    return x, index, experts, sources, seed


def loop_route(x, index, experts, sources) -> dict:
    """Component e, source s: x[t] for every (t, j) in row-major order with index[t, j] == e, t in
    block s."""
    blocks, start = {}, 0
    for s, n in enumerate(sources):
        for e in range(experts):
            blocks[(e, s)] = [x[t] for t in range(start, start + n) for j in range(index.shape[1])
                              if index[t, j] == e]
        start += n
    return blocks


@given(routings())
def test_route_puts_each_tokens_rows_under_its_experts_in_token_order(case):
    x, index, experts, _, _ = case
    n = route_values(x, index, experts, np)
    blocks = loop_route(x, index, experts, (x.shape[0],))
    counts = np.array([[len(blocks[(e, 0)]) for e in range(experts)]])
    assert n.extents.tolist() == counts.tolist()
    assert np.array_equal(n.data, stored(blocks, 1, experts, x.shape[1:]))
    assert n.extents.sum() == index.size  # every (token, choice) pair is one row


@given(routings())
def test_route_from_source_blocks_keeps_the_same_rows_split_by_block(case):
    x, index, experts, sources, _ = case
    n = route_values(x, index, experts, np, sources=sources)
    blocks = loop_route(x, index, experts, sources)
    counts = np.array([[len(blocks[(e, s)]) for e in range(experts)] for s in range(len(sources))])
    assert n.extents.tolist() == counts.tolist()
    assert np.array_equal(n.data, stored(blocks, len(sources), experts, x.shape[1:]))
    # merging the blocks of each component gives the one-source routing
    one = loop_route(x, index, experts, (x.shape[0],))
    for e in range(experts):
        merged = [r for s in range(len(sources)) for r in blocks[(e, s)]]
        assert np.array_equal(np.reshape(merged, (-1,) + x.shape[1:]), np.reshape(one[(e, 0)], (-1,) + x.shape[1:]))


@given(routings(), st.booleans())
def test_unroute_of_per_expert_maps_is_the_weighted_per_token_sum(case, with_sources):
    x, index, experts, sources, seed = case
    src = sources if with_sources else None
    rng = np.random.default_rng(seed + 1)
    t, k = index.shape
    d, f = x.shape[1], 3
    mats, bias = rng.standard_normal((experts, d, f)), rng.standard_normal((experts, f))
    weights = rng.standard_normal((t, k))
    n = route_values(x, index, experts, np, sources=src)
    counts = n.extents
    blocks = storage_blocks(n.data, counts)
    mapped = {(e, s): np.asarray(b) @ mats[e] + bias[e] for (e, s), b in blocks.items()}
    y = Nested(stored(mapped, counts.shape[0], experts, (f,)), counts, 0)
    got = unroute_values(y, index, weights, np, sources=src)
    want = np.zeros((t, f))
    for tok in range(t):
        for j in range(k):
            e = index[tok, j]
            want[tok] += weights[tok, j] * (x[tok] @ mats[e] + bias[e])
    assert got.shape == (t, f)
    assert np.allclose(got, want, rtol=1e-12, atol=1e-12)
    # without weights: the plain sum of the choices
    plain = unroute_values(y, index, None, np, sources=src)
    want_plain = np.zeros((t, f))
    for tok in range(t):
        for j in range(k):
            want_plain[tok] += x[tok] @ mats[index[tok, j]] + bias[index[tok, j]]
    assert np.allclose(plain, want_plain, rtol=1e-12, atol=1e-12)


@given(routings(), st.booleans())
def test_unroute_pairs_puts_each_pairs_row_back_unsummed(case, with_sources):
    # JetMoE's mixture of attention: each (token, choice) row's projection back at its pair, none summed
    x, index, experts, sources, seed = case
    src = sources if with_sources else None
    rng = np.random.default_rng(seed + 2)
    t, k = index.shape
    mats = rng.standard_normal((experts, x.shape[1], 3))
    n = route_values(x, index, experts, np, sources=src)
    blocks = storage_blocks(n.data, n.extents)
    mapped = {(e, s): np.asarray(b).reshape(-1, x.shape[1]) @ mats[e] for (e, s), b in blocks.items()}
    y = Nested(stored(mapped, n.extents.shape[0], experts, (3,)), n.extents, 0)
    got = unroute_values(y, index, None, np, sources=src, pairs=True)
    want = np.zeros((t, k, 3))
    for tok in range(t):
        for j in range(k):
            want[tok, j] = x[tok] @ mats[index[tok, j]]
    assert got.shape == (t, k, 3) and np.allclose(got, want, rtol=1e-12, atol=1e-12)
    # and routed again one row per pair (route pairs=True): the rows the experts had
    again = route_values(got, index, experts, np, sources=src, pairs=True)
    assert again.extents.tolist() == n.extents.tolist() and np.allclose(again.data, y.data, rtol=1e-12, atol=1e-12)


def test_route_and_unroute_refuse_what_they_cannot_mean():
    x = np.arange(15.0).reshape(5, 3)
    idx = np.array([[0, 1], [1, 2], [2, 0], [0, 1], [3, 1]])
    with pytest.raises(RaggedError, match="out of range"):
        route_values(x, np.array([[0, 5]] * 5), 5, np)
    with pytest.raises(RaggedError, match="cover 4 tokens"):
        route_values(x, idx, 5, np, sources=(2, 2))
    with pytest.raises(RaggedError, match="does not fit the index"):
        route_values(x[:4], idx, 5, np)
    n = route_values(x, idx, 5, np, sources=(2, 3))
    # all tokens with every source's rows: the sources merged in order are the tokens' order
    np.testing.assert_array_equal(unroute_values(n, idx, np.ones((5, 2)), np),
                                  unroute_values(n, idx, np.ones((5, 2)), np, sources=(2, 3)))
    with pytest.raises(RaggedError, match="2 source blocks"):  # combined with other token blocks
        unroute_values(n, idx, np.ones((5, 2)), np, sources=(1, 1, 3))
    with pytest.raises(RaggedError, match="same indices"):  # the blocks were cut elsewhere
        unroute_values(n, idx, np.ones((5, 2)), np, sources=(3, 2))
    with pytest.raises(RaggedError, match="nested"):
        unroute_values(np.zeros((5, 4, 3)), idx, np.ones((5, 2)), np)


def test_route_and_unroute_on_torch_equal_numpy():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, 4))
    idx = np.stack([rng.permutation(5)[:2] for _ in range(9)])
    w = rng.standard_normal((9, 2))
    a = route_values(x, idx, 5, np, sources=(4, 0, 5))
    b = route_values(torch.from_numpy(x), torch.from_numpy(idx), 5, torch, sources=(4, 0, 5))
    assert b.extents.tolist() == a.extents.tolist()
    assert np.array_equal(b.data.numpy(), a.data)
    yb = unroute_values(b, torch.from_numpy(idx), torch.from_numpy(w), torch, sources=(4, 0, 5))
    assert np.allclose(yb.numpy(), unroute_values(a, idx, w, np, sources=(4, 0, 5)), rtol=1e-12, atol=1e-12)
    pb = unroute_values(b, torch.from_numpy(idx), None, torch, sources=(4, 0, 5), pairs=True)
    assert np.allclose(pb.numpy(), unroute_values(a, idx, None, np, sources=(4, 0, 5), pairs=True), rtol=1e-12,
                       atol=1e-12)


# -- run_nested --------------------------------------------------------------------------------------
def _dense(opdef, args, params, shapes):
    return opdef.run_numpy(args, params, shapes)


@st.composite
def nested_values(draw):
    sources, components = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    counts = np.array(draw(st.lists(st.lists(st.integers(0, 3), min_size=components, max_size=components),
                                    min_size=sources, max_size=sources)))
    d = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    return Nested(rng.standard_normal((int(counts.sum()), d)), counts, 0), rng


@given(nested_values(), st.integers(1, 4))
def test_grouped_einsum_is_one_matmul_per_component(value, f):
    n, rng = value
    counts = n.extents
    c, d = n.components, n.data.shape[1]
    w = rng.standard_normal((c, d, f))
    rows = max(1, int(counts.sum()))
    for name, params in (("einsum", {"equation": "erd,edf->erf"}), ("bmm", {})):
        out = run_nested(get_op(name), [n, w], params, [(c, rows, f)], _dense, np)[0]
        assert isinstance(out, Nested) and out.dim == 0
        assert out.extents.tolist() == counts.tolist()  # every row stays in its (component, source) block
        want = {(e, s): b @ w[e] for (e, s), b in storage_blocks(n.data, counts).items()}
        assert np.allclose(out.data, stored(want, counts.shape[0], c, (f,)), rtol=1e-12, atol=1e-12)


@given(nested_values())
def test_rowwise_ops_act_on_the_stored_rows(value):
    n, rng = value
    d = n.data.shape[1]
    shape = [(n.components, max(1, int(n.extents.sum())), d)]
    out = run_nested(get_op("silu"), [n], {}, shape, _dense, np)[0]
    assert out.extents.tolist() == n.extents.tolist()
    assert np.allclose(out.data, n.data / (1 + np.exp(-n.data)), rtol=1e-12, atol=1e-12)
    v = rng.standard_normal(d)
    for dense, factor in ((v, v), (v.reshape(1, d), v), (v.reshape(1, 1, d), v), (2.5, 2.5)):
        out = run_nested(get_op("mul"), [n, dense], {}, shape, _dense, np)[0]
        assert out.extents.tolist() == n.extents.tolist()
        for (e, s), rows in storage_blocks(out.data, n.extents).items():  # row by row
            assert np.allclose(rows, storage_blocks(n.data, n.extents)[(e, s)] * factor, rtol=1e-12, atol=1e-12)
    both = run_nested(get_op("add"), [n, out], {}, shape, _dense, np)[0]  # two nested operands, same extents
    assert both.extents.tolist() == n.extents.tolist()
    assert np.allclose(both.data, n.data * 3.5, rtol=1e-12, atol=1e-12)


@given(nested_values())
def test_a_dense_operand_per_component_scales_each_components_rows(value):
    n, rng = value
    d = n.data.shape[1]
    v = rng.standard_normal((n.components, 1, d))  # (E, 1, D): one row per expert, broadcast along its rows
    shape = [(n.components, max(1, int(n.extents.sum())), d)]
    out = run_nested(get_op("mul"), [n, v], {}, shape, _dense, np)[0]
    assert out.extents.tolist() == n.extents.tolist()
    want = {(e, s): rows * v[e, 0] for (e, s), rows in storage_blocks(n.data, n.extents).items()}
    assert np.allclose(out.data, stored(want, n.sources, n.components, (d,)), rtol=1e-12, atol=1e-12)


def test_run_nested_refuses_ops_the_ragged_dim_leaves_undefined():
    rng = np.random.default_rng(0)
    counts = np.array([[2, 0, 3], [1, 2, 0]])
    n = Nested(rng.standard_normal((8, 4)), counts, 0)
    w = rng.standard_normal((3, 4, 5))
    shape = [(3, 4, 4)]
    with pytest.raises(RaggedError, match="ragged dim"):  # (rows, D) dense: ragged and dense rows would mix
        run_nested(get_op("mul"), [n, rng.standard_normal((4, 4))], {}, shape, _dense, np)
    with pytest.raises(RaggedError, match="component"):  # 2 along 3 components
        run_nested(get_op("mul"), [n, rng.standard_normal((2, 1, 4))], {}, shape, _dense, np)
    other = Nested(n.data, np.array([[3, 0, 2], [1, 2, 0]]), 0)
    with pytest.raises(RaggedError, match="different extents"):
        run_nested(get_op("add"), [n, other], {}, shape, _dense, np)
    with pytest.raises(RaggedError, match="ragged"):  # contracts the ragged letter
        run_nested(get_op("einsum"), [n, w], {"equation": "erd,edf->ef"}, [(3, 5)], _dense, np)
    with pytest.raises(RaggedError, match="ragged"):  # separates it from its component letter
        run_nested(get_op("einsum"), [n, w], {"equation": "erd,edf->efr"}, [(3, 5, 4)], _dense, np)
    with pytest.raises(RaggedError, match="ragged dim"):  # a dense operand over the ragged letter
        run_nested(get_op("einsum"), [n, rng.standard_normal((4, 4))], {"equation": "erd,rd->erd"}, shape,
                   _dense, np)
    with pytest.raises(RaggedError, match="not defined"):
        run_nested(get_op("sum"), [n], {"dim": [2]}, [(3, 4)], _dense, np)


# -- the routed MoE, planned and simulated ------------------------------------------------------------
def dense_moe(x, router, w1, w2, top_k):
    """The oracle: per token, softmax over the router logits, the top-k experts by probability,
    each a SiLU MLP, summed weighted by their probabilities."""
    logits = x @ router
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    out = np.zeros_like(x)
    chosen = np.zeros(router.shape[1], dtype=int)
    for t in range(x.shape[0]):
        for e in np.argsort(-p[t], kind="stable")[:top_k]:
            h = x[t] @ w1[e]
            out[t] += p[t, e] * ((h / (1 + np.exp(-h))) @ w2[e])
            chosen[e] += 1
    return out, chosen


def moe_inputs(sizes, seed, dead=()):
    """x, router, w1, w2; ``dead`` experts never win: x's feature 0 is 1 and their router column
    is -1000 there, 0 elsewhere."""
    tokens, dim, experts, ffn, _ = sizes
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, dim))
    router = rng.standard_normal((dim, experts)) / np.sqrt(dim)
    if dead:
        x[:, 0] = 1.0
        router[:, list(dead)] = 0.0
        router[0, list(dead)] = -1000.0
    w1 = rng.standard_normal((experts, dim, ffn)) / np.sqrt(dim)
    w2 = rng.standard_normal((experts, ffn, dim)) / np.sqrt(ffn)
    return {"x": x, "router": router, "experts.w1": w1, "experts.w2": w2}


def simulate(p, inputs):
    pieces = {n: p.shardings[n].shard(v) for n, v in inputs.items()}
    values = dict(walk(p, NumpySimulator(p.mesh), pieces))
    return p.shardings["combine"].unshard(values["combine"])


BIG = (256, 64, 8, 128, 2)  # tokens, dim, experts, ffn, top_k: style ep dispatches tokens (all_to_all)
CASES = [
    ("ep=4", "ep", BIG), ("dp=2,ep=2", "ep", BIG), ("ep=2,tp=2", "ep", BIG),
    ("dp=4", "dp", BIG), ("dp=4", "fsdp", BIG),
    ("ep=4", "ep", (30, 64, 6, 256, 3)),  # uneven: 8, 8, 8, 6 tokens; experts 2, 2, 2, 0 per rank
    ("ep=4", "ep", (32, 16, 8, 24, 2)),  # small: the planner gathers the expert weights instead
]


@pytest.mark.parametrize("mesh,style,sizes", CASES)
def test_routed_moe_plan_on_every_rank_equals_a_dense_per_token_moe(mesh, style, sizes):
    m = Mesh.parse(mesh)
    prog = moe(*sizes)
    p = plan(prog, m, style_pins(prog, m, style))
    for seed, dead in ((0, (2, 3)), (1, (5,)), (2, ()), (3, ()), (4, ())):
        inputs = moe_inputs(sizes, seed, dead)
        want, chosen = dense_moe(inputs["x"], inputs["router"], inputs["experts.w1"], inputs["experts.w2"],
                                  sizes[4])
        assert all(chosen[e] == 0 for e in dead)  # the crafted router does starve them
        got = simulate(p, inputs)
        assert got.shape == want.shape
        assert np.allclose(got, want, rtol=1e-9, atol=1e-9), (mesh, style, seed, float(np.abs(got - want).max()))


def test_expert_parallel_plan_dispatches_and_combines_with_one_all_to_all_each():
    tokens, dim, experts, ffn, top_k = BIG
    ep = 4
    m = Mesh.parse(f"ep={ep}")
    prog = moe(*BIG)
    p = plan(prog, m, style_pins(prog, m, "ep"))
    kinds = [c.kind.value for c in p.collectives]
    assert kinds == ["all_to_all", "all_to_all"]
    for c in p.collectives:
        assert c.bytes == (tokens // ep) * top_k * dim * 4
        assert c.tensor in ("dispatch", "expert_out")
    assert {c.tensor for c in p.collectives} == {"dispatch", "expert_out"}
    for c in p.collectives:  # nothing gathers the tokens or a dense (experts, tokens, dim) tensor
        assert not (c.kind.value == "all_gather" and (c.tensor == "x" or c.src.shape == (experts, tokens, dim)))
    # the experts stay where the style put them: each rank computes only its own experts
    assert str(p.shardings["experts.w1"]) == "[ep*2, 64, 128]"
    assert str(p.shardings["combine"]) == str(p.shardings["x"]) == "[ep*64, 64]"


# -- mutations: the verification can fail --------------------------------------------------------------
def _ep_plan():
    m = Mesh.parse("ep=4")
    prog = moe(*BIG)
    return plan(prog, m, style_pins(prog, m, "ep"))


def test_the_unmutated_ep_plan_verifies():
    p = _ep_plan()
    assert verify_full(p).ok
    assert p.verify().ok


def test_dropping_the_dispatch_all_to_all_is_caught():
    p = _ep_plan()
    key = next(k for k, chain in p.moves.items() if k[0] == "dispatch" and any(c.kind.value == "all_to_all"
                                                                               for c in chain))
    bad = dataclasses.replace(p, moves={**p.moves, key: ()})
    assert not verify_full(bad).ok
    assert not bad.verify().ok


def test_a_swapped_component_assignment_is_caught_by_simulation():
    """The dispatch lands on ranks holding experts {r, r+4} while the expert weights are {2r, 2r+1}:
    every move is wired correctly, only the values are wrong."""
    p = _ep_plan()
    i = next(j for j, op in enumerate(p.program.ops) if op.name == "expert_in")
    po = p.ops[i]
    assert po.inputs[0] == "dispatch"
    swapped = Sharding.parse("[2*ep, 64, 64]", p.mesh)
    ops = list(p.ops)
    ops[i] = dataclasses.replace(po, input_targets=(swapped,) + tuple(po.input_targets[1:]))
    moves = {**p.moves, ("dispatch", swapped): plan_move(p.shardings["dispatch"], swapped)}
    bad = dataclasses.replace(p, ops=ops, moves=moves)
    assert not check_wiring(bad, i).failed  # the chain reaches the target: only the numbers can tell
    v = verify_full(bad)
    assert not v.ok and "expert_in" in v.first_mismatch
    assert not bad.verify().ok


# -- bugs found (xfail strict: they pass once fixed) ----------------------------------------------------
def _plan_and_compare(mesh, pins, sizes=BIG):
    m = Mesh.parse(mesh)
    p = plan(moe(*sizes), m, pins)
    v = verify_full(p)
    assert v.ok, v.first_mismatch
    inputs = moe_inputs(sizes, 0)
    want, _ = dense_moe(inputs["x"], inputs["router"], inputs["experts.w1"], inputs["experts.w2"], sizes[4])
    assert np.allclose(simulate(p, inputs), want, rtol=1e-9, atol=1e-9)


def test_tokens_sharded_on_two_axes_dispatch_to_experts_on_one():
    _plan_and_compare("dp=2,ep=2", {"x": "[dp*ep*64, 64]", "experts.w1": "[ep*4, 64, 128]",
                                    "experts.w2": "[ep*4, 128, 64]"})


def test_tokens_with_a_sharded_feature_dim():
    _plan_and_compare("tp=2", {"x": "[256, tp*32]"})


def test_a_plan_gathering_a_dense_dim_of_a_ragged_tensor():
    _plan_and_compare("tp=2", {"experts.w1": "[8, 64, tp*64]", "expert_act": "[8, 64, 128]"})


# -- random pins: every plan of the routed MoE is exact (or refused with a clear error) -------------
@settings(max_examples=min(N, 25), deadline=None)
@given(st.sampled_from(["tp=2", "ep=2,tp=2", "dp=2,tp=2", "dp=2,ep=2"]), st.data())
def test_random_pins_plan_the_routed_moe_exactly(mesh_text, data):
    prog = moe(tokens=64, dim=32, experts=4, ffn=64, top_k=2)
    m = Mesh.parse(mesh_text)
    pins = {}
    for name in ("x", "experts.w1", "experts.w2", "router"):
        if data.draw(st.booleans()):
            shape = prog.tensors[name].shape
            d = data.draw(st.integers(0, len(shape) - 1))
            a = data.draw(st.sampled_from(m.names))
            parts = [str(n) for n in shape]
            parts[d] = f"{a}*{shape[d] // m.axis_size(a)}"
            pins[name] = "[" + ", ".join(parts) + "]"
    try:
        p = plan(prog, m, pins)
    except ShardingError as e:  # refused: a one-line reason naming what to change
        assert "\n" not in str(e)
        return
    assert verify_full(p).ok, (mesh_text, pins)


def test_expert_parallel_with_tensor_parallel_experts():
    # experts on ep, their ffn on tp: dispatch and combine are the two all_to_alls, the expert
    # output a partial sum over tp through the combine; every rank equals a dense MoE
    sizes = (512, 256, 8, 1024, 2)
    pins = {"x": "[ep*256, 256]", "experts.w1": "[ep*4, 256, tp*512]", "experts.w2": "[ep*4, tp*512, 256]"}
    m = Mesh.parse("ep=2,tp=2")
    p = plan(moe(*sizes), m, pins)
    assert p.counts() == {("all_to_all", ("ep",)): 2}
    assert dict(p.shardings["expert_out"].partial) == {"tp": "sum"}
    _plan_and_compare("ep=2,tp=2", pins, sizes)
