"""How far are the guard's device ceilings from what the device does? (docs/seeds.md,
"Fractions above 100%": seeds run 5 had 11 workload figures above 100% of SOL, and the
ceilings ranged over 3.97-4.15 TB/s and 759-785 TFLOP/s across runs.)

Two measurements of the same operations, in one process:

- "guard": ``guard/runner/ceilings.measure`` exactly as the guard runs it (a 1 GiB copy and
  square GEMMs; the median of host-synchronised calls after two warm-ups), ``--repeats``
  times in a row, so the first repeat starts from idle clocks as the guard's does;
- "ramped": after ``--ramp-s`` seconds of the same work (clocks up), the best of ``--reps``
  batches of ``--batch`` calls, each batch timed between two CUDA events (no host round
  trip inside a batch); copies of two sizes and GEMMs of several shapes, since a ceiling is
  the best rate the device shows, not one shape's.

NVML clocks, temperature and throttle reasons are read before and after each part. Nothing
here changes the guard; the result says whether its ceilings should be measured this way.

Usage: python -m benchmarks.ceilings_probe OUT_DIR [--repeats 3] [--ramp-s 0.5] [--device cuda|cpu]
(``--device cpu``: small sizes, to check the script, not to measure.)
Writes OUT_DIR/ceilings_probe.json and prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from guard.runner import ceilings, nvml  # noqa: E402

log = logging.getLogger("ceilings_probe")

# (M, N, K): the guard's square shape, and the shapes where cuBLAS beat the guard's bf16
# ceiling in seeds run 5 (Llama projections)
GEMMS_CUDA = [(8192, 8192, 8192), (1024, 4096, 14336), (2048, 6144, 4096), (4096, 28672, 4096), (512, 10240, 8192)]
GEMMS_CPU = [(512, 512, 512), (256, 512, 1024)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_rate(
    fn: Callable[[], object], work: float, device: torch.device, ramp_s: float, batch: int, reps: int
) -> dict:
    """Work per second of ``fn``: the best and the median of ``reps`` batches of ``batch``
    calls, after ``ramp_s`` seconds of calls that bring the clocks up."""
    t_end = time.perf_counter() + ramp_s
    fn()
    while time.perf_counter() < t_end:
        fn()
        _sync(device)
    rates = []
    for _ in range(reps):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(batch):
                fn()
            stop.record()
            stop.synchronize()
            seconds = start.elapsed_time(stop) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            seconds = time.perf_counter() - t0
        rates.append(work * batch / seconds)
    return {"best": max(rates), "median": statistics.median(rates), "batches": len(rates), "batch": batch}


def ramped(device: torch.device, ramp_s: float, reps: int, batch: int) -> dict:
    cuda = device.type == "cuda"
    out: dict = {"copy": {}, "matmul": {}}
    for n_bytes in (1 << 28, 1 << 30) if cuda else (1 << 24, 1 << 26):
        src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).normal_()
        dst = torch.empty_like(src)
        out["copy"][str(n_bytes)] = best_rate(
            lambda dst=dst, src=src: dst.copy_(src), 2 * n_bytes, device, ramp_s, batch, reps
        )
        del src, dst
    for dtype in ("bfloat16", "float16", "float32"):
        dt_ = getattr(torch, dtype)
        shapes = GEMMS_CUDA if cuda else GEMMS_CPU
        if dtype == "float32":  # the guard's float32 shape; no TF32, as the guard measures it
            shapes = [(4096, 4096, 4096)] if cuda else [(768, 768, 768)]
        for m, n, k in shapes:
            a = torch.randn(m, k, device=device).to(dt_)
            b = torch.randn(k, n, device=device).to(dt_)
            out["matmul"][f"{dtype} {m}x{n}x{k}"] = best_rate(
                lambda a=a, b=b: torch.mm(a, b), 2 * m * n * k, device, ramp_s, batch, reps
            )
            del a, b
    return out


def _clocks(device: torch.device) -> dict | None:
    return nvml.snapshot(index=device.index or 0) if device.type == "cuda" else None


def summary(guard_runs: list[dict], ramp: dict) -> list[dict]:
    """One row per ceiling: the guard's values over its repeats against the ramped best and
    median (of the shape or size whose best is highest). A best of several batches leans high;
    the median beside it shows how much of the gap is that choice of statistic."""

    def top(entries: dict) -> dict:
        return max(entries.values(), key=lambda v: v["best"]) if entries else {"best": 0.0, "median": 0.0}

    rows = [
        {
            "ceiling": "copy (read + write)",
            "unit": "TB/s",
            "scale": 1e12,
            "guard": [g["copy_bytes_per_s"] for g in guard_runs],
            **_ramped_of(top(ramp["copy"])),
        }
    ]
    for dtype in ("bfloat16", "float16", "float32"):
        mine = {k: v for k, v in ramp["matmul"].items() if k.startswith(dtype + " ")}
        rows.append(
            {
                "ceiling": f"matmul {dtype}",
                "unit": "TFLOP/s",
                "scale": 1e12,
                "guard": [g["matmul_flops_per_s"].get(dtype) or 0.0 for g in guard_runs],
                **_ramped_of(top(mine)),
            }
        )
    for r in rows:
        r["guard_to_ramped"] = [g / r["ramped"] if r["ramped"] else None for g in r["guard"]]
    return rows


def _ramped_of(entry: dict) -> dict:
    return {"ramped": entry["best"], "ramped_median": entry["median"]}


def render(rows: list[dict]) -> str:
    lines = [
        "| ceiling | guard's measurement, each repeat | ramped best (median) | guard / ramped best |",
        "|---|---|---|---|",
    ]
    for r in rows:
        s = r["scale"]
        lines.append(
            f"| {r['ceiling']} | " + ", ".join(f"{g / s:.2f}" for g in r["guard"]) + f" {r['unit']} | "
            f"{r['ramped'] / s:.2f} ({r['ramped_median'] / s:.2f}) {r['unit']} | "
            + ", ".join("-" if x is None else f"{x:.0%}" for x in r["guard_to_ramped"])
            + " |"
        )
    return "\n".join(lines)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--repeats", type=int, default=3, help="times the guard's own measurement is run")
    ap.add_argument("--ramp-s", type=float, default=0.5, help="seconds of work before each ramped measurement")
    ap.add_argument("--reps", type=int, default=10, help="timed batches per ramped measurement")
    ap.add_argument("--batch", type=int, default=5, help="calls per timed batch")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device here (use --device cpu to check the script)")
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    result: dict = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "args": {k: str(v) for k, v in vars(args).items()},
        "clocks": {"start": _clocks(device)},
    }
    guard_runs = []
    for i in range(args.repeats):
        t = time.perf_counter()
        guard_runs.append(ceilings.measure(str(device)))
        log.info("guard's measurement %d/%d: %.1f s", i + 1, args.repeats, time.perf_counter() - t)
    result["guard"] = guard_runs
    result["clocks"]["after_guard"] = _clocks(device)
    result["ramped"] = ramped(device, args.ramp_s, args.reps, args.batch)
    result["clocks"]["after_ramped"] = _clocks(device)
    result["summary"] = summary(guard_runs, result["ramped"])
    (args.out / "ceilings_probe.json").write_text(json.dumps(result, indent=2, default=str))
    print(render(result["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
