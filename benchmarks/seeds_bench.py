"""Measure every seed problem on the GPU: reference eager, torch.compile, the Triton seed and
the CUDA C++ seed; median latency over the workloads and fraction of speed of light.

Usage: python -m benchmarks.seeds_bench OUT_DIR [--budget-s 480] [--only NAME ...] [--kinds triton cuda]
       python -m benchmarks.seeds_bench --render RUN1.json [RUN2.json ...] [--write docs/seeds.md]
(``--write``: the table replaces the block between the document's seeds_bench markers.)
CUDA seeds are compiled first, in parallel, into the guard's shared build cache.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.gpu_judge import summarize as verdict_summary  # noqa: E402
from guard.candidates.load import from_file  # noqa: E402
from guard.config import GuardConfig  # noqa: E402
from guard.paths import cache_dir  # noqa: E402
from guard.scoring import geomean  # noqa: E402
from guard.workspace import Workspace  # noqa: E402
from seeds import SEEDS_DIR  # noqa: E402

# the seed kernels of a problem folder, by kind
SEED_FILES = {"triton": "seed_triton.py", "cuda": "seed_cuda.cu"}


def _prebuild(path: str) -> tuple[str, str | None]:
    from guard.builders import BuildError, get_builder

    sol = from_file(Path(path)).model_dump(mode="json")
    src = Path(tempfile.mkdtemp(prefix="prebuild-"))
    try:
        get_builder("cuda_cpp").build(sol, src, cache_dir() / "torch_extensions", "cuda")
        return path, None
    except BuildError as exc:
        return path, str(exc)[:500]


def prebuild(paths: list[Path], jobs: int) -> dict:
    os.environ.setdefault("MAX_JOBS", str(max(1, (os.cpu_count() or 4) // jobs)))
    with mp.get_context("spawn").Pool(jobs) as pool:
        return dict(pool.map(_prebuild, [str(p) for p in paths]))


def summarize(v, wall_s: float) -> dict:
    """``gpu_judge.summarize``'s fields, with the SOL fraction, the score and every workload."""
    ws = v.workloads
    return verdict_summary(v, wall_s) | {
        "sol_fraction": geomean([w.sol_fraction for w in ws]) if ws else None,
        "score": v.score,
        "per_workload": [
            {
                "uuid": w.uuid,
                "axes": w.axes,
                "ms": w.latency_ms,
                "eager_ms": w.eager_ms,
                "compile_ms": w.compile_ms,
                "sol_ms": w.sol_ms,
                "bound": w.bound,
            }
            for w in ws
        ],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--only", nargs="*")
    ap.add_argument(
        "--render", type=Path, nargs="+", help="result files; a problem measured in a later one replaces it"
    )
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument(
        "--kinds",
        nargs="+",
        choices=list(SEED_FILES),
        default=list(SEED_FILES),
        help="which seeds to evaluate (the baselines come with the first one)",
    )
    ap.add_argument(
        "--write", type=Path, metavar="DOC", help=f"put the table into DOC, between the lines {BEGIN!r} and {END!r}"
    )
    args = ap.parse_args()
    if args.write and not args.render:
        ap.error("--write goes with --render: the document's table is the merge of the runs it names")
    if args.write and not _has_block(args.write):
        ap.error(f"{args.write} has no block to replace: add the lines {BEGIN!r} and {END!r} where the table goes")
    if args.render:
        table = render(merge([json.loads(p.read_text()) for p in args.render]))
        print(table)
        if args.write:
            write_block(args.write, table)
        return 0
    if args.out is None:
        ap.error("OUT_DIR is needed to measure (or --render to print a table from results)")
    t_start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    problems = sorted(p.parent for p in SEEDS_DIR.glob("*/definition.json"))
    if args.only:
        problems = [p for p in problems if p.name in args.only]
    cuda_seeds = [
        p / SEED_FILES["cuda"] for p in problems if (p / SEED_FILES["cuda"]).is_file() and "cuda" in args.kinds
    ]
    t = time.monotonic()
    build_errors = prebuild(cuda_seeds, args.jobs)
    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "prebuild_s": time.monotonic() - t,
        "prebuild_errors": {Path(k).parent.name: v for k, v in build_errors.items() if v},
        "prebuilt": sorted(Path(k).parent.name for k, v in build_errors.items() if not v),
        "problems": {},
    }
    from guard.cascade import Guard

    ws = Workspace.open(Path(tempfile.mkdtemp(prefix="seeds-bench-")) / "ws")
    cfg = GuardConfig(target_time_s=0.1, max_iters=300)
    out_json = args.out / "seeds_bench.json"
    with Guard(ws, cfg, device="cuda") as guard:
        guard.warm_up()
        for folder in problems:
            if time.monotonic() - t_start > args.budget_s:
                result["problems"][folder.name] = {"skipped": "time budget of the run spent"}
                continue
            entry: dict = {}
            for kind, fname in SEED_FILES.items():
                path = folder / fname
                if kind not in args.kinds or not path.is_file():
                    continue
                t = time.monotonic()
                v = guard.evaluate(from_file(path), folder.name, agent=f"seed-{kind}")
                entry[kind] = summarize(v, time.monotonic() - t)
                if kind == "cuda" and build_errors.get(str(path)):
                    entry[kind]["prebuild_error"] = build_errors[str(path)]
            ref = reference_workloads(entry)
            if ref:
                entry["eager_median_ms"] = statistics.median(w["eager_ms"] for w in ref)
                entry["eager_sol_fraction"] = geomean([w["sol_ms"] / w["eager_ms"] for w in ref])
                entry["bound"] = _bound(ref)
                entry["workloads"] = len(ref)
            entry["baseline_diagnostics"] = _baseline_diagnostics(guard, folder.name)
            result["problems"][folder.name] = entry
            result["device"] = guard.device_info()
            out_json.write_text(json.dumps(result, indent=2, default=str))
            print(
                f"{folder.name}: "
                + ", ".join(f"{k} {entry[k]['status']} {entry[k]['median_ms']}" for k in SEED_FILES if k in entry),
                flush=True,
            )
    result["total_s"] = time.monotonic() - t_start
    out_json.write_text(json.dumps(result, indent=2, default=str))
    print(render(result))
    return 0


