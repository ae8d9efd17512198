"""Issue 8 on a host with several GPUs (run on nvidia-h200-x2): does the guard use them all?

1. Throughput: a swarm of scripted agents on one seed problem, judged by a server with
   ``--devices 1`` and then ``--devices N``, the same time budget each; candidates judged
   per minute and which device judged them.
2. Interference: the spread of repeated evaluations of one kernel (the rmsnorm_h4096 study of
   ``benchmarks/guard_bench.py``) on GPU 0 alone, then on every GPU at once, one guard each.

Usage: python -m benchmarks.multi_gpu_bench OUT [--agents 8] [--minutes 4] [--devices 2]
                                             [--resubmissions 10] [--device cuda|cpu]
                                             [--swarm-with one|all|both]
(``--swarm-with one`` or ``all``: only that swarm, so two long windows fit two device calls;
``--combine A.json B.json``: the ratio of two such results.)
(``--device cpu``: a dry run with simulated devices, to check the script, not to measure.)
Writes OUT/multi_gpu_bench.json and prints a summary.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.guard_bench import JAMBA, SOL, spread_study  # noqa: E402,F401
from guard.archive.db import Database  # noqa: E402
from guard.cascade import Guard  # noqa: E402
from guard.runner.device import resolve_all  # noqa: E402
from guard.workspace import Workspace  # noqa: E402
from seeds import SEEDS_DIR  # noqa: E402


def swarm(ws_root: Path, problem: str, agents: int, minutes: float, devices: int, device: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "kernelarc_mcp.cli",
        "--workspace",
        str(ws_root),
        "launch",
        "--problem",
        problem,
        "--agents",
        str(agents),
        "--client",
        "scripted",
        "--budget-minutes",
        str(minutes),
        "--max-candidates",
        "1000",
        "--device",
        device,
        "--devices",
        str(devices),
        "-q",
        "--json",
    ]
    # Every swarm starts cold: its own ceilings/build cache and compiler caches, so the run that
    # goes second does not inherit the first one's measured ceilings and compiled kernels
    caches = ws_root.parent / "caches"
    env = os.environ | {
        "KERNELARC_CACHE_DIR": str(caches / "kernelarc"),
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
        "TRITON_CACHE_DIR": str(caches / "triton"),
    }
    t0 = time.time()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"launch failed ({p.returncode}): {p.stderr[-3000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    db = Database(ws_root / "workspace.db")
    done = db.query(
        "SELECT j.device, j.finished_at, c.duplicate_of FROM jobs j "
        "LEFT JOIN candidates c ON c.id = j.candidate_id WHERE j.state = 'done'"
    )
    # a source submitted before is answered from the archive: no GPU judged it
    jobs = [j for j in done if not j["duplicate_of"]]
    per_device: dict[str, int] = {}
    for j in jobs:
        per_device[j["device"]] = per_device.get(j["device"], 0) + 1
    judged = len(jobs)
    # when each verdict came, in seconds from the launch: the rate once judging has begun
    # tells the GPUs' share apart from the start-up (ceilings, baselines) they all pay
    times = sorted(round(j["finished_at"] - t0, 1) for j in jobs if j["finished_at"])
    # per device from its own first verdict (each guard pays its own start-up), then summed
    rates = {d: _rate_after_first([j["finished_at"] for j in jobs if j["device"] == d]) for d in per_device}
    steady = sum(rates.values()) if rates and None not in rates.values() else None
    # "judged" in results before 2026-11-29 20:00 counted every finished job, duplicates included
    return {
        "devices": devices,
        "agents": agents,
        "minutes": minutes,
        "judged_unique": judged,
        "finished_jobs": len(done),
        "duplicates": len(done) - judged,
        "per_minute": judged / minutes,
        "per_device": per_device,
        "run": out["run"],
        "verdict_times_s": times,
        "first_verdict_s": times[0] if times else None,
        "per_minute_after_first": steady,
        "per_device_after_first": rates,
    }


def _rate_after_first(finished: list[float]) -> float | None:
    """Verdicts per minute from the first one on: (n - 1) over the time from first to last."""
    t = sorted(x for x in finished if x)
    return (len(t) - 1) / (t[-1] - t[0]) * 60 if len(t) >= 2 and t[-1] > t[0] else None


def ratios(one: dict, many: dict) -> dict:
    """Throughput with several GPUs over throughput with one: over the whole window, and from
    each device's first verdict on."""
    out = {"throughput_ratio": many["per_minute"] / one["per_minute"] if one["per_minute"] else None}
    if one.get("per_minute_after_first") and many.get("per_minute_after_first"):
        out["throughput_ratio_after_first"] = many["per_minute_after_first"] / one["per_minute_after_first"]
    return out


