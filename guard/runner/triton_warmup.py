"""A candidate worker's first Triton kernel pays for setting Triton up: loading its
compiler and building the driver's C helpers into the worker's empty cache (on the H200
1.2-1.8 s for a first kernel against 0.4-0.5 s for a second, different one:
``benchmarks/triton_warm_probe.py``). A worker started ahead of its candidate pays that with
a small kernel of its own, before any candidate code exists, so the verdict does not.

Only on a GPU (the CPU runs Triton's interpreter, which compiles nothing), and never fatal:
a worker whose warm-up fails is the same worker as one that had none."""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


def warm_triton(device: str) -> float | None:
    """Compile and run one small Triton kernel on ``device``; seconds taken, or None."""
    if not device.startswith("cuda"):
        return None
    t0 = time.perf_counter()
    try:
        import torch
        import triton
        import triton.language as tl

        # left unannotated: Triton reads a parameter's annotation as its type
        @triton.jit  # type: ignore[untyped-decorator]
        def _double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2.0, mask=i < n)

        x = torch.ones(1024, device=device)
        out = torch.empty_like(x)
        _double[(1,)](x, out, x.numel(), BLOCK=1024)
        torch.cuda.synchronize(device)
        if not bool((out == 2.0).all()):
            log.warning("the Triton warm-up kernel gave a wrong result")
        del x, out
        torch.cuda.empty_cache()  # the candidate's memory figures start from nothing held
    except Exception as exc:  # noqa: BLE001 - an optimisation only: the candidate's own kernel sets Triton up
        log.warning("Triton warm-up skipped: %s: %s", type(exc).__name__, exc)
        return None
    return time.perf_counter() - t0
