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
import importlib.metadata
import importlib.util
import json
import os
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from seeds import SEEDS_DIR

PROBLEM = "rmsnorm_llama3_8b"
# language -> (seed file in the problem's folder, module to import, distributions to report)
LANGUAGES = {
    "cute_dsl": ("seed_cute_dsl.py", "cutlass.cute", ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base")),
    "cutile": ("seed_cutile.py", "cuda.tile", ("cuda-tile", "nvidia-cuda-tileiras", "nvidia-cuda-nvcc", "nvidia-nvvm")),
    "tilelang": ("seed_tilelang.py", "tilelang", ("tilelang", "apache-tvm-ffi", "z3-solver")),
}
BASELINE = ("triton", "seed_triton.py")
IMPORT_TIMEOUT_S = 180
TITLE = {"cute_dsl": "CuTe DSL", "cutile": "cuTile", "tilelang": "TileLang", "triton": "Triton (baseline)"}


def seed_files(problem: str = PROBLEM) -> dict[str, Path]:
    """The DSL seeds of ``problem`` that exist, by language."""
    folder = SEEDS_DIR / problem
    return {lang: folder / fname for lang, (fname, _, _) in LANGUAGES.items() if (folder / fname).is_file()}


def cutlass_path_fix() -> str | None:
    """nvidia-cutlass-dsl puts its ``cutlass`` package on sys.path through a .pth file, which
    Python reads only in site-packages folders, not in a PYTHONPATH folder (wheels unpacked with
    ``pip install --target``). Read it as site-packages would, and add what it adds to PYTHONPATH
    too, for the guard's workers, which inherit it. Returns what was added, or None."""
    try:
        if importlib.util.find_spec("cutlass") is not None:
            return None
    except (ImportError, ValueError):
        return None
    before = list(sys.path)
    for folder in before:
        if folder and Path(folder).is_dir() and any(Path(folder).glob("nvidia_cutlass_dsl*.pth")):
            site.addsitedir(folder)
    added = [p for p in sys.path if p not in before]
    if not added:
        return None
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), *added) if p)
    return os.pathsep.join(added)


def versions(dists: tuple[str, ...]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for d in dists:
        try:
            out[d] = importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            out[d] = None
    return out


def check_import(module: str) -> tuple[bool, float, str]:
    """Import ``module`` in a child process (a DSL's import can be slow, touch the GPU or crash):
    whether it worked, how long it took, and the end of its error."""
    t = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", f"import {module}"],
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
            env=dict(os.environ),
        )
    except subprocess.TimeoutExpired:
        return False, time.monotonic() - t, f"import {module} took more than {IMPORT_TIMEOUT_S} s"
    ok = proc.returncode == 0
    tail = "" if ok else (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:300]
    return ok, time.monotonic() - t, tail


def toolchain() -> dict[str, str | None]:
    """Where the compilers the DSLs call were found (nvcc for TileLang; tileiras for cuTile, which
    takes the pip one from the first folder of ``nvidia.cu13``, else the one on PATH)."""
    out: dict[str, str | None] = {name: shutil.which(name) for name in ("nvcc", "ptxas", "tileiras")}
    out["CUDA_HOME"] = os.environ.get("CUDA_HOME")
    try:
        spec = importlib.util.find_spec("nvidia.cu13")
    except (ImportError, ValueError):
        spec = None
    out["nvidia.cu13"] = os.pathsep.join(spec.submodule_search_locations or []) if spec else None
    return out


def summarize(v, wall_s: float) -> dict:
    ws = v.workloads
    return {
        "status": v.status,
        "decision": v.decision,
        "reason": v.reason if v.status != "PASSED" else None,
        "median_ms": statistics.median(w.latency_ms for w in ws) if ws else None,
        "eager_median_ms": statistics.median(w.eager_ms for w in ws if w.eager_ms) if ws else None,
        "speedup_eager": v.speedup_eager,
        "wall_s": wall_s,
        "per_workload": [{"uuid": w.uuid, "axes": w.axes, "ms": w.latency_ms, "eager_ms": w.eager_ms} for w in ws],
    }


