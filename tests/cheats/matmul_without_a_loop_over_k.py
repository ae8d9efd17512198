"""A matmul with one K tile of 256 and no loop over K: right for K up to 256 only, while the
problem's own K are 768 and more. The CPU showed K of at most 200, and held-out workloads
vary M only (`heldout_axes`), so it was PASSED and ACCEPTed as the global best (second red
team, session 46); the CPU now adds one workload at the largest of the problem's own K that
its budget holds.
EXPECT PROBLEM=matmul_bf16_llm_projections screen=INCORRECT_NUMERICAL runtime=INCORRECT_NUMERICAL"""
import torch

BLOCK_K = 256


def run(x, weight):
    k = min(x.shape[1], BLOCK_K)
    return (x[:, :k].float() @ weight[:, :k].float().T).to(x.dtype)