BEGIN = "<!-- seeds_bench table: begin -->"
END = "<!-- seeds_bench table: end -->"


def _has_block(doc: Path) -> bool:
    if not doc.is_file():
        return False
    lines = doc.read_text().splitlines()
    return BEGIN in lines and END in lines and lines.index(BEGIN) < lines.index(END)


def write_block(doc: Path, table: str) -> None:
    """Replace what lies between the markers in ``doc`` by ``table``; the rest of the document
    (the prose around the table) stays as it is."""
    lines = doc.read_text().splitlines()
    i, j = lines.index(BEGIN), lines.index(END)
    doc.write_text("\n".join(lines[: i + 1] + table.splitlines() + lines[j:]) + "\n")


def _baseline_diagnostics(guard, problem: str) -> list[dict]:
    """Per workload, what the eager and torch.compile baselines ran: device operations per
    call and dynamo's counters (a compiled baseline with no graph was eager in disguise)."""
    from guard.problems.derive import workload_set

    prob = guard.store.get(problem)
    d = prob.definition
    out = []
    for w in workload_set(prob, guard.device.kind, guard._secret).visible:
        base = guard.db.baseline(d.content_hash(), w.uuid, guard.device.key) or {}
        out.append(
            {
                "uuid": w.uuid,
                "eager_ops_per_call": (base.get("eager") or {}).get("device_ops_per_call"),
                "compiled_ops_per_call": (base.get("compiled") or {}).get("device_ops_per_call"),
                "compile_counters": base.get("compile_counters"),
                "compile_checked": base.get("compile_checked", False),
                "compile_error": base.get("compile_error"),
            }
        )
    return out


