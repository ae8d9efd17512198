"""Seed causal GQA attention in Triton (FlashAttention-2 style forward): one program per block
of 64 queries of one head, a loop over key/value blocks up to the diagonal with an online
softmax in float32, P rounded to bfloat16 for the P @ V product.

A fair starting point, not the best possible: fixed 64x64 tiles, no autotuning, no pipelining
hints, the diagonal block is masked like the others, heads sharing a key/value head each load
it again. (On a CPU, Triton's interpreter cannot tl.dot bfloat16 operands,
triton-lang/triton#11584, so there the tiles are widened to float32 first.)"""

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
def _attn_fwd(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    seq_len,
    n_q_heads,
    group,
    head_dim,
    scale,
    sqb,
    sqh,
    sqs,
    skb,
    skh,
    sks,
    svb,
    svh,
    svs,
    sob,
    soh,
    sos,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BD: tl.constexpr,
    DOT_BF16: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_q_heads
    h = bh % n_q_heads
    kvh = h // group
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    dmask = offs_d < head_dim
    q = tl.load(
        q_ptr + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :],
        mask=(offs_m[:, None] < seq_len) & dmask[None, :],
        other=0.0,
    )
    if not DOT_BF16:
        q = q.to(tl.float32)
    k_base = k_ptr + b * skb + kvh * skh
    v_base = v_ptr + b * svb + kvh * svh
    m_i = tl.zeros((BM,), dtype=tl.float32) - float("inf")
    l_i = tl.zeros((BM,), dtype=tl.float32)
    acc = tl.zeros((BM, BD), dtype=tl.float32)
    hi = tl.minimum((pid_m + 1) * BM, seq_len)
    for start_n in range(0, hi, BN):
        cols = start_n + offs_n
        kv_mask = (cols[:, None] < seq_len) & dmask[None, :]
        k = tl.load(k_base + cols[:, None] * sks + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + cols[:, None] * svs + offs_d[None, :], mask=kv_mask, other=0.0)
        if not DOT_BF16:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * scale
        keep = (offs_m[:, None] >= cols[None, :]) & (cols[None, :] < seq_len)
        s = tl.where(keep, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if ROUND_BF16:  # a bfloat16 model's P @ V takes P in bfloat16
            p = _round_bf16(p)
        if DOT_BF16:
            p = p.to(tl.bfloat16)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    out = acc / l_i[:, None]
    if ROUND_BF16:
        out = _round_bf16(out)
    tl.store(
        o_ptr + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=(offs_m[:, None] < seq_len) & dmask[None, :],
    )


def run(q, k, v):
    q = q.contiguous()
    k = k.contiguous()
    v = v.contiguous()
    batch, n_q_heads, seq_len, head_dim = q.shape
    group = n_q_heads // k.shape[1]
    o = torch.empty_like(q)
    if batch * n_q_heads * seq_len == 0:
        return o
    bm, bn = 64, 64
    low = q.dtype == torch.bfloat16  # in float32 (a model run on the CPU) nothing is rounded
    grid = (triton.cdiv(seq_len, bm), batch * n_q_heads)
    _attn_fwd[grid](
        q,
        k,
        v,
        o,
        seq_len,
        n_q_heads,
        group,
        head_dim,
        head_dim**-0.5,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        o.stride(0),
        o.stride(1),
        o.stride(2),
        BM=bm,
        BN=bn,
        BD=triton.next_power_of_2(head_dim),
        DOT_BF16=q.is_cuda and low,
        ROUND_BF16=low,
        num_warps=4,
        num_stages=2,
    )
    return o
