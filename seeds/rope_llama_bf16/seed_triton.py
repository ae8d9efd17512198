"""Seed rotary embedding in Triton: one program per token, all its heads at once as a
[heads, head_dim/2] tile for each half, float32 arithmetic, bfloat16 out.

A fair starting point, not the best possible: one program per token (little work per program
for few heads), padding to powers of two, no autotuning."""

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_token(
    x_ptr,
    cos_ptr,
    sin_ptr,
    y_ptr,
    n_heads,
    half,
    stride_xt,
    stride_xh,
    stride_yt,
    stride_yh,
    stride_ct,
    stride_st,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    dmask = d < half
    mask = (h[:, None] < n_heads) & dmask[None, :]
    c = tl.load(cos_ptr + t * stride_ct + d, mask=dmask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + t * stride_st + d, mask=dmask, other=0.0).to(tl.float32)
    x_base = x_ptr + t * stride_xt + h[:, None] * stride_xh + d[None, :]
    x1 = tl.load(x_base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_base + half, mask=mask, other=0.0).to(tl.float32)
    y1 = x1 * c[None, :] - x2 * s[None, :]
    y2 = x2 * c[None, :] + x1 * s[None, :]
    y_base = y_ptr + t * stride_yt + h[:, None] * stride_yh + d[None, :]
    tl.store(y_base, y1.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_base + half, y2.to(y_ptr.dtype.element_ty), mask=mask)


def run(x, cos, sin):
    x = x.contiguous()
    cos = cos.contiguous()
    sin = sin.contiguous()
    n_tokens, n_heads, head_dim = x.shape
    half = head_dim // 2
    y = torch.empty_like(x)
    if n_tokens == 0:
        return y
    _rope_token[(n_tokens,)](
        x,
        cos,
        sin,
        y,
        n_heads,
        half,
        x.stride(0),
        x.stride(1),
        y.stride(0),
        y.stride(1),
        cos.stride(0),
        sin.stride(0),
        BLOCK_H=triton.next_power_of_2(n_heads),
        BLOCK_D=triton.next_power_of_2(half),
        num_warps=4,
    )
    return y
