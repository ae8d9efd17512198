"""Seed decode attention in Triton: one program per (sequence, query head) streams that
head's key/value cache in blocks of 64 positions with an online softmax in float32.

A fair starting point, not the best possible: the query heads of a group each read the shared
key/value head again (gqa_group times the necessary traffic), one program per head leaves the
GPU idle for small batches (no split over the cache length), scores by a multiply and a row
sum instead of tl.dot."""

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_fwd(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    kv_len,
    n_q_heads,
    group,
    head_dim,
    scale,
    sqb,
    sqh,
    skb,
    skh,
    sks,
    svb,
    svh,
    svs,
    sob,
    soh,
    BN: tl.constexpr,
    BD: tl.constexpr,
):
    bh = tl.program_id(0)
    b = bh // n_q_heads
    h = bh % n_q_heads
    kvh = h // group
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    dmask = offs_d < head_dim
    q = tl.load(q_ptr + b * sqb + h * sqh + offs_d, mask=dmask, other=0.0).to(tl.float32)
    k_base = k_ptr + b.to(tl.int64) * skb + kvh * skh
    v_base = v_ptr + b.to(tl.int64) * svb + kvh * svh
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros((BD,), dtype=tl.float32)
    for start in range(0, kv_len, BN):
        pos = start + offs_n
        mask = (pos[:, None] < kv_len) & dmask[None, :]
        k = tl.load(k_base + pos[:, None] * sks + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale
        s = tl.where(pos < kv_len, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_base + pos[:, None] * svs + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    tl.store(o_ptr + b * sob + h * soh + offs_d, (acc / l_i).to(o_ptr.dtype.element_ty), mask=dmask)


def run(q, k_cache, v_cache):
    q = q.contiguous()
    k = k_cache.contiguous()
    v = v_cache.contiguous()
    batch, n_q_heads, head_dim = q.shape
    kv_len = k.shape[2]
    group = n_q_heads // k.shape[1]
    o = torch.empty_like(q)
    if batch * n_q_heads == 0:
        return o
    _decode_fwd[(batch * n_q_heads,)](
        q,
        k,
        v,
        o,
        kv_len,
        n_q_heads,
        group,
        head_dim,
        head_dim**-0.5,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        o.stride(0),
        o.stride(1),
        BN=64,
        BD=triton.next_power_of_2(head_dim),
        num_warps=4,
    )
    return o
