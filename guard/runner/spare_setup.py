"""What a spare candidate worker, started ahead of its candidate, does before it says ready.

A new process that first uses Triton builds (or loads) the driver's helper module and hashes
Triton's own files into the key of every kernel it compiles: about 0.7 s on the H200, paid in
the first request of a Triton candidate (the workers' profile, docs/benchmarks.md, session 16).
Neither depends on the candidate, so a spare does both before it reports ready; nothing of the
candidate's has run yet (the threads they start count as the worker's own), and the kernels
the candidate compiles still go into its own empty cache. A worker started on demand does
not: its candidate may not use Triton, and would wait for it.

A spare on a GPU starts once an evaluation's timing is over (``WorkerPool.take_candidate``); a
figure that the outside clock contradicts or floors while one starts is measured again once it
is ready (``WorkerPool.quiet_spare``).
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


def set_up(device: str) -> float:
    """Seconds spent; 0 without a GPU. Never raises: the candidate's own first call would pay
    the same set-up (and meet the same failure) without it."""
    if not device.startswith("cuda"):
        return 0.0
    t0 = time.monotonic()
    try:
        from triton.runtime import driver
        from triton.runtime.cache import triton_key

        driver.active.get_current_device()  # builds or loads the driver's helper module
        triton_key()  # cached for the process's life
    except Exception as exc:  # noqa: BLE001 - a diagnostic only
        log.info("Triton's set-up ahead of the candidate failed: %s", exc)
        return 0.0
    return time.monotonic() - t0