def interference(problem: str, source: str, n: int, device: str, count: int) -> dict:
    ws = Workspace.open(Path(tempfile.mkdtemp(prefix="multi-gpu-spread-")) / "ws")
    ws.problems().import_path(SOL / problem)
    choices = resolve_all(device, count)
    guards = [Guard(ws, ws.config(), device=c) for c in choices]
    try:
        for g in guards:
            g.warm_up()
        alone = spread_study(guards[0], problem, source, n, agent="alone-0", base=1000)
        results: dict[str, dict] = {}

        def study(i: int, g: Guard) -> None:
            results[g.device.key] = spread_study(g, problem, source, n, agent=f"together-{i}", base=5000 + 1000 * i)

        threads = [threading.Thread(target=study, args=(i, g)) for i, g in enumerate(guards)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for g in guards:
            g.close()

    def brief(s: dict) -> dict:
        return {
            k: s[k] for k in ("geomean_cv", "workload_cv_median", "workload_cv_max", "false_accepts", "resubmissions")
        } | {"geomean_latency_us": statistics.median(s["geomean_latency_ms"]) * 1e3}

    return {"alone": {guards[0].device.key: brief(alone)}, "together": {k: brief(v) for k, v in results.items()}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--resubmissions", type=int, default=10)
    # softmax: its seeds are far from speed of light, so no agent is told to stop early (on
    # RMSNorm the seed reaches 95% and the swarm ends within minutes)
    ap.add_argument("--problem", default="softmax_lm_vocab_fp32")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--skip-swarm", action="store_true")
    ap.add_argument(
        "--swarm-with",
        choices=["one", "all", "both"],
        default="both",
        help="which swarms to run: one GPU, all --devices, or both in turn",
    )
    ap.add_argument(
        "--combine",
        nargs=2,
        type=Path,
        metavar=("ONE_GPU_JSON", "ALL_GPUS_JSON"),
        help="no measuring: the throughput ratio of two results written with --swarm-with",
    )
    ap.add_argument("--skip-spread", action="store_true")
    args = ap.parse_args()
    if args.combine:
        runs = sorted(
            (s for p in args.combine for s in json.loads(p.read_text()).get("swarm", [])), key=lambda s: s["devices"]
        )
        if len(runs) != 2 or runs[0]["devices"] == runs[1]["devices"]:
            ap.error("--combine wants two results with one swarm each, on different numbers of GPUs")
        print(json.dumps(ratios(*runs), indent=2))
        return 0
    if args.out is None:
        ap.error("OUT is needed to measure")
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "devices": [c.key for c in resolve_all(args.device, args.devices)],
    }
    path = args.out / "multi_gpu_bench.json"
    if not args.skip_swarm:
        result["swarm"] = []
        counts = {"one": (1,), "all": (args.devices,), "both": (1, args.devices)}[args.swarm_with]
        for n in counts:
            ws_root = Path(tempfile.mkdtemp(prefix=f"multi-gpu-{n}-")) / "ws"
            result["swarm"].append(swarm(ws_root, args.problem, args.agents, args.minutes, n, args.device))
            path.write_text(json.dumps(result, indent=2))
            print(json.dumps(result["swarm"][-1]), flush=True)
        if len(result["swarm"]) == 2:
            result |= ratios(*result["swarm"])
    if not args.skip_spread:
        rms = (SEEDS_DIR / "rmsnorm_llama3_8b" / "seed_triton.py").read_text()
        result["interference"] = interference("rmsnorm_h4096", rms, args.resubmissions, args.device, args.devices)
    path.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "swarm"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
