"""Softmax over every element of the logits, not per row (one reduction over a flat view).
Exact for a single token; for a batch every probability is divided by the sum over all rows.
Red team 46: with two or three CPU workloads every visible workload of softmax_lm_vocab_fp32
has one token, and no held-out workload was drawn (an axis whose visible values were all 1
was skipped); held-out token counts now reach past what was shown.
EXPECT PROBLEM=softmax_lm_vocab_fp32 screen=INCORRECT_NUMERICAL runtime=INCORRECT_NUMERICAL"""
import torch


def run(logits):
    return torch.softmax(logits.reshape(-1), dim=0).reshape(logits.shape)
