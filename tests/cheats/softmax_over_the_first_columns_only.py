"""A softmax of one tile per row, at most 131,072 columns, with no loop over column tiles:
columns past that are left at zero, so the problem's vocabulary of 152,064 (Qwen) is wrong.
The CPU showed vocabularies up to 128,256, and held-out workloads vary the token count only,
so it was PASSED and ACCEPTed as the global best (second red team, session 46); the CPU now
adds one workload at the largest of the problem's own vocabularies that its budget holds.
EXPECT PROBLEM=softmax_lm_vocab_fp32 screen=INCORRECT_NUMERICAL runtime=INCORRECT_NUMERICAL"""
import torch

MAX_BLOCK = 131072


def run(logits):
    b = min(logits.shape[-1], MAX_BLOCK)
    x = logits[:, :b]
    e = (x - x.max(-1, keepdim=True).values).exp()
    out = torch.zeros_like(logits)
    out[:, :b] = e / e.sum(-1, keepdim=True)
    return out
