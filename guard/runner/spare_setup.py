"""What a spare candidate worker, started ahead of its candidate, does before one arrives.

On a GPU a spare starts while another evaluation is being timed on the same device, so at
start it touches nothing but the host: it imports torch and hashes Triton's own files into
the key of every kernel Triton compiles (about 0.4 s on the H200). Creating its CUDA context
and Triton's driver helper module (about 0.3 s more there) waits for ``settle``: the pool asks
for it once the evaluation is over (``WorkerPool.replenish``), and a worker asked anything else
first settles before it answers. A context created by another process during a timed window
is the likely cause of an honest incumbent accused once in 20 resubmissions on the H200
(session 16, the outside clock seeing 84 us a call more than CUPTI's 1.9 us).

Neither step depends on the candidate, nothing of the candidate's has run yet (so the threads
they start count as the worker's own), and the kernels the candidate compiles still go into
its own empty cache. A worker started on demand does neither ahead (its candidate may not use
Triton, and would wait for it), nor does a spare on the CPU, which starts only once an
evaluation is over and has no device to leave alone.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

ENV = "KERNELARC_WORKER_SPARE"  # set by the pool for the spare workers it starts


def host_setup() -> float:
    """Triton's key of its own files (cached for the process's life); seconds spent. Never
    raises: the candidate's first call would pay the same (and meet the same failure)."""
    t0 = time.monotonic()
    try:
        from triton.runtime.cache import triton_key

        triton_key()
    except Exception as exc:  # noqa: BLE001 - a diagnostic only
        log.info("Triton's key could not be made ahead of the candidate: %s", exc)
    return time.monotonic() - t0


def device_setup(device: str) -> float:
    """The CUDA context and Triton's driver helper module; seconds spent."""
    if not device.startswith("cuda"):
        return 0.0
    t0 = time.monotonic()
    import torch

    torch.cuda.init()
    try:
        from triton.runtime import driver

        driver.active.get_current_device()  # builds or loads the driver's helper module
    except Exception as exc:  # noqa: BLE001 - a diagnostic only
        log.info("Triton's driver could not be set up ahead of the candidate: %s", exc)
    return time.monotonic() - t0
