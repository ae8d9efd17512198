"""How the held atol (``guard/runner/held_atol.py``) judges honest seed kernels, and the
stand-ins an audit found passing, at the seeds' real sizes.

Per seed problem, workload and round kind (inputs made by the guard's ``InputMaker``, as in a
correctness round): the reference in its dtypes, the same in float64, the problem's Triton
seed, and three stand-ins: zeros, the reference scaled by 0.9, and the reference rounded
through bfloat16 (a float32 problem answered in bf16). Each output is judged as the trusted
worker judges it (the reference, then before a numerical failure stands the float64 reference,
the reference's own error its floor; adversarial rounds with the row allowance), once with the
stated atol and once held. The JSON lists every judgement; stdout a table per problem and
candidate: rounds passed, stated and held.

Usage: python -m benchmarks.tolerance_probe OUT.json [--only NAME ...] [--device cuda]
       [--kinds normal mixed large tiny] [--workloads N] [--budget-s 420]
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import functools
import importlib.util
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from guard.problems import tolerance  # noqa: E402
from guard.problems.problem import load_problem  # noqa: E402
from guard.runner.common import load_module_from_source, normalize_outputs  # noqa: E402
from guard.runner.compare import judge, spec_args  # noqa: E402
from guard.runner.held_atol import held_atol, reference_gap, rms  # noqa: E402
from guard.runner.inputs import InputMaker  # noqa: E402
from seeds import SEEDS_DIR  # noqa: E402

log = logging.getLogger("tolerance_probe")
SEED = 20261206


def _judge(out: Any, ref: torch.Tensor, exact: Any, tol: dict, row_scaled: bool, scale: bool) -> tuple[bool, str]:
    """(passed, by what), as the guard decides (``compare.judge``). ``exact``: a callable giving
    the float64 output, or None where it cannot run."""
    if not isinstance(out, torch.Tensor):
        return False, "not a tensor"
    kw = {"row_scaled": row_scaled, "scale": scale, **spec_args(tol)}
    report = judge(out, ref, exact, tol["atol"], tol["rtol"], **kw)
    if report["ok"]:
        return True, report.get("via", "reference")
    return False, str(report.get("message", report["status"]))[:300]


def _float64_outputs(module: Any, args: list[Any], names: list[str]) -> list[Any]:
    """The reference on the same inputs widened to float64 (``TrustedRole._run_reference``)."""
    wide = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    with torch.no_grad():
        return normalize_outputs(module.run(*wide), names)


def _nth(outputs: Any, j: int) -> Any:
    return outputs()[j]


def _seed_module(problem_dir: Path):
    path = problem_dir / "seed_triton.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"seed_{problem_dir.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stand_ins(refs: list[Any]) -> dict[str, list[Any]]:
    def each(f):
        return [f(r) if isinstance(r, torch.Tensor) and r.is_floating_point() else r for r in refs]

    return {
        "zeros": each(torch.zeros_like),
        "scaled_0.9": each(lambda r: (r.double() * 0.9).to(r.dtype)),
        "via_bf16": each(lambda r: r.to(torch.bfloat16).to(r.dtype)),
    }


def probe_problem(
    name: str,
    device: str,
    kinds: list[str],
    most: int | None,
    deadline: float,
    kernels: bool = True,
    gaps: bool = False,
) -> list[dict]:
    """Rows of judgements for one seed problem. ``kernels``: the Triton seed too (slow in the
    CPU's interpreter); ``gaps``: each row also holds its reference's gap to float64 as a share
    of the float64 output's RMS (``held_atol.NOISE_SHARE`` keeps the stated atol above it)."""
    folder = SEEDS_DIR / name
    problem = load_problem(folder, "seed")
    d = problem.definition.to_json()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        module = load_module_from_source(d["reference"], Path(tmp), "reference")
        maker = InputMaker(d, torch.device(device), module, str(problem.root) if problem.root else None)
        seed_mod = _seed_module(folder) if kernels else None
        names = list(d["outputs"])
        workloads = problem.workloads[:most] if most else problem.workloads
        for w in workloads:
            tols = {k: t.message() for k, t in tolerance.for_workload(problem.definition, w).items()}
            wd = w.model_dump(mode="json")
            for kind in kinds:
                if time.monotonic() > deadline:
                    log.warning("budget spent: stopping at %s %s %s", name, w.uuid, kind)
                    return rows
                args = maker.make(wd, problem.definition.resolve_axes(w.axes), SEED, kind)
                with torch.no_grad():
                    refs = normalize_outputs(module.run(*args), names)
                if not all(
                    torch.isfinite(r).all() for r in refs if isinstance(r, torch.Tensor) and r.is_floating_point()
                ):
                    continue  # the guard drops a round whose reference is not finite
                exact_all = functools.cache(functools.partial(_float64_outputs, module, args, names))
                candidates = _stand_ins(refs)
                if seed_mod is not None:
                    try:
                        candidates["seed_triton"] = normalize_outputs(
                            seed_mod.run(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args]), names
                        )
                    except Exception as exc:  # noqa: BLE001 - reported as the seed's failure
                        log.warning("%s %s: the seed failed: %s", name, w.uuid, exc)
                if device == "cuda":
                    torch.cuda.synchronize()
                for cand, outs in candidates.items():
                    for j, (out, ref) in enumerate(zip(outs, refs)):
                        if not (isinstance(ref, torch.Tensor) and ref.is_floating_point()):
                            continue
                        tol = tols[names[j]]
                        adversarial = kind != "normal"
                        row = {
                            "problem": name,
                            "workload": w.uuid,
                            "kind": kind,
                            "candidate": cand,
                            "output": names[j],
                            "atol": tol["atol"],
                            "rtol": tol["rtol"],
                            "rms": rms(ref),
                        }
                        row["held_atol"] = held_atol(tol["atol"], tol["rtol"], row["rms"]).atol
                        hi = exact_all()[j] if gaps else None
                        if hi is not None and hi.is_floating_point():
                            row["gap_share"] = reference_gap(ref, hi).rms / max(rms(hi), 1e-300)

                        exact_j = functools.partial(_nth, exact_all, j)
                        row["stated_ok"], row["stated_by"] = _judge(out, ref, exact_j, tol, adversarial, False)
                        row["held_ok"], row["held_by"] = _judge(out, ref, exact_j, tol, adversarial, True)
                        rows.append(row)
                del args, refs, candidates, exact_all
            log.info("%s %s done", name, w.uuid)
    return rows


