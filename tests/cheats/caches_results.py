"""Caches results across calls by shape: right once, stale afterwards.
EXPECT screen=INCORRECT_NUMERICAL runtime=INCORRECT_NUMERICAL"""
import torch

_cache = {}


def run(hidden_states, weight):
    key = tuple(hidden_states.shape)
    if key not in _cache:
        x = hidden_states.float()
        _cache[key] = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(hidden_states.dtype)
    return _cache[key].clone()
