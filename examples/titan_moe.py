"""A torchtitan-style mixture-of-experts layer, for ``shardlayout plan --module examples/titan_moe.py:make``.

Token-choice top-k routing as torchtitan writes it: router scores, ``topk``, per-expert counts
(``histc`` or ``bincount``), tokens sorted by expert (stable ``argsort``, rows gathered by
``order // top_k``), SwiGLU experts as ``torch._grouped_mm`` in bfloat16 with ``cumsum``
offsets, the routing scores applied after (or before) the experts, and the rows summed back into
the tokens (``scatter_add``, or ``index_add``). The variants are the forms users write; every
one is recognised as route / grouped matmul / unroute (``shardlayout.program.routing``).
``experts="loop"`` runs the experts as torchtitan's for-loop does instead (``use_grouped_mm=False``:
``torch.split`` of the rows by ``counts.tolist()``, one matmul chain per expert, ``torch.cat``, and
its zero padding), read as the same grouped computation (``shardlayout.program.expert_loop``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class TitanMoE(nn.Module):
    """``TitanMoE(dim, experts, ffn, top_k, counts="histc"|"bincount", gather="index"|"gather",
    combine="scatter_add"|"index_add"|"deterministic", scores="after"|"before", run="grouped"|"loop",
    batched=False, casts="once"|"per_matmul", biases=False)`` (``deterministic``: torchtitan's
    ``deterministic_scatter_add`` custom op; ``counts="onehot"``, ``batched`` and ``casts="per_matmul"``:
    its Qwen3-MoE's forms; ``biases``: its GPT-OSS's per-expert biases, each expert's row repeated
    over its rows by ``repeat_interleave`` of the counts padded with a slack entry)."""

    def __init__(self, dim: int = 256, experts: int = 8, ffn: int = 512, top_k: int = 2, counts: str = "histc",
                 gather: str = "index", combine: str = "scatter_add", scores: str = "after", run: str = "grouped",
                 batched: bool = False, casts: str = "once", biases: bool = False):
        super().__init__()
        self.experts, self.top_k, self.batched, self.casts = experts, top_k, batched, casts
        self.b1 = nn.Parameter(torch.randn(experts, ffn) / 4) if biases else None
        self.b2 = nn.Parameter(torch.randn(experts, dim) / 4) if biases else None
        self.counts, self.gather, self.combine, self.scores, self.run = counts, gather, combine, scores, run
        self.router = nn.Linear(dim, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, dim, ffn) / dim ** 0.5)
        self.w3 = nn.Parameter(torch.randn(experts, dim, ffn) / dim ** 0.5)
        self.w2 = nn.Parameter(torch.randn(experts, ffn, dim) / ffn ** 0.5)

    def forward(self, x):
        t, d = x.shape
        if self.batched:  # torchtitan 0.3's Qwen3-MoE router: scores (batch, seq, E), top-k on the last dim
            probs = torch.softmax(self.router(x.view(1, t, d)), dim=-1)
            top_nd, idx_nd = torch.topk(probs, self.top_k, dim=-1)
            top, idx = top_nd.view(t, self.top_k), idx_nd.view(t, self.top_k)
        else:
            probs = torch.softmax(self.router(x), dim=1)
            top, idx = torch.topk(probs, self.top_k, dim=1)
            idx_nd = idx
        flat = idx.view(-1)
        if self.counts == "histc":
            counts = torch.histc(flat.float(), bins=self.experts, min=0, max=self.experts)
        elif self.counts == "onehot":  # each choice a one in its expert's column, summed over the tokens
            counts = torch.zeros_like(probs).scatter(-1, idx_nd, 1).sum(dim=tuple(range(probs.dim() - 1)))
        else:
            counts = torch.bincount(flat, minlength=self.experts)
        order = torch.argsort(flat, stable=True)
        token = order // self.top_k
        if self.gather == "index":
            xs = x[token]
        else:
            xs = torch.gather(x, 0, token.unsqueeze(-1).expand(-1, d))
        weights = top.view(-1)[order].reshape(-1, 1)
        if self.scores == "before":
            xs = xs * weights
        if self.run == "loop":
            ys = experts_for_loop(self.w1, self.w2, self.w3, xs, counts)
        else:
            offs = torch.cumsum(counts.to(torch.int32), dim=0, dtype=torch.int32)
            xb = xs.bfloat16()
            xb3 = xs.bfloat16() if self.casts == "per_matmul" else xb  # torchtitan casts per expert matmul
            h1 = torch._grouped_mm(xb, self.w1.bfloat16(), offs=offs)
            if self.b1 is not None:
                h1 = h1 + per_expert_rows(self.b1, counts, offs, xs.shape[0]).to(h1.dtype)
            h = F.silu(h1) * torch._grouped_mm(xb3, self.w3.bfloat16(), offs=offs)
            ys = torch._grouped_mm(h, self.w2.bfloat16(), offs=offs)
            if self.b2 is not None:
                ys = ys + per_expert_rows(self.b2, counts, offs, xs.shape[0]).to(ys.dtype)
            ys = ys.float()
        if self.scores == "after":
            ys = ys * weights
        if self.combine == "scatter_add":
            return torch.zeros_like(x).scatter_add(0, token.unsqueeze(1).expand(-1, d), ys)
        if self.combine == "deterministic":  # torchtitan's own combine (its Qwen3-MoE, DeepSeek-V3)
            return deterministic_scatter_add()(torch.zeros_like(x), token.unsqueeze(1).expand(-1, d), ys)
        return torch.zeros_like(x).index_add(0, token, ys)


def per_expert_rows(b, counts, offs, rows: int):
    """Each routed row's expert's row of ``b`` (experts, features), as torchtitan's GPT-OSS adds its
    expert biases: ``b`` padded with a zero row, repeated by the counts padded with the slack
    ``rows - offs[-1]`` (no D2H sync: ``output_size`` is static)."""
    tail = (rows - offs[-1]).unsqueeze(0).to(counts.dtype)
    padded = torch.cat([b, b.new_zeros(1, b.shape[-1])])
    return padded.repeat_interleave(torch.cat([counts, tail]).long(), dim=0, output_size=rows)


def deterministic_scatter_add():
    """torchtitan's custom op ``torchtitan::deterministic_scatter_add(out, index, src)`` (its
    ``torchtitan.ops.scatter_add``: ``out.scatter_add(0, index, src)`` under deterministic
    algorithms): torchtitan's when it is imported, else registered here the same way."""
    existing = getattr(torch.ops.torchtitan, "deterministic_scatter_add", None)
    if existing is not None:
        return existing

    @torch.library.custom_op("torchtitan::deterministic_scatter_add", mutates_args=())
    def op(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return out.scatter_add(dim=0, index=index, src=src)

    @op.register_fake
    def _(out, index, src):
        return torch.empty_like(out)

    return torch.ops.torchtitan.deterministic_scatter_add


def experts_for_loop(w1, w2, w3, x, counts):
    """The experts one at a time, as torchtitan's ``_run_experts_for_loop``: the rows split by the
    counts (``.tolist()``: sizes known at run time only), SwiGLU per expert, joined, zero padded."""
    sizes = counts.to(torch.int64).tolist()
    padding = x.shape[0] - sum(sizes)
    outs = []
    for e, xe in enumerate(torch.split(x[: sum(sizes)], sizes, dim=0)):
        h = F.silu(xe @ w1[e]) * (xe @ w3[e])
        outs.append(h @ w2[e])
    out = torch.cat(outs, dim=0)
    return torch.vstack((out, out.new_zeros((padding, out.shape[-1]))))


def make(tokens: int = 1024, **kw):
    """The layer and one batch of ``tokens`` tokens (seeded)."""
    torch.manual_seed(0)
    m = TitanMoE(**kw)
    return m, (torch.randn(tokens, m.router.in_features),)


def make_qwen3(tokens: int = 64, **kw):
    """torchtitan 0.3's Qwen3-MoE routing: a batched router (top-k on the last dim of (1, T, E)),
    counts as a one-hot summed over the tokens, the routed rows cast to bf16 once per expert
    matmul, and its ``deterministic_scatter_add`` combine (small sizes)."""
    return make(tokens=tokens, dim=32, experts=8, ffn=64, batched=True, counts="onehot", casts="per_matmul",
                combine="deterministic", **kw)


def make_bincount_index_add():
    """``bincount`` counts, ``gather`` of the rows, ``index_add`` back, scores before the experts
    (``make_small``'s sizes)."""
    return make(tokens=128, dim=32, experts=8, ffn=64, counts="bincount", gather="gather", combine="index_add",
                scores="before")


def make_loop(tokens: int = 1024, **kw):
    """The experts as torchtitan's for-loop (``run="loop"``), the routing as ``make``'s."""
    return make(tokens, run="loop", **kw)


def make_small():
    """A small layer (128 tokens, dim 32, 8 experts, ffn 64) for quick runs and tests."""
    return make(tokens=128, dim=32, experts=8, ffn=64)


def make_loop_small():
    """``make_small``'s layer with torchtitan's for-loop experts, for quick runs and tests."""
    return make(tokens=128, dim=32, experts=8, ffn=64, run="loop")
