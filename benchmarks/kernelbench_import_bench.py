"""Import every KernelBench level 1-3 file on the CPU and time it.

One probe process serves all files (torch is imported once, its time reported apart); each
file's time is the whole ``import_kernelbench_file`` call: the meta-device probe, the
reduced-size fall-back where needed, and the run of the reference at the CPU workload.

Usage: python -m benchmarks.kernelbench_import_bench OUT.tsv [--root DIR] [--only SUBSTRING]

Writes a table (file, seconds, how, var axes, largest tensor bytes at full size, CPU
workload, CPU check) to OUT.tsv and prints a summary (median, max, failures, over 5 s).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_ROOT = REPO / ".." / "shared" / "datasets" / "kernelbench"
SLOW_S = 5.0


def kernelbench_files(root: Path) -> list[Path]:
    return sorted(p for level in ("level1", "level2", "level3") for p in (root / level).glob("*.py"))


def largest_full_bytes(problem) -> int:
    from guard.problems.dtypes import dtype_info

    d = problem.definition
    axes = d.resolve_axes(problem.workloads[0].axes)
    return max(
        (
            math.prod(d.shape_of(s, axes)) * int(dtype_info(s.dtype).bytes)
            for s in list(d.inputs.values()) + list(d.outputs.values())
            if s.shape is not None
        ),
        default=0,
    )


def import_all(files: list[Path], root: Path, progress=None) -> tuple[list[dict], float]:
    """One row per file; also the seconds the probe process took to start (import torch)."""
    from guard.problems.derive import cpu_workloads
    from guard.problems.kernelbench_import import KernelBenchProber, import_kernelbench_file
    from guard.problems.problem import ProblemError
    from guard.problems.schema import VarAxis

    rows = []
    t0 = time.perf_counter()
    with KernelBenchProber() as prober:
        prober.probe(REPO / "tests" / "data" / "kernelbench" / "1_Square_matmul.py")  # start-up
        startup = time.perf_counter() - t0
        for path in files:
            rel = str(path.relative_to(root))
            t = time.perf_counter()
            report: dict = {}
            try:
                problem, notes = import_kernelbench_file(path, prober, report)
            except ProblemError as exc:
                rows.append({"file": rel, "seconds": time.perf_counter() - t, "error": str(exc)})
                if progress:
                    progress(rows[-1])
                continue
            seconds = time.perf_counter() - t
            d = problem.definition
            cpu = cpu_workloads(d, problem.workloads)[0]
            checked = next((n for n in notes if n.startswith("CPU workload")), None)
            rows.append(
                {
                    "file": rel,
                    "seconds": seconds,
                    "var_axes": ",".join(a for a, x in d.axes.items() if isinstance(x, VarAxis)),
                    "full_bytes": largest_full_bytes(problem),
                    "cpu_workload": ",".join(f"{k}={v}" for k, v in cpu.axes.items()),
                    "cpu_check": "ok" if checked else ("not run" if "was not run" in " ".join(notes) else "FAILED"),
                    "runs": report.get("runs"),
                    "phases": " ".join(f"{k[:-2]}={v:.2f}" for k, v in (report.get("timings") or {}).items()),
                    "how": next((n.split(";")[0] for n in notes if "meta device" in n), "meta"),
                    "notes": notes,
                }
            )
            if progress:
                progress(rows[-1])
    return rows, startup


def summary(rows: list[dict], startup: float) -> str:
    ok = [r for r in rows if "error" not in r]
    secs = [r["seconds"] for r in rows]
    fails = [r for r in rows if "error" in r]
    unchecked = [r for r in ok if r["cpu_check"] == "FAILED"]
    not_run = [r for r in ok if r["cpu_check"] == "not run"]
    slow = [r for r in rows if r["seconds"] > SLOW_S]
    lines = [
        f"files: {len(rows)}, imported: {len(ok)}, failures: {len(fails)}, "
        f"CPU workload failed: {len(unchecked)}, too heavy to run at import: {len(not_run)}",
        f"seconds per file: median {statistics.median(secs):.2f}, "
        f"mean {statistics.mean(secs):.2f}, max {max(secs):.2f} "
        f"({max(rows, key=lambda r: r['seconds'])['file']}), over {SLOW_S:g} s: {len(slow)}",
        f"probe process start-up (import torch, once): {startup:.2f} s",
    ]
    lines += [f"FAILED {r['file']}: {r['error']}" for r in fails]
    lines += [f"UNCHECKED {r['file']}: {[n for n in r['notes'] if 'could not be run' in n]}" for r in unchecked]
    lines += [f"NOT RUN {r['file']}: {[n for n in r['notes'] if 'was not run' in n]}" for r in not_run]
    lines += [f"SLOW {r['file']}: {r['seconds']:.2f} s ({r.get('runs')} runs; {r.get('phases')})" for r in slow]
    return "\n".join(lines)


def write_table(rows: list[dict], out: Path) -> None:
    cols = ["file", "seconds", "how", "var_axes", "full_bytes", "cpu_workload", "cpu_check", "runs", "phases"]
    with out.open("w") as f:
        f.write("\t".join(cols) + "\n")
        for r in rows:
            if "error" in r:
                f.write(f"{r['file']}\t{r['seconds']:.2f}\tERROR\t{r['error'].splitlines()[0]}\t\t\t\n")
            else:
                f.write("\t".join(f"{r[c]:.2f}" if c == "seconds" else str(r[c]) for c in cols) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    ap.add_argument("--only", help="only files whose path contains this")
    args = ap.parse_args()
    root = args.root.resolve()
    files = kernelbench_files(root)
    if args.only:
        files = [p for p in files if args.only in str(p)]
    if not files:
        print(f"no KernelBench files under {root}", file=sys.stderr)
        return 2

    def progress(r):
        state = "ERROR" if "error" in r else r["cpu_check"]
        print(f"{r['seconds']:6.2f} s  {state:6}  {r['file']}", file=sys.stderr, flush=True)

    rows, startup = import_all(files, root, progress)
    write_table(rows, args.out)
    print(summary(rows, startup))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
