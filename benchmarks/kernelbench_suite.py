"""KernelBench levels 1-3 through the whole guard at their real sizes (issue 16's benchmark).

For every level-1 file and the first ``--per-level`` files of levels 2 and 3 (by problem
number), it imports the file, submits the reference itself as a ``ModelNew`` candidate (the
file with ``Model`` renamed), and records one row per file:
- import time; verdict status, decision, reason, wall time of the evaluation;
- both workers' peak memory (``peak_memory_bytes``) and, on a GPU, what one call of the
  reference needs on its own (its peak allocated memory in this process, inputs and outputs
  included), and the ratio of the larger worker peak to it (the target is at most 3);
- the SOL score.

It is resumable: rows already in ``OUT/kernelbench_suite.jsonl`` and rows of an earlier call
(``--resume FILE``, a JSONL this script wrote) are kept and their files skipped (judge a file
again into a new OUT); every row is appended as soon as it is known, so a call stopped by its
time limit keeps what it did. ``--only`` (repeatable) picks files by part of their path. ``--time-limit`` stops
starting new files after that many seconds. ``--render FILE`` prints the markdown summary.

Usage (GPU machine; the KernelBench files copied into the repository, e.g. ``.kb/``):
  python3 -m benchmarks.kernelbench_suite OUT --root .kb [--resume prior.jsonl] [--time-limit 480]
  python3 -m benchmarks.kernelbench_suite --render OUT/kernelbench_suite.jsonl
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import logging
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.kernelbench_import_bench import DEFAULT_ROOT, kernelbench_files  # noqa: E402

log = logging.getLogger("kernelbench_suite")
RESULTS = "kernelbench_suite.jsonl"
PEAK_TARGET = 3.0
# What a verdict holds whatever the problem's size, beside the 3x: the flush buffer (twice the
# L2: 120 MiB on the H200), the extra input sets a call under 256 MiB rotates over (at most
# 256 MiB), and cuBLAS and cuDNN workspaces and the allocator's rounding (the rest). Under
# about 300 MiB a call's own peak is smaller than these, and 3x alone cannot hold.
PEAK_ALLOWANCE_BYTES = 640 << 20


def worker_peak(peaks: dict[str, int] | None) -> int | None:
    """The larger of the two workers' reported peaks; None without one."""
    found = [b for b in (peaks or {}).values() if b]
    return max(found) if found else None


def over_bound(row: dict) -> bool | None:
    """Whether the larger worker peak exceeds ``PEAK_TARGET`` times the reference's own peak
    plus ``PEAK_ALLOWANCE_BYTES``; None without the figures."""
    peak, own = worker_peak(row.get("peak_memory_bytes")), row.get("own_peak_bytes")
    if not peak or not own:
        return None
    return peak > PEAK_TARGET * own + PEAK_ALLOWANCE_BYTES


def _number(path: Path) -> int:
    m = re.match(r"(\d+)_", path.name)
    return int(m.group(1)) if m else 10**6


def select(root: Path, per_level: int, only: list[str] | None = None) -> list[Path]:
    """Every level-1 file, the first ``per_level`` of levels 2 and 3 by problem number; with
    ``only``, those whose path contains any of its strings."""
    files = kernelbench_files(root)
    chosen = []
    for level in ("level1", "level2", "level3"):
        mine = sorted((p for p in files if p.parent.name == level), key=_number)
        chosen += mine if level == "level1" else mine[:per_level]
    return [p for p in chosen if not only or any(o in str(p) for o in only)]


def modelnew_source(reference: str) -> str:
    """The reference file as a ``ModelNew`` candidate: the class, and every use of its name
    (``super(Model, self)``), renamed."""
    if "ModelNew" in reference:
        raise ValueError("the file already defines ModelNew")
    return re.sub(r"\bModel\b", "ModelNew", reference)


