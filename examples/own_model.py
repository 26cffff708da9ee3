"""A model of your own, written the Hugging Face way, planned by shardlayout:

    shardlayout plan --module examples/own_model.py:make --mesh dp=2,tp=2 --style megatron --verify
    shardlayout plan --module examples/own_model.py:make --mesh tp=2 --tp-plan examples/own_model_tp.json

Nothing here is named for shardlayout: the styles find the attention and MLP blocks by the
structure of the exported graph. ``make()`` returns ``(module, example_args)``.
"""

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv_proj = nn.Linear(dim, 3 * dim, bias=False)  # fused q|k|v
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv_proj(x).chunk(3, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(a.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.input_layernorm, self.self_attn = RMSNorm(dim), Attention(dim, heads)
        self.post_attention_layernorm, self.mlp = RMSNorm(dim), MLP(dim, hidden)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLM(nn.Module):
    def __init__(self, vocab=64, dim=32, heads=4, hidden=64, layers=2):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Layer(dim, heads, hidden) for _ in range(layers))
        self.norm, self.lm_head = RMSNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def make():
    torch.manual_seed(0)
    return TinyLM().eval(), (torch.randint(0, 64, (2, 16)),)


def make_linear():
    """A single Linear: no attention and no MLP block for a style to shard."""
    return nn.Linear(32, 32), (torch.randn(4, 32),)
