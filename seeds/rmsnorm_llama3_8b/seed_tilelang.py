"""Seed RMSNorm in TileLang: one thread block per token row, the row held in a float32
register fragment, a block-wide sum of squares, then scale by the weight and store bfloat16.

The token count is a symbolic dimension, so one compiled kernel serves every workload; it is
compiled when the module is imported (the guard's build step), not inside the timed call.
A fair starting point, not the best possible: one row per block, no tuning of threads."""

import tilelang
import tilelang.language as T
import torch

HIDDEN = 4096  # Llama-3-8B; the definition fixes it
EPS = 1e-5
THREADS = 256  # 16 elements of the row per thread


def rmsnorm_kernel(hidden, threads):
    num_tokens = T.symbolic("num_tokens")

    @T.prim_func
    def rmsnorm(
        X: T.Tensor((num_tokens, hidden), "bfloat16"),
        W: T.Tensor((hidden,), "bfloat16"),
        Y: T.Tensor((num_tokens, hidden), "bfloat16"),
    ):
        with T.Kernel(num_tokens, threads=threads) as row:
            x = T.alloc_fragment((1, hidden), "float32")
            sq = T.alloc_fragment((1, hidden), "float32")
            total = T.alloc_fragment((1,), "float32")
            for i, j in T.Parallel(1, hidden):
                x[i, j] = T.cast(X[row + i, j], "float32")
            for i, j in T.Parallel(1, hidden):
                sq[i, j] = x[i, j] * x[i, j]
            T.reduce_sum(sq, total, dim=1)
            for i in T.Parallel(1):
                total[i] = T.rsqrt(total[i] / hidden + EPS)
            for i, j in T.Parallel(1, hidden):
                Y[row + i, j] = T.cast(x[i, j] * total[i] * T.cast(W[j], "float32"), "bfloat16")

    return rmsnorm


_KERNEL = tilelang.compile(rmsnorm_kernel(HIDDEN, THREADS), target="cuda")


def run(hidden_states, weight):
    x = hidden_states.contiguous()
    y = torch.empty_like(x)
    if x.shape[0] == 0:
        return y
    _KERNEL(x, weight.contiguous(), y)
    return y
