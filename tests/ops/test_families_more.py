"""Norms, cat/split/slice/select, scans, sort/topk, index ops, embedding, attention and grouped mm:
every rule checked by simulation on random shardings (every output, every rank)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from shardlayout import Mesh, Sharding, ShardingError, propagate
from shardlayout.execute import run_moves
from shardlayout.sharding.move import plan_move

from .test_strategy import rand_mesh, rand_sharding


def simulate_all(p, arrays, global_fn, local_fn=None):
    local_fn = local_fn or global_fn
    pieces = []
    for s, t, x in zip(p.inputs, p.input_targets, arrays):
        pieces.append(run_moves(plan_move(s, t), s.shard(x)))
    mesh = p.outputs[0].mesh
    per_rank = {r: local_fn(*(pc[r] for pc in pieces)) for r in mesh.ranks()}
    wants = global_fn(*arrays)
    if not isinstance(wants, tuple):
        wants = (wants,)
        per_rank = {r: (v,) for r, v in per_rank.items()}
    for k, (out, want) in enumerate(zip(p.outputs, wants)):
        got = out.unshard({r: np.asarray(per_rank[r][k]) for r in mesh.ranks()}, tolerance=1e-9)
        assert got.shape == np.shape(want) and np.allclose(got, want, atol=1e-9), (p.op, k, str(out))


def cases(seed, n=30, dims=(1, 3), partial=False):
    rng = random.Random(seed)
    for _ in range(n):
        mesh = rand_mesh(rng)
        shape = tuple(rng.choice([2, 3, 4, 6, 8]) for _ in range(rng.randint(*dims)))
        yield rng, mesh, shape, rand_sharding(rng, mesh, shape, allow_partial=partial)


def test_layer_norm_and_rms_norm():
    for rng, mesh, shape, s in cases(1, dims=(2, 3)):
        x = np.random.default_rng(0).standard_normal(shape)
        w = np.random.default_rng(1).standard_normal(shape[-1:])
        ws = rand_sharding(rng, mesh, shape[-1:])

        def ln(a, b):
            mu = a.mean(-1, keepdims=True)
            var = a.var(-1, keepdims=True)
            return (a - mu) / np.sqrt(var + 1e-5) * b

        simulate_all(propagate("layer_norm", [s, ws], normalized_shape=shape[-1:]), [x, w], ln)
        rms = lambda a, b: a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6) * b  # noqa: E731
        simulate_all(propagate("rms_norm", [s, ws], normalized_shape=shape[-1:]), [x, w], rms)
        p = propagate("native_layer_norm", [s, ws], normalized_shape=shape[-1:])

        def nln(a, b):
            mu = a.mean(-1, keepdims=True)
            r = 1 / np.sqrt(a.var(-1, keepdims=True) + 1e-5)
            return (a - mu) * r * b, mu, r

        simulate_all(p, [x, w], nln)


def test_cat_split_slice_select():
    for rng, mesh, shape, s in cases(2, dims=(1, 3), partial=True):
        d = rng.randrange(len(shape))
        x = np.random.default_rng(0).standard_normal(shape)
        t = rand_sharding(rng, mesh, shape, allow_partial=False)
        y = np.random.default_rng(1).standard_normal(shape)
        simulate_all(propagate("cat", [s, t], dim=d), [x, y], lambda a, b, d=d: np.concatenate([a, b], d))
        n = shape[d]
        sizes = [n // 2, n - n // 2] if n > 1 else [1]
        sp = propagate("split_with_sizes", [s], split_sizes=sizes, dim=d)
        local = [o.local_shape(0)[d] for o in sp.outputs]  # a carved split cuts at the local sizes
        simulate_all(sp, [x], lambda a, d=d, sz=sizes: tuple(np.split(a, [sz[0]], axis=d)) if len(sz) > 1 else a,
                     lambda a, d=d, sz=local: tuple(np.split(a, [sz[0]], axis=d)) if len(sz) > 1 else a)
        simulate_all(propagate("slice", [s], dim=d, start=1, end=n), [x],
                     lambda a, d=d, n=n: np.take(a, range(1, n), axis=d))
        simulate_all(propagate("select", [s], dim=d, index=0), [x], lambda a, d=d: np.take(a, 0, axis=d))
        simulate_all(propagate("cumsum", [s], dim=d), [x], lambda a, d=d: np.cumsum(a, axis=d))


def test_sort_topk():
    for _rng, _mesh, shape, s in cases(3):
        d = _rng.randrange(len(shape))
        x = np.random.default_rng(0).standard_normal(shape)
        simulate_all(propagate("sort", [s], dim=d), [x],
                     lambda a, d=d: (np.sort(a, axis=d), np.argsort(a, axis=d, kind="stable")))
        k = max(1, shape[d] // 2)

        def topk(a, d=d, k=k):
            idx = np.flip(np.argsort(a, axis=d, kind="stable"), axis=d)
            idx = np.take(idx, range(k), axis=d)
            return np.take_along_axis(a, idx, d), idx

        simulate_all(propagate("topk", [s], dim=d, k=k), [x], topk)


def test_max_min_argmax_argmin():
    """Over a dim: (values, indices) with that dim whole; without: the whole tensor's (max and
    min combine a partial max / min; argmax / argmin the flat index)."""
    for rng, _mesh, shape, s in cases(11, partial=True):
        d = rng.randrange(len(shape))
        keep = rng.random() < 0.5
        x = np.random.default_rng(0).standard_normal(shape)

        def with_index(value, index, d=d, keep=keep):
            return lambda a: (value(a, axis=d, keepdims=keep),
                              (np.expand_dims(index(a, axis=d), d) if keep else index(a, axis=d)))

        for op, value, index in (("max", np.max, np.argmax), ("min", np.min, np.argmin)):
            p = propagate(op, [s], dim=d, keepdim=keep)
            if s.partial:  # a partial sum has no max until it is summed
                assert not p.input_targets[0].partial
            both = with_index(value, index)
            simulate_all(p, [x], both)
            simulate_all(propagate("arg" + op, [s], dim=d, keepdim=keep), [x], lambda a, f=both: f(a)[1])
            simulate_all(propagate("arg" + op, [s]), [x], lambda a, i=index: np.asarray(float(i(a))))
        if not s.partial:
            simulate_all(propagate("max", [s]), [x], lambda a: np.asarray(a.max()))
            simulate_all(propagate("min", [s]), [x], lambda a: np.asarray(a.min()))


def test_index_ops_and_embedding():
    for rng, mesh, shape, s in cases(4, dims=(2, 3)):
        d = rng.randrange(len(shape))
        x = np.random.default_rng(0).standard_normal(shape)
        idx = np.array([rng.randrange(shape[d]) for _ in range(5)])
        si = rand_sharding(rng, mesh, (5,))
        simulate_all(propagate("index_select", [s, si], dim=d), [x, idx],
                     lambda a, i, d=d: np.take(a, i.astype(int), axis=d))
        gidx = np.random.default_rng(2).integers(0, shape[d], size=shape)
        sg = rand_sharding(rng, mesh, shape)
        simulate_all(propagate("gather", [s, sg], dim=d), [x, gidx],
                     lambda a, i, d=d: np.take_along_axis(a, i.astype(int), d))
        w = np.random.default_rng(3).standard_normal((10, 6))
        ws = rand_sharding(rng, mesh, (10, 6))
        tok = np.random.default_rng(4).integers(0, 10, size=(4, 3))
        ts = rand_sharding(rng, mesh, (4, 3))
        simulate_all(propagate("embedding", [ws, ts]), [w, tok], lambda a, i: a[i.astype(int)])


def test_attention():
    def sdpa(q, k, v, causal=False):
        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
        if causal:
            s = s + np.triu(np.full(s.shape[-2:], -np.inf), 1)
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v

    rng = random.Random(6)
    for _ in range(25):
        mesh = rand_mesh(rng)
        shp = (2, 4, 8, 4)
        ins = [rand_sharding(rng, mesh, shp, allow_partial=False) for _ in range(3)]
        arrs = [np.random.default_rng(i).standard_normal(shp) for i in range(3)]
        simulate_all(propagate("scaled_dot_product_attention", ins), arrs, sdpa)
        p = propagate("scaled_dot_product_attention", ins, is_causal=True)
        assert all(f.axis is None for f in p.outputs[0].dims[2])
        simulate_all(p, arrs, lambda q, k, v: sdpa(q, k, v, True))


def test_attention_broadcasts_one_kv_head_to_every_query_head():
    """Multi-query attention as Falcon calls it: k and v with one head for q's four (torch's math
    path broadcasts them); q's heads shard, the single k/v head is read whole by every rank."""
    rng = random.Random(12)
    for _ in range(20):
        mesh = rand_mesh(rng)
        shapes = [(2, 4, 8, 4), (2, 1, 8, 4), (2, 1, 8, 4)]
        ins = [rand_sharding(rng, mesh, sh, allow_partial=False) for sh in shapes]
        arrs = [np.random.default_rng(i).standard_normal(sh) for i, sh in enumerate(shapes)]
        p = propagate("scaled_dot_product_attention", ins)
        assert p.outputs[0].shape == (2, 4, 8, 4)
        simulate_all(p, arrs, lambda q, k, v: _np_attention(q, k, v))
    m = Mesh.parse("tp=2")
    with pytest.raises(ShardingError, match="do not fit"):
        propagate("scaled_dot_product_attention", [Sharding(m, (2, 4, 8, 4)), Sharding(m, (2, 2, 8, 4)),
                                                   Sharding(m, (2, 2, 8, 4))])