def merge(results: list[dict]) -> dict:
    """Several runs as one: what a later run measured of a problem replaces what an earlier
    one did (a run of the Triton seeds alone keeps the CUDA seeds' figures of an earlier one);
    the dates of the runs that measured it are under ``measured``, and each seed's figures and
    the baselines' diagnostics carry the date of their run (``run``, ``diagnostics_run``), so
    diagnostics vouch only for times measured with them. The header (date, device, ceilings)
    is the first run's; every run's ceilings are under ``runs``, since a problem's fractions
    of SOL use the ceilings of the run that measured them."""
    out = {k: v for k, v in results[0].items() if k != "problems"}
    out["problems"] = {}
    out["runs"] = [{"date": r["date"][:16], "ceilings": r.get("device", {}).get("ceilings", {})} for r in results]
    for r in results:
        date = r["date"][:16]
        for name, entry in r["problems"].items():
            old = out["problems"].get(name, {})
            if "skipped" in entry:
                out["problems"].setdefault(name, entry)
                continue
            if "skipped" in old:
                old = {}
            entry = dict(entry, **{k: dict(entry[k], run=date) for k in SEED_FILES if k in entry})
            if "baseline_diagnostics" in entry:
                entry["diagnostics_run"] = date
            else:
                old.pop("baseline_diagnostics", None)
                old.pop("diagnostics_run", None)
            out["problems"][name] = dict(old, **entry, measured=old.get("measured", []) + [date])
    return out


def reference_workloads(e: dict) -> list[dict]:
    """The per-workload figures that came with the problem's baselines: those of a seed
    measured in the same run as the diagnostics (after ``merge``), else of either seed."""
    seeds = [e[k] for k in SEED_FILES if isinstance(e.get(k), dict)]
    if "diagnostics_run" in e:
        seeds = [x for x in seeds if x.get("run") == e["diagnostics_run"]]
    return (seeds[0] if seeds else {}).get("per_workload", [])


def _bound(workloads: list[dict]) -> str:
    """The bound most of the workloads share; "mixed" on a tie."""
    bounds = [w["bound"] for w in workloads if w.get("bound")]
    counts = {b: bounds.count(b) for b in set(bounds)}
    if not counts:
        return "-"
    top = max(counts.values())
    winners = sorted(b for b, n in counts.items() if n == top)
    return winners[0] if len(winners) == 1 else "mixed"


def compile_check(e: dict) -> tuple[list[dict], int]:
    """The workloads whose torch.compile time is trustworthy, and how many there are in all.
    Where the guard checked for dynamo falling back to eager (``compile_checked``), a time it
    kept is trusted. Older runs are judged by dynamo's counters, which count over the whole
    worker: every frame met so far compiled. A run without diagnostics has none, and
    diagnostics never vouch for a time another run measured."""
    ref = reference_workloads(e)
    if not ref:  # no seed measured with these diagnostics: count the workloads, vouch for none
        return [], max((len(e[k].get("per_workload", [])) for k in SEED_FILES if isinstance(e.get(k), dict)), default=0)
    diag = {d["uuid"]: d for d in e.get("baseline_diagnostics") or []}
    ok = []
    for w in ref:
        d = diag.get(w["uuid"]) or {}
        c = d.get("compile_counters")
        if not w.get("compile_ms") or not c or d.get("compile_error"):
            continue
        if d.get("compile_checked") or c["frames_ok"] == c["frames_total"]:
            ok.append(w)
    return ok, len(ref)


def _us(ms):
    return "-" if ms is None else f"{ms * 1e3:.1f}"


def _pct(x):
    return "-" if x is None else f"{x:.0%}"


