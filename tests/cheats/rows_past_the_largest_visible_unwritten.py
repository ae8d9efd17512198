"""RMSNorm with one tile of 4 rows and no loop over tiles: rows past the 4th are never written
(torch.empty: whatever the allocator held). 4 tokens is the largest visible CPU workload at the
tests' settings (two CPU workloads: 1 and 4 tokens), so it is right on every visible workload
and wrong on any larger batch. Red team 46 (the same with 32 rows, the largest visible batch at
the guard's default of four CPU workloads): PASSED and ACCEPTed as the global best while
held-out workloads were drawn inside the visible range only; the CPU's first held-out workload
now lies above the largest visible one (at either setting: tests/test_problems.py).
EXPECT screen=INCORRECT_NUMERICAL runtime=INCORRECT_NUMERICAL"""
import torch

TILE = 4


def run(hidden_states, weight):
    out = torch.empty_like(hidden_states)
    x = hidden_states[:TILE].float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    out[:TILE] = y.to(hidden_states.dtype)
    return out
