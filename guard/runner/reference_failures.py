"""A failure of the reference in the trusted worker: the reference's own, or the device's state.

The two are judged differently. A reference's own failure is a property of the problem: a
round whose inputs it cannot take is skipped, and a reference that refuses float64 (an op
without a double kernel, an assert on its dtype) leaves an output held to the stated atol
(``held_atol.UNKNOWN_GAP``), more lenient than the held one. A failure of the device's state
(out of memory, cuBLAS or cuDNN unable to allocate) is not the problem's, and the candidate
can cause it: its worker shares the GPU with the trusted worker, and one that held the
device's memory while the guard worked made the float64 run fail, which read as a refusal and
turned the held atol off (review, session 39); held-out rounds whose reference ran out of
memory were skipped alike. Such a failure is tried once more with the allocator's cache let
go, then raised as ``ReferenceUnavailable``: the check it was for is not made, and the guard
gives no verdict (a guard error) rather than a more lenient one.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")

# what the CUDA stack and torch's allocators say when memory or a library's resources ran
# out: the runtime's, cuBLAS's, cuDNN's and the CPU allocator's own text, not a reference's
# (torch's CPU allocator raises a plain RuntimeError: second red-team review, session 39)
_DEVICE_FAILURE = re.compile(
    r"out of memory|CUDA error|CUDA driver error|CUBLAS_STATUS|CUDNN_STATUS|cuDNN error|cudaMalloc"
    r"|DefaultCPUAllocator|can't allocate memory",
    re.IGNORECASE,
)


class ReferenceUnavailable(RuntimeError):
    """The reference could not run for a reason of the device's state: the check it was
    needed for cannot be made."""


def device_state_failure(exc: BaseException) -> bool:
    """Whether ``exc`` could come from the state of the device or the host (memory, a CUDA
    library's resources) rather than from the reference's own code."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    return bool(_DEVICE_FAILURE.search(str(exc)))


def despite_device_state(run: Callable[[], T], let_go: Callable[[], None], what: str) -> T:
    """``run()``; where it fails for the device's state, once more after ``let_go`` (the
    allocator's cache released), and ``ReferenceUnavailable`` if it fails again. The
    reference's own failures propagate as they are."""
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - sorted here: the reference's own, or the device's
        if not device_state_failure(exc):
            raise
        first = exc
    gc.collect()
    let_go()
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - the device's state, twice: the check is not made
        raise ReferenceUnavailable(
            f"{what} could not run ({type(exc).__name__}: {str(exc)[:300]}; before that "
            f"{type(first).__name__}): the device's memory or a library's resources ran out, so the "
            "check it is for is not made"
        ) from exc


def float64_or_refusal(run: Callable[[], T], let_go: Callable[[], None]) -> T | None:
    """``run()`` (the reference in float64); None where the reference refuses float64 itself,
    ``ReferenceUnavailable`` where the device's state keeps it from running."""
    try:
        return despite_device_state(run, let_go, "the reference evaluated in float64")
    except ReferenceUnavailable:
        raise
    except Exception:  # noqa: BLE001 - the reference's own refusal
        return None
