"""Honest PyTorch RMSNorm: must pass."""
import torch


def run(hidden_states, weight):
    x = hidden_states.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return y.to(hidden_states.dtype)
