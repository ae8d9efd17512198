"""What a forged median still gains on the CPU: the honest RMSNorm kernel and the same kernel
with its reported median forged to 1 us (``tests/cheats/forges_median_keeping_mean.py``'s
idea, without the mean), judged in turn by one guard with a user's settings and the static
screen off, several rounds. Prints each verdict's decided figure per workload and, at the end, per workload the
median of the forger's figures over the median of the honest ones (1.0: no gain).
``--forger second-core``: the forger also runs the outside clock's calls on a second core
while its loop goes on (``tests/cheats/calls_on_a_second_core.py``); ``--forger leaner-loop``:
its outside-clock loop is a leaner one than the guard's, its calls honest
(``tests/cheats/replaces_the_loop_with_a_leaner_one.py``); ``--forger batching``: it
makes one batched call of a window's calls where the guard does not pace them (session 34). ``--stall``: the trusted
worker is stopped for five sixths of each of its outside-clock windows while the forger is
judged (``harness.Staller``), as a busy machine would hold it off its core
(``tests/test_outside_clock_stalls.py``). ``--forger none``: the honest kernel alone, for the
ratio of its paced figure to its own median (what half the paced figure floors; until f9efc08
``benchmarks/cpu_paced_ratio.py``).

    python -m benchmarks.cpu_forgery_probe --rounds 4 [--forger second-core|batching|leaner-loop|none]
        [--stall] [--out table.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import CHEATS, RMS, honest_source, stalling_trusted_windows, unique

log = logging.getLogger("cpu_forgery_probe")

FORGER = """
import torch

_role = torch.sys.modules["guard.runner.candidate_role"].CandidateRole
_stats = _role.stats


def _forged_stats(self, msg):
    reply = _stats(self, msg)
    if getattr(reply, "ok", False):
        reply.stats["median_ms"] = 0.001
    return reply


_role.stats = _forged_stats


def run(hidden_states, weight):
    x = hidden_states.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(hidden_states.dtype)
"""


# the forger above, whose outside-clock loop also makes one batched call of a window's calls
# where every call's inputs are there at the start (the windows that are not paced), and runs
# honestly where the guard paces the calls (``guard/runner/pacing.py``)
BATCHER = (
    FORGER
    + """

_mods = torch.sys.modules
_confirm = _mods["guard.runner.confirm"]
_orig = _confirm.ConfirmLoop._held_loop


def _batched(self, iters, call, pad_passes, n):
    if call is None or self.kept is None or self.kept.static is not None or self.paced_now:
        return _orig(self, iters, call, pad_passes, n)
    rows = self.staged.rows
    x = torch.stack([rows[it][0] for it in range(iters)]).float()
    w = torch.stack([rows[it][1] for it in range(iters)]).float()
    w = w.unsqueeze(1) if x.dim() == 3 else w
    out = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w).to(rows[0][0].dtype)
    for it in range(iters):
        self.kept.take(it, [out[it]])
        if self.pacing is not None:
            self.pacing.pacer.done(_confirm.pack_outputs([out[it]], self.pacing.ndims))


_confirm.ConfirmLoop._held_loop = _batched
"""
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--forger", choices=("median", "second-core", "batching", "leaner-loop", "none"), default="median"
    )
    parser.add_argument("--stall", action="store_true", help="stall the trusted windows while the forger is judged")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    forger = {
        "median": FORGER,
        "second-core": (CHEATS / "calls_on_a_second_core.py").read_text(),
        "batching": BATCHER,
        "leaner-loop": (CHEATS / "replaces_the_loop_with_a_leaner_one.py").read_text(),
        "none": None,
    }[args.forger]
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    from guard.candidates.load import from_source
    from guard.cascade import Guard
    from guard.config import GuardConfig
    from guard.workspace import Workspace

    ws = Path(tempfile.mkdtemp(prefix="forgery-probe-")) / "ws"
    # a user's settings (the screen off, to judge the run-time defences alone)
    cfg = GuardConfig(static_screen=False, compile_baseline=False)
    guard = Guard(Workspace.open(ws), cfg, device="cpu")
    rows = []
    try:
        for r in range(args.rounds):
            kinds = [("honest", honest_source())] + ([("forger", forger)] if forger is not None else [])
            for kind, src in kinds:
                undo = stalling_trusted_windows() if args.stall and kind == "forger" else None
                try:
                    v = guard.evaluate(from_source(unique(src), "pytorch"), RMS, agent=f"{kind}-{r}")
                finally:
                    if undo is not None:
                        undo()
                row = {"round": r, "kind": kind, "status": v.status, "decision": v.decision, "workloads": {}}
                for w in v.workloads:
                    oc = w.timing.outside_clock if w.timing else None
                    row["workloads"][w.uuid] = {
                        "decided_ms": w.latency_ms,
                        "inside_ms": oc.inside_ms if oc else None,
                        "outside_ms": oc.outside_ms if oc else None,
                        "windows": oc.windows if oc else None,
                        "loop_windows": oc.loop_windows if oc else None,
                        "paced_ms": oc.paced_ms if oc else None,
                        "paced_share": oc.paced_share if oc else None,
                        "paced_loops": oc.paced_loops if oc else None,
                        "paced_ratio": oc.paced_ms / oc.inside_ms if oc and oc.paced_ms and oc.inside_ms > 0 else None,
                        "calls": oc.run_iters if oc else None,
                    }
                rows.append(row)
                if undo is not None:
                    row["stalled_windows"] = len(undo.stalled)
                figures = " ".join(
                    f"{x['decided_ms']:.4f}" + (f" (paced {x['paced_ratio']:.2f}x)" if x["paced_ratio"] else "")
                    for x in row["workloads"].values()
                )
                log.info("round %d %-6s %s %s decided ms: %s", r, kind, v.status, v.decision, figures)
    finally:
        guard.close()
    summary = {}
    names = sorted({u for row in rows for u in row["workloads"]})
    for u in names:
        fig = {
            k: [row["workloads"][u]["decided_ms"] for row in rows if row["kind"] == k and u in row["workloads"]]
            for k in ("honest", "forger")
        }
        if fig["honest"] and fig["forger"]:
            summary[u] = {
                "honest_median_ms": statistics.median(fig["honest"]),
                "forger_median_ms": statistics.median(fig["forger"]),
                "forger_min_ms": min(fig["forger"]),
                "gain": statistics.median(fig["honest"]) / statistics.median(fig["forger"]),
                "worst_gain": statistics.median(fig["honest"]) / min(fig["forger"]),
            }
            log.info(
                "%-32s honest %.4f ms, forger %.4f ms (min %.4f): gain %.2fx, worst %.2fx",
                u,
                summary[u]["honest_median_ms"],
                summary[u]["forger_median_ms"],
                summary[u]["forger_min_ms"],
                summary[u]["gain"],
                summary[u]["worst_gain"],
            )
    if args.out:
        result = {"forger": args.forger, "stall": args.stall, "rows": rows, "summary": summary}
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
