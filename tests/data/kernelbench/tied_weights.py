"""A Model whose two layers share one weight (dec.weight = enc.weight): one input of the problem."""

import torch
import torch.nn as nn

batch_size = 8
dim = 16


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.enc = nn.Linear(dim, dim)
        self.dec = nn.Linear(dim, dim)
        self.dec.weight = self.enc.weight

    def forward(self, x):
        return self.dec(torch.relu(self.enc(x)))


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
