"""Seed SwiGLU gate/up in Triton: one program per 64x64 output tile runs both projections
over the same x tiles (two float32 accumulators, tl.dot), then the epilogue rounds gate and up
to bfloat16 as a bfloat16 model does and writes silu(gate) * up.

A fair starting point, not the best possible: fixed tiles, no autotuning, no grouped tile
order, the weights read as two separate matrices. (On a CPU, Triton's interpreter cannot
tl.dot bfloat16 operands, triton-lang/triton#11584, so there the tiles are widened to float32
first.)"""

import torch
import triton
import triton.language as tl


@triton.jit
def _round_bf16(x):
    """x (float32) rounded to the nearest bfloat16, ties to even, kept as float32. Triton's CPU
    interpreter truncates in .to(tl.bfloat16); rounding by hand gives the GPU's result on both."""
    b = x.to(tl.uint32, bitcast=True)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _gate_up_kernel(
    x_ptr,
    wg_ptr,
    wu_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    DOT_BF16: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(
            x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0
        )
        w_off = rn[None, :] * stride_wn + kk[:, None]
        w_mask = (rn[None, :] < N) & (kk[:, None] < K)
        g = tl.load(wg_ptr + w_off, mask=w_mask, other=0.0)
        u = tl.load(wu_ptr + w_off, mask=w_mask, other=0.0)
        if DOT_BF16:
            acc_g = tl.dot(a, g, acc_g)
            acc_u = tl.dot(a, u, acc_u)
        else:
            a32 = a.to(tl.float32)
            acc_g = tl.dot(a32, g.to(tl.float32), acc_g)
            acc_u = tl.dot(a32, u.to(tl.float32), acc_u)
    gate, up = acc_g, acc_u
    if ROUND_BF16:  # a bfloat16 model rounds gate and up to bfloat16
        gate = _round_bf16(gate)
        up = _round_bf16(up)
    y = gate / (1.0 + tl.exp(-gate)) * up
    if ROUND_BF16:
        y = _round_bf16(y)
    tl.store(
        y_ptr + rm[:, None] * stride_ym + rn[None, :],
        y.to(y_ptr.dtype.element_ty),
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


def run(x, gate_proj, up_proj):
    x = x.contiguous()
    gate_proj = gate_proj.contiguous()
    up_proj = up_proj.contiguous()
    M, K = x.shape
    N = gate_proj.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    bm, bn, bk = 64, 64, 32
    low = x.dtype == torch.bfloat16  # in float32 (a model run on the CPU) nothing is rounded
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn))
    _gate_up_kernel[grid](
        x,
        gate_proj,
        up_proj,
        y,
        M,
        N,
        K,
        x.stride(0),
        gate_proj.stride(0),
        y.stride(0),
        BM=bm,
        BN=bn,
        BK=bk,
        DOT_BF16=x.is_cuda and low,
        ROUND_BF16=low,
        num_warps=4,
        num_stages=3,
    )
    return y