def summarize(rows: list[dict]) -> str:
    """Per problem and candidate: outputs judged, passed with the stated atol, passed held."""
    table: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for r in rows:
        t = table[(r["problem"], r["candidate"])]
        t[0] += 1
        t[1] += bool(r["stated_ok"])
        t[2] += bool(r["held_ok"])
    lines = [f"{'problem':40s} {'candidate':12s} {'judged':>6s} {'stated':>6s} {'held':>6s}"]
    for (p, c), (n, s, h) in sorted(table.items()):
        lines.append(f"{p:40s} {c:12s} {n:6d} {s:6d} {h:6d}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--kinds", nargs="*", default=["normal", "mixed", "large", "tiny"])
    ap.add_argument("--workloads", type=int, default=None, help="the first N workloads of each problem")
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--no-kernels", action="store_true", help="the stand-ins only, not the Triton seeds")
    ap.add_argument("--gaps", action="store_true", help="each reference's gap to float64, as a share of its size")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    names = a.only or sorted(p.name for p in SEEDS_DIR.iterdir() if (p / "definition.json").is_file())
    deadline = time.monotonic() + a.budget_s
    rows: list[dict] = []
    for name in names:
        try:
            rows += probe_problem(name, a.device, a.kinds, a.workloads, deadline, not a.no_kernels, a.gaps)
        except Exception as exc:  # noqa: BLE001 - one problem's failure is reported, the rest go on
            log.error("%s: %s: %s", name, type(exc).__name__, exc)
            rows.append({"problem": name, "error": f"{type(exc).__name__}: {exc}"[:500]})
        a.out.write_text(
            json.dumps(
                {"date": dt.datetime.now(dt.UTC).isoformat(), "device": _device(a.device), "rows": rows}, indent=1
            )
        )
        print(summarize([r for r in rows if "error" not in r and r["problem"] == name]), flush=True)
    print(summarize([r for r in rows if "error" not in r]), flush=True)
    shares = [r for r in rows if "gap_share" in r and r["candidate"] == "zeros"]
    if shares:
        worst = max(shares, key=lambda r: r["gap_share"])
        print(
            f"largest reference gap to float64: {worst['gap_share']:.3g} of the output's size "
            f"({worst['problem']} {worst['workload']} {worst['kind']} {worst['output']}) over {len(shares)} outputs",
            flush=True,
        )
    honest_misses = [r for r in rows if r.get("candidate") == "seed_triton" and r["stated_ok"] and not r["held_ok"]]
    for r in honest_misses:
        print(f"HONEST SEED NEWLY REJECTED: {r['problem']} {r['workload']} {r['kind']} {r['output']}: {r['held_by']}")
    return 0


def _device(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


if __name__ == "__main__":
    raise SystemExit(main())
