"""Seed softmax in Triton: one program per row, the row streamed in blocks twice: an online
pass for the maximum and the sum of exponentials, then a pass that writes exp(x - max) / sum.

A fair starting point, not the best possible: one program per row even for a handful of rows
(a decode batch leaves most of the GPU idle), no autotuning, the row is read twice."""

import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_row(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    y_row = y_ptr + row.to(tl.int64) * stride_y
    cols = tl.arange(0, BLOCK)
    m = -float("inf")
    s = 0.0
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    inv = 1.0 / s
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(y_row + start + cols, tl.exp(x - m) * inv, mask=mask)


def run(logits):
    x = logits.contiguous()
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    if n_rows == 0 or n_cols == 0:
        return y
    _softmax_row[(n_rows,)](x, y, n_cols, x.stride(0), y.stride(0), BLOCK=4096, num_warps=8)
    return y
