"""How much slower a paced CPU call is than the same honest call timed hot: the honest RMSNorm
kernel judged several times on the CPU with a user's settings, and per workload its own median
(``inside_ms``), the outside clock's unpaced figure, the paced window's figure and their ratio.
The ratio sets what half the paced figure floors (docs/guard.md, "A paced call runs after a
handshake").

    python -m benchmarks.cpu_paced_ratio --rounds 3 [--out table.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import RMS, honest_source, unique

log = logging.getLogger("cpu_paced_ratio")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    from guard.candidates.load import from_source
    from guard.cascade import Guard
    from guard.config import GuardConfig
    from guard.workspace import Workspace

    ws = Path(tempfile.mkdtemp(prefix="paced-ratio-")) / "ws"
    guard = Guard(Workspace.open(ws), GuardConfig(static_screen=False, compile_baseline=False), device="cpu")
    rows = []
    try:
        for r in range(args.rounds):
            v = guard.evaluate(from_source(unique(honest_source()), "pytorch"), RMS, agent=f"honest-{r}")
            row: dict[str, dict[str, float | int | None]] = {}
            for w in v.workloads:
                oc = w.timing.outside_clock if w.timing else None
                if oc is None or oc.paced_ms is None:
                    continue
                row[w.uuid] = {
                    "inside_ms": oc.inside_ms,
                    "outside_ms": oc.outside_ms,
                    "paced_ms": oc.paced_ms,
                    "paced_loops": oc.paced_loops,
                    "ratio": oc.paced_ms / oc.inside_ms if oc.inside_ms > 0 else None,
                }
            rows.append({"round": r, "status": v.status, "workloads": row})
            log.info(
                "round %d %s %s",
                r,
                v.status,
                " | ".join(
                    f"{u.rsplit('-', 1)[-1]}: inside {x['inside_ms']:.4f} outside {x['outside_ms']:.4f} "
                    f"paced {x['paced_ms']:.4f} ratio {x['ratio'] or 0:.2f}"
                    for u, x in row.items()
                ),
            )
    finally:
        guard.close()
    if args.out:
        args.out.write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
