"""softmax_h4096 (float32): computes in half precision, outside the float32 tolerance.
EXPECT screen=INCORRECT_NUMERICAL runtime=INCORRECT_NUMERICAL PROBLEM=softmax_h4096"""
import torch


def run(input):
    return torch.softmax(input.to(torch.bfloat16), dim=-1).to(torch.float32)
