"""Where does the run-to-run spread of one kernel's timing come from? (GPU only.)

docs/benchmarks.md found that evaluations of one kernel in separate processes differ by more
than each run's own spread, and that a whole run shifts together. This probe times the
Triton RMSNorm seed on rmsnorm_h4096 shapes in several fresh processes, each with several
fresh allocations (new inputs, new flush buffer), in two ways over the same loop:

- "graph-events": the guard's timer (CUDA graph replay between two events, L2 flushed);
- "guard": the guard's timer as it stands (its method is recorded);
- "cupti-kernel": the kernel's own duration as CUPTI reports it (torch.profiler), which
  leaves out the graph launch and the events' resolution.

It reports, per method and shape, the spread between processes and between allocations
within a process, with the SM clock read from NVML at each measurement.

Usage: python -m benchmarks.spread_probe OUT_DIR [--processes 6] [--allocations 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCHES = (1, 16, 170, 8804)
HIDDEN = 4096


def _child(allocations: int) -> dict:
    sys.path.insert(0, str(REPO))
    import torch
    from torch.profiler import ProfilerActivity, profile

    from guard.runner import nvml
    from guard.runner.timing import Timer, summarize

    spec = importlib.util.spec_from_file_location("seed", REPO / "seeds" / "rmsnorm_llama3_8b" / "seed_triton.py")
    seed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seed)
    out: dict = {"allocations": []}
    for _ in range(allocations):
        timer = Timer("cuda")
        row: dict = {}
        for b in BATCHES:
            sets = [
                (
                    torch.randn(b, HIDDEN, device="cuda", dtype=torch.bfloat16),
                    torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16),
                )
                for _ in range(4)
            ]

            def call(k, sets=sets):
                return seed.run(*sets[k])

            kw = dict(min_iters=200, max_iters=600, target_time_s=0.1, warmup_time_s=0.05)
            guard_stats = timer.measure(call, len(sets), **kw)  # the guard's timer as it is
            stats = timer.measure(call, len(sets), use_cupti=False, **kw)
            graphs, err = timer._capture(call, len(sets))
            if graphs is None:
                raise SystemExit(f"capture failed: {err}")
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                timer._graph_loop(graphs, 300, set(), lambda *_: None)
            durations = [
                e.duration_ns() / 1e6
                for e in prof.profiler.kineto_results.events()
                if "rmsnorm" in e.name() and e.duration_ns() > 0
            ]
            row[str(b)] = {
                "guard": guard_stats["median_ms"],
                "guard-method": guard_stats["method"],
                "graph-events": stats["median_ms"],
                "graph-events-rel_se": stats["rel_se"],
                "cupti-kernel": summarize(durations)["median_ms"] if durations else None,
                "cupti-kernels-seen": len(durations),
            }
        row["sm_clock_mhz"] = (nvml.snapshot(index=0) or {}).get("sm_clock_mhz")
        out["allocations"].append(row)
        del timer
        torch.cuda.empty_cache()
    return out


def _cv(xs: list[float]) -> float:
    xs = [x for x in xs if x]
    return statistics.pstdev(xs) / statistics.fmean(xs) if len(xs) > 1 else 0.0


def summarize_runs(runs: list[dict]) -> dict:
    table = {}
    for method in ("guard", "graph-events", "cupti-kernel"):
        for b in BATCHES:
            per_proc = [[al[str(b)][method] for al in r["allocations"]] for r in runs]
            means = [statistics.fmean(p) for p in per_proc if all(p)]
            values = [x for p in per_proc for x in p if x]
            table[f"{method} b={b}"] = {
                "median_ms": statistics.median(values) if values else None,
                "between_process_cv": _cv(means),
                "within_process_cv": statistics.fmean(_cv(p) for p in per_proc if all(p)) if means else None,
            }
    return table


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--allocations", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.allocations)))
        return 0
    if args.out is None:
        ap.error("OUT_DIR is required")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in range(args.processes):
        p = subprocess.run(
            [sys.executable, "-m", "benchmarks.spread_probe", "--child", "--allocations", str(args.allocations)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if p.returncode != 0:
            print(p.stderr[-3000:], file=sys.stderr)
            return 1
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
        print(f"process {i + 1}/{args.processes} done", file=sys.stderr, flush=True)
    result = {"runs": runs, "summary": summarize_runs(runs)}
    (args.out / "spread_probe.json").write_text(json.dumps(result, indent=2))
    for k, v in result["summary"].items():
        if v["median_ms"] is None:
            print(f"{k:<24} no samples")
            continue
        print(
            f"{k:<24} median {v['median_ms'] * 1e3:8.2f} us  between-process CV {v['between_process_cv']:.2%}"
            f"  within-process CV {v['within_process_cv']:.2%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
