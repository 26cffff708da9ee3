"""Model families written in plain torch, the way their authors write them, for the structural
styles: none uses this project's weight names.

    HFLlama      Hugging Face naming (``self_attn.q_proj``, ``mlp.gate_proj``), GQA, RoPE from an
                 ``inv_freq`` buffer, RMSNorm with casts, SDPA, an untied ``lm_head``
    TitanLlama   torchtitan naming (``attention.wq``, ``feed_forward.w1``), SDPA
    Titan3Llama  torchtitan 0.3's Llama3 block: q|k|v fused per kv group in one ``wqkv`` (a view to
                 ``(groups, heads_per_group + 2, head_dim)`` split on the middle dim), RoPE on
                 complex numbers (``view_as_complex``), SDPA with ``enable_gqa=True``
    GPT2         fused ``c_attn`` (q|k|v, split), Conv1D-style ``(in, out)`` weights with biases
                 (``addmm``), attention written out (softmax(QK^T)V with a causal mask), tanh GELU
    MLPStack     residual MLP blocks only: one Linear pair with biases, one fused gate|up (chunk)
    ViT          timm's: a patch convolution, a class token, fused ``qkv`` reshaped and unbound
    Phi3         Phi-3's fused ``qkv_proj`` cut by slices (``qkv[..., :d]``) and ``gate_up_proj``
                 (chunk), RoPE on the sliced q and k
    ConvNet      no attention and no MLP block: convolutions and a single Linear head
    DropoutGPT   GPT-2's shape in training mode: ``nn.Dropout`` and SDPA's ``dropout_p``
    DiffLlama    HFLlama with differential attention (DiffLlama's form): two SDPA calls over the
                 halves of v, the result's heads paired ``i, i + H/2``; ``halves_llama``: one SDPA
                 call, the result's heads in halves scaled apart and joined again, not paired

Each ``make_*`` returns ``(module, example_args)``, as ``--module FILE.py:factory`` wants.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, FFN, SEQ, BATCH = 32, 16, 4, 32, 8, 2


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


# ------------------------------------------------------------------------------------------
# Hugging Face Llama naming
# ------------------------------------------------------------------------------------------


class HFAttention(nn.Module):
    def __init__(self, dim=DIM, heads=HEADS, kv_heads=HEADS // 2):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, heads * self.hd, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(heads * self.hd, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads  # repeat_kv
        k = k[:, :, None].expand(b, self.kv_heads, rep, t, self.hd).reshape(b, self.heads, t, self.hd)
        v = v[:, :, None].expand(b, self.kv_heads, rep, t, self.hd).reshape(b, self.heads, t, self.hd)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(a.transpose(1, 2).reshape(b, t, -1))


class HFMLP(nn.Module):
    def __init__(self, dim=DIM, ffn=FFN):
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn, bias=False)
        self.up_proj = nn.Linear(dim, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class HFLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = RMSNorm(DIM)
        self.self_attn = HFAttention()
        self.post_attention_layernorm = RMSNorm(DIM)
        self.mlp = HFMLP()

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class HFLlama(nn.Module):
    def __init__(self, layers: int = 2):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(HFLayer() for _ in range(layers))
        self.norm = RMSNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        hd = DIM // HEADS
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd), persistent=False)

    def forward(self, input_ids):
        t = input_ids.shape[1]
        pos = torch.arange(t, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


# ------------------------------------------------------------------------------------------
# torchtitan naming
# ------------------------------------------------------------------------------------------


class TitanAttention(nn.Module):
    def __init__(self, dim=DIM, heads=HEADS):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q, k, v = (w(x).view(b, t, self.heads, self.hd) for w in (self.wq, self.wk, self.wv))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(a.transpose(1, 2).contiguous().view(b, t, -1))


class TitanFeedForward(nn.Module):
    def __init__(self, dim=DIM, ffn=FFN):
        super().__init__()
        self.w1 = nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)
        self.w3 = nn.Linear(dim, ffn, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TitanBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = TitanAttention()
        self.feed_forward = TitanFeedForward()
        self.attention_norm = nn.RMSNorm(DIM)
        self.ffn_norm = nn.RMSNorm(DIM)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class TitanLlama(nn.Module):
    def __init__(self, layers: int = 2):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): TitanBlock() for i in range(layers)})
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        hd = DIM // HEADS
        freqs = torch.outer(torch.arange(SEQ).float(), 1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd))
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [t, 1, hd]: broadcast over heads
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.cos, self.sin)
        return self.output(self.norm(h))


class Titan3Attention(nn.Module):
    def __init__(self, dim=DIM, heads=HEADS, kv_heads=HEADS // 2):
        super().__init__()
        self.hd, self.per_group = dim // heads, heads // kv_heads
        self.wqkv = nn.Linear(dim, kv_heads * (self.per_group + 2) * self.hd, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x, freqs):
        b, t, _ = x.shape
        qkv = self.wqkv(x).view(b, t, -1, self.per_group + 2, self.hd)
        q, k, v = torch.split(qkv, [self.per_group, 1, 1], dim=-2)
        q, k, v = (y.reshape(b, t, -1, self.hd).contiguous() for y in (q, k, v))
        q, k = (torch.view_as_real(torch.view_as_complex(y.float().reshape(b, t, -1, self.hd // 2, 2)) * freqs)
                .flatten(3) for y in (q, k))
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=True)
        return self.wo(a.transpose(1, 2).contiguous().flatten(2))


class Titan3Block(TitanBlock):
    def __init__(self):
        super().__init__()
        self.attention = Titan3Attention()


class Titan3Llama(TitanLlama):
    def __init__(self, layers: int = 2):
        super().__init__(layers)
        self.layers = nn.ModuleDict({str(i): Titan3Block() for i in range(layers)})
        hd = DIM // HEADS
        angles = torch.outer(torch.arange(SEQ).float(), 1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd))
        self.register_buffer("freqs", torch.polar(torch.ones_like(angles), angles)[None, :, None, :],
                             persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            x = layer.attention_norm(h)
            h = h + layer.attention(x, self.freqs)
            h = h + layer.feed_forward(layer.ffn_norm(h))
        return self.output(self.norm(h))


# ------------------------------------------------------------------------------------------
# GPT-2: fused qkv, Conv1D weights (in, out), written-out attention
# ------------------------------------------------------------------------------------------


class Conv1D(nn.Module):
    """Hugging Face's GPT-2 ``Conv1D``: a Linear with a transposed ``(in, out)`` weight."""

    def __init__(self, nf: int, nx: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.weight.size(-1),)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, dim=DIM, heads=HEADS):
        super().__init__()
        self.heads, self.hd, self.dim = heads, dim // heads, dim
        self.c_attn = Conv1D(3 * dim, dim)
        self.c_proj = Conv1D(dim, dim)
        self.register_buffer("bias", torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)).view(1, 1, SEQ, SEQ),
                             persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.c_attn(x).split(self.dim, dim=2)
        q, k, v = (z.view(b, t, self.heads, self.hd).permute(0, 2, 1, 3) for z in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hd)
        w = torch.where(self.bias[:, :, :t, :t], w, torch.tensor(torch.finfo(w.dtype).min))
        w = torch.softmax(w, dim=-1)
        a = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous().view(b, t, self.dim)
        return self.c_proj(a)


