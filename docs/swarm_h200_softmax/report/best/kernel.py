import torch


@torch.no_grad()
def run(logits):
    """Softmax over the last dimension (float32)."""
    return torch.softmax(logits, dim=-1)
