"""An RMSNorm with eps 1e-1 instead of 1e-5: plausible output, wrong model."""

import torch


def run(hidden_states, weight):
    x = hidden_states.float()
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-1) * weight.float()
    return y.to(hidden_states.dtype)
