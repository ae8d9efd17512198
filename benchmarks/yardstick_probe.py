"""Would a trusted yardstick take a CPU window's luck out of a stored figure?

The pairing's open residual (docs/guard.md, "Decision"): a stored median carries the luck of
the window it was timed in, and the proposed fix divides every figure by the reference's time
measured in the same window. That only works if the two move together. This probe times, as
the guard's two workers would, a candidate-like call in one process for ``--cand-s`` and then
the reference-like call in another process for ``--ref-s``, window after window, and reports
how much a figure varies from window to window alone and divided by its yardstick.

    python -m benchmarks.yardstick_probe OUT.json --windows 60 --rows 16 256 --hogs 2

``--hogs N`` starts N processes that spin and sleep at random (0.05-1 s each), the way other
work shares a 2-core machine. Nothing here runs the guard: it asks whether the design holds
before it is built.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing as mp
import random
import statistics
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("yardstick_probe")


def _candidate(x: Any, w: Any) -> Any:
    return x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * w


def _reference(x: Any, w: Any) -> Any:
    xf = x.float()
    return (xf * (xf.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()).to(x.dtype) * w


def _timer(conn: Any, which: str, rows: int) -> None:
    """A worker: on each request (seconds), the median time of its call over that long."""
    import torch

    torch.set_num_threads(1)
    f = _candidate if which == "candidate" else _reference
    x, w = torch.randn(rows, 4096), torch.randn(4096)
    while True:
        secs = conn.recv()
        if secs is None:
            return
        times, end = [], time.perf_counter() + secs
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            f(x, w)
            times.append(time.perf_counter() - t0)
        conn.send(statistics.median(times))


def _hog(seed: int) -> None:
    rng = random.Random(seed)
    while True:
        end = time.perf_counter() + rng.uniform(0.05, 1.0)
        while time.perf_counter() < end:
            pass
        time.sleep(rng.uniform(0.05, 1.0))


def _spread(figures: list[float]) -> dict[str, float]:
    logs = [math.log(f) for f in figures]
    return {"sd_log": statistics.pstdev(logs), "max_over_min": math.exp(max(logs) - min(logs))}


def probe(rows: int, windows: int, cand_s: float, ref_s: float) -> dict[str, Any]:
    pipes, procs = {}, []
    for which in ("candidate", "reference"):
        ours, theirs = mp.Pipe()
        p = mp.Process(target=_timer, args=(theirs, which, rows), daemon=True)
        p.start()
        pipes[which], procs = ours, procs + [p]
    pairs = []
    for _ in range(windows):
        pipes["candidate"].send(cand_s)
        c = pipes["candidate"].recv()
        pipes["reference"].send(ref_s)
        pairs.append((c, pipes["reference"].recv()))
    for conn in pipes.values():
        conn.send(None)
    for p in procs:
        p.join(5)
    cand = [c for c, _ in pairs]
    ref = [r for _, r in pairs]
    out = {
        "rows": rows,
        "windows": windows,
        "candidate": _spread(cand),
        "reference": _spread(ref),
        "candidate_over_yardstick": _spread([c / r for c, r in pairs]),
        "correlation_of_logs": statistics.correlation([math.log(c) for c in cand], [math.log(r) for r in ref]),
        "pairs_ms": [(c * 1e3, r * 1e3) for c, r in pairs],
    }
    log.info(
        "rows %d: sd of log figure %.3f alone, %.3f over the yardstick (max/min %.2fx, %.2fx); correlation %.2f",
        rows,
        out["candidate"]["sd_log"],
        out["candidate_over_yardstick"]["sd_log"],
        out["candidate"]["max_over_min"],
        out["candidate_over_yardstick"]["max_over_min"],
        out["correlation_of_logs"],
    )
    return out


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--windows", type=int, default=60)
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 256])
    ap.add_argument("--cand-s", type=float, default=0.2, help="the candidate's window (target_time_s)")
    ap.add_argument("--ref-s", type=float, default=0.1, help="the yardstick's window")
    ap.add_argument("--hogs", type=int, default=0)
    args = ap.parse_args()
    hogs = [mp.Process(target=_hog, args=(i,), daemon=True) for i in range(args.hogs)]
    for h in hogs:
        h.start()
    try:
        results = [probe(r, args.windows, args.cand_s, args.ref_s) for r in args.rows]
    finally:
        for h in hogs:
            h.terminate()
    args.out.write_text(json.dumps({"hogs": args.hogs, "results": results}, indent=1))


if __name__ == "__main__":
    main()
