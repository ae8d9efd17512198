"""Seed MLP block of a Llama decoder layer in Triton, as three plain kernels that keep the
model's bfloat16 intermediates: (1) RMSNorm per row -> h; (2) gate and up GEMMs over the same
h tiles with silu(gate) * up in the epilogue -> act; (3) the down GEMM with the residual added
in the epilogue -> output. Float32 accumulation throughout.

A fair starting point, not the best possible: h and act round-trip through memory, fixed
64x64 tiles, no autotuning, no split-K for decode. (On a CPU, Triton's interpreter cannot
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
def _rmsnorm_row(x_ptr, w_ptr, h_ptr, n_cols, stride_x, stride_h, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(h_ptr + row * stride_h + cols, _round_bf16(x * inv_rms * w).to(h_ptr.dtype.element_ty), mask=mask)


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
    gate = _round_bf16(acc_g)  # the model rounds gate and up to bfloat16
    up = _round_bf16(acc_u)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(
        y_ptr + rm[:, None] * stride_ym + rn[None, :],
        _round_bf16(y).to(y_ptr.dtype.element_ty),
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


@triton.jit
def _down_residual_kernel(
    a_ptr,
    w_ptr,
    r_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_am,
    stride_wn,
    stride_rm,
    stride_ym,
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
            a_ptr + rm[:, None] * stride_am + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0
        )
        w = tl.load(
            w_ptr + rn[None, :] * stride_wn + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0
        )
        if DOT_BF16:
            acc = tl.dot(a, w, acc)
        else:
            acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc)
    out_mask = (rm[:, None] < M) & (rn[None, :] < N)
    r = tl.load(r_ptr + rm[:, None] * stride_rm + rn[None, :], mask=out_mask, other=0.0)
    # the model rounds the projection to bfloat16 before the residual add
    y = _round_bf16(acc) + r.to(tl.float32)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], _round_bf16(y).to(y_ptr.dtype.element_ty), mask=out_mask)


def run(hidden_states, norm_weight, gate_proj, up_proj, down_proj, eps):
    x = hidden_states.contiguous()
    wg = gate_proj.contiguous()
    wu = up_proj.contiguous()
    wd = down_proj.contiguous()
    T, H = x.shape
    I = wg.shape[0]
    out = torch.empty_like(x)
    if T == 0:
        return out
    h = torch.empty_like(x)
    _rmsnorm_row[(T,)](
        x,
        norm_weight.contiguous(),
        h,
        H,
        x.stride(0),
        h.stride(0),
        float(eps),
        BLOCK=triton.next_power_of_2(H),
        num_warps=8,
    )
    act = torch.empty((T, I), dtype=x.dtype, device=x.device)
    bm, bn, bk = 64, 64, 32
    _gate_up_kernel[(triton.cdiv(T, bm), triton.cdiv(I, bn))](
        h,
        wg,
        wu,
        act,
        T,
        I,
        H,
        h.stride(0),
        wg.stride(0),
        act.stride(0),
        BM=bm,
        BN=bn,
        BK=bk,
        DOT_BF16=x.is_cuda,
        num_warps=4,
        num_stages=3,
    )
    _down_residual_kernel[(triton.cdiv(T, bm), triton.cdiv(H, bn))](
        act,
        wd,
        x,
        out,
        T,
        H,
        I,
        act.stride(0),
        wd.stride(0),
        x.stride(0),
        out.stride(0),
        BM=bm,
        BN=bn,
        BK=bk,
        DOT_BF16=x.is_cuda,
        num_warps=4,
        num_stages=3,
    )
    return out
