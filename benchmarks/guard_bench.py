"""Benchmark of the guard itself (run on the GPU machine; results go to docs/benchmarks.md).

1. Verdict latency split into its phases (start, build, correctness, benchmark) for
   SOL-ExecBench's rmsnorm_h4096 and Jamba attention-output-projection problems and for a
   16-workload seed problem: the first (cold) verdict, warm verdicts of the same kernel with
   a trivial change, and warm verdicts of a kernel whose Triton code changed (new JIT).
2. The spread of repeated evaluations of one kernel (each trivially changed, so measured
   again) and 3. false ACCEPTs among those resubmissions of the incumbent.

Usage: python -m benchmarks.guard_bench OUT_DIR [--resubmissions 20] [--device cuda] [--gpus N]

``--gpus N`` splits the resubmissions over N GPUs of one host, one process each (its own
workspace and incumbent, ``CUDA_VISIBLE_DEVICES`` set), so that 50 fit in one device call;
each device's spread is reported on its own (two devices' figures are not one sample) and
the false ACCEPTs and rejections are summed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from guard.candidates.load import from_source  # noqa: E402
from guard.cascade import Guard  # noqa: E402
from guard.config import GuardConfig  # noqa: E402
from guard.runner import request_profile  # noqa: E402
from guard.workspace import Workspace  # noqa: E402
from seeds import SEEDS_DIR  # noqa: E402

SOL = REPO / "tests" / "data" / "sol-execbench-examples"
JAMBA = "ai21labs_AI21-Jamba-Reasoning-3B_attention_output_projection_with_residual"
PHASES = ("start", "build", "correctness", "benchmark", "total")


def variant(source: str, i: int, comment: str = "#") -> str:
    return source + f"\n{comment} resubmission {i}\n"


def jit_variant(source: str, i: int) -> str:
    """Change the Triton kernel body itself, so Triton compiles it again."""
    return source.replace("tl.program_id(0)", f"tl.program_id(0) + 0 * {i}", 1)


def evaluate(guard, source, problem, agent, language="triton", must_pass=True):
    t0 = time.monotonic()
    v = guard.evaluate(from_source(source, language, "kernel.py"), problem, agent=agent)
    wall = time.monotonic() - t0
    untraced = {w.timing.cupti_error for w in v.workloads if w.timing and "cupti" not in (w.timing.method or "")}
    if untraced:  # the events then time the calls: noisier, and worth knowing at once
        print(f"{problem}: CUPTI gave no spans on {len(untraced)} kind(s) of workload: {sorted(map(str, untraced))}")
    if v.status != "PASSED":
        print(f"{problem}: {v.status} {v.reason}\n{v.diagnostic}", flush=True)
        if must_pass:
            raise SystemExit(1)
    return v, wall


def _workload_lines(v) -> str:
    """Per workload: timed calls, the warm-up's call and loop estimates, the decided figure
    with its standard error and method, whether the outside clock floored it (and the
    candidate's own median then), and the outside clock's windows and walls: what a stored
    comparison of two verdicts is made of."""
    rows = []
    for w in v.workloads:
        if w.timing is None:
            continue
        t, oc = w.timing, w.timing.outside_clock
        extra = t.model_extra or {}
        floored = (
            f" FLOORED (own {extra.get('inside_median_ms') or 0:.4f}ms)"
            if extra.get("floored_by_outside_clock")
            else ""
        )
        rows.append(
            f"    {w.uuid}: iters {t.planned_iters} call~{t.eager_warmup_median_ms or 0:.3f}ms "
            f"loop~{t.loop_warmup_median_ms or 0:.3f}ms median {t.median_ms:.4f}ms se {t.rel_se or 0:.4f} "
            f"{t.method}{floored}"
            + (
                f" run {oc.run_wall_s:.3f}s loop {oc.loop_wall_s:.3f}s ({oc.run_iters} calls, {oc.loop}, "
                f"outside {oc.outside_ms:.4f}ms, "
                f"windows {oc.windows}, host-bound {oc.host_bound})"
                if oc
                else ""
            )
        )
    return "\n".join(rows)


def _phases_line(label: str, v, wall: float) -> str:
    """Every phase of a verdict, the per-request waits (``trusted.confirm``...) included."""
    parts = "  ".join(f"{k} {x:.2f}s" for k, x in sorted(v.phases_s.items(), key=lambda kv: -kv[1]))
    return f"{v.problem} {label}: wall {wall:.2f}s  {parts}"


def _gates_line(phases: dict[str, float]) -> str:
    """The gates that take a warm verdict's time, and the wait for a starting spare where the
    verdict waited (``wait_for_starts_before_timing``)."""
    keys = ("correctness", "spare_wait", "benchmark", "pairing", "heldout")
    return ", ".join(f"{k} {phases[k]:.1f}s" for k in keys if k in phases)


def _decision(v) -> dict:
    """The verdict's decision and, for each comparison it re-measured side by side, what the
    pairing found: why it paired, the stored and paired speedups, and why it decided nothing
    where it did not (a pairing costs a warm verdict most of its time: worth seeing why)."""
    out: dict = {"decision": v.decision, "speedup_vs_best": v.speedup_vs_best, "threshold": v.threshold}
    for label, e in (v.paired or {}).items():  # the entry less its per-turn figures
        out[f"paired_{label}"] = {**e.model_dump(exclude={"workloads"}), "note": (e.note or "")[:300] or None}
    return out


def _decision_line(d: dict) -> str:
    parts = [f"{d['decision']} speedup {d['speedup_vs_best'] or 0:.4f} threshold {d['threshold'] or 0:.4f}"]
    for label in ("agent", "global"):
        e = d.get(f"paired_{label}")
        if e and not (label == "global" and e == d.get("paired_agent")):  # the agent's best is the global one
            # an entry holds only the fields the guard set (``verdict._Part``)
            paired = f"{e['paired_speedup']:.4f}" if e.get("paired_speedup") else "none"
            slow = f" incumbent slowdown {e['incumbent_slowdown']:.3f}" if e.get("incumbent_slowdown") else ""
            parts.append(
                f"paired ({label}): stored {e.get('stored_speedup') or 0:.4f} -> paired {paired}{slow}"
                f" (why: {e.get('why') or '?'})"
            )
    return "; ".join(parts)


def _figures(v) -> dict:
    """Per workload: the decided median, its relative standard error, the method and whether
    the outside clock floored it (what a stored comparison of two verdicts is made of), then
    the outside clock's windows and trusted loops and its wait for a starting spare (s)."""
    out = {}
    for w in v.workloads:
        if w.timing is None:
            continue
        oc = w.timing.outside_clock
        out[w.uuid] = {
            "median_ms": w.latency_ms,
            "rel_se": w.timing.rel_se,
            "method": w.timing.method,
            "floored": (w.timing.model_extra or {}).get("floored_by_outside_clock"),
            "windows": oc.windows if oc else None,
            "loop_windows": oc.loop_windows if oc else None,
            "spare_wait_s": oc.quiet_wait_s if oc else None,
        }
    return out


def _windows_line(figures: dict) -> str:
    """The outside clock's extra work in a verdict: floors, windows beyond the first, waits."""
    rows = list(figures.values())
    floored = sum(1 for r in rows if r["floored"])
    extra = sum((r["windows"] or 1) - 1 for r in rows)
    waits = [r["spare_wait_s"] for r in rows if r["spare_wait_s"] is not None]
    return f"floored {floored}, extra windows {extra}, spare waits {len(waits)} ({sum(waits):.1f} s)"


def latency_study(
    guard, problem, source, warm_runs=3, after_verdict=lambda: None, settle=False, out: dict | None = None
) -> dict:
    """A cold verdict, then ``warm_runs`` of each warm kind; ``after_verdict`` runs after each
    (the profiles so far written out: a device call cut by its limit keeps them). ``settle``:
    before each warm verdict, wait (untimed) until the spare workers that the last one started
    are ready, as they are for an agent that takes longer than a start to write its next
    kernel; without it the verdicts follow at once, as a swarm's queue makes them. ``out``:
    the dict to fill, verdict by verdict, so that ``after_verdict`` can write it out."""
    out = {} if out is None else out
    out.update({"problem": problem, "workloads": None, "cold": None, "warm_trivial": [], "warm_new_jit": []})
    v, wall = evaluate(guard, variant(source, 0), problem, "latency")
    print(_phases_line("cold", v, wall), flush=True)
    print(_workload_lines(v), flush=True)
    out["workloads"] = v.checked.model_dump()
    out["cold"] = {**v.phases_s, "wall": wall, "figures": _figures(v)}
    after_verdict()
    for i in range(1, warm_runs + 1):
        for label, key, text in (
            ("warm trivial", "warm_trivial", variant(source, i)),
            ("warm new JIT", "warm_new_jit", jit_variant(source, i + 100)),
        ):
            settled = guard.pool.quiet_spare() if settle else None
            v, wall = evaluate(guard, text, problem, "latency")
            decided = _decision(v)
            print(_phases_line(label, v, wall), flush=True)
            figures = _figures(v)
            before = f"; settled {settled:.1f} s before" if settled is not None else ""
            print(f"    {_decision_line(decided)}; {_windows_line(figures)}{before}", flush=True)
            print(_workload_lines(v), flush=True)
            out[key].append({**v.phases_s, "wall": wall, "verdict": decided, "figures": figures, "settled_s": settled})
            after_verdict()
    return out


def spread_study(guard, problem, source, n, agent="incumbent", base=1000, deadline: float = float("inf")) -> dict:
    first, first_wall = evaluate(guard, variant(source, base), problem, agent)
    print(_phases_line("incumbent", first, first_wall), flush=True)
    print(_workload_lines(first), flush=True)
    decisions, per_workload, geo, refused = [], {}, [], []
    for i in range(n):
        if time.monotonic() > deadline:  # the device call's time is bounded: report what was done
            print(f"time limit: {i} of {n} resubmissions done", flush=True)
            break
        v, wall = evaluate(guard, variant(source, base + 1 + i), problem, agent, must_pass=False)
        if v.status != "PASSED":  # an honest resubmission refused: a false rejection, counted
            refused.append({"status": v.status, "reason": v.reason})
            continue
        decided = _decision(v)
        paired = decided.get("paired_agent") or {}
        outside = _windows_line(_figures(v))
        decisions.append(
            {
                **decided,
                "outside_clock": outside,
                "paired": bool(paired.get("paired_speedup")),  # a side-by-side comparison decided
                "pairing_tried": bool(paired),
                "stored_speedup": paired.get("stored_speedup"),
                # the verdict's gates (not its per-request waits): where a verdict's time went
                "phases": {k: x for k, x in v.phases_s.items() if "." not in k},
            }
        )
        print(
            f"resubmission {i + 1}: {_decision_line(decided)} "
            f"geomean {v.latency_ms * 1e3:.2f} us methods {sorted({w.timing.method for w in v.workloads})} "
            f"total {v.phases_s.get('total', 0):.1f}s ({_gates_line(v.phases_s)}); {outside}",
            flush=True,
        )
        geo.append(v.latency_ms)
        for w in v.workloads:
            per_workload.setdefault(w.uuid, []).append(w.latency_ms)
    if not geo:
        return {
            "problem": problem,
            "incumbent": first.candidate_id,
            "resubmissions": len(refused),
            "false_accepts": 0,
            "false_rejections": refused,
        }
    cv = {u: statistics.pstdev(xs) / statistics.fmean(xs) for u, xs in per_workload.items()}
    speedups = [d["speedup_vs_best"] for d in decisions if d["speedup_vs_best"]]
    stored = [d["stored_speedup"] for d in decisions if d["stored_speedup"]]
    return {
        "problem": problem,
        "incumbent": first.candidate_id,
        "first_verdict_phases": {**first.phases_s, "wall": first_wall},
        "resubmissions": len(decisions) + len(refused),
        "false_accepts": sum(d["decision"] == "ACCEPT" for d in decisions),
        "false_rejections": refused,
        "decisions": decisions,
        "paired_decisions": sum(d["paired"] for d in decisions),
        "pairings_tried": sum(d["pairing_tried"] for d in decisions),
        # the decision's own spread: speedups of the incumbent over itself, paired (or stored)
        "speedup_rms_deviation": (statistics.fmean((x - 1) ** 2 for x in speedups)) ** 0.5 if speedups else None,
        "stored_speedup_rms_deviation": (statistics.fmean((x - 1) ** 2 for x in stored)) ** 0.5 if stored else None,
        "geomean_latency_ms": geo,
        "geomean_cv": statistics.pstdev(geo) / statistics.fmean(geo),
        "workload_cv": cv,
        "workload_cv_max": max(cv.values()),
        "workload_cv_median": statistics.median(cv.values()),
        "workload_median_ms": {u: statistics.median(xs) for u, xs in per_workload.items()},
        # every resubmission's figure, in order: a single slow outlier shows here, not in the CV
        "workload_latency_ms": per_workload,
    }


def spread_on_gpus(args: argparse.Namespace, gpus: int) -> dict:
    """The spread study split over ``gpus`` child processes of this script, one GPU each,
    their output prefixed with the GPU's index; their spreads side by side and the counts summed."""
    visible = [x for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    if visible and len(visible) < gpus:
        raise SystemExit(f"--gpus {gpus}: CUDA_VISIBLE_DEVICES names only {len(visible)}")
    # as even a split as the count allows: 50 over 4 is 13, 13, 12, 12
    counts = [args.resubmissions // gpus + (i < args.resubmissions % gpus) for i in range(gpus)]
    work = Path(tempfile.mkdtemp(prefix="guard-bench-gpus-"))
    children: list[tuple[subprocess.Popen, threading.Thread]] = []
    try:
        _start_children(args, gpus, counts, visible, work, children)
        for proc, echo in children:
            proc.wait()
            echo.join()
    finally:  # a parent stopped early takes its children with it
        for proc, _ in children:
            if proc.poll() is None:
                proc.kill()
    per_gpu = []
    for i, (proc, _) in enumerate(children):
        path = work / f"gpu{i}" / "guard_bench.json"
        got = json.loads(path.read_text()) if path.exists() else {}
        per_gpu.append({"gpu": i, "exit": proc.returncode, "device": got.get("device"), "spread": got.get("spread")})
    spreads = [g["spread"] for g in per_gpu if g["spread"]]
    return {
        "problem": spreads[0]["problem"] if spreads else None,
        "gpus": per_gpu,
        "resubmissions": sum(sp["resubmissions"] for sp in spreads),
        "false_accepts": sum(sp["false_accepts"] for sp in spreads),
        "false_rejections": [r for sp in spreads for r in sp["false_rejections"]],
        "paired_decisions": sum(sp.get("paired_decisions") or 0 for sp in spreads),
        "pairings_tried": sum(sp.get("pairings_tried") or 0 for sp in spreads),
        # a child whose incumbent was refused wrote no spread: its GPU is listed here
        "failed_gpus": [g["gpu"] for g in per_gpu if g["exit"] != 0 or not g["spread"]],
    }


def _start_children(
    args: argparse.Namespace,
    gpus: int,
    counts: list[int],
    visible: list[str],
    work: Path,
    children: list[tuple[subprocess.Popen, threading.Thread]],
) -> None:
    for i in range(gpus):
        each = counts[i]
        cmd = [sys.executable, "-m", "benchmarks.guard_bench", str(work / f"gpu{i}"), "--skip-latency"]
        cmd += ["--resubmissions", str(each), "--spread-time-limit", str(args.spread_time_limit)]
        cmd += ["--device", args.device]
        cmd += [x for o in args.overrides for x in ("--set", o)]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible[i] if visible else str(i)}
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        echo = threading.Thread(target=_prefixed, args=(proc, f"[gpu {i}] "), daemon=True)
        echo.start()
        children.append((proc, echo))


def _prefixed(proc: subprocess.Popen, prefix: str) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        print(prefix + line, end="", flush=True)


def with_overrides(cfg: GuardConfig, overrides: list[str]) -> GuardConfig:
    """``cfg`` with ``FIELD=VALUE`` settings, each value parsed and checked as the field's type."""
    fields = dict(cfg.model_dump())
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in GuardConfig.model_fields:
            raise SystemExit(f"--set {item!r}: expected FIELD=VALUE with a field of the guard's config")
        fields[key] = json.loads(value) if value[:1] in "[{" else value
    return GuardConfig.model_validate(fields)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--resubmissions", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warm-runs", type=int, default=3)
    ap.add_argument(
        "--gpus", type=int, default=1, help="split the resubmissions over this many GPUs of the host (see above)"
    )
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--skip-spread", action="store_true")
    ap.add_argument(
        "--spread-time-limit",
        type=float,
        default=float("inf"),
        help="seconds after which no further resubmission starts",
    )
    ap.add_argument(
        "--latency-problems",
        nargs="*",
        default=None,
        help="only the latency studies of problems whose name contains one of these",
    )
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a guard config field for this run (repeatable), e.g. outside_windows_first=2 to time as "
        "before the outside clock's windows became adaptive",
    )
    ap.add_argument(
        "--settle-spares",
        action="store_true",
        help="before each warm verdict of the latency studies, wait (untimed) for the spare workers the "
        "last one started, as an agent's thinking time would; without it the verdicts follow at once",
    )
    ap.add_argument(
        "--profile-workers",
        action="store_true",
        help="profile every worker's requests (slower: for finding costs, not measuring them); "
        "the reports go to OUT/worker_profiles.txt",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.gpus < 1:
        raise SystemExit("--gpus: at least 1")
    if args.gpus > 1 and not args.skip_spread:
        if not args.skip_latency or args.profile_workers:
            raise SystemExit("--gpus N times the spread only: add --skip-latency, leave out --profile-workers")
        result = {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
            "python": platform.python_version(),
            "overrides": args.overrides,
            "spread": spread_on_gpus(args, args.gpus),
        }
        (args.out / "guard_bench.json").write_text(json.dumps(result, indent=2, default=str))
        print(render(result))
        return 1 if result["spread"]["failed_gpus"] else 0
    profiles = Path(tempfile.mkdtemp(prefix="worker-profiles-")) if args.profile_workers else None
    if profiles is not None:
        os.environ[request_profile.ENV] = str(profiles)
    ws = Workspace.open(Path(tempfile.mkdtemp(prefix="guard-bench-")) / "ws")
    ws.problems().import_path(SOL / "rmsnorm_h4096")
    ws.problems().import_path(SOL / JAMBA)
    rms_seed = (SEEDS_DIR / "rmsnorm_llama3_8b" / "seed_triton.py").read_text()
    jamba = (REPO / "benchmarks" / "candidates" / "jamba_oproj_triton.py").read_text()
    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
    }
    cfg = with_overrides(ws.config(), args.overrides)
    result["overrides"] = args.overrides
    result["settle_spares"] = args.settle_spares
    with Guard(ws, cfg, device=args.device) as guard:
        guard.warm_up()
        result["device"] = guard.device_info()
        result["config"] = guard.cfg.model_dump()
        if not args.skip_spread:
            result["spread"] = spread_study(
                guard, "rmsnorm_h4096", rms_seed, args.resubmissions, deadline=time.monotonic() + args.spread_time_limit
            )
            (args.out / "guard_bench.json").write_text(json.dumps(result, indent=2, default=str))
        if not args.skip_latency:
            result["latency"] = []
            sixteen = sorted(SEEDS_DIR.glob("attn_out_proj_residual*/seed_triton.py"))
            plan = [("rmsnorm_h4096", rms_seed), (JAMBA, jamba)]
            plan += [(sixteen[0].parent.name, sixteen[0].read_text())] if sixteen else []
            if args.latency_problems:
                plan = [(p, s) for p, s in plan if any(x in p for x in args.latency_problems)]

            def after_verdict() -> None:  # a device call cut by its limit keeps every verdict so far
                _save_profiles(profiles, args.out)
                (args.out / "guard_bench.json").write_text(json.dumps(result, indent=2, default=str))

            for problem, source in plan:
                study: dict = {}
                result["latency"].append(study)
                latency_study(
                    guard, problem, source, args.warm_runs, after_verdict, settle=args.settle_spares, out=study
                )
        result["device"] = guard.device_info()
    (args.out / "guard_bench.json").write_text(json.dumps(result, indent=2, default=str))
    _save_profiles(profiles, args.out)  # the trusted worker's too, now that the guard is closed
    print(render(result))
    return 0


