"""Paired re-measurements of one kernel against itself on the CPU, to see how far apart its
turns fall on this machine (run it beside a load of your own to see a busy one).

The incumbent's stored figures are made 40% slower, as a slow window would leave them, so that
every resubmission of the same kernel (a comment changed) is re-measured side by side. Each
pairing's samples go to OUT_JSON, with the decision and reason, as they come.

Usage: ``python -m benchmarks.pair_noise OUT_JSON [RESUBMISSIONS]``."""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import RMS, fast_config, honest_source

log = logging.getLogger("pair_noise")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from guard.candidates.load import from_source
    from guard.cascade import Guard, pairing_gate
    from guard.workspace import Workspace

    out, n = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 12
    pairings: list[dict] = []
    remeasure = pairing_gate.remeasure

    def recording(ctx, pool, row):  # the samples as the pairing gate gets them
        samples = remeasure(ctx, pool, row)
        pairings.append({"incumbent": row["id"], "samples": samples})
        return samples

    pairing_gate.remeasure = recording
    cfg = fast_config(min_iters=40, max_iters=80, pairing_band_cpu=2.5)
    guard = Guard(Workspace.open(Path(tempfile.mkdtemp()) / "ws"), cfg, device="cpu", prestart=False)
    verdicts = []
    try:
        guard.evaluate(from_source(honest_source(), None, "kernel.py"), RMS, agent="warm-up")  # a cold first verdict
        source = honest_source()
        first = guard.evaluate(from_source(source, None, "kernel.py"), RMS, agent="agent-p")
        with guard.db.transaction() as c:
            c.execute(
                "UPDATE workload_results SET latency_ms = latency_ms * 1.4, rel_se = 0 WHERE candidate_id = ?",
                (first.candidate_id,),
            )
        for i in range(n):
            t0 = time.monotonic()
            v = guard.evaluate(from_source(f"{source}\n# resubmission {i}\n", None, "kernel.py"), RMS, agent="agent-p")
            verdicts.append({"decision": v.decision, "reason": v.reason, "wall_s": time.monotonic() - t0})
            log.info("%d %s %s (%.0f s)", i, v.decision, v.reason, verdicts[-1]["wall_s"])
            out.write_text(json.dumps({"verdicts": verdicts, "pairings": pairings}, indent=1))
    finally:
        guard.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
