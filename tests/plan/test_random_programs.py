"""Random small programs with random pins: every plan verifies on every rank (hypothesis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shardlayout import Mesh, Sharding
from shardlayout.plan import plan
from shardlayout.program import ProgramBuilder

from ..ops.test_view import prime_factors as factorizations


@st.composite
def programs(draw):
    nd = draw(st.integers(1, 3))
    mesh = Mesh(tuple(draw(st.sampled_from([2, 2, 3, 4])) for _ in range(nd)), ("a", "b", "c")[:nd])
    shape = tuple(draw(st.sampled_from([2, 3, 4, 6, 8])) for _ in range(draw(st.integers(1, 3))))
    b = ProgramBuilder()
    cur = b.input("x", shape)
    pins = {}

    def rand_pin(name, shp):
        pl = []
        for _ in range(mesh.ndim):
            k = draw(st.integers(0, 9))
            pl.append("R" if k < 3 or not shp else f"S({draw(st.integers(0, len(shp) - 1))})" if k < 9 else "P")
        return Sharding.from_placements(mesh, shp, pl)

    pins["x"] = rand_pin("x", shape)
    for i in range(draw(st.integers(1, 6))):
        shp = b._tensors[cur].shape
        kind = draw(st.sampled_from(["add", "mul", "mm", "sum", "mean", "view", "transpose", "softmax", "silu",
                                     "add_const", "mul_const", "neg", "slice", "cat", "pow", "expand",
                                     "permute", "amax", "where", "layer_norm", "cumsum", "topk",
                                     "index_select", "einsum"]))
        if kind in ("add", "mul"):
            other = b.param(f"p{i}", shp[draw(st.integers(0, len(shp) - 1)):] if shp else ())
            pins[other] = rand_pin(other, b._tensors[other].shape)
            cur = b.op(kind, [cur, other])
        elif kind == "mm" and len(shp) == 2:
            w = b.param(f"w{i}", (shp[1], draw(st.sampled_from([2, 4, 6]))))
            pins[w] = rand_pin(w, b._tensors[w].shape)
            cur = b.op("mm", [cur, w])
        elif kind in ("sum", "mean") and len(shp) >= 2:
            cur = b.op(kind, [cur], dim=draw(st.integers(0, len(shp) - 1)))
        elif kind in ("add_const", "mul_const"):
            cur = b.op(kind[:3], [cur, draw(st.sampled_from([0.5, 2.0, -1.0]))])
        elif kind == "neg":
            cur = b.op("neg", [cur])
        elif kind == "slice" and shp and max(shp) > 1:
            d = max(range(len(shp)), key=lambda k: shp[k])
            cur = b.op("slice", [cur], dim=d, start=1, end=shp[d])
        elif kind == "cat" and shp:
            cur = b.op("cat", [cur, cur], dim=draw(st.integers(0, len(shp) - 1)))
        elif kind == "pow":
            cur = b.op("pow", [cur, 2.0])
        elif kind == "expand" and len(shp) < 3:
            u = b.op("unsqueeze", [cur], dim=0)
            cur = b.op("expand", [u], size=(2,) + shp)
        elif kind == "permute" and len(shp) >= 2:
            cur = b.op("permute", [cur], dims=tuple(reversed(range(len(shp)))))
        elif kind == "amax" and len(shp) >= 2:
            cur = b.op("amax", [cur], dim=draw(st.integers(0, len(shp) - 1)))
        elif kind == "where" and shp:
            mask = b.op("gt", [cur, 0.0])
            cur = b.op("where", [mask, cur, b.op("neg", [cur])])
        elif kind == "einsum" and len(shp) == 2:
            eq, other_shape = draw(st.sampled_from([
                ("ij,jk->ik", (shp[1], 3)), ("ij,ij->i", shp), ("ij,kj->ik", (2, shp[1])), ("ij,i->j", shp[:1])]))
            other = b.param(f"e{i}", other_shape)
            pins[other] = rand_pin(other, other_shape)
            cur = b.op("einsum", [cur, other], equation=eq)
        elif kind == "cumsum" and shp:
            cur = b.op("cumsum", [cur], dim=draw(st.integers(0, len(shp) - 1)))
        elif kind == "topk" and shp and shp[-1] > 1:
            cur = b.op("topk", [cur], n_out=2, k=shp[-1] - 1, dim=len(shp) - 1)[0]
        elif kind == "index_select" and shp:
            d = draw(st.integers(0, len(shp) - 1))
            idx = b.op("arange", [], end=shp[d], start=0)
            cur = b.op("index_select", [cur, idx], dim=d)
        elif kind == "layer_norm" and shp and shp[-1] > 1:
            w = b.param(f"ln{i}", shp[-1:])
            pins[w] = rand_pin(w, shp[-1:])
            cur = b.op("layer_norm", [cur, w], normalized_shape=shp[-1:])
        elif kind == "view" and shp:
            dims = [1] * draw(st.integers(1, 3))
            for p in factorizations(int(__import__("math").prod(shp))):
                dims[draw(st.integers(0, len(dims) - 1))] *= p
            cur = b.op("view", [cur], shape=tuple(dims))
        elif kind == "transpose" and len(shp) >= 2:
            cur = b.op("transpose", [cur], dim0=0, dim1=len(shp) - 1)
        elif kind == "softmax" and shp:
            cur = b.op("_softmax", [cur], dim=len(shp) - 1)
        elif kind == "silu":
            cur = b.op("silu", [cur])
    b.output(cur)
    if draw(st.booleans()):
        out = cur
        pins[out] = rand_pin(out, b._tensors[out].shape)
        if pins[out].partial:
            del pins[out]
    return b.build(), mesh, pins


@given(programs())
def test_random_programs_plan_and_verify(case):
    prog, mesh, pins = case
    p = plan(prog, mesh, pins)
    v = p.verify(rtol=1e-5, atol=1e-6)
    assert v.ok, (v, [str(o.target) for o in prog.ops], {k: str(s) for k, s in pins.items()})
