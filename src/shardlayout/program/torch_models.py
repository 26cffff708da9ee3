"""The built-in models as torch modules (torch extra), op for op the same as ``models.py``.

    >>> import torch  # doctest: +SKIP
    >>> LlamaTorch(layers=1)(torch.randn(2, 8, 16), torch.randn(8, 4), torch.randn(8, 4)).shape  # doctest: +SKIP
    torch.Size([2, 8, 16])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int, causal: bool = True):
        super().__init__()
        self.heads = heads
        self.causal = causal
        self.attn_norm = nn.Parameter(torch.ones(dim))
        self.mlp_norm = nn.Parameter(torch.ones(dim))
        for n, shape in [("wq", (dim, dim)), ("wk", (dim, dim)), ("wv", (dim, dim)), ("wo", (dim, dim)),
                         ("w_gate", (dim, ffn)), ("w_up", (dim, ffn)), ("w_down", (ffn, dim))]:
            setattr(self, n, nn.Parameter(torch.randn(shape) / shape[0] ** 0.5))

    @staticmethod
    def _norm(x, w):
        return x * torch.rsqrt(x.pow(2.0).mean(-1, keepdim=True) + 1e-6) * w

    @staticmethod
    def _rope(z, cos, sin):
        hd = z.shape[-1]
        rot = torch.cat([-z[..., hd // 2:], z[..., : hd // 2]], dim=3)
        return z * cos + rot * sin

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        hd = d // self.heads
        h = self._norm(x, self.attn_norm).view(b * t, d)
        q, k, v = ((h @ w).view(b, t, self.heads, hd).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + (a.transpose(1, 2).reshape(b * t, d) @ self.wo).view(b, t, d)
        h = self._norm(x, self.mlp_norm).view(b * t, d)
        return x + ((F.silu(h @ self.w_gate) * (h @ self.w_up)) @ self.w_down).view(b, t, d)


class LlamaTorch(nn.Module):
    """``LlamaTorch(layers=2)``: parameters named ``layers.{i}.{wq,...}`` like the builder model."""

    def __init__(self, layers: int = 2, dim: int = 16, heads: int = 4, ffn: int = 32, causal: bool = True):
        super().__init__()
        self.layers = nn.ModuleList(_Block(dim, heads, ffn, causal) for _ in range(layers))

    def forward(self, x, cos, sin):
        for blk in self.layers:
            x = blk(x, cos, sin)
        return x


class MoETorch(nn.Module):
    """The MoE layer of ``models.moe`` as a torch module (router, top-k gates, stacked experts)."""

    def __init__(self, dim: int = 16, experts: int = 4, ffn: int = 32, top_k: int = 2):
        super().__init__()
        self.top_k = top_k
        self.router = nn.Parameter(torch.randn(dim, experts) / dim ** 0.5)
        self.experts = nn.ParameterDict({
            "w1": nn.Parameter(torch.randn(experts, dim, ffn) / dim ** 0.5),
            "w2": nn.Parameter(torch.randn(experts, ffn, dim) / ffn ** 0.5),
        })

    def forward(self, x):
        probs = torch.softmax(x @ self.router, dim=1)
        vals, _ = torch.topk(probs, self.top_k, dim=1)
        gate = probs * (probs >= vals[:, self.top_k - 1: self.top_k])
        h = F.silu(torch.einsum("td,edf->etf", x, self.experts["w1"]))
        return torch.einsum("te,etd->td", gate, torch.einsum("etf,efd->etd", h, self.experts["w2"]))
