"""Built-in models written with the builder (no torch needed). Styles (``style_pins``) are in
``program.styles`` and re-exported here.

    >>> prog = llama(layers=1)
    >>> len(prog.ops) > 30, prog.tensors["x"].shape
    (True, (2, 8, 16))
"""

from __future__ import annotations

from ..caches import paused_gc
from ..errors import ShardingError
from . import Program, ProgramBuilder
from .styles import STYLES, apply_style, style_pins  # noqa: F401 - styles live in program.styles


def _rms_norm(b: ProgramBuilder, x: str, w: str, prefix: str) -> str:
    sq = b.op("pow", [x, 2.0], name=f"{prefix}.sq")
    ms = b.op("mean", [sq], name=f"{prefix}.ms", dim=-1, keepdim=True)
    eps = b.op("add", [ms, 1e-6], name=f"{prefix}.eps")
    r = b.op("rsqrt", [eps], name=f"{prefix}.r")
    n = b.op("mul", [x, r], name=f"{prefix}.n")
    return b.op("mul", [n, w], name=f"{prefix}.out")


def _rope(b: ProgramBuilder, z: str, cos: str, sin: str, hd: int, prefix: str) -> str:
    z1 = b.op("slice", [z], name=f"{prefix}.lo", dim=3, start=0, end=hd // 2)
    z2 = b.op("slice", [z], name=f"{prefix}.hi", dim=3, start=hd // 2, end=hd)
    nz2 = b.op("neg", [z2], name=f"{prefix}.neg")
    rot = b.op("cat", [nz2, z1], name=f"{prefix}.rot", dim=3)
    a = b.op("mul", [z, cos], name=f"{prefix}.cos")
    c = b.op("mul", [rot, sin], name=f"{prefix}.sin")
    return b.op("add", [a, c], name=f"{prefix}.out")


def llama(layers: int = 2, batch: int = 2, seq: int = 8, dim: int = 16, heads: int = 4, ffn: int = 32) -> Program:
    """A Llama-style decoder: RMSNorm, attention with RoPE and causal SDPA, SwiGLU MLP; ``layers``
    blocks (``ProgramBuilder.repeat``: from 6 layers on, the middle ones are made when read).
    Weights are ``(in, out)`` and applied with ``mm`` on ``(batch*seq, dim)`` rows."""
    if layers < 1 or min(batch, seq, dim, heads, ffn) < 1:
        raise ShardingError(f"llama: layers, batch, seq, dim, heads and ffn must be >= 1 (got layers={layers})")
    if dim % heads or (dim // heads) % 2:
        raise ShardingError(f"llama: dim {dim} must split into {heads} heads of an even size")
    with paused_gc():  # ~10**4 small immutable records, no cycles worth collecting
        return _llama(layers, batch, seq, dim, heads, ffn)


def _llama(layers: int, batch: int, seq: int, dim: int, heads: int, ffn: int) -> Program:
    hd = dim // heads
    b = ProgramBuilder()
    x = b.input("x", (batch, seq, dim))
    cos = b.input("cos", (seq, hd))
    sin = b.input("sin", (seq, hd))

    def layer(b: ProgramBuilder, x: str) -> str:  # names relative to the layer: layers.{i}.wq
        w = {n: b.param(n, s) for n, s in [
            ("attn_norm", (dim,)), ("wq", (dim, dim)), ("wk", (dim, dim)), ("wv", (dim, dim)), ("wo", (dim, dim)),
            ("mlp_norm", (dim,)), ("w_gate", (dim, ffn)), ("w_up", (dim, ffn)), ("w_down", (ffn, dim))]}
        h = _rms_norm(b, x, w["attn_norm"], "attn_norm")
        h2 = b.op("view", [h], name="attn_in", shape=(batch * seq, dim))
        heads_out = []
        for n in ("q", "k", "v"):
            y = b.op("mm", [h2, w[f"w{n}"]], name=n)
            y = b.op("view", [y], name=f"{n}4", shape=(batch, seq, heads, hd))
            y = b.op("transpose", [y], name=f"{n}t", dim0=1, dim1=2)
            if n != "v":
                y = _rope(b, y, cos, sin, hd, f"rope_{n}")
            heads_out.append(y)
        a = b.op("scaled_dot_product_attention", heads_out, name="sdpa", is_causal=True)
        a = b.op("transpose", [a], name="sdpa_t", dim0=1, dim1=2)
        a = b.op("view", [a], name="attn_flat", shape=(batch * seq, dim))
        o = b.op("mm", [a, w["wo"]], name="attn_out")
        o = b.op("view", [o], name="attn_out3", shape=(batch, seq, dim))
        x = b.op("add", [x, o], name="resid1")
        h = _rms_norm(b, x, w["mlp_norm"], "mlp_norm")
        h2 = b.op("view", [h], name="mlp_in", shape=(batch * seq, dim))
        g = b.op("mm", [h2, w["w_gate"]], name="gate")
        u = b.op("mm", [h2, w["w_up"]], name="up")
        act = b.op("mul", [b.op("silu", [g], name="silu"), u], name="swiglu")
        d = b.op("mm", [act, w["w_down"]], name="mlp_out")
        d = b.op("view", [d], name="mlp_out3", shape=(batch, seq, dim))
        return b.op("add", [x, d], name="resid2")

    x = b.repeat(layer, layers, x, prefix="layers")
    b.output(x)
    return b.build()


def _router(b: ProgramBuilder, tokens: int, dim: int, experts: int, ffn: int) -> tuple:
    """The MoE layer's tokens, stacked expert weights and router probabilities (shared by
    :func:`moe` and :func:`moe_dense`)."""
    x = b.input("x", (tokens, dim))
    wr = b.param("router", (dim, experts))
    w1 = b.param("experts.w1", (experts, dim, ffn))
    w2 = b.param("experts.w2", (experts, ffn, dim))
    logits = b.op("mm", [x, wr], name="router_logits")
    return x, w1, w2, b.op("_softmax", [logits], name="router_probs", dim=1)


def moe(tokens: int = 16, dim: int = 16, experts: int = 4, ffn: int = 32, top_k: int = 2) -> Program:
    """A mixture-of-experts layer with token-choice top-k routing: router, top-k, tokens sorted by
    expert into a nested tensor (``route``: experts x ragged rows), SiLU experts applied per
    expert (einsum over the stacked ``(E, D, F)`` weights), weighted combine back to the tokens
    (``unroute``). Each expert computes only the tokens routed to it."""
    b = ProgramBuilder()
    x, w1, w2, probs = _router(b, tokens, dim, experts, ffn)
    scores, idx = b.op("topk", [probs], name="topk", n_out=2, dtypes=("float32", "int64"), k=top_k, dim=1)
    xs = b.op("route", [x, idx], name="dispatch", experts=experts)
    h = b.op("einsum", [xs, w1], name="expert_in", equation="erd,edf->erf")
    a = b.op("silu", [h], name="expert_act")
    o = b.op("einsum", [a, w2], name="expert_out", equation="erf,efd->erd")
    b.output(b.op("unroute", [o, idx, scores], name="combine"))
    return b.build()


def moe_dense(tokens: int = 16, dim: int = 16, experts: int = 4, ffn: int = 32, top_k: int = 2) -> Program:
    """The dense form of :func:`moe`, for comparison: every expert computes every token (an
    ``(experts, tokens, dim)`` tensor) and the top-k gate zeroes the ones it did not choose:
    ``experts / top_k`` times the FLOPs of the routed layer."""
    b = ProgramBuilder()
    x, w1, w2, probs = _router(b, tokens, dim, experts, ffn)
    vals, _ = b.op("topk", [probs], name="topk", n_out=2, k=top_k, dim=1)
    thr = b.op("slice", [vals], name="kth", dim=1, start=top_k - 1, end=top_k)
    mask = b.op("ge", [probs, thr], name="chosen")
    gate = b.op("mul", [probs, mask], name="gate")
    h = b.op("einsum", [x, w1], name="expert_in", equation="td,edf->etf")
    a = b.op("silu", [h], name="expert_act")
    o = b.op("einsum", [a, w2], name="expert_out", equation="etf,efd->etd")
    y = b.op("einsum", [gate, o], name="combine", equation="te,etd->td")
    b.output(y)
    return b.build()


MODELS = {"llama": llama, "moe": lambda layers=1, **sizes: moe(**sizes),
          "moe-dense": lambda layers=1, **sizes: moe_dense(**sizes)}
