"""A torchtitan-style mixture-of-experts layer, for ``shardlayout plan --module examples/titan_moe.py:make``.

Token-choice top-k routing as torchtitan writes it: router scores, ``topk``, per-expert counts
(``histc`` or ``bincount``), tokens sorted by expert (stable ``argsort``, rows gathered by
``order // top_k``), SwiGLU experts as ``torch._grouped_mm`` in bfloat16 with ``cumsum``
offsets, the routing scores applied after (or before) the experts, and the rows summed back into
the tokens (``scatter_add``, or ``index_add``). The variants are the forms users write; every
one is recognised as route / grouped matmul / unroute (``shardlayout.program.routing``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class TitanMoE(nn.Module):
    """``TitanMoE(dim, experts, ffn, top_k, counts="histc"|"bincount", gather="index"|"gather",
    combine="scatter_add"|"index_add", scores="after"|"before")``."""

    def __init__(self, dim: int = 256, experts: int = 8, ffn: int = 512, top_k: int = 2, counts: str = "histc",
                 gather: str = "index", combine: str = "scatter_add", scores: str = "after"):
        super().__init__()
        self.experts, self.top_k = experts, top_k
        self.counts, self.gather, self.combine, self.scores = counts, gather, combine, scores
        self.router = nn.Linear(dim, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, dim, ffn) / dim ** 0.5)
        self.w3 = nn.Parameter(torch.randn(experts, dim, ffn) / dim ** 0.5)
        self.w2 = nn.Parameter(torch.randn(experts, ffn, dim) / ffn ** 0.5)

    def forward(self, x):
        t, d = x.shape
        probs = torch.softmax(self.router(x), dim=1)
        top, idx = torch.topk(probs, self.top_k, dim=1)
        flat = idx.view(-1)
        if self.counts == "histc":
            counts = torch.histc(flat.float(), bins=self.experts, min=0, max=self.experts)
        else:
            counts = torch.bincount(flat, minlength=self.experts)
        order = torch.argsort(flat, stable=True)
        token = order // self.top_k
        if self.gather == "index":
            xs = x[token]
        else:
            xs = torch.gather(x, 0, token.unsqueeze(-1).expand(-1, d))
        weights = top.view(-1)[order].unsqueeze(-1)
        if self.scores == "before":
            xs = xs * weights
        offs = torch.cumsum(counts.to(torch.int32), dim=0, dtype=torch.int32)
        xb = xs.bfloat16()
        h = F.silu(torch._grouped_mm(xb, self.w1.bfloat16(), offs=offs)) * \
            torch._grouped_mm(xb, self.w3.bfloat16(), offs=offs)
        ys = torch._grouped_mm(h, self.w2.bfloat16(), offs=offs).float()
        if self.scores == "after":
            ys = ys * weights
        if self.combine == "scatter_add":
            return torch.zeros_like(x).scatter_add(0, token.unsqueeze(1).expand(-1, d), ys)
        return torch.zeros_like(x).index_add(0, token, ys)


def make(tokens: int = 1024, **kw):
    """The layer and one batch of ``tokens`` tokens (seeded)."""
    torch.manual_seed(0)
    m = TitanMoE(**kw)
    return m, (torch.randn(tokens, m.router.in_features),)


def make_bincount_index_add():
    """``bincount`` counts, ``gather`` of the rows, ``index_add`` back, scores before the experts."""
    return make(counts="bincount", gather="gather", combine="index_add", scores="before")
