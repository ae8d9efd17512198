"""One cheat file judged again and again, each time in a fresh workspace (a new secret, so new
seeds for every round and timed call), with the tests' fast settings and the static screen on
or off: how often a cheat whose detection is a matter of chance gets through. Prints each
verdict's status and reason.

    python -m benchmarks.cheat_repeat tests/cheats/phase_by_version_assumes_standard_normal.py --runs 10 [--screen-off]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from collections import Counter
from pathlib import Path

from benchmarks.harness import CHEATS, REPO, fast_config, submit_cheat

log = logging.getLogger("cheat_repeat")
SOL_EXAMPLES = REPO / "tests" / "data" / "sol-execbench-examples"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cheat", type=Path, help="a file in tests/cheats/")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--screen-off", action="store_true", help="judge by the run-time defences alone")
    args = parser.parse_args(argv)
    path = args.cheat if args.cheat.is_file() else CHEATS / args.cheat
    if not path.is_file():
        parser.error(f"no cheat file {args.cheat}")

    from guard.cascade import Guard
    from guard.workspace import Workspace

    seen: Counter[str] = Counter()
    for i in range(args.runs):
        ws = Path(tempfile.mkdtemp(prefix="cheat-repeat-")) / "ws"
        cfg = fast_config(static_screen=not args.screen_off, call_timeout_s=10)
        guard = Guard(Workspace.open(ws), cfg, device="cpu")
        guard.store.import_path(SOL_EXAMPLES / "softmax_h4096")  # the problem of a cheat that names it
        try:
            v = submit_cheat(guard, path, f"repeat-{i}")
        finally:
            guard.close()
        seen[v.status] += 1
        log.info("%d %s %s", i, v.status, (v.reason or "")[:200])
    log.info("%s: %s", path.stem, ", ".join(f"{k} {n}" for k, n in seen.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
