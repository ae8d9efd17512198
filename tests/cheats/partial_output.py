"""Computes only the first half of the rows.
EXPECT screen=INCORRECT_NUMERICAL runtime=INCORRECT_NUMERICAL"""
import torch


def run(hidden_states, weight):
    out = torch.empty_like(hidden_states)
    half = max(1, hidden_states.shape[0] // 2)
    x = hidden_states[:half].float()
    out[:half] = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(out.dtype)
    return out
