"""Which inputs a timed call's refill can redraw in place, from the problem's JSON alone.

Torch-free: the guard's own process decides from it how the outside clock's loops draw their
inputs (``cascade.timed_workload``), and the workers refill by it (``runner.refill``).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["INDICES", "INDPTR", "LABELS", "is_float_dtype", "redrawn_inputs", "stream_refill_possible"]

# Integer inputs by name, for the ranges the guard draws them in (``InputMaker``): offsets into
# a list of indices, the indices themselves (below a page count), class labels (below the last
# axis of the first float input); any other integer input is drawn below 64.
INDPTR = re.compile(r"indptr|offsets?$|cu_seqlens", re.I)
INDICES = re.compile(r"indices|page_ids|block_table", re.I)
LABELS = re.compile(r"target|label|token|ids?$|idx|index", re.I)


def is_float_dtype(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def redrawn_inputs(definition: dict[str, Any], workload: dict[str, Any]) -> list[tuple[int, str]]:
    """(position, name) of the inputs a refill redraws in place: every tensor the guard makes
    at random, floats, integers and offsets alike (``runner/refill.py`` says how and why).
    Loaded inputs keep their set's values: the problem fixes them."""
    specs = workload.get("inputs", {})
    out: list[tuple[int, str]] = []
    for j, (name, spec) in enumerate(definition["inputs"].items()):
        kind = specs.get(name, {}).get("type", "random")
        if spec.get("shape") is not None and kind == "random":
            out.append((j, name))
    return out


def stream_refill_possible(definition: dict[str, Any], workload: dict[str, Any]) -> bool:
    """Whether a loop's fresh inputs can come from one generator drawn on in order
    (``StreamRefill``): not when a custom generator makes them, nor when no input can be
    redrawn in place (integer-only inputs: the loop would repeat each set's values, and a
    cache keyed by them would hit on every call), where the ``InputMaker`` remakes them all.
    Integer inputs are redrawn beside the floats, but decide nothing here: the regime of
    integer-only inputs stays the remaking one it was measured in."""
    specs = workload.get("inputs", {})
    custom = definition.get("custom_inputs_entrypoint") and any(s.get("type") == "custom" for s in specs.values())
    floats = [
        n for _, n in redrawn_inputs(definition, workload) if is_float_dtype(str(definition["inputs"][n]["dtype"]))
    ]
    return not custom and bool(floats)
