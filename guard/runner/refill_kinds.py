"""Which inputs a timed call's refill can redraw in place, from the problem's JSON alone.

Torch-free: the guard's own process decides from it how the outside clock's loops draw their
inputs (``cascade.timed_workload``), and the workers refill by it (``runner.replays``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["redrawn_inputs", "stream_refill_possible"]


def redrawn_inputs(definition: dict[str, Any], workload: dict[str, Any]) -> list[tuple[int, str]]:
    """(position, name) of the inputs a refill redraws in place: float tensors the guard makes
    at random. Integer and loaded inputs keep their set's values (index conventions hold)."""
    specs = workload.get("inputs", {})
    out: list[tuple[int, str]] = []
    for j, (name, spec) in enumerate(definition["inputs"].items()):
        kind = specs.get(name, {}).get("type", "random")
        dtype = str(spec.get("dtype", ""))
        if spec.get("shape") is not None and kind == "random" and dtype.startswith(("float", "bfloat")):
            out.append((j, name))
    return out


def stream_refill_possible(definition: dict[str, Any], workload: dict[str, Any]) -> bool:
    """Whether a loop's fresh inputs can come from one generator drawn on in order
    (``StreamRefill``): not when a custom generator makes them, nor when no input can be
    redrawn in place (integer-only inputs: the loop would repeat each set's values, and a
    cache keyed by them would hit on every call), where the ``InputMaker`` remakes them all."""
    specs = workload.get("inputs", {})
    custom = definition.get("custom_inputs_entrypoint") and any(s.get("type") == "custom" for s in specs.values())
    return not custom and bool(redrawn_inputs(definition, workload))
