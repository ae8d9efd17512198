"""The reference evaluated in float64 before a failure stands, and what its own failure means.

A reference that refuses float64 (an op without a double kernel, an assert on its dtype)
leaves nothing that sizes an output beyond its rounding, and the checks then hold it to the
stated atol (``held_atol.UNKNOWN_GAP``): more lenient than the held atol. So a float64 run
that fails for a reason the candidate could cause must never read as such a refusal. The
candidate's worker shares the device with the trusted worker: holding the device's memory
while its outputs are checked made the float64 run fail (an out-of-memory error, or cuBLAS
unable to allocate its handle), and the held atol was off for that check (found in review,
session 39). Such a failure is tried once more with the allocator's cache let go, then
raised as ``ReferenceUnavailable``: the check is not made, and the guard gives no verdict
(a guard error), rather than a more lenient one.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")

# what the CUDA stack says when memory or a library's resources ran out: text of the
# runtime's, cuBLAS's and cuDNN's own, not of a reference's code
_DEVICE_FAILURE = re.compile(
    r"out of memory|CUDA error|CUDA driver error|CUBLAS_STATUS|CUDNN_STATUS|cuDNN error|cudaMalloc",
    re.IGNORECASE,
)


class ReferenceUnavailable(RuntimeError):
    """The float64 reference could not run for a reason of the device's state: the check it
    was needed for cannot be made."""


def device_state_failure(exc: BaseException) -> bool:
    """Whether ``exc`` could come from the state of the device or the host (memory, a CUDA
    library's resources) rather than from the reference's own code."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    return bool(_DEVICE_FAILURE.search(str(exc)))


def run_or_refusal(run: Callable[[], T], let_go: Callable[[], None]) -> T | None:
    """``run()`` (the reference in float64); None where the reference refuses float64 itself.
    A failure of the device's state gets one more try after ``let_go`` (the allocator's cache
    released), then raises ``ReferenceUnavailable``."""
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - sorted below: the reference's own, or the device's
        if not device_state_failure(exc):
            return None
        first = exc
    gc.collect()
    let_go()
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - the device's state, twice: no lenient fallback
        raise ReferenceUnavailable(
            f"the reference evaluated in float64 could not run ({type(exc).__name__}: {str(exc)[:300]}; "
            f"before that {type(first).__name__}): the device's memory or a library's resources ran "
            "out, so the check it decides is not made"
        ) from exc
