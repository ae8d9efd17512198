"""Shape-only shortcuts on meta tensors for what torch's meta device runs slowly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def patch_for_meta(torch: Any) -> None:
    """Shape-only shortcuts on meta tensors for what torch's meta device runs slowly in
    Python: the LSTM/GRU recurrence step by step (about 30 s for a 6-layer LSTM over 512
    steps) and the normalizations."""
    vf = torch._VF
    if getattr(vf, "_kernelarc_meta_rnns", False):
        return
    vf._kernelarc_meta_rnns = True

    def wrap(name: str, has_cell: bool) -> Callable[..., Any]:
        real = getattr(vf, name)

        def fn(*args: Any) -> Any:
            inp = args[0]
            if (
                len(args) == 9
                and isinstance(inp, torch.Tensor)
                and inp.device.type == "meta"
                and isinstance(args[2], (list, tuple))
            ):
                hx = args[1][0] if has_cell else args[1]
                d = 2 if args[7] else 1
                out = inp.new_empty(tuple(inp.shape[:-1]) + (d * hx.shape[-1],))
                # the matmuls the recurrence does (input, hidden and projection weights), so
                # that a FLOP counter sees them; shapes only, on meta
                rows = inp.numel() // max(1, inp.shape[-1])
                for w in args[2]:
                    if w.dim() == 2:
                        torch.mm(w.new_empty((rows, w.shape[1])), w.t())
                if has_cell:
                    return out, args[1][0].new_empty(args[1][0].shape), args[1][1].new_empty(args[1][1].shape)
                return out, hx.new_empty(hx.shape)
            return real(*args)

        return fn

    for name, cell in (("lstm", True), ("gru", False), ("rnn_tanh", False), ("rnn_relu", False)):
        try:
            setattr(vf, name, wrap(name, cell))
        except AttributeError:
            pass
    patch_norms_for_meta(torch)


def patch_norms_for_meta(torch: Any) -> None:
    """Batch, group, layer and instance norm on meta run torch's Python decompositions
    (three quarters of a DenseNet's meta forward); their output is shaped as the input.
    The checks that can fail for real are kept (F.batch_norm's batch-size check runs
    before ``torch.batch_norm``; the others are repeated here)."""

    def meta(x: object) -> bool:
        return isinstance(x, torch.Tensor) and x.device.type == "meta"

    real_bn, real_in, real_gn, real_ln = (torch.batch_norm, torch.instance_norm, torch.group_norm, torch.layer_norm)

    def batch_norm(input: Any, *args: Any, **kwargs: Any) -> Any:
        return torch.empty_like(input) if meta(input) else real_bn(input, *args, **kwargs)

    def instance_norm(input: Any, *args: Any, **kwargs: Any) -> Any:
        return torch.empty_like(input) if meta(input) else real_in(input, *args, **kwargs)

    def group_norm(input: Any, num_groups: int, *args: Any, **kwargs: Any) -> Any:
        if meta(input):
            if input.dim() < 2 or input.shape[1] % num_groups:
                raise RuntimeError(
                    f"Expected number of channels in input to be divisible by num_groups, but got "
                    f"input of shape {list(input.shape)} and num_groups={num_groups}"
                )
            return torch.empty_like(input)
        return real_gn(input, num_groups, *args, **kwargs)

    def layer_norm(input: Any, normalized_shape: Any, *args: Any, **kwargs: Any) -> Any:
        if meta(input):
            n = len(normalized_shape)
            if tuple(input.shape[input.dim() - n :]) != tuple(normalized_shape) or n > input.dim():
                raise RuntimeError(
                    f"Given normalized_shape={list(normalized_shape)}, expected input with shape "
                    f"[*, {', '.join(str(x) for x in normalized_shape)}], but got input of size {list(input.shape)}"
                )
            return torch.empty_like(input)
        return real_ln(input, normalized_shape, *args, **kwargs)

    torch.batch_norm, torch.instance_norm = batch_norm, instance_norm
    torch.group_norm, torch.layer_norm = group_norm, layer_norm
