"""Reconcile the guard's timing with independent measurements (GPU-NOTES' timing puzzle):
eager softmax on 8192x8192 fp16 measured with Triton's do_bench, raw CUDA events, events
around an L2 flush, the guard's Timer, the CUPTI kernel durations from torch.profiler, CUDA
graph replay, and Nsight Compute (when ``ncu`` is on the PATH).

Usage: python -m benchmarks.timing_puzzle OUT_DIR      (writes timing_puzzle.json)
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

N = 8192
BYTES = 2 * N * N * 2  # read once + write once, fp16


def fn_factory():
    x = torch.randn(N, N, device="cuda", dtype=torch.float16)
    return x, (lambda: torch.softmax(x, dim=-1))


def events(fn, flush=None, reps=100):
    out = []
    for _ in range(10):
        fn()
    for _ in range(reps):
        if flush is not None:
            flush()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e))
    return statistics.median(out)


def profiler_kernels(fn, flush):
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            flush()
            fn()
        torch.cuda.synchronize()
    kernels = {}
    for ev in prof.events():
        if ev.device_type.name == "CUDA" or "cuda" in str(ev.device_type).lower():
            kernels.setdefault(ev.name, []).append(ev.device_time if hasattr(ev, "device_time") else ev.cuda_time)
    return {k: {"calls": len(v), "median_us": statistics.median(v)} for k, v in kernels.items()}


def graph_replay(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        st.record()
        g.replay()
        en.record()
        torch.cuda.synchronize()
        times.append(st.elapsed_time(en) / reps)
    return statistics.median(times)


def run_ncu(out_dir: Path) -> dict:
    ncu = shutil.which("ncu")
    if ncu is None:
        return {"error": "ncu not on PATH"}
    results = {}
    for cache in ("all", "none"):
        cmd = [
            ncu,
            "--clock-control",
            "none",
            "--cache-control",
            cache,
            "--metrics",
            "gpu__time_duration.sum,dram__bytes.sum",
            "-k",
            "regex:softmax|SoftMax",
            "-c",
            "5",
            sys.executable,
            "-m",
            "benchmarks.timing_puzzle",
            "--ncu-target",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
        (out_dir / f"ncu_cache_{cache}.txt").write_text(proc.stdout[-20000:] + proc.stderr[-5000:])
        found = re.findall(r"gpu__time_duration\.sum\s+\S+\s+([\d.,]+)", proc.stdout)
        durs = [float(x.replace(",", "")) for x in found]
        unit = re.findall(r"gpu__time_duration\.sum\s+(\S+)", proc.stdout)
        dram = re.findall(r"dram__bytes\.sum\s+(\S+)\s+([\d.,]+)", proc.stdout)
        results[cache] = {
            "durations": durs,
            "unit": unit[0] if unit else None,
            "dram_bytes": dram[:5],
            "returncode": proc.returncode,
        }
    return results


def main() -> int:
    if "--ncu-target" in sys.argv:
        x, fn = fn_factory()
        for _ in range(8):
            fn()
        torch.cuda.synchronize()
        return 0
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    import triton.testing

    from guard.runner.timing import Timer

    x, fn = fn_factory()
    timer = Timer("cuda")
    flush = timer._flush
    res = {
        "op": "torch.softmax(x, dim=-1), x 8192x8192 fp16",
        "bytes_read_plus_written": BYTES,
        "do_bench_median_ms": triton.testing.do_bench(fn, return_mode="median"),
        "events_no_flush_ms": events(fn),
        "events_with_flush_ms": events(fn, flush),
        "guard_timer": timer.measure(lambda k: fn(), 1, 50, 200, 0.2, 0.05),
        "graph_replay_per_call_ms": graph_replay(fn),
        "profiler_kernels_with_flush": profiler_kernels(fn, flush),
        "l2_flush_bytes": timer.flush_bytes,
    }
    try:
        from guard.runner import nvml

        res["nvml_after"] = nvml.snapshot()
    except Exception as exc:  # noqa: BLE001
        res["nvml_error"] = str(exc)
    res["ncu"] = run_ncu(out)
    (out / "timing_puzzle.json").write_text(json.dumps(res, indent=2, default=str))
    g = res["guard_timer"]
    print(
        f"do_bench {res['do_bench_median_ms'] * 1e3:.1f} us"
        f" | events (no flush) {res['events_no_flush_ms'] * 1e3:.1f} us"
        f" | events+flush {res['events_with_flush_ms'] * 1e3:.1f} us | guard {g['median_ms'] * 1e3:.1f} us"
        f" (events {g['event_median_ms'] * 1e3:.1f}, host {g['host_median_ms'] * 1e3:.1f})"
        f" | graph {res['graph_replay_per_call_ms'] * 1e3:.1f} us"
    )
    for k, v in res["profiler_kernels_with_flush"].items():
        print(f"  profiler kernel {k[:70]}: {v['median_us']:.1f} us x{v['calls']}")
    for cache, v in res["ncu"].items():
        print(f"  ncu cache={cache}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
