"""Two transformer blocks written in plain PyTorch, no downloads: a GPT-2-like block
(LayerNorm, multi-head attention, GELU MLP) and a Llama-like block (RMSNorm, grouped-query
attention with rotary embeddings, SwiGLU MLP). Module classes are named after the op
families they implement, so the profiler can attribute time to them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaSize:
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    batch: int
    seq: int
    eps: float = 1e-5


@dataclass(frozen=True)
class GPT2Size:
    hidden: int
    heads: int
    batch: int
    seq: int
    eps: float = 1e-5


SIZES = {
    # Llama-3-8B's layer dimensions; 512 tokens of prefill
    "llama_block": {"real": LlamaSize(4096, 32, 8, 14336, 1, 512), "small": LlamaSize(256, 8, 2, 688, 1, 32)},
    # GPT-2 small's layer dimensions
    "gpt2_block": {"real": GPT2Size(768, 12, 4, 512), "small": GPT2Size(128, 4, 1, 32)},
}


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Llama's rotate-half convention: the first and second halves of each head pair up."""

    def __init__(self, head_dim: int, base: float = 500000.0):
        super().__init__()
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def tables(self, seq: int, device, dtype):
        t = torch.arange(seq, device=device, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq.to(device))
        return freqs.cos().to(dtype), freqs.sin().to(dtype)

    def forward(self, x, cos, sin):
        """x: [tokens, heads, head_dim]; cos, sin: [tokens, head_dim / 2]."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        c, s = cos.float()[:, None, :], sin.float()[:, None, :]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


class GQAttention(nn.Module):
    """Causal grouped-query attention; the projections are Linear modules of their own."""

    def __init__(self, hidden: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.rope = RotaryEmbedding(self.head_dim)

    def attend(self, q, k, v):
        """q: [batch, heads, seq, dim], k and v: [batch, kv_heads, seq, dim] -> like q."""
        group = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x):
        b, s, _ = x.shape
        cos, sin = self.rope.tables(s, x.device, x.dtype)
        cos, sin = cos.repeat(b, 1), sin.repeat(b, 1)
        q = self.rope(self.q_proj(x).reshape(b * s, self.heads, self.head_dim), cos, sin)
        k = self.rope(self.k_proj(x).reshape(b * s, self.kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).reshape(b * s, self.kv_heads, self.head_dim)

        def heads_first(t, n):
            return t.reshape(b, s, n, self.head_dim).transpose(1, 2)

        out = self.attend(heads_first(q, self.heads), heads_first(k, self.kv_heads), heads_first(v, self.kv_heads))
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class SwiGLUMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def gate_up(self, x):
        """silu(x @ gate.T) * (x @ up.T): the part a fused kernel replaces."""
        return F.silu(self.gate_proj(x)) * self.up_proj(x)

    def forward(self, x):
        return self.down_proj(self.gate_up(x))


class LlamaBlock(nn.Module):
    def __init__(self, size: LlamaSize):
        super().__init__()
        self.attn_norm = RMSNorm(size.hidden, size.eps)
        self.attn = GQAttention(size.hidden, size.heads, size.kv_heads)
        self.mlp_norm = RMSNorm(size.hidden, size.eps)
        self.mlp = SwiGLUMLP(size.hidden, size.intermediate)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class MHAttention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def attend(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        out = self.attend(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, s, h))


class GELUMLP(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.proj = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    def __init__(self, size: GPT2Size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(size.hidden, eps=size.eps)
        self.attn = MHAttention(size.hidden, size.heads)
        self.ln_2 = nn.LayerNorm(size.hidden, eps=size.eps)
        self.mlp = GELUMLP(size.hidden)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def build(name: str, size: str, device: str, dtype: torch.dtype, seed: int = 0):
    """(model, example inputs) for a built-in model."""
    if name not in SIZES:
        raise ValueError(f"no built-in model {name!r}: {', '.join(SIZES)}")
    spec = SIZES[name][size]
    torch.manual_seed(seed)
    model = (LlamaBlock(spec) if name == "llama_block" else GPT2Block(spec)).to(device=device, dtype=dtype).eval()
    for p in model.parameters():  # weights of a trained model's scale, not default init
        if p.dim() >= 2:
            nn.init.normal_(p, std=1.0 / math.sqrt(p.shape[-1]))
    x = torch.randn(spec.batch, spec.seq, spec.hidden, device=device, dtype=dtype)
    return model, (x,)
