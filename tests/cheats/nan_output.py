"""Right everywhere except one NaN.
EXPECT screen=INCORRECT_NUMERICAL runtime=INCORRECT_NUMERICAL"""
import torch


def run(hidden_states, weight):
    x = hidden_states.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    y[0, 0] = float("nan")
    return y.to(hidden_states.dtype)
