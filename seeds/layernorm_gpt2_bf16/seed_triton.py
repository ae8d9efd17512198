"""Seed LayerNorm in Triton: one program per row, the whole row in registers, float32 mean
and (biased) variance, then (x - mean) * rstd * weight + bias.

A fair starting point, not the best possible: one row per program (tiny rows for GPT-2 sizes
leave most lanes idle), no autotuning."""

import torch
import triton
import triton.language as tl


@triton.jit
def _layernorm_row(x_ptr, w_ptr, b_ptr, y_ptr, n_cols, stride_x, stride_y, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = xc * rstd * w + b
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def run(hidden_states, weight, bias, eps):
    x = hidden_states.contiguous()
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    if n_rows == 0:
        return y
    block = triton.next_power_of_2(n_cols)
    _layernorm_row[(n_rows,)](
        x,
        weight.contiguous(),
        bias.contiguous(),
        y,
        n_cols,
        x.stride(0),
        y.stride(0),
        float(eps),
        BLOCK=block,
        num_warps=4,
    )
    return y
