"""Seed row sum in Triton: one program per row, a loop over the row in blocks accumulating a
float32 vector, a final tl.sum, bfloat16 out.

A fair starting point, not the best possible: one program per row (a few long rows use a few
SMs only), no vectorisation tuning, no autotuning."""

import torch
import triton
import triton.language as tl


@triton.jit
def _sum_row(x_ptr, y_ptr, n_cols, stride_x, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        acc += tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row, tl.sum(acc, axis=0).to(y_ptr.dtype.element_ty))


def run(x):
    x = x.contiguous()
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows,), dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return y
    _sum_row[(n_rows,)](x, y, n_cols, x.stride(0), BLOCK=2048, num_warps=8)
    return y
