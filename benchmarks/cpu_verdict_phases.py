"""Where a CPU verdict's time goes: the honest RMSNorm kernel judged a few times in a row by one
guard on the CPU, each verdict's phases as the verdict records them (``Verdict.phases_s``: the
gates, and per worker request kind, ``trusted.draw_inputs`` or ``trusted.verify_replays`` for
example). The first verdict measures the baselines; the later ones are warm.

    python -m benchmarks.cpu_verdict_phases [--verdicts 2] [--fast] [--set FIELD=VALUE ...] [--out phases.json]

``--fast``: the tests' settings (``benchmarks.harness.FAST``); else a user's defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import FAST, RMS, honest_source, unique


def _overrides(items: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in items:
        field, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected FIELD=VALUE")
        out[field] = json.loads(value)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verdicts", type=int, default=2)
    ap.add_argument("--fast", action="store_true", help="the tests' settings")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    from guard.candidates.load import from_source
    from guard.cascade import Guard
    from guard.config import GuardConfig
    from guard.workspace import Workspace

    settings = {**(FAST if args.fast else {}), **_overrides(args.overrides)}
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        guard = Guard(Workspace.open(Path(folder)), GuardConfig(**settings), device="cpu", prestart=False)
        try:
            for i in range(args.verdicts):
                t0 = time.monotonic()
                v = guard.evaluate(from_source(unique(honest_source()), None, "kernel.py"), RMS, agent=f"a{i}")
                row = {
                    "verdict": i,
                    "status": v.status,
                    "wall_s": round(time.monotonic() - t0, 3),
                    "workloads": {w.uuid: w.latency_ms for w in v.workloads},
                    "phases_s": {k: round(s, 3) for k, s in sorted(v.phases_s.items(), key=lambda x: -x[1])},
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            guard.close()
    if args.out:
        args.out.write_text(json.dumps({"settings": settings, "verdicts": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