def own_peak_bytes(path: Path, device: str) -> int | None:
    """Peak device memory of one call of the reference in this process (inputs, weights,
    the call's own allocations, outputs), on a GPU; None on the CPU."""
    if device != "cuda":
        return None
    import torch

    spec = importlib.util.spec_from_file_location(f"kb_{_number(path)}_{path.parent.name}", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    # reserved, as the guard's workers report theirs: what the allocator took from the device
    base = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    try:
        with torch.no_grad():
            model = module.Model(*module.get_init_inputs()).to("cuda")
            inputs = [x.to("cuda") if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
            out = model(*inputs)
            torch.cuda.synchronize()
        peak = torch.cuda.max_memory_reserved() - base
        del model, inputs, out
        return int(peak)
    finally:
        torch.cuda.empty_cache()


def judge_file(guard, path: Path, root: Path, prober, device: str) -> dict[str, Any]:
    from guard.candidates.load import from_source
    from guard.problems.kernelbench_import import import_kernelbench_file

    row: dict[str, Any] = {"file": str(path.relative_to(root)), "level": path.parent.name}
    t = time.monotonic()
    problem, _notes = import_kernelbench_file(path, prober)
    row["import_s"] = round(time.monotonic() - t, 2)
    problem.save(guard.store.workspace_problems / problem.name)
    row["problem"] = problem.name
    try:
        row["own_peak_bytes"] = own_peak_bytes(path, device)
    except Exception as exc:  # noqa: BLE001 - the reference alone does not fit or fails: say so
        row["own_peak_error"] = f"{type(exc).__name__}: {exc}"[:300]
    solution = from_source(modelnew_source(path.read_text()), None, "model_new.py")
    t = time.monotonic()
    v = guard.evaluate(solution, problem.name, agent="kernelbench-suite")
    row["wall_s"] = round(time.monotonic() - t, 2)
    row.update(
        status=v.status,
        decision=v.decision,
        reason=(v.reason or "")[:300],
        score=v.score,
        peak_memory_bytes=v.peak_memory_bytes,
        phases_s={k: round(x, 2) for k, x in v.phases_s.items()},
        peak_memory_by_gate=v.peak_memory_by_gate,
    )
    peak = worker_peak(v.peak_memory_bytes)
    if peak and row.get("own_peak_bytes"):
        row["peak_ratio"] = round(peak / row["own_peak_bytes"], 2)
    return row


def load_rows(path: Path | None) -> list[dict]:
    if path is None or not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start_rows(out: Path, resume: Path | None) -> list[dict]:
    """The rows a call starts from: those already in ``out`` (never overwritten: a second run
    into the same OUT once erased six rows measured on the H200), then ``resume``'s that
    ``out`` lacks. Their files are not judged again."""
    kept = load_rows(out)
    return kept + [r for r in load_rows(resume) if r not in kept]


def run(args: argparse.Namespace) -> int:
    from guard.cascade import Guard
    from guard.problems.kernelbench_import import KernelBenchProber
    from guard.workspace import Workspace

    root = args.root.resolve()
    files = select(root, args.per_level, args.only)
    if not files:
        log.error("no KernelBench files under %s", root)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / RESULTS
    prior = start_rows(out, args.resume)
    done = {r["file"] for r in prior}
    out.write_text("".join(json.dumps(r) + "\n" for r in prior))
    todo = [p for p in files if str(p.relative_to(root)) not in done]
    log.info("%d files chosen, %d recorded before, %d to judge", len(files), len(done), len(todo))
    deadline = time.monotonic() + args.time_limit
    ws = Workspace.open(Path(tempfile.mkdtemp(prefix="kb-suite-")) / "ws")
    with Guard(ws, ws.config(), device=args.device) as guard, KernelBenchProber() as prober:
        for i, path in enumerate(todo):
            if time.monotonic() > deadline:
                log.info("time limit: %d of %d left for the next call (--resume %s)", len(todo) - i, len(todo), out)
                break
            try:
                row = judge_file(guard, path, root, prober, args.device)
            except Exception as exc:  # noqa: BLE001 - recorded, and the suite goes on
                row = {
                    "file": str(path.relative_to(root)),
                    "level": path.parent.name,
                    "error": f"{type(exc).__name__}: {exc}"[:500],
                }
            row["date"] = dt.date.today().isoformat()
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(
                f"[{i + 1}/{len(todo)}] {row['file']}: {row.get('status', 'ERROR')} "
                f"import {row.get('import_s', '-')} s, verdict {row.get('wall_s', '-')} s, "
                f"peak ratio {row.get('peak_ratio', '-')} {row.get('reason') or row.get('error') or ''}"[:400],
                flush=True,
            )
    print(render(load_rows(out)))
    return 0


def latest(rows: list[dict]) -> list[dict]:
    """Each file's last row: a results file gathers several calls, and a file judged again (at a
    later commit) is judged by its latest verdict."""
    by_file: dict[str, dict] = {}
    for r in rows:
        by_file.pop(r["file"], None)
        by_file[r["file"]] = r
    return list(by_file.values())


def render(rows: list[dict]) -> str:
    """The summary for docs/kernelbench.md: counts per level and status, times, peaks, over each
    file's latest row."""
    rows = latest(rows)
    lines = [
        "| level | judged | PASSED | other verdicts | errors | import s (median / max) | "
        "verdict s (median / max) | peak ratio (max) | SOL score (median) | measured |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for level in ("level1", "level2", "level3"):
        mine = [r for r in rows if r.get("level") == level]
        if not mine:
            continue
        passed = [r for r in mine if r.get("status") == "PASSED"]
        other = [r for r in mine if r.get("status") not in (None, "PASSED")]
        errors = [r for r in mine if "error" in r]

        def med_max(key: str, rs: list[dict] = mine) -> str:
            xs = [r[key] for r in rs if isinstance(r.get(key), (int, float))]
            return f"{statistics.median(xs):.1f} / {max(xs):.1f}" if xs else "-"

        ratios = [r["peak_ratio"] for r in mine if isinstance(r.get("peak_ratio"), (int, float))]
        scores = [r["score"] for r in passed if isinstance(r.get("score"), (int, float))]
        score = f"{statistics.median(scores):.3f}" if scores else "-"
        lines.append(
            f"| {level[-1]} | {len(mine)} | {len(passed)} | {len(other)} | {len(errors)} | "
            f"{med_max('import_s')} | {med_max('wall_s')} | "
            f"{max(ratios) if ratios else '-'} | {score} | {_dates(mine)} |"
        )
    failing = [r for r in rows if r.get("status") not in ("PASSED",)]
    if failing:
        lines.append("")
        lines += [
            f"- `{r['file']}`: {r.get('status', 'ERROR')} {r.get('reason') or r.get('error', '')}"[:300]
            for r in failing
        ]
    over = [r for r in rows if isinstance(r.get("peak_ratio"), (int, float)) and r["peak_ratio"] > PEAK_TARGET]
    allowance = f"{PEAK_TARGET:g}x + {PEAK_ALLOWANCE_BYTES >> 20} MiB"
    lines += [
        f"- peak over {PEAK_TARGET:g}x: `{r['file']}` {r['peak_ratio']}x ({r.get('date', '?')}), "
        + ("over" if over_bound(r) else "within" if over_bound(r) is False else "no figures for")
        + f" {allowance}"
        for r in over
    ]
    return "\n".join(lines)


def _dates(rows: list[dict]) -> str:
    """The first and last day the rows were measured on."""
    days = sorted({r["date"] for r in rows if r.get("date")})
    return "-" if not days else days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"


def render_files(rows: list[dict]) -> str:
    """One line per judged file (docs/kernelbench.md): verdict and correctness seconds, the
    reference's own peak, each worker's peak with the gate it was in, the ratio, the SOL score."""
    rows = latest(rows)
    gib = float(1 << 30)
    lines = [
        "| file | verdict s | correctness s | own peak GiB | trusted peak GiB (gate) | "
        "candidate peak GiB (gate) | ratio | SOL score |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        gates = r.get("peak_memory_by_gate") or {}

        def top(role: str, gates: dict = gates) -> str:
            held = {g: peaks[role] for g, peaks in gates.items() if role in peaks}
            if not held:
                return "-"
            gate = max(held, key=lambda g: held[g])
            return f"{held[gate] / gib:.1f} ({gate})"

        own = r.get("own_peak_bytes")
        score = r.get("score")
        correctness = (r.get("phases_s") or {}).get("correctness", "-")
        lines.append(
            f"| {Path(r['file']).stem} | {r.get('wall_s', '-')} | {correctness} | "
            f"{f'{own / gib:.2f}' if own else '-'} | {top('trusted')} | {top('candidate')} | "
            f"{r.get('peak_ratio', '-')} | {f'{score:.3f}' if isinstance(score, (int, float)) else '-'} |"
        )
    return "\n".join(lines)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--per-level", type=int, default=25, help="files of levels 2 and 3 (level 1: all)")
    ap.add_argument("--only", action="append", help="only files whose path contains this (repeatable: any of them)")
    ap.add_argument("--resume", type=Path, help="a JSONL of an earlier call: its files are skipped")
    ap.add_argument("--time-limit", type=float, default=float("inf"), help="seconds after which no new file is started")
    ap.add_argument("--render", type=Path, help="print the summary of a results file and stop")
    ap.add_argument("--files", action="store_true", help="with --render: one line per file instead")
    args = ap.parse_args()
    if args.render:
        rows = load_rows(args.render)
        print(render_files(rows) if args.files else render(rows))
        return 0
    if args.out is None:
        ap.error("OUT is required unless --render is given")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