def _np_attention(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def test_grouped_mm():
    rng = random.Random(7)
    offs = np.array([3, 8, 8, 16])

    def gmm(a, b, o):
        out = np.zeros((a.shape[0], b.shape[2]))
        start = 0
        for g, end in enumerate(o.astype(int)):
            out[start:end] = a[start:end] @ b[g]
            start = end
        return out

    for _ in range(25):
        mesh = rand_mesh(rng)
        sa = rand_sharding(rng, mesh, (16, 8))
        sb = rand_sharding(rng, mesh, (4, 8, 6))
        so = Sharding(mesh, (4,))
        a = np.random.default_rng(0).standard_normal((16, 8))
        b = np.random.default_rng(1).standard_normal((4, 8, 6))
        simulate_all(propagate("_grouped_mm", [sa, sb, so]), [a, b, offs], gmm)


def test_creation_and_counting():
    m = Mesh.parse("dp=2,tp=4")
    assert str(propagate("arange", [], mesh=m, end=10).outputs[0]) == "[10]"
    assert str(propagate("full", [], mesh=m, size=(2, 3), fill_value=0.0).outputs[0]) == "[2, 3]"
    with pytest.raises(ShardingError, match="pass mesh="):
        propagate("zeros", [], size=(2,))
    h = propagate("histc", [Sharding.parse("[dp*4, tp*3]", m)], bins=5, min=-3, max=3)
    assert h.outputs[0].partial == (("dp", "sum"), ("tp", "sum")) and not h.needs_communication
    # without a range the bins follow the data's own min and max: every rank needs all of it
    own = propagate("histc", [Sharding.parse("[dp*4, tp*3]", m)], bins=5)
    assert not own.outputs[0].partial and own.needs_communication
    oh = propagate("one_hot", [Sharding.parse("[dp*4]", m)], num_classes=7)
    assert str(oh.outputs[0]) == "[dp*4, 7]"


def test_backward_rules_and_index():
    def softmax(v, d):
        e = np.exp(v - v.max(axis=d, keepdims=True))
        return e / e.sum(axis=d, keepdims=True)

    for rng, mesh, shape, s in cases(8, dims=(2, 3)):
        d = rng.randrange(len(shape))
        g = np.random.default_rng(0).standard_normal(shape)
        y = softmax(np.random.default_rng(1).standard_normal(shape), d)
        t = rand_sharding(rng, mesh, shape)
        bwd = lambda gg, yy, d=d: yy * (gg - (gg * yy).sum(axis=d, keepdims=True))  # noqa: E731
        simulate_all(propagate("_softmax_backward_data", [s, t], dim=d), [g, y], bwd)
        x = np.random.default_rng(2).standard_normal(shape)

        def lnb(gg, xx):
            mu = xx.mean(-1, keepdims=True)
            r = 1 / np.sqrt(xx.var(-1, keepdims=True) + 1e-5)
            xh = (xx - mu) * r
            n = xx.shape[-1]
            gi = r / n * (n * gg - gg.sum(-1, keepdims=True) - xh * (gg * xh).sum(-1, keepdims=True))
            lead = tuple(range(xx.ndim - 1))
            return gi, (gg * xh).sum(axis=lead), gg.sum(axis=lead)

        p = propagate("native_layer_norm_backward", [s, t], normalized_shape=shape[-1:])
        simulate_all(p, [g, x], lnb)
        idx = np.array([rng.randrange(shape[0]) for _ in range(3)])
        simulate_all(propagate("index", [s, rand_sharding(rng, mesh, (3,))]), [x, idx],
                     lambda a, i: a[i.astype(int)])


LLAMA_MOE_OPS = [  # torch 2.13 core ATen of a Llama block and a MoE layer, forward and joint backward
    "aten._assert_tensor_metadata.default", "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default", "aten._softmax.default",
    "aten._to_copy.default", "aten._unsafe_view.default", "aten.add.Scalar", "aten.add.Tensor",
    "aten.any.dim", "aten.arange.start_step", "aten.bmm.default", "aten.cat.default", "aten.clone.default",
    "aten.detach.default", "aten.div.Scalar", "aten.empty_like.default", "aten.eq.Scalar",
    "aten.expand.default", "aten.fill.Scalar", "aten.full.default", "aten.full_like.default",
    "aten.le.Scalar", "aten.logical_and.default", "aten.logical_not.default", "aten.mean.dim",
    "aten.mm.default", "aten.mul.Scalar", "aten.mul.Tensor", "aten.neg.default", "aten.ones_like.default",
    "aten.permute.default", "aten.pow.Tensor_Scalar", "aten.rsqrt.default", "aten.scalar_tensor.default",
    "aten.select.int", "aten.sigmoid.default", "aten.silu.default", "aten.slice.Tensor",
    "aten.slice_backward.default", "aten.sub.Tensor", "aten.sum.default", "aten.sum.dim_IntList",
    "aten.t.default", "aten.topk.default", "aten.transpose.int", "aten.unsqueeze.default",
    "aten.view.default", "aten.where.self",
]


def test_every_op_of_an_exported_llama_block_and_moe_layer_has_a_rule():
    from shardlayout.ops import registered
    from shardlayout.propagation import canonical_op_name

    assert [o for o in LLAMA_MOE_OPS if canonical_op_name(o) not in registered()] == []


def test_fused_attention_and_slice_backward():
    rng = random.Random(9)
    for _ in range(15):
        mesh = rand_mesh(rng)
        shp = (2, 4, 8, 4)
        ins = [rand_sharding(rng, mesh, shp, allow_partial=False) for _ in range(3)]
        p = propagate("aten._scaled_dot_product_flash_attention_for_cpu.default", ins)
        assert len(p.outputs) == 2 and p.outputs[1].shape == (2, 4, 8)
        g = rand_sharding(rng, mesh, shp, allow_partial=False)
        lse = Sharding(mesh, (2, 4, 8))
        b = propagate("_scaled_dot_product_flash_attention_for_cpu_backward", [g] + ins + [g, lse])
        assert [o.shape for o in b.outputs] == [shp, shp, shp]
        x = np.random.default_rng(0).standard_normal((4, 6))
        s = rand_sharding(rng, mesh, (4, 6))

        def back(a):
            out = np.zeros((a.shape[0], 9))
            out[:, 2:8] = a
            return out

        simulate_all(propagate("slice_backward", [s], input_sizes=(4, 9), dim=1, start=2, end=8), [x], back)


def test_where_scatter_add_index_put_one_hot_histc():
    for rng, mesh, shape, s in cases(10, dims=(2, 3)):
        x = np.random.default_rng(0).standard_normal(shape)
        y = np.random.default_rng(1).standard_normal(shape)
        c = np.random.default_rng(2).random(shape) > 0.5
        sc, sy = rand_sharding(rng, mesh, shape), rand_sharding(rng, mesh, shape)
        simulate_all(propagate("where", [sc, s, sy]), [c.astype(float), x, y],
                     lambda cc, a, b: np.where(cc > 0.5, a, b))
        d = rng.randrange(len(shape))
        idx = np.random.default_rng(3).integers(0, shape[d], size=shape)
        si = rand_sharding(rng, mesh, shape)

        def scatter_add(a, i, src, d=d):
            out = a.copy()
            where = tuple(i.astype(int) if k == d else np.indices(i.shape)[k] for k in range(a.ndim))
            np.add.at(out, where, src)
            return out

        simulate_all(propagate("scatter_add", [s, si, sy], dim=d), [x, idx, y], scatter_add)
        rows = np.array([0, min(1, shape[0] - 1)])
        vals = np.random.default_rng(4).standard_normal((2,) + shape[1:])
        sv = rand_sharding(rng, mesh, vals.shape)

        def index_put(a, i, v):
            out = a.copy()
            out[i.astype(int)] = v
            return out

        p = propagate("index_put", [s, rand_sharding(rng, mesh, (2,)), sv])
        simulate_all(p, [x, rows, vals], index_put)
        labels = np.random.default_rng(5).integers(0, 5, size=shape)
        simulate_all(propagate("one_hot", [rand_sharding(rng, mesh, shape)], num_classes=5),
                     [labels], lambda v: np.eye(5)[v.astype(int)])
        simulate_all(propagate("histc", [s], bins=4), [x],
                     lambda v: np.histogram(v, bins=4, range=(-4, 4))[0].astype(float))


def test_more_contractions_and_index_add_by_simulation():
    rng = random.Random(12)
    for _ in range(40):
        mesh = rand_mesh(rng)
        # einsum with two contracted indices and a batch index
        A = rand_sharding(rng, mesh, (4, 6, 2))
        B = rand_sharding(rng, mesh, (6, 2, 3))
        a = np.random.default_rng(0).standard_normal((4, 6, 2))
        b = np.random.default_rng(1).standard_normal((6, 2, 3))
        simulate_all(propagate("einsum", [A, B], equation="bhk,hkd->bd"), [a, b],
                     lambda u, v: np.einsum("bhk,hkd->bd", u, v))
        # addmm: bias + a @ b, the bias broadcast over rows
        S = rand_sharding(rng, mesh, (3,), allow_partial=False)
        M1, M2 = rand_sharding(rng, mesh, (4, 6)), rand_sharding(rng, mesh, (6, 3))
        bias = np.random.default_rng(2).standard_normal(3)
        m1 = np.random.default_rng(3).standard_normal((4, 6))
        m2 = np.random.default_rng(4).standard_normal((6, 3))
        simulate_all(propagate("addmm", [S, M1, M2]), [bias, m1, m2], lambda c, u, v: c + u @ v)
        # matmul with broadcasting batch dims and a matrix-vector product
        X, Y = rand_sharding(rng, mesh, (2, 4, 6)), rand_sharding(rng, mesh, (6, 3))
        x = np.random.default_rng(5).standard_normal((2, 4, 6))
        y = np.random.default_rng(6).standard_normal((6, 3))
        simulate_all(propagate("matmul", [X, Y]), [x, y], np.matmul)
        V = rand_sharding(rng, mesh, (6,))
        vv = np.random.default_rng(7).standard_normal(6)
        simulate_all(propagate("matmul", [M1, V]), [m1, vv], np.matmul)
        # index_add(self, dim, index, src)
        sx = rand_sharding(rng, mesh, (5, 4), allow_partial=False)
        si = rand_sharding(rng, mesh, (3,), allow_partial=False)
        ss = rand_sharding(rng, mesh, (3, 4), allow_partial=False)
        base = np.random.default_rng(8).standard_normal((5, 4))
        idx = np.array([0, 2, 2])
        src = np.random.default_rng(9).standard_normal((3, 4))

        def index_add(t, i, v):
            out = t.copy()
            np.add.at(out, i.astype(int), v)
            return out

        simulate_all(propagate("index_add", [sx, si, ss], dim=0), [base, idx, src], index_add)


def test_chunk_unbind_log_softmax_by_simulation():
    for rng, mesh, shape, s in cases(13, dims=(2, 3)):
        d = rng.randrange(len(shape))
        x = np.random.default_rng(0).standard_normal(shape)
        n = shape[d]
        c = -(-n // 2)
        simulate_all(propagate("chunk", [s], chunks=2, dim=d), [x],
                     lambda a, d=d, c=c, n=n: tuple(np.split(a, [c], axis=d)) if c < n else a)
        simulate_all(propagate("unbind", [s], dim=d), [x],
                     lambda a, d=d: tuple(np.moveaxis(a, d, 0)) if a.shape[d] > 1 else np.take(a, 0, axis=d))
        t = rand_sharding(rng, mesh, shape, allow_partial=False)

        def log_softmax(a, d=d):
            m = a.max(axis=d, keepdims=True)
            return a - m - np.log(np.exp(a - m).sum(axis=d, keepdims=True))

        simulate_all(propagate("_log_softmax", [t], dim=d), [x], log_softmax)


def test_vocab_parallel_embedding_is_a_partial_sum_and_proven():
    """A table cut on its rows (Megatron's VocabParallelEmbedding): each rank looks up the tokens
    in its rows, zeros elsewhere; the output is partial(sum), nothing moves; exact on every rank,
    proven by the index-level check, refused without the local run; a table whose gather is
    cheaper than reducing the output later is gathered."""
    from shardlayout.execute import NumpySimulator
    from shardlayout.execute.indexmap import index_map
    from shardlayout.execute.proof import check_op
    from shardlayout.ops import get_op

    m = Mesh.parse("dp=2,tp=4")
    w, i = Sharding.parse("[tp*64, 8]", m), Sharding.parse("[dp, 3]", m)
    p = propagate("embedding", [w, i])
    assert str(p.outputs[0]) == "[dp, 3, 8] +sum(tp)" and not p.collectives
    rng = np.random.default_rng(0)
    W, idx = rng.standard_normal((256, 8)), rng.integers(0, 256, (2, 3))
    outs = NumpySimulator(m).op(get_op("embedding"), [w.shard(W), i.shard(idx)], dict(p.local), p.outputs)
    assert np.allclose(p.outputs[0].unshard(outs[0]), W[idx])
    assert check_op(m, index_map("embedding", (w, i), dict(p.local)), (w, i), p.outputs).status == "proven"
    assert check_op(m, index_map("embedding", (w, i), {}), (w, i), p.outputs).failed
    small = propagate("embedding", [Sharding.parse("[tp*2, 8]", m), Sharding.parse("[64, 32]", m)])
    assert small.collectives and any("gathered" in n for n in small.notes)  # 8 rows vs 2048 lookups


@pytest.mark.parametrize("table,idx,params", [
    ("[tp:(1)2*64, 8]", "[2, 3]", {}),  # a sub-axis: a partial sum needs a whole axis
    ("[tp*64, 8]", "[4, 3] +sum(dp)", {}),  # partial indices: a lookup is not linear in them
    ("[tp*64, 8]", "[2, 3]", {"scale_grad_by_freq": True}),  # needs every token's count
])
def test_vocab_parallel_lookup_is_refused_where_it_would_be_wrong(table, idx, params):
    m = Mesh.parse("dp=2,tp=4")
    p = propagate("embedding", [Sharding.parse(table, m), Sharding.parse(idx, m)], **params)
    assert not p.local and "tp" not in dict(p.outputs[0].partial)


def test_a_replicated_operand_of_a_partial_one_gets_its_gradient_summed():
    """``partial * w``: w's gradient is a partial sum over the partial input's axis (the vocab-
    parallel embedding's output meeting a norm weight); the partial input's own is not."""
    from shardlayout.plan.backward import op_reductions

    m = Mesh.parse("tp=2")
    x, w = Sharding.parse("[4, 8] +sum(tp)", m), Sharding.parse("[8]", m)
    got = op_reductions(("x", "w"), (x, w), (x,), {"x", "w"})
    assert got == (("w", w, frozenset({"tp"})),)


@pytest.mark.parametrize("end", [float("nan"), float("inf"), -float("inf")])
def test_arange_refuses_bounds_that_are_not_finite(end):
    from shardlayout.errors import OpError

    with pytest.raises(OpError) as e:
        propagate("arange", [], end=end, mesh=Mesh.parse("tp=2"))
    assert f"op arange: end = {end!r} is not a finite number; give finite start, end and step" in str(e.value)
    assert propagate("arange", [], end=10.5, mesh=Mesh.parse("tp=2")).outputs[0].shape == (11,)


def test_repeat_interleave_of_counts_keeps_counts_and_indices_whole():
    """``repeat_interleave(repeats; output_size)``: index i repeated repeats[i] times (torch's own, the
    oracle); every position depends on all the counts before it, so sharded counts are gathered and
    the indices are whole; without ``output_size`` the extent is data-dependent: refused."""
    import torch

    from shardlayout.ops import registered

    m = Mesh.parse("tp=2")
    p = propagate("repeat_interleave", [Sharding.parse("[tp*3]", m)], output_size=9)
    assert str(p.outputs[0]) == "[9]" and str(p.input_targets[0]) == "[6]" and p.needs_communication
    counts = np.array([2, 0, 3, 1, 0, 3])
    got = registered()["repeat_interleave"].numpy(counts, output_size=9)
    assert np.array_equal(got, torch.repeat_interleave(torch.tensor(counts), output_size=9).numpy())
    with pytest.raises(ShardingError, match="give output_size"):
        propagate("repeat_interleave", [Sharding.parse("[6]", m)])
    with pytest.raises(ShardingError, match=r"output_size >= 1 .*got 0"):
        propagate("repeat_interleave", [Sharding.parse("[6]", m)], output_size=0)
    for bad in ([1.5, 2.0], [2, -1]):  # torch refuses both
        with pytest.raises(ShardingError, match="whole counts >= 0"):
            registered()["repeat_interleave"].numpy(np.array(bad))
