"""The launcher's live view: one line per agent on stderr, redrawn in place on a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


class LiveView:
    def __init__(self, out: TextIO = sys.stderr, every_s: float = 2.0):
        self.out = out
        self.tty = out.isatty()
        self.every_s = every_s
        self.lines = 0
        self.last = 0.0
        self.last_text = ""
        self.t0 = time.monotonic()

    def __call__(self, runs, note: str | None = None) -> None:
        now = time.monotonic()
        header = f"{'agent':<30} {'client':<8} {'state':<9} {'tries':>5} {'best':>7}  last verdict            advice"
        rows = [
            f"{r.spec.name[:30]:<30} {r.spec.client:<8} {r.state:<9} {r.attempts:>5} {_fmt(r.best_score):>7}  "
            f"{(r.last_decision or '-')[:22]:<22}  {r.advice or '-'}"
            for r in runs
        ]
        text = "\n".join([f"swarm {now - self.t0:6.0f}s" + (f"  {note}" if note else ""), header, *rows])
        if self.tty:
            if self.lines:
                self.out.write(f"\x1b[{self.lines}F\x1b[J")
            self.out.write(text + "\n")
            self.lines = text.count("\n") + 1
        elif text.split("\n", 1)[1] != self.last_text.split("\n", 1)[-1] or now - self.last > 60:
            self.out.write(text + "\n")
            self.last = now
        self.last_text = text
        self.out.flush()
