"""LayerNorm with one mean and one variance over the whole tensor instead of per row: exact
for one token, wrong for every row of a batch. Red team 46: PASSED and ACCEPTed where every
visible CPU workload of layernorm_gpt2_bf16 had one token and no held-out workload was drawn.
EXPECT PROBLEM=layernorm_gpt2_bf16 screen=INCORRECT_NUMERICAL runtime=INCORRECT_NUMERICAL"""
import torch


def run(hidden_states, weight, bias, eps):
    x = hidden_states.float()
    var, mean = torch.var_mean(x, unbiased=False)
    y = (x - mean) * torch.rsqrt(var + eps) * weight.float() + bias.float()
    return y.to(hidden_states.dtype)
