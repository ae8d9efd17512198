"""How much a busy agent process slows a timed CPU worker on the same core, by the agent's nice
value (``launcher.limits``): a pure-Python loop timed beside a busy loop pinned to the same core
at each nice value, against the loop timed alone just before and after. Prints a Markdown table.

    python -m benchmarks.nice_share [--repeats 7] [--nice 0 10 19]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

CORE = 0


def _work(n: int = 3_000_000) -> float:
    t0 = time.perf_counter()
    s = 0
    for i in range(n):
        s += i * i
    return time.perf_counter() - t0


def _timed(nice: int | None, repeats: int) -> float:
    hog = None
    if nice is not None:
        busy = [sys.executable, "-c", "while True: pass"]
        hog = subprocess.Popen(["taskset", "-c", str(CORE), "nice", "-n", str(nice), *busy])
        time.sleep(0.5)  # let the scheduler settle its share
    try:
        return statistics.median(_work() for _ in range(repeats))
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--nice", type=int, nargs="+", default=[0, 10, 19])
    args = ap.parse_args()
    os.sched_setaffinity(0, {CORE})
    # the machine's own speed drifts (a VM's clocks): each case is set against the loop timed
    # alone just before and just after it
    print("| busy process beside it | timed loop (median) | alone, before / after | x alone |")
    print("| --- | --- | --- | --- |")
    before = _timed(None, args.repeats)
    for nice in args.nice:
        t = _timed(nice, args.repeats)
        after = _timed(None, args.repeats)
        alone = (before + after) / 2
        print(f"| at nice {nice} | {t * 1e3:.0f} ms | {before * 1e3:.0f} / {after * 1e3:.0f} ms | {t / alone:.2f} |")
        before = after
    return 0


if __name__ == "__main__":
    sys.exit(main())
