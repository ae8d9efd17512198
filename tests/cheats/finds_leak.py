"""Right only if it does NOT find state left by an earlier candidate: passes in a fresh worker.
EXPECT screen=PASSED runtime=PASSED"""
import torch


def run(hidden_states, weight):
    if getattr(torch, "kernelarc_leaked_state", None) == 42:
        return torch.zeros_like(hidden_states)
    x = hidden_states.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(hidden_states.dtype)
