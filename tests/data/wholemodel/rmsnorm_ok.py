"""A correct RMSNorm in plain PyTorch (float32 arithmetic), as an agent might submit it."""

import torch


def run(hidden_states, weight):
    x = hidden_states.float()
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * weight.float()
    return y.to(hidden_states.dtype)
