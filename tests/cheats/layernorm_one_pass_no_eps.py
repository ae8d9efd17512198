"""LayerNorm whose variance is E[x^2] - E[x]^2 in one pass, with eps ignored: right on
standard-normal rows, NaN on a row of zeros (a padding token), wrong on rows at small scales.
Red team 46: PASSED and ACCEPTed while layernorm_gpt2_bf16 had no adversarial rounds (they
scaled weight and bias too); they now scale hidden_states only, and its small-scale rows
show the missing eps.
EXPECT PROBLEM=layernorm_gpt2_bf16 screen=INCORRECT_NUMERICAL runtime=INCORRECT_NUMERICAL"""
import torch


def run(hidden_states, weight, bias, eps):
    x = hidden_states.float()
    mean = x.mean(-1, keepdim=True)
    var = x.pow(2).mean(-1, keepdim=True) - mean * mean
    y = (x - mean) * torch.rsqrt(var) * weight.float() + bias.float()
    return y.to(hidden_states.dtype)
