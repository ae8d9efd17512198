"""Human-readable output for the command line: tables and a progress line (stderr)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from guard.printable import printable


def table(headers: list[str], rows: list[list[Any]], out: TextIO = sys.stdout) -> None:
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    print(line.rstrip(), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), file=out)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 100:
            return f"{v:.1f}"
        if abs(v) >= 1:
            return f"{v:.3f}"
        return f"{v:.4g}"
    return printable(str(v))  # names and notes may come from agents' files


def ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1e3:.1f} us" if v < 1 else f"{v:.3f} ms"


class ProgressLine:
    """A one-line progress bar on stderr; plain lines when stderr is not a terminal."""

    def __init__(self, out: TextIO = sys.stderr, enabled: bool = True):
        self.out = out
        self.enabled = enabled
        self.tty = out.isatty()
        self.t0 = time.monotonic()
        self.last_phase = None

    def __call__(self, phase: str, done: int, total: int, detail: str) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.t0
        if self.tty:
            width = 24
            filled = int(width * done / total) if total else width
            bar = "#" * filled + "." * (width - filled)
            text = f"\r{phase:<11} [{bar}] {done}/{total} {detail[:50]:<50} {elapsed:5.1f}s"
            self.out.write(text)
            self.out.flush()
        elif phase != self.last_phase or done == total:
            self.out.write(f"[{elapsed:6.1f}s] {phase}: {done}/{total} {detail}\n")
            self.out.flush()
        self.last_phase = phase

    def finish(self) -> None:
        if self.enabled and self.tty:
            self.out.write("\r" + " " * 110 + "\r")
            self.out.flush()


def verdict(v, out: TextIO = sys.stdout) -> None:
    """A verdict as a short report and a per-workload table."""
    print(f"candidate  {v.candidate_id}  ({v.agent} on {v.problem})", file=out)
    print(f"decision   {v.decision}   status {v.status}" + (f"   gate {v.gate}" if v.gate else ""), file=out)
    print(f"reason     {v.reason}", file=out)
    if v.diagnostic and v.diagnostic.strip() not in v.reason:
        print("diagnostic", file=out)
        for line in v.diagnostic.splitlines()[:25]:
            print(f"  {line}", file=out)
    if v.decision != "REJECT":
        print(
            f"score      SOL {_fmt(v.score)}   speedup vs eager {_fmt(v.speedup_eager)}x   vs compile "
            f"{_fmt(v.speedup_compile)}x   fraction of SOL {_fmt(v.sol_fraction)}",
            file=out,
        )
    if v.workloads:
        print(file=out)
        table(
            ["workload", "axes", "latency", "eager", "compile", "SOL time", "bound", "speedup", "SOL score"],
            [
                [
                    w.uuid[-40:],
                    ",".join(f"{k}={x}" for k, x in w.axes.items())[:28],
                    ms(w.latency_ms),
                    ms(w.eager_ms),
                    ms(w.compile_ms),
                    ms(w.sol_ms),
                    w.bound,
                    w.speedup_eager,
                    w.sol_score,
                ]
                for w in v.workloads
            ],
            out,
        )
    if v.checked.rounds is not None:  # none when correctness did not pass
        c = v.checked
        print(
            f"\nchecked    {c.visible_workloads} visible + {c.heldout_workloads} held-out "
            f"workloads, {c.rounds} rounds" + (", determinism" if c.determinism else ""),
            file=out,
        )
    for r in v.repeats:
        print(f"repeats    {r}", file=out)
    print(f"advice     {v.advice.message}", file=out)
    for t in v.advice.tried:
        print(f"  tried    {t}", file=out)
    if v.phases_s:
        print("time       " + "  ".join(f"{k} {s:.1f}s" for k, s in v.phases_s.items()), file=out)
