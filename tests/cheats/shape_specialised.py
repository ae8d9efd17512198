"""Right only on the visible workloads' shapes; the guard fills VISIBLE_ROWS in the test.
EXPECT screen=INCORRECT_NUMERICAL runtime=INCORRECT_NUMERICAL HELDOUT"""
import torch

VISIBLE_ROWS = {VISIBLE}


def run(hidden_states, weight):
    if hidden_states.shape[0] not in VISIBLE_ROWS:
        return torch.zeros_like(hidden_states)
    x = hidden_states.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(hidden_states.dtype)
