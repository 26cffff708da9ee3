"""Which program tensors are ragged (``program.ragged``): set on route outputs from the routing's
sizes, carried through the ops defined on ragged tensors, refused (ProgramError, at build time and
naming the op) through the ones that are not, kept by the JSON round trip and checked on reading."""

from __future__ import annotations

import json

import pytest

from shardlayout.program import Program, ProgramBuilder, ProgramError
from shardlayout.program.models import moe
from shardlayout.sharding.ragged import Ragged

T, K, E, D, F = 8, 2, 4, 4, 6


def routed(b: ProgramBuilder):
    """x (T, D) routed by idx (T, K) to E experts; returns (x, idx, scores, w (E, D, F), xs)."""
    x = b.input("x", (T, D))
    idx = b.input("idx", (T, K), "int64")
    sc = b.input("sc", (T, K))
    w = b.param("w", (E, D, F))
    xs = b.op("route", [x, idx], name="xs", experts=E)
    return x, idx, sc, w, xs


def expected_ragged(dim: int = 1) -> Ragged:
    # ceil(T*K/E) expected rows per expert; at most T (a token picks an expert once); T*K rows in all
    return Ragged(dim, E, -(-T * K // E), T, T * K, "bincount(idx, 4)")


def test_route_output_is_ragged_from_the_routing_sizes():
    b = ProgramBuilder()
    *_, xs = routed(b)
    b.output(xs)
    p = b.build()
    t = p.tensors["xs"]
    assert t.shape == (E, -(-T * K // E), D)
    assert t.ragged == expected_ragged()
    assert all(p.tensors[n].ragged is None for n in ("x", "idx", "sc", "w"))


@pytest.mark.parametrize("tokens,k,experts", [(8, 2, 4), (10, 3, 4), (5, 1, 8), (7, 2, 2)])
def test_route_ragged_counts_follow_the_sizes(tokens, k, experts):
    b = ProgramBuilder()
    x = b.input("x", (tokens, 3))
    idx = b.input("i", (tokens, k), "int64")
    b.output(b.op("route", [x, idx], name="y", experts=experts))
    r = b.build().tensors["y"].ragged
    assert (r.dim, r.components, r.expected, r.maximum, r.total) == (
        1, experts, -(-tokens * k // experts), tokens, tokens * k)
    assert b.build().tensors["y"].shape == (experts, -(-tokens * k // experts), 3)


def test_ragged_is_carried_through_einsum_and_rowwise_ops_and_ends_at_unroute():
    b = ProgramBuilder()
    x, idx, sc, w, xs = routed(b)
    h = b.op("einsum", [xs, w], name="h", equation="erd,edf->erf")
    a = b.op("silu", [h], name="a")
    g = b.op("mul", [a, b.input("gain", (F,))], name="g")  # broadcasts along the rows
    s = b.op("add", [g, a], name="s")  # two ragged operands, one ragged dim
    u = b.op("unsqueeze", [s], name="u", dim=3)  # a dense dim after the ragged one
    q = b.op("squeeze", [u], name="q", dim=3)
    bm = b.op("bmm", [q, b.param("w2", (E, F, D))], name="bm")
    y = b.op("unroute", [bm, idx, sc], name="y")
    b.output(y)
    p = b.build()
    for n in ("xs", "h", "a", "g", "s", "u", "q", "bm"):
        assert p.tensors[n].ragged == expected_ragged(), n
    assert p.tensors["h"].shape == (E, 4, F) and p.tensors["u"].shape == (E, 4, F, 1)
    assert p.tensors["y"].ragged is None and p.tensors["y"].shape == (T, D)


def test_an_einsum_with_a_leading_dense_dim_moves_the_ragged_dim():
    b = ProgramBuilder()
    *_, w, xs = routed(b)
    b.output(b.op("einsum", [xs, w], name="o", equation="erd,edf->ferd"))
    assert b.build().tensors["o"].ragged == expected_ragged(dim=2)


def test_the_routed_moe_marks_exactly_the_tensors_between_route_and_unroute():
    p = moe(tokens=16, dim=8, experts=4, ffn=12, top_k=2)
    ragged = {n for n, t in p.tensors.items() if t.ragged is not None}
    assert ragged == {"dispatch", "expert_in", "expert_act", "expert_out"}
    r = p.tensors["dispatch"].ragged
    assert (r.dim, r.components, r.expected, r.maximum, r.total) == (1, 4, 8, 16, 32)


@pytest.mark.parametrize("build,needle", [
    (lambda b, xs, w, idx, sc: b.op("view", [xs], shape=(E * 4, D)), "view"),
    (lambda b, xs, w, idx, sc: b.op("sum", [xs], dim=[2]), "sum"),
    (lambda b, xs, w, idx, sc: b.op("sum", [xs], dim=[1]), "sum"),
    (lambda b, xs, w, idx, sc: b.op("transpose", [xs], dim0=0, dim1=1), "transpose"),
    (lambda b, xs, w, idx, sc: b.op("transpose", [xs], dim0=1, dim1=2), "transpose"),
    (lambda b, xs, w, idx, sc: b.op("_softmax", [xs], dim=2), "_softmax"),
    (lambda b, xs, w, idx, sc: b.op("unsqueeze", [xs], dim=0), "only dims after the ragged dim"),
    # a dense operand spanning the ragged dim
    (lambda b, xs, w, idx, sc: b.op("mul", [xs, b.input("d", (4, D))]), "ragged dim"),
    (lambda b, xs, w, idx, sc: b.op("add", [xs, b.input("d", (E, 4, 1))]), "ragged dim"),
    (lambda b, xs, w, idx, sc: b.op("einsum", [xs, b.input("d", (4, D))], equation="erd,rd->erd"), "ragged dim"),
    # an einsum contracting or separating the ragged dim
    (lambda b, xs, w, idx, sc: b.op("einsum", [xs, w], equation="erd,edf->ef"), "contracting"),
    (lambda b, xs, w, idx, sc: b.op("einsum", [xs, w], equation="erd,edf->efr"), "separates"),
    (lambda b, xs, w, idx, sc: b.op("einsum", [xs, w], equation="erd,edf->ref"), "separates"),
])
def test_ops_not_defined_on_ragged_tensors_are_refused_at_build(build, needle):
    b = ProgramBuilder()
    _, idx, sc, w, xs = routed(b)
    out = build(b, xs, w, idx, sc)
    b.output(out)
    with pytest.raises(ProgramError, match=needle):
        b.build()


def test_a_dense_operand_may_vary_along_the_component_dim():
    b = ProgramBuilder()
    *_, xs = routed(b)
    b.output(b.op("mul", [xs, b.input("bias", (E, 1, D))], name="m"))  # one row per expert
    assert b.build().tensors["m"].ragged == expected_ragged()


def test_unroute_of_a_dense_tensor_is_refused_at_build():
    b = ProgramBuilder()
    _, idx, sc, _, _ = routed(b)
    b.output(b.op("unroute", [b.input("dense", (E, 4, D)), idx, sc], name="y"))
    with pytest.raises(ProgramError, match="ragged"):
        b.build()


def _moe_json() -> tuple:
    p = moe(tokens=16, dim=8, experts=4, ffn=12, top_k=2)
    return p, json.loads(p.to_json())


def test_json_round_trip_keeps_ragged():
    p, data = _moe_json()
    entries = {t["name"]: t.get("ragged") for t in data["tensors"]}
    assert {n for n, r in entries.items() if r is not None} == {"dispatch", "expert_in", "expert_act", "expert_out"}
    assert entries["dispatch"] == {"dim": 1, "components": 4, "expected": 8, "maximum": 16, "total": 32,
                                   "counts": p.tensors["dispatch"].ragged.counts}
    q = Program.from_json(p.to_json())
    assert q == p
    assert {n: t.ragged for n, t in q.tensors.items()} == {n: t.ragged for n, t in p.tensors.items()}
    assert q.to_json() == p.to_json()


def test_json_without_ragged_entries_derives_them_from_the_ops():
    p, data = _moe_json()
    for t in data["tensors"]:
        t.pop("ragged", None)
    assert Program.from_json(json.dumps(data)) == p


@pytest.mark.parametrize("edit", [
    lambda ts: ts["dispatch"]["ragged"].update(expected=9),
    lambda ts: ts["expert_in"]["ragged"].update(dim=2),
    lambda ts: ts["expert_out"]["ragged"].update(components=5),
    lambda ts: ts["combine"].update(ragged={"dim": 1, "components": 4, "expected": 8, "maximum": 16}),  # dense
    lambda ts: ts["x"].update(ragged={"dim": 1, "components": 16, "expected": 8, "maximum": 8}),
])
def test_json_whose_ragged_disagrees_with_the_ops_is_refused(edit):
    _, data = _moe_json()
    edit({t["name"]: t for t in data["tensors"]})
    with pytest.raises(ProgramError, match="ragged"):
        Program.from_json(json.dumps(data))


def test_json_with_an_op_not_defined_on_ragged_tensors_is_refused():
    _, data = _moe_json()
    data["tensors"].append({"name": "flat", "shape": [32, 8], "dtype": "float32", "kind": "value"})
    data["ops"].append({"name": "flat", "target": "view", "inputs": ["dispatch"], "params": {"shape": [32, 8]},
                        "outputs": ["flat"]})
    with pytest.raises(ProgramError, match="view"):
        Program.from_json(json.dumps(data))


def test_the_planners_routed_param_is_refused_from_a_caller():
    import json

    from shardlayout.errors import ShardingError
    from shardlayout.mesh import Mesh
    from shardlayout.plan import plan
    from shardlayout.program import Program
    from shardlayout.program.models import moe

    data = json.loads(moe(tokens=16, dim=8, experts=4, ffn=8, top_k=2).to_json())
    for op in data["ops"]:
        if op["target"] == "unroute":
            op["params"]["routed"] = ["ep"]
    with pytest.raises(ShardingError, match="set by the planner"):
        plan(Program.from_json(json.dumps(data)), Mesh.parse("ep=2"))


def test_a_float_index_is_refused_at_build():
    from shardlayout.program import ProgramBuilder, ProgramError

    b = ProgramBuilder()
    x, idx = b.input("x", (8, 4)), b.input("idx", (8, 2), "float32")
    b.output(b.op("route", [x, idx], name="xs", experts=4))
    with pytest.raises(ProgramError, match="integer dtype"):
        b.build()
