"""Device ceilings, measured once per device and cached by the parent: copy bandwidth
(bytes read plus written per second) and dense matmul rate per dtype."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from .harness import T


def _time(fn: Callable[[], object], reps: int, device: torch.device) -> float:
    """Median seconds of ``fn`` over ``reps`` runs after two warm-ups. On the CPU a run counts
    the lesser of its wall time and its process's CPU time spread over torch's threads: a
    stall (the machine's other work holding the core) lengthens the wall and not the CPU
    time. Ceilings are cached for every later run, and one measured beside a test suite on a
    2-core machine (bfloat16 matmul at 0.6 GFLOP/s) put an honest RMSNorm at 106% of its
    speed of light: the guard told the demo's agents to stop after one attempt."""
    for _ in range(2):
        fn()
    cuda = device.type == "cuda"
    threads = max(1, torch.get_num_threads())
    samples: list[float] = []
    for _ in range(reps):
        if cuda:
            T.cuda_sync()
        t0, c0 = T.perf_counter(), time.process_time()
        fn()
        if cuda:
            T.cuda_sync()
        wall = T.perf_counter() - t0
        samples.append(wall if cuda else min(wall, (time.process_time() - c0) / threads))
    return statistics.median(samples)


def measure(device_name: str) -> dict[str, Any]:
    device = torch.device(device_name)
    cuda = device.type == "cuda"
    n_bytes = (1 << 30) if cuda else (1 << 26)
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    copy_s = _time(lambda: dst.copy_(src), 10 if cuda else 5, device)
    out: dict[str, Any] = {"copy_bytes_per_s": 2 * n_bytes / copy_s}
    del src, dst
    sizes = (
        {"bfloat16": 8192, "float16": 8192, "float32": 4096}
        if cuda
        else {
            "bfloat16": 512,
            "float16": 512,
            "float32": 768,
        }
    )
    matmul: dict[str, float | None] = {}
    for name, n in sizes.items():
        dt = getattr(torch, name)
        try:
            a = torch.randn(n, n, device=device, dtype=torch.float32).to(dt)
            b = torch.randn(n, n, device=device, dtype=torch.float32).to(dt)
            s = _time(lambda: torch.mm(a, b), 10 if cuda else 3, device)
            matmul[name] = 2 * n**3 / s
        except RuntimeError as exc:  # a dtype the device's matmul does not support
            matmul[name] = None
            out.setdefault("notes", []).append(f"{name} matmul: {exc}"[:200])
    # float64 and integer problems fall back to the float32 rate.
    out["matmul_flops_per_s"] = matmul
    if cuda:
        props = torch.cuda.get_device_properties(device)
        out["device"] = props.name
        out["sm_count"] = props.multi_processor_count
        out["l2_bytes"] = int(props.L2_cache_size)
        out["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    else:
        out["device"] = "cpu"
        out["threads"] = torch.get_num_threads()
    return out
