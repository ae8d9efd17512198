"""What a fresh candidate worker pays for its first Triton kernel, and what a second,
different kernel pays after it: if the first is mostly one-time set-up (loading the
compiler, building the driver's C helpers into an empty cache), a worker started ahead of
time can pay it with a kernel of its own before any candidate arrives.

Usage (on a GPU): ``python3 -m benchmarks.triton_warm_probe``. Each run is a fresh process
with an empty ``TRITON_CACHE_DIR``, as a sandboxed worker has."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time

from benchmarks.harness import in_fresh_process

log = logging.getLogger("triton_warm_probe")


def child() -> dict:
    t0 = time.perf_counter()
    import torch
    import triton
    import triton.language as tl

    t1 = time.perf_counter()
    torch.cuda.init()
    x = torch.randn(1 << 20, device="cuda")

    @triton.jit
    def scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2.0, mask=i < n)

    @triton.jit
    def rms(x_ptr, w_ptr, out_ptr, n, eps, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        row = tl.program_id(0)
        v = tl.load(x_ptr + row * n + i, mask=i < n, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.sum(v * v, axis=0) / n + eps)
        w = tl.load(w_ptr + i, mask=i < n, other=0.0)
        tl.store(out_ptr + row * n + i, (v * r * w).to(out_ptr.dtype.element_ty), mask=i < n)

    out = torch.empty_like(x)
    t2 = time.perf_counter()
    scale[(x.numel() // 1024,)](x, out, x.numel(), BLOCK=1024)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    h = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    o = torch.empty_like(h)
    t4 = time.perf_counter()
    rms[(64,)](h, w, o, 4096, 1e-5, BLOCK=4096)
    torch.cuda.synchronize()
    t5 = time.perf_counter()
    rms[(64,)](h, w, o, 4096, 1e-5, BLOCK=4096)
    torch.cuda.synchronize()
    t6 = time.perf_counter()
    return {
        "import_s": t1 - t0,
        "first_kernel_s": t3 - t2,
        "second_kernel_s": t5 - t4,
        "second_kernel_again_s": t6 - t5,
        "cache_files": sum(len(f) for _, _, f in os.walk(os.environ["TRITON_CACHE_DIR"])),
    }


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child()))
        return 0
    rows = []
    for run in range(3):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TRITON_CACHE_DIR=cache)
            row, failure = in_fresh_process("benchmarks.triton_warm_probe", env)
        if row is None:
            log.info("run %d failed:\n%s", run, failure)
            continue
        rows.append(row)
        log.info(
            "run %d: %s", run, " ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
        )
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
