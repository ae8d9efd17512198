"""A model file as `kernelarc profile` documents it: an RMSNorm with eps 1e-6, a Linear,
and an op no family names (a cumulative maximum)."""

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, hidden))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = RMSNorm(64, 1e-6)
        self.proj = nn.Linear(64, 48, bias=True)

    def forward(self, x):
        return torch.cummax(self.proj(self.norm(x)), dim=-1).values


def build_model(device, dtype):
    torch.manual_seed(0)
    return Tiny().to(device=device, dtype=dtype)


def example_inputs(device, dtype):
    torch.manual_seed(1)
    return (torch.randn(2, 16, 64, device=device, dtype=dtype),)
