"""Judge the Python kernel-DSL seeds (CuTe DSL, cuTile, TileLang) through the guard on a GPU, as
an agent's submission is judged: screen, build, correctness, timing. One problem
(``rmsnorm_llama3_8b``), one seed per language, beside the problem's Triton seed as a baseline.

Usage: python3 -m benchmarks.dsl_seeds OUT_DIR [--only cute_dsl cutile tilelang] [--budget-s 360]
                                              [--no-baseline]
       python3 -m benchmarks.dsl_seeds --render RUN1/dsl_seeds.json [RUN2/dsl_seeds.json ...]

Installs nothing: the DSL packages must already be importable (on the GPU machine, wheels
unpacked onto PYTHONPATH by the caller). Each DSL's import is checked first, in a child process
with a time limit; a language that does not import, is refused, or fails is reported and the
run goes on with the next. Writes OUT_DIR/dsl_seeds.json and OUT_DIR/dsl_seeds.md, rewritten
after each language, and prints one line per language as it goes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.gpu_judge import (
    DSL_PACKAGES,
    SETTINGS,
    cutlass_path_fix,
    dsl_readiness,
    judge,
    merge_runs,
    open_guard,
    toolchain,
    versions,
)
from seeds import SEEDS_DIR

PROBLEM = "rmsnorm_llama3_8b"
# language -> (seed file in the problem's folder, module to import, distributions to report)
LANGUAGES = {lang: (f"seed_{lang}.py", module, dists) for lang, (module, dists) in DSL_PACKAGES.items()}
BASELINE = ("triton", "seed_triton.py")
TITLE = {"cute_dsl": "CuTe DSL", "cutile": "cuTile", "tilelang": "TileLang", "triton": "Triton (baseline)"}


def seed_files(problem: str = PROBLEM) -> dict[str, Path]:
    """The DSL seeds of ``problem`` that exist, by language."""
    folder = SEEDS_DIR / problem
    return {lang: folder / fname for lang, (fname, _, _) in LANGUAGES.items() if (folder / fname).is_file()}


def line(lang: str, e: dict) -> str:
    ms = e.get("median_ms")
    per_call = f"{ms * 1e3:.1f} us/call" if ms else "-"
    reason = e.get("reason") or ""
    return f"{lang}: {e.get('status')} {per_call} ({e.get('wall_s', 0):.0f} s){' - ' + reason[:300] if reason else ''}"


def render(r: dict) -> str:
    dev = r.get("device", {})
    lines = [
        f"Measured {r['date'][:10]} on {dev.get('name', '?')} by `python3 -m benchmarks.dsl_seeds` "
        f"(problem {r['problem']}; {SETTINGS}).",
        "",
        "| language | seed | packages | status | median us/call | eager us/call | speedup vs eager | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for lang, e in r["languages"].items():
        pkgs = ", ".join(f"{k} {v}" for k, v in (e.get("versions") or {}).items() if v) or "-"
        ms, eager, sp = e.get("median_ms"), e.get("eager_median_ms"), e.get("speedup_eager")
        lines.append(
            f"| {TITLE.get(lang, lang)} | {e.get('seed', '-')} | {pkgs} | {e.get('status')} | "
            f"{'-' if not ms else f'{ms * 1e3:.1f}'} | {'-' if not eager else f'{eager * 1e3:.1f}'} | "
            f"{'-' if not sp else f'{sp:.2f}x'} | {e.get('wall_s', 0):.0f} |"
        )
    fails = [(k, e) for k, e in r["languages"].items() if e.get("status") != "PASSED"]
    if fails:
        lines += ["", "Not passed:", ""]
        lines += [f"- {TITLE.get(k, k)}: {e.get('status')}: {e.get('reason')}" for k, e in fails]
    return "\n".join(lines)


def merge(results: list[dict]) -> dict:
    """Runs of one DSL each as one table: a language measured in a later run replaces an earlier
    one's entry, unless the later one did not get to run it (not installed, skipped)."""
    return merge_runs(results, "languages")


def write(out: Path, result: dict) -> None:
    (out / "dsl_seeds.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "dsl_seeds.md").write_text(render(result) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--only", nargs="+", choices=list(LANGUAGES), default=list(LANGUAGES))
    ap.add_argument(
        "--budget-s",
        type=float,
        default=360,
        help="languages not started by then are skipped (a started one runs to its end)",
    )
    ap.add_argument("--no-baseline", action="store_true", help="skip the problem's Triton seed")
    ap.add_argument(
        "--render",
        type=Path,
        nargs="+",
        metavar="RESULT_JSON",
        help="print the table of result files (one device call per DSL) and exit",
    )
    args = ap.parse_args()
    if args.render:
        print(render(merge([json.loads(p.read_text()) for p in args.render])))
        return 0
    if args.out is None:
        ap.error("OUT_DIR is needed (or --render RESULT.json)")
    t_start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    seeds = seed_files()
    result: dict = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "problem": PROBLEM,
        "python": sys.version.split()[0],
        "cutlass_path_added": cutlass_path_fix(),
        "toolchain": toolchain(),
        "languages": {},
    }

    # 1. which DSLs import here (before the guard starts its workers, which inherit PYTHONPATH)
    runnable = []
    for lang in args.only:
        fname = LANGUAGES[lang][0]
        entry = result["languages"][lang] = {"seed": fname}
        if lang not in seeds:
            entry.update(
                versions=versions(LANGUAGES[lang][2]), status="NO_SEED", reason=f"seeds/{PROBLEM}/{fname} is missing"
            )
        else:
            ready = dsl_readiness(lang)
            entry.update((k, v) for k, v in ready.items() if k != "ready")
            if ready["ready"]:
                runnable.append(lang)
        if lang not in runnable:
            print(line(lang, entry), flush=True)
    write(args.out, result)

    # 2. each seed through the guard, one at a time
    from guard.candidates.load import from_file

    todo = ([BASELINE[0]] if not args.no_baseline else []) + runnable
    if not todo:
        print(render(result))
        return 0
    with open_guard("dsl-seeds-") as guard:
        guard.warm_up()
        for lang in todo:
            path = SEEDS_DIR / PROBLEM / (BASELINE[1] if lang == BASELINE[0] else LANGUAGES[lang][0])
            entry = result["languages"].setdefault(lang, {"seed": path.name})
            if time.monotonic() - t_start > args.budget_s:
                entry.update(status="SKIPPED", reason=f"the run's budget of {args.budget_s:.0f} s was spent")
                print(line(lang, entry), flush=True)
                continue
            entry.update(judge(guard, lambda path=path: from_file(path), PROBLEM, agent=f"seed-{lang}"))
            print(line(lang, entry), flush=True)
            result["device"] = guard.device_info()
            write(args.out, result)
    result["total_s"] = time.monotonic() - t_start
    write(args.out, result)
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
