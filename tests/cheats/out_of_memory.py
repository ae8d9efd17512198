"""Asks for far more memory than exists.
EXPECT screen=RUNTIME_ERROR runtime=RUNTIME_ERROR"""
import torch


def run(hidden_states, weight):
    big = torch.empty(1 << 42, dtype=torch.uint8, device=hidden_states.device)
    return big[: hidden_states.numel()].view(hidden_states.dtype)
