"""Every KernelBench file's reference, run through the weightless model ``run()`` now calls.

An imported KernelBench reference calls its ``Model`` with the weights it is given
(``torch.func.functional_call``). That model is built on the meta device when every tensor it
holds is in its state_dict (``_ka_shell`` in the generated adapter), else as the file says.
For each file this imports it, makes the CPU workload's inputs, runs the reference with the
model kept from making them (real weights), then with the shell, and compares. Prints one
line per file that differs or fails, and a summary; exits 1 if any did.

    python -m benchmarks.kernelbench_shells [--root ../shared/datasets/kernelbench] [--only level3/]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from guard.problems.kernelbench_import import KernelBenchProber, import_kernelbench_file
from guard.runner.common import load_module_from_source, normalize_outputs

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "kernelbench"


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    return torch.allclose(a, b, atol=1e-6, rtol=1e-5, equal_nan=True)


def check_file(path: Path, prober: KernelBenchProber, scratch: Path) -> tuple[str, bool]:
    """(where the shell lives: "meta" or "device", whether it gave the kept model's outputs)."""
    problem, _ = import_kernelbench_file(path, prober)
    d = problem.definition
    axes = d.resolve_axes(d.kernelarc.cpu_workloads[0].axes)
    module = load_module_from_source(d.reference, scratch / path.stem, "reference")
    torch.manual_seed(0)
    values = module.generate_inputs(dict(axes), "cpu")
    args = [values[n] for n in d.inputs]
    torch.manual_seed(1)
    names = list(d.outputs)
    kept = normalize_outputs(module.run(*args), names)  # the CPU keeps the model its inputs came from
    module._ka_models.clear()
    params = list(module._ka_model("cpu").parameters())
    where = "meta" if all(p.is_meta for p in params) else "device"
    torch.manual_seed(1)
    shell = normalize_outputs(module.run(*args), names)
    return where, len(kept) == len(shell) and all(_same(a, b) for a, b in zip(kept, shell))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    ap.add_argument("--only", default="", help="only files whose path contains this")
    args = ap.parse_args()
    files = [f for f in sorted(args.root.glob("level*/*.py")) if args.only in str(f)]
    scratch = Path(tempfile.mkdtemp(prefix="kb-shells-"))
    counts = {"meta": 0, "device": 0}
    bad = 0
    with KernelBenchProber() as prober:
        for path in files:
            name = f"{path.parent.name}/{path.name}"
            try:
                where, same = check_file(path, prober, scratch)
            except Exception as exc:  # noqa: BLE001 - reported, and the check goes on
                bad += 1
                print(f"ERROR {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            counts[where] += 1
            if not same:
                bad += 1
                print(f"DIFFERS {name} ({where})", flush=True)
    print(f"{len(files)} files: {counts['meta']} on the meta device, {counts['device']} built for real, {bad} bad")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