def line(lang: str, e: dict) -> str:
    ms = e.get("median_ms")
    per_call = f"{ms * 1e3:.1f} us/call" if ms else "-"
    reason = e.get("reason") or ""
    return f"{lang}: {e.get('status')} {per_call} ({e.get('wall_s', 0):.0f} s){' - ' + reason[:300] if reason else ''}"


def render(r: dict) -> str:
    dev = r.get("device", {})
    lines = [
        f"Measured {r['date'][:10]} on {dev.get('name', '?')} by `python3 -m benchmarks.dsl_seeds` "
        f"(problem {r['problem']}; guard defaults except 0.1 s of timing per workload, at most 300 "
        "iterations, no torch.compile baseline).",
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
    out = dict(results[0], languages={})
    for r in results:
        for lang, e in r["languages"].items():
            old = out["languages"].get(lang)
            if old is None or e.get("status") not in ("NOT_INSTALLED", "SKIPPED", "NO_SEED"):
                out["languages"][lang] = e
        out["device"] = r.get("device") or out.get("device", {})
    return out


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
    from guard.builders import dsl_refusal

    runnable = []
    for lang in args.only:
        fname, module, dists = LANGUAGES[lang]
        entry = result["languages"][lang] = {"seed": fname, "versions": versions(dists)}
        if lang not in seeds:
            entry.update(status="NO_SEED", reason=f"seeds/{PROBLEM}/{fname} is missing")
        elif refusal := dsl_refusal(lang, "cuda"):
            entry.update(status="NOT_INSTALLED", reason=refusal)
        else:
            ok, secs, err = check_import(module)
            entry["import_s"] = secs
            if ok:
                runnable.append(lang)
            else:
                entry.update(status="IMPORT_FAILED", reason=f"import {module}: {err}")
        if lang not in runnable:
            print(line(lang, entry), flush=True)
    write(args.out, result)

    # 2. each seed through the guard, one at a time
    from guard.candidates.load import from_file
    from guard.cascade import Guard, GuardError
    from guard.config import GuardConfig
    from guard.workspace import Workspace

    todo = ([BASELINE[0]] if not args.no_baseline else []) + runnable
    if not todo:
        print(render(result))
        return 0
    ws = Workspace.open(Path(tempfile.mkdtemp(prefix="dsl-seeds-")) / "ws")
    cfg = GuardConfig(target_time_s=0.1, max_iters=300, compile_baseline=False, build_timeout_s=240)
    with Guard(ws, cfg, device="cuda") as guard:
        guard.warm_up()
        for lang in todo:
            path = SEEDS_DIR / PROBLEM / (BASELINE[1] if lang == BASELINE[0] else LANGUAGES[lang][0])
            entry = result["languages"].setdefault(lang, {"seed": path.name})
            if time.monotonic() - t_start > args.budget_s:
                entry.update(status="SKIPPED", reason=f"the run's budget of {args.budget_s:.0f} s was spent")
                print(line(lang, entry), flush=True)
                continue
            t = time.monotonic()
            try:
                v = guard.evaluate(from_file(path), PROBLEM, agent=f"seed-{lang}")
                entry.update(summarize(v, time.monotonic() - t))
            except GuardError as exc:  # refused before anything ran
                entry.update(status="REFUSED", reason=str(exc)[:2000], wall_s=time.monotonic() - t)
            except Exception as exc:  # one language's failure must not end the run
                entry.update(status="ERROR", reason=f"{type(exc).__name__}: {exc}"[:2000], wall_s=time.monotonic() - t)
            print(line(lang, entry), flush=True)
            result["device"] = guard.device_info()
            write(args.out, result)
    result["total_s"] = time.monotonic() - t_start
    write(args.out, result)
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