def _ceilings(c: dict) -> str:
    rates = c.get("matmul_flops_per_s", {})
    return f"copy {c.get('copy_bytes_per_s', 0) / 1e12:.2f} TB/s (read + write), dense matmul " + ", ".join(
        f"{k} {v / 1e12:.0f} TFLOP/s" for k, v in rates.items() if v
    )


def render(r: dict) -> str:
    dev = r.get("device", {})
    c = dev.get("ceilings", {})
    runs = r.get("runs") or [{"date": r["date"][:16], "ceilings": c}]
    lines = [
        f"Measured {r['date'][:10]} on {dev.get('name')} by `python -m benchmarks.seeds_bench` "
        "(guard defaults except 0.1 s of timing per workload, at most 300 iterations).",
        "",
    ]
    if len(runs) == 1:
        lines += [f"Ceilings used for speed of light: {_ceilings(c)}", ""]
    else:
        lines += [
            "Ceilings used for speed of light, measured by each run (each figure's fraction uses those of the "
            "run that measured that figure; the runs of a problem are under `measured` in the merged JSON):",
            "",
        ]
        lines += [f"- {run['date']}: {_ceilings(run['ceilings'])}" for run in runs] + [""]
    lines += [
        "Latency: median over the problem's workloads, in microseconds. Fraction of SOL: geometric mean over",
        "the workloads of T_sol / T.",
        "",
        "| problem | workloads | bound | eager us | compile us | Triton seed us | CUDA seed us "
        "| eager SOL | compile SOL | Triton SOL | CUDA SOL |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    partial, invalid = [], []
    for name, e in r["problems"].items():
        if "skipped" in e:
            lines.append(f"| {name} | not measured: {e['skipped']} |||||||||")
            continue
        tri, cu = e.get("triton", {}), e.get("cuda", {})
        ref = reference_workloads(e)
        valid, n = compile_check(e)
        if valid:
            comp_us = _us(statistics.median(w["compile_ms"] for w in valid))
            comp_sol = _pct(geomean([w["sol_ms"] / w["compile_ms"] for w in valid]))
            if len(valid) < n:
                comp_us += f" ({len(valid)}/{n})"
                partial.append(name)
        else:
            comp_us = comp_sol = "not valid"
            invalid.append(name)

        def cell(x, key, fmt):
            if not x:
                return "-"
            if x.get("status") != "PASSED":
                return f"{x.get('status')}"
            return fmt(x.get(key))

        lines.append(
            f"| {name} | {e.get('workloads', '-')} | {_bound(ref) if ref else e.get('bound', '-')} | "
            f"{_us(e.get('eager_median_ms'))} | "
            f"{comp_us} | {cell(tri, 'median_ms', _us)} | {cell(cu, 'median_ms', _us)} | "
            f"{_pct(e.get('eager_sol_fraction'))} | {comp_sol} | "
            f"{cell(tri, 'sol_fraction', _pct)} | {cell(cu, 'sol_fraction', _pct)} |"
        )
    lines += [
        "",
        "bound: what most workloads are bound by, under the ceilings of the run that measured them "
        "(mixed: as many of each).",
        "compile: only workloads whose baseline shows every frame compiled by dynamo (none fell back to eager).",
    ]
    if invalid:
        lines += [
            f'"not valid" ({", ".join(invalid)}): no such workload in the runs shown (runs without '
            "diagnostics, or a compile that fell back to eager)."
        ]
    if partial:
        lines += [f"(k/n): the median over the k of n workloads that compiled ({', '.join(partial)})."]
    fails = [
        (n, k, e[k])
        for n, e in r["problems"].items()
        for k in SEED_FILES
        if isinstance(e.get(k), dict) and e[k].get("status") != "PASSED"
    ]
    if fails:
        lines += ["", "Seeds that did not pass on this run:", ""]
        lines += [f"- {n} ({k}): {x.get('status')}: {x.get('reason')}" for n, k, x in fails]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
