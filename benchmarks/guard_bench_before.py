"""The guard as it was before issue 15 (commit f1a31cc), timed by its own guard_bench studies.

Issue 15 asks for guard_bench "before and after, in one run". The old guard_bench always runs
every latency problem, rmsnorm first, so a device call cannot afford it beside the current one.
This driver imports the old tree's own `latency_study` and `spread_study` (the code that
produced the 11.3 s of 2026-11-29) and runs only what is asked, writing JSON as it goes:

    git archive f1a31cc | tar -x -C .before && echo f1a31cc > .before/TREE_REV   # carried
    cd .before && python3 ../benchmarks/guard_bench_before.py OUT \
        --latency-problem attn_out_proj --warm-runs 2 --resubmissions 50

It must run with the old tree as the working directory, so that its `guard` package is the
one imported.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger("guard_bench_before")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--tree", type=Path, default=Path.cwd(), help="the old checkout (default: the working directory)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--latency-problem", default=None, help="a seed or SOL problem whose name contains this")
    ap.add_argument("--warm-runs", type=int, default=2)
    ap.add_argument("--resubmissions", type=int, default=0, help="0 skips the spread study")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    tree = args.tree.resolve()
    if not (tree / "guard" / "pipeline.py").is_file():
        ap.error(f"{tree} is not a pre-issue-15 checkout (it has no guard/pipeline.py)")
    sys.path.insert(0, str(tree))
    old = __import__("benchmarks.guard_bench", fromlist=["latency_study"])
    if Path(old.__file__).resolve().parents[1] != tree:
        ap.error(f"imported {old.__file__}, not the old tree's guard_bench: run from {tree}")
    from guard.pipeline import Guard  # the old tree's, checked above through its benchmarks
    from guard.workspace import Workspace
    from seeds import SEEDS_DIR

    args.out.mkdir(parents=True, exist_ok=True)
    # `git archive` leaves no .git: the archive's commit is written beside it as TREE_REV
    named = tree / "TREE_REV"
    rev = named.read_text().strip() if named.is_file() else "unknown (no TREE_REV file)"
    result: dict = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "tree": str(tree),
        "tree_rev": rev,
    }

    def save() -> None:
        (args.out / "guard_bench.json").write_text(json.dumps(result, indent=2, default=str))

    ws = Workspace.open(Path(tempfile.mkdtemp(prefix="guard-bench-before-")) / "ws")
    ws.problems().import_path(old.SOL / "rmsnorm_h4096")
    ws.problems().import_path(old.SOL / old.JAMBA)
    with Guard(ws, ws.config(), device=args.device) as guard:
        t0 = time.monotonic()
        guard.warm_up()
        result["warm_up_s"] = time.monotonic() - t0
        result["device"] = guard.device_info()
        save()
        if args.latency_problem:
            seeds = sorted(p for p in SEEDS_DIR.glob("*/seed_triton.py") if args.latency_problem in p.parent.name)
            if not seeds:
                ap.error(f"no Triton seed's problem contains {args.latency_problem!r}")
            problem, source = seeds[0].parent.name, seeds[0].read_text()
            log.info("latency study of %s, %d warm runs", problem, args.warm_runs)
            result["latency"] = [old.latency_study(guard, problem, source, args.warm_runs)]
            save()
        if args.resubmissions:
            rms_seed = (SEEDS_DIR / "rmsnorm_llama3_8b" / "seed_triton.py").read_text()
            log.info("spread study, %d resubmissions", args.resubmissions)
            result["spread"] = old.spread_study(guard, "rmsnorm_h4096", rms_seed, args.resubmissions)
            save()
    print(old.render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
