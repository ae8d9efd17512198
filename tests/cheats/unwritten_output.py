"""Never writes its output, hoping freed memory still holds the reference's result.
EXPECT screen=INCORRECT_NUMERICAL runtime=INCORRECT_NUMERICAL"""
import torch


def run(hidden_states, weight):
    return torch.empty_like(hidden_states)
