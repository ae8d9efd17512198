"""Judge the SOL-ExecBench-format regression suite (``tests/data/sol-regression``) through the
guard on a GPU: every solution its ``manifest.json`` lists, or those of the languages given, each
against the verdict the manifest expects (honest ones PASSED, bugs and reward hacks REJECTed).

Usage: python3 -m benchmarks.sol_regression OUT_DIR [--only triton pytorch cuda_cpp ...] [--budget-s 480]
       python3 -m benchmarks.sol_regression --render RUN1/sol_regression.json [RUN2/sol_regression.json ...]

A device call carries one DSL's packages at most, so a whole run is one call for
``--only triton pytorch cuda_cpp`` and one per DSL (``--only tilelang``). Installs nothing: a DSL's
package must already be importable (wheels unpacked onto PYTHONPATH by the caller); a language
whose package is missing or does not import is reported as such, not judged. Prints one line per
solution as it goes (expected, got, time), writes OUT_DIR/sol_regression.json and
OUT_DIR/sol_regression.md after each, and exits 1 unless every selected solution got what the
manifest expects.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.gpu_judge import (
    SETTINGS,
    cutlass_path_fix,
    dsl_readiness,
    judge,
    merge_runs,
    open_guard,
    toolchain,
)
from guard.candidates.solution import LANGUAGES

SUITE = REPO / "tests" / "data" / "sol-regression"
EXAMPLES = REPO / "tests" / "data" / "sol-execbench-examples"


def load_manifest(suite: Path = SUITE) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads((suite / "manifest.json").read_text())
    return cases


def select(cases: list[dict[str, Any]], only: list[str] | None) -> list[dict[str, Any]]:
    """The cases in the languages ``only`` (all when None), in the manifest's order."""
    return [c for c in cases if only is None or c["language"] in only]


def expected(case: dict[str, Any]) -> str:
    want = case["expect"]
    return f"{want['decision']} {want['status']}"


def got(entry: dict[str, Any]) -> str:
    """What the run gave: a verdict's decision and status, or why there was none."""
    return f"{entry['decision']} {entry['status']}" if entry.get("decision") else str(entry.get("status"))


def as_expected(case: dict[str, Any], entry: dict[str, Any]) -> bool:
    want = case["expect"]
    verdict = (entry.get("decision"), entry.get("status")) == (want["decision"], want["status"])
    return verdict and want.get("reason", "") in (entry.get("reason") or "")


def line(name: str, e: dict[str, Any]) -> str:
    ms = e.get("median_ms")
    per_call = f", {ms * 1e3:.1f} us/call" if ms else ""
    mark = "ok" if e.get("as_expected") else "MISMATCH"
    reason = e.get("reason") or ""
    return (
        f"{name} [{e.get('language')}]: expected {e.get('expected')}, got {got(e)}: {mark} "
        f"({e.get('wall_s', 0):.0f} s{per_call}){' - ' + reason[:300] if reason else ''}"
    )


def render(r: dict[str, Any]) -> str:
    dev = r.get("device", {})
    sols = r["solutions"]
    ok = sum(1 for e in sols.values() if e.get("as_expected"))
    lines = [
        f"Run {r['date'][:10]} on {dev.get('name', '?')} by `python3 -m benchmarks.sol_regression` "
        f"({SETTINGS}): {ok} of {len(sols)} solutions got the verdict `tests/data/sol-regression/manifest.json` "
        "expects.",
        "",
        "| solution | language | problem | expected | got | as expected | median us/call | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, e in sols.items():
        ms = e.get("median_ms")
        lines.append(
            f"| {name} | {e.get('language')} | {e.get('problem')} | {e.get('expected')} | {got(e)} | "
            f"{'yes' if e.get('as_expected') else '**no**'} | {'-' if not ms else f'{ms * 1e3:.1f}'} | "
            f"{e.get('wall_s', 0):.0f} |"
        )
    notes = [(k, e) for k, e in sols.items() if e.get("reason")]
    if notes:
        lines += ["", "Reasons:", ""]
        lines += [f"- {k}: {e.get('status')}: {' '.join(str(e['reason']).split())[:400]}" for k, e in notes]
    return "\n".join(lines)


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs of a few languages each as one table: a solution judged in a later run replaces an
    earlier one's entry, unless the later one did not get to judge it (not installed, skipped)."""
    return merge_runs(results, "solutions")


def write(out: Path, result: dict[str, Any]) -> None:
    (out / "sol_regression.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "sol_regression.md").write_text(render(result) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--only", nargs="+", choices=LANGUAGES, metavar="LANG", help=f"of {', '.join(LANGUAGES)}")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=480,
        help="solutions not started by then are skipped (a started one runs to its end)",
    )
    ap.add_argument(
        "--render",
        type=Path,
        nargs="+",
        metavar="RESULT_JSON",
        help="print the table of result files (one device call per DSL) and exit",
    )
    args = ap.parse_args(argv)
    if args.render:
        print(render(merge([json.loads(p.read_text()) for p in args.render])))
        return 0
    if args.out is None:
        ap.error("OUT_DIR is needed (or --render RESULT.json)")
    t_start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    cases = select(load_manifest(), args.only)
    result: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "only": args.only,
        "cutlass_path_added": cutlass_path_fix(),
        "toolchain": toolchain(),
        "solutions": {},
    }

    # 1. which languages can be judged here (before the guard starts its workers, which inherit
    # PYTHONPATH): a DSL needs its package, importable
    readiness = {lang: dsl_readiness(lang) for lang in sorted({c["language"] for c in cases})}
    todo = []
    for case in cases:
        name = case["solution"].removesuffix(".json")
        ready = readiness[case["language"]]
        entry = result["solutions"][name] = {
            "problem": case["problem"],
            "language": case["language"],
            "requires": case["requires"],
            "expected": expected(case),
            **{k: v for k, v in ready.items() if k != "ready"},
        }
        if ready["ready"]:
            todo.append((name, case))
        else:
            entry["as_expected"] = False
            print(line(name, entry), flush=True)
    write(args.out, result)
    if not todo:
        print(render(result))
        return 1

    # 2. each solution through the guard, one at a time
    from guard.candidates.load import from_solution_json

    with open_guard("sol-regression-") as guard:
        guard.warm_up()
        for problem in sorted({c["problem"] for _, c in todo}):
            guard.store.import_path(EXAMPLES / problem)
        for name, case in todo:
            entry = result["solutions"][name]
            if time.monotonic() - t_start > args.budget_s:
                entry.update(status="SKIPPED", reason=f"the run's budget of {args.budget_s:.0f} s was spent")
                entry["as_expected"] = False
                print(line(name, entry), flush=True)
                continue
            definition = json.loads((EXAMPLES / case["problem"] / "definition.json").read_text())["name"]
            text = (SUITE / case["solution"]).read_text()
            entry.update(judge(guard, lambda text=text: from_solution_json(text), definition, agent=name))
            entry["as_expected"] = as_expected(case, entry)
            print(line(name, entry), flush=True)
            result["device"] = guard.device_info()
            write(args.out, result)
    result["total_s"] = time.monotonic() - t_start
    write(args.out, result)
    print(render(result))
    return 0 if all(e.get("as_expected") for e in result["solutions"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
