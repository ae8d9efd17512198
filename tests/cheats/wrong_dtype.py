"""Returns float32 where the problem asks for bfloat16.
EXPECT screen=INCORRECT_DTYPE runtime=INCORRECT_DTYPE"""
import torch


def run(hidden_states, weight):
    x = hidden_states.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
