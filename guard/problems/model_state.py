"""A KernelBench model's weights as a problem's inputs: one input per tensor."""

from __future__ import annotations

from typing import Any


def untied_state(model: Any) -> dict[str, Any]:
    """The model's state_dict with one key per tensor: a tied parameter (``dec.weight =
    enc.weight``) is one input of the problem, under its first name, as it is one tensor of the
    model; ``functional_call`` binds the other names to it (two inputs made it refuse them)."""
    seen: set[int] = set()
    out = {}
    for key, value in model.state_dict(keep_vars=True).items():
        if id(value) not in seen:
            seen.add(id(value))
            out[key] = value.detach() if hasattr(value, "detach") else value
    return out
