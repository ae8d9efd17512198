"""Latency of recall with 100k conclusions, in the library (no HTTP): the conclusions
search alone (``Memory.recall``) and everything the ``recall`` tool does
(``Service.recall``: conclusions, trajectory, the agent's best, the decision policy).

Usage: python -m benchmarks.recall_bench OUT_DIR [--conclusions 100000] [--queries 1000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.mcp_load import PROBLEMS, pct, populate, words  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--conclusions", type=int, default=100_000)
    ap.add_argument("--candidates", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=1000)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from benchmarks.harness import fast_workspace
    from guard.config import GuardConfig
    from guard.workspace import Workspace
    from kernelarc_mcp.service import Service

    ws_path = fast_workspace(Path(tempfile.mkdtemp(prefix="recall-")) / "ws")
    agents = [f"agent{i:02d}" for i in range(16)]
    populate(ws_path, args.candidates, args.conclusions, agents)
    svc = Service(Workspace.open(ws_path), GuardConfig(compile_baseline=False), device="cpu", evaluator=False)
    rng = random.Random(11)
    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({os.cpu_count()} cores), Python {platform.python_version()}",
        "conclusions": svc.memory.count(),
        "candidates": args.candidates,
        "queries": args.queries,
    }
    for scope in ("problem", "family", "any"):
        mem, full = [], []
        for _ in range(args.queries):
            p = svc.guard.store.get(rng.choice(PROBLEMS))
            q = " ".join(words(rng, rng.randint(1, 6)))
            t0 = time.perf_counter()
            svc.memory.recall(p, q, scope, 8)
            mem.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            svc.recall(rng.choice(agents), p.name, q, scope, 8)
            full.append((time.perf_counter() - t0) * 1e3)
        result[scope] = {
            "memory_p50_ms": pct(mem, 0.5),
            "memory_p99_ms": pct(mem, 0.99),
            "tool_p50_ms": pct(full, 0.5),
            "tool_p99_ms": pct(full, 0.99),
        }
    svc.close()
    (args.out / "recall_bench.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
