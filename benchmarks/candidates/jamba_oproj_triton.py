"""Attention output projection with residual (Jamba, hidden 2560): a tiled Triton GEMM
with the residual added in the epilogue. bf16 in, fp32 accumulation."""

import torch
import triton
import triton.language as tl


@triton.jit
def _oproj(
    a_ptr, w_ptr, r_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT_BF16: tl.constexpr
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(
            a_ptr + rm[:, None] * K + (k0 + rk)[None, :], mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0
        )
        # W is [N, K]; the product needs W^T, read as [BK, BN]
        w = tl.load(
            w_ptr + rn[None, :] * K + (k0 + rk)[:, None], mask=(rn[None, :] < N) & ((k0 + rk)[:, None] < K), other=0.0
        )
        if DOT_BF16:
            acc += tl.dot(a, w)
        else:  # Triton's CPU interpreter cannot tl.dot bfloat16 operands
            acc += tl.dot(a.to(tl.float32), w.to(tl.float32))
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    r = tl.load(r_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0)
    out = (acc + r.to(tl.float32)).to(tl.bfloat16)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], out, mask=mask)


def run(attn_output, residual, o_proj_weight):
    b, s, h = attn_output.shape
    a = attn_output.reshape(b * s, h).contiguous()
    r = residual.reshape(b * s, h).contiguous()
    w = o_proj_weight.contiguous()
    out = torch.empty_like(r)
    m, n, k = a.shape[0], w.shape[0], h
    grid = (triton.cdiv(m, 128), triton.cdiv(n, 128))
    _oproj[grid](a, w, r, out, m, n, k, BM=128, BN=128, BK=64, DOT_BF16=a.is_cuda, num_warps=8, num_stages=3)
    return out.reshape(b, s, h)