def _save_profiles(profiles: Path | None, out: Path) -> None:
    """Every worker's profile written so far, in one file (the device call brings back only a
    few): a candidate worker's once it is discarded after its verdict, the trusted worker's when
    the guard closes."""
    if profiles is None:
        return
    reports = sorted(profiles.glob("*.txt"), key=lambda p: p.stat().st_mtime)
    (out / "worker_profiles.txt").write_text("".join(f"##### {p.stem}\n{p.read_text()}\n" for p in reports))


def render(r: dict) -> str:
    lines = [f"guard benchmark {r['date']} on {(r.get('device') or {}).get('name', 'several GPUs')}"]
    if r.get("overrides"):
        lines.append("config overrides: " + " ".join(r["overrides"]))
    for s in r.get("latency", []):
        lines.append(f"\n{s['problem']} ({s['workloads']})")
        rows = [("cold", [s["cold"]])]
        rows += [("warm, trivial change", s["warm_trivial"]), ("warm, new Triton JIT", s["warm_new_jit"])]
        for label, runs in rows:
            med = {
                k: statistics.median(x[k] for x in runs if x.get(k) is not None)
                for k in PHASES
                if any(x.get(k) is not None for x in runs)
            }
            lines.append(f"  {label:<22} " + "  ".join(f"{k} {v:6.2f}s" for k, v in med.items()))
    sp = r.get("spread")
    if sp and "gpus" in sp:
        lines.append(
            f"\nspread over {sp['resubmissions']} resubmissions of {sp['problem']} on {len(sp['gpus'])} GPUs: "
            f"false ACCEPTs {sp['false_accepts']}, false rejections {len(sp['false_rejections'])}, "
            f"paired {sp['paired_decisions']}, GPUs that failed {sp['failed_gpus']}"
        )
        for g in sp["gpus"]:
            one = render({"date": r["date"], "device": g["device"] or {}, "spread": g["spread"]}) if g["spread"] else ""
            lines.append(f"  GPU {g['gpu']} (exit {g['exit']}): " + (one.split("\n", 2)[-1] or "no result"))
    elif sp and "geomean_cv" not in sp:
        lines.append(f"\nspread: every resubmission refused: {sp['false_rejections']}")
    elif sp:
        lines.append(
            f"\nspread over {sp['resubmissions']} resubmissions of {sp['problem']}: geomean CV {sp['geomean_cv']:.3%}, "
            f"per-workload CV median {sp['workload_cv_median']:.3%} max {sp['workload_cv_max']:.3%}; "
            f"false ACCEPTs {sp['false_accepts']}; paired {sp.get('paired_decisions')} of {sp.get('pairings_tried')} "
            f"pairings tried; speedup RMS deviation "
            f"{sp.get('speedup_rms_deviation') or 0:.3%} (stored {sp.get('stored_speedup_rms_deviation') or 0:.3%})"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
