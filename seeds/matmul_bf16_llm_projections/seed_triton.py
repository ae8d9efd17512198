"""Seed GEMM in Triton: y = x @ weight.T, one program per 64x64 output tile, a K loop of
tl.dot with float32 accumulation, bfloat16 out.

A fair starting point, not the best possible: fixed tiles, no autotuning, no grouped tile
order, no split-K for small M. (On a CPU, Triton's interpreter cannot tl.dot bfloat16
operands, triton-lang/triton#11584, so there the tiles are widened to float32 first.)"""

import torch
import triton
import triton.language as tl


@triton.jit
def _linear_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_ym,
    stride_yn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    DOT_BF16: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(
            x_ptr + rm[:, None] * stride_xm + kk[None, :] * stride_xk,
            mask=(rm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        b = tl.load(  # a [BK, BN] tile of weight.T
            w_ptr + rn[None, :] * stride_wn + kk[:, None] * stride_wk,
            mask=(rn[None, :] < N) & (kk[:, None] < K),
            other=0.0,
        )
        if DOT_BF16:
            acc = tl.dot(a, b, acc)
        else:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    tl.store(
        y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn,
        acc.to(y_ptr.dtype.element_ty),
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


def run(x, weight):
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    bm, bn, bk = 64, 64, 32
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn))
    _linear_kernel[grid](
        x,
        weight,
        y,
        M,
        N,
        K,
        x.stride(0),
        x.stride(1),
        weight.stride(0),
        weight.stride(1),
        y.stride(0),
        y.stride(1),
        BM=bm,
        BN=bn,
        BK=bk,
        DOT_BF16=x.is_cuda,
        num_warps=4,
        num_stages=3,
    )
    return y
