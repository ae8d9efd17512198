"""RMSNorm with one tile of 32 rows and no loop over tiles: rows past the 32nd are never
written (torch.empty: whatever the allocator held). Right on every CPU workload the guard
showed (1 to 32 tokens); wrong on any batch of more than 32. Red team 46: PASSED and ACCEPTed
as the global best while held-out workloads were drawn inside the visible range only; the
CPU's first held-out workload now lies above the largest visible one.
EXPECT screen=INCORRECT_NUMERICAL runtime=INCORRECT_NUMERICAL"""
import torch

TILE = 32


def run(hidden_states, weight):
    out = torch.empty_like(hidden_states)
    x = hidden_states[:TILE].float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    out[:TILE] = y.to(hidden_states.dtype)
    return out