class GPT2MLP(nn.Module):
    def __init__(self, dim=DIM, ffn=4 * DIM):
        super().__init__()
        self.c_fc = Conv1D(ffn, dim)
        self.c_proj = Conv1D(dim, ffn)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(DIM)
        self.attn = GPT2Attention()
        self.ln_2 = nn.LayerNorm(DIM)
        self.mlp = GPT2MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, layers: int = 2):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.wpe = nn.Embedding(SEQ, DIM)
        self.h = nn.ModuleList(GPT2Block() for _ in range(layers))
        self.ln_f = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, input_ids):
        pos = torch.arange(input_ids.shape[1])
        x = self.wte(input_ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# ------------------------------------------------------------------------------------------
# MLP blocks only; no blocks at all
# ------------------------------------------------------------------------------------------


class FusedSwiGLU(nn.Module):
    def __init__(self, dim=DIM, ffn=FFN):
        super().__init__()
        self.w12 = nn.Linear(dim, 2 * ffn, bias=False)
        self.w3 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x):
        gate, up = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(gate) * up)


class PlainMLP(nn.Module):
    def __init__(self, dim=DIM, ffn=FFN):
        super().__init__()
        self.fc1 = nn.Linear(dim, ffn)
        self.fc2 = nn.Linear(ffn, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class MLPStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([PlainMLP(), FusedSwiGLU()])
        self.norms = nn.ModuleList([nn.LayerNorm(DIM), nn.LayerNorm(DIM)])

    def forward(self, x):
        for norm, block in zip(self.norms, self.blocks):
            x = x + block(norm(x))
        return x


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.fc(x.mean(dim=(2, 3)))


class ViTAttention(nn.Module):
    """timm's: one fused ``qkv`` Linear reshaped to (b, n, 3, heads, hd) and unbound."""

    def __init__(self, dim=DIM, heads=HEADS):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))


class ViTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.attn, self.norm2 = nn.LayerNorm(DIM), ViTAttention(), nn.LayerNorm(DIM)
        self.mlp = PlainMLP(DIM, 4 * DIM)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """A patch convolution, a class token and position embeddings, two blocks, a head on the class token."""

    def __init__(self, layers: int = 2):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, DIM, 2, stride=2)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, 10, DIM) * 0.02)
        self.blocks = nn.ModuleList(ViTBlock() for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, 10)

    def forward(self, img):
        x = self.patch_embed(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


# ------------------------------------------------------------------------------------------
# Phi-3: fused projections cut by slices
# ------------------------------------------------------------------------------------------


class Phi3Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_proj = nn.Linear(DIM, 3 * DIM, bias=False)
        self.o_proj = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        qkv = self.qkv_proj(x)
        q, k, v = qkv[..., :DIM], qkv[..., DIM:2 * DIM], qkv[..., 2 * DIM:]
        q, k, v = (t.view(b, s, HEADS, DIM // HEADS).transpose(1, 2) for t in (q, k, v))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, DIM))


class Phi3MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_up_proj = nn.Linear(DIM, 2 * FFN, bias=False)
        self.down_proj = nn.Linear(FFN, DIM, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Phi3Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(DIM), RMSNorm(DIM)
        self.self_attn, self.mlp = Phi3Attention(), Phi3MLP()

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Phi3(HFLlama):
    def __init__(self, layers: int = 2):
        super().__init__(layers)
        self.layers = nn.ModuleList(Phi3Layer() for _ in range(layers))


class DropoutLayer(nn.Module):
    """A GPT-2 layer as users train it: ``nn.Dropout`` after the embedding's sum and each branch,
    attention dropout inside SDPA (``dropout_p`` in training mode) with a boolean causal mask."""

    def __init__(self, dim=DIM, heads=HEADS, p=0.1, causal=False):
        super().__init__()
        self.heads, self.hd, self.p, self.is_causal = heads, dim // heads, p, causal
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(dim, dim) for _ in range(4))
        self.up, self.down = nn.Linear(dim, FFN), nn.Linear(FFN, dim)
        self.drop = nn.Dropout(p)
        self.register_buffer("causal", torch.ones(SEQ, SEQ, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln_1(x)
        q, k, v = (w(h).view(b, t, self.heads, self.hd).transpose(1, 2)
                   for w in (self.q_proj, self.k_proj, self.v_proj))
        mask = None if self.is_causal else self.causal[:t, :t]  # nanoGPT's is_causal=True, or GPT-2's mask
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.p if self.training else 0.0,
                                           is_causal=self.is_causal)
        x = x + self.drop(self.o_proj(a.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.down(F.gelu(self.up(self.ln_2(x)))))


class DropoutGPT(nn.Module):
    def __init__(self, layers: int = 2, p: float = 0.1, causal: bool = False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.drop = nn.Dropout(p)
        self.h = nn.ModuleList(DropoutLayer(p=p, causal=causal) for _ in range(layers))
        self.ln_f = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids):
        x = self.drop(self.wte(ids) + self.wpe(torch.arange(ids.shape[1])))
        for layer in self.h:
            x = layer(x)
        return self.lm_head(self.ln_f(x))


# ------------------------------------------------------------------------------------------
# differential attention (DiffLlama's form), and heads split in halves that are not combined
# ------------------------------------------------------------------------------------------


class DiffAttention(HFAttention):
    """``paired``: two SDPA calls on one q and k over the halves of v (kv heads ``j`` and ``j + kv/2``,
    each half repeated to the kv heads), the results' heads chunked in two, head ``i`` minus lambda
    times head ``i + H/2``, then an RMSNorm of each pair (DiffLlama). Else one SDPA call whose
    result's heads are chunked in two halves scaled apart and joined again (nothing pairs them)."""

    def __init__(self, paired: bool = True, heads=HEADS):
        super().__init__(kv_heads=heads)
        self.paired = paired
        self.lambda_q, self.lambda_k = nn.Parameter(torch.randn(self.hd) / 4), nn.Parameter(torch.randn(self.hd) / 4)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if not self.paired:
            a1, a2 = torch.chunk(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2), 2, dim=2)
            return self.o_proj(torch.cat([a1 * 0.5, a2 * 2.0], dim=2).reshape(b, t, -1))
        v1, v2 = (h.repeat(1, 2, 1, 1) for h in torch.chunk(v, 2, dim=1))
        a = torch.cat([F.scaled_dot_product_attention(q, k, v1, is_causal=True).transpose(1, 2),
                       F.scaled_dot_product_attention(q, k, v2, is_causal=True).transpose(1, 2)], dim=-1)
        a1, a2 = torch.chunk(a, 2, dim=2)  # [b, t, H/2, 2 hd] each
        a = a1 - (torch.exp(torch.sum(self.lambda_q * self.lambda_k)) + 0.2) * a2
        a = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.o_proj(a.reshape(b, t, -1))


class DiffLayer(HFLayer):
    def __init__(self, paired: bool = True):
        super().__init__()
        self.self_attn = DiffAttention(paired)


class DiffLlama(HFLlama):
    def __init__(self, layers: int = 2, paired: bool = True):
        super().__init__(layers)
        self.layers = nn.ModuleList(DiffLayer(paired) for _ in range(layers))


def make_diff_llama(layers: int = 2):
    torch.manual_seed(0)
    return DiffLlama(layers).eval(), (_tokens(),)


def make_halves_llama(layers: int = 2):
    torch.manual_seed(0)
    return DiffLlama(layers, paired=False).eval(), (_tokens(),)


def _tokens():
    return torch.randint(0, VOCAB, (BATCH, SEQ))


def make_dropout(layers: int = 2, p: float = 0.1, causal: bool = False):
    """``DropoutGPT`` in training mode (dropout on), as ``Model(config)`` leaves a module; ``causal``:
    SDPA with ``is_causal=True`` and no mask (nanoGPT's call)."""
    torch.manual_seed(0)
    return DropoutGPT(layers, p, causal).train(), (_tokens(),)


def make_hf_llama(layers: int = 2):
    torch.manual_seed(0)
    return HFLlama(layers).eval(), (_tokens(),)


def make_titan_llama(layers: int = 2):
    torch.manual_seed(0)
    return TitanLlama(layers).eval(), (_tokens(),)


class GainNorm(nn.RMSNorm):
    """torchtitan's muse_glimmer norm: the scale is ``weight + gain_center``."""

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight + 1.0, self.eps)


class TitanTiedLlama(TitanLlama):
    """TitanLlama with the table tied to the head (``output.weight is tok_embeddings.weight``: torch.export
    reads both by the head's name), gain-centred norms, and a ``vision`` encoder its forward never runs."""

    def __init__(self, layers: int = 2):
        super().__init__(layers)
        self.output.weight = self.tok_embeddings.weight
        for layer in self.layers.values():
            layer.attention_norm, layer.ffn_norm = GainNorm(DIM), GainNorm(DIM)
        self.vision = nn.Sequential(nn.Linear(DIM, DIM), nn.Linear(DIM, DIM))


def make_titan_tied_llama(layers: int = 2):
    torch.manual_seed(0)
    return TitanTiedLlama(layers).eval(), (_tokens(),)


def make_titan3_llama(layers: int = 2):
    torch.manual_seed(0)
    return Titan3Llama(layers).eval(), (_tokens(),)


def make_gpt2(layers: int = 2):
    torch.manual_seed(0)
    return GPT2(layers).eval(), (_tokens(),)


def make_gpt2_tied(layers: int = 1):
    """GPT-2 with its lm_head tied to the token embedding (as HF ties them): one parameter read by
    the embedding and, transposed, by the head."""
    torch.manual_seed(0)
    model = GPT2(layers)
    model.lm_head.weight = model.wte.weight
    return model.eval(), (_tokens(),)


def make_phi3(layers: int = 2):
    torch.manual_seed(0)
    return Phi3(layers).eval(), (_tokens(),)


def make_mlp_stack():
    torch.manual_seed(0)
    return MLPStack().eval(), (torch.randn(BATCH, SEQ, DIM),)


def make_vit(layers: int = 2):
    torch.manual_seed(0)
    return ViT(layers).eval(), (torch.randn(BATCH, 3, 6, 6),)


def make_convnet():
    torch.manual_seed(0)
    return ConvNet().eval(), (torch.randn(BATCH, 3, 8, 8),)


FAMILIES = {"hf_llama": make_hf_llama, "titan_llama": make_titan_llama, "titan3_llama": make_titan3_llama,
            "titan_tied_llama": make_titan_tied_llama,
            "gpt2": make_gpt2,
            "mlp_stack": make_mlp_stack, "vit": make_vit, "convnet": make_convnet, "phi3": make_phi3,
            "diff_llama": make_diff_llama, "halves_llama": make_halves_llama}


LAYERED = ("hf_llama", "titan_llama", "titan3_llama", "titan_tied_llama", "gpt2", "vit", "phi3", "diff_llama",
           "halves_llama")


@functools.cache
def program(name: str, layers: int = 2):
    """The family's Program from torch.export, exported once per test session (~1 s each)."""
    import warnings

    from shardlayout.program.torch_import import from_torch

    warnings.filterwarnings("ignore")
    module, args = FAMILIES[name](layers) if name in LAYERED else FAMILIES[name]()
    return from_torch(module, args)
