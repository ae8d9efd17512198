"""``kernelarc profile`` and ``kernelarc verify``: a thin layer over ``wholemodel``."""

from __future__ import annotations

import argparse
import logging
import math
import sys
import tempfile
from pathlib import Path

from wholemodel import VERIFY_MEMORY_GB, VERIFY_TIMEOUT_S

from .. import render
from ..common import device_option, emit_json, open_workspace

log = logging.getLogger("kernelarc")

MODEL_HELP = """MODEL is a built-in block (llama_block, gpt2_block; append :small or :real, default real
on the GPU and small on the CPU) or a Python file defining
    build_model(device: str, dtype: torch.dtype) -> torch.nn.Module
    example_inputs(device: str, dtype: torch.dtype) -> tuple   # the forward's positional args
profile runs the file in this process; verify runs it with the kernels in the guard's
sandbox, which gets the file's text and shows no folder of yours (--in-process: in this
process, for a model that reads files beside it; --seeds also runs it here once, to find the
shapes the seed kernels are built for).
See docs/profiling.md for which modules kernels plug into."""


def _print(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _load(args):
    from wholemodel.loader import load

    lm = load(args.model, device=args.device, dtype=args.dtype)
    if lm.device == "cpu":
        from wholemodel.verify import use_triton_interpreter

        use_triton_interpreter()
    return lm


def _write_markdown(path: str | None, sections: list[tuple[str, str]]) -> None:
    if not path:
        return
    text = "\n\n".join(f"{title}\n\n{body}" if title else body for title, body in sections) + "\n"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
    log.info("wrote %s", path)


def cmd_profile(args) -> int:
    from wholemodel import tables
    from wholemodel.profile import profile_model

    if args.top is not None and args.top < 1:
        raise ValueError("--top must be at least 1")
    if args.reps < 1:
        raise ValueError("--reps must be at least 1")
    lm = _load(args)
    print(f"profiling {lm.name} on {lm.device} ({args.reps} forwards)...", file=sys.stderr)
    prof = profile_model(lm, reps=args.reps)
    written, skipped, imported = [], [], []
    if args.top:
        from wholemodel.problems import write_problems

        out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="kernelarc-profile-"))
        written, skipped = write_problems(prof, args.top, out_dir, prefix=args.prefix)
        if not args.no_import:
            store = open_workspace(args).problems()
            for folder in written:
                problem, _ = store.import_path(folder, replace=args.replace)
                imported.append(problem.name)
    if args.json:
        payload = prof.to_json()
        payload["problems_written"] = [str(f) for f in written]
        payload["problems_imported"] = imported
        payload["skipped"] = [{"family": e.family, "where": e.where, "share": e.share} for e in skipped]
        emit_json(payload)
        return 0
    _print(tables.profile_heading(prof))
    _print()
    _print("Kernels by time; 'model xF' is the whole model's speedup if that kernel alone got F times faster (Amdahl):")
    render.table(*tables.kernel_table(prof, args.limit))
    _print()
    render.table(*tables.family_table(prof))
    if args.top:
        _print()
        for e in skipped:
            _print(f"skipped {e.family} in {e.where} ({e.share:.1%}): no site where a kernel could be plugged in")
        for folder in written:
            _print(f"wrote {folder}")
        for name in imported:
            _print(f"imported {name}: start a swarm with  kernelarc launch --problem {name}")
    _write_markdown(
        args.markdown,
        [
            ("", tables.profile_heading(prof)),
            (
                "### Kernels by time (model xF: whole-model speedup if that kernel got F times faster)",
                tables.markdown(tables.kernel_table(prof, args.limit)),
            ),
            ("### By family", tables.markdown(tables.family_table(prof))),
        ],
    )
    return 0


# Where the machine has no sandbox, verify builds and runs its kernels in this process, as the
# user (red team, session 42: an accepted C++ kernel's load-time constructor ran a command there)
AGENT_KERNELS_REFUSED = (
    "--run and --candidate plug in kernels that agents wrote, and {why} verify would build and "
    "run them in this process, as you: a load-time constructor or a compile flag of theirs runs "
    "with your permissions. Read them first (the workspace's archive/<problem>/<agent>/"
    "<candidate>/sources/, or kernelarc export), then add --trust-agent-kernels"
)


def _kernel_sources(args, device: str):
    from guard.workspace import Workspace
    from wholemodel import sources

    found = []
    if args.run or args.candidate or args.kernel:
        ws = Workspace.open(args.workspace)
        found += [sources.from_run(ws, r) for r in args.run or []]
        found += [sources.from_candidate(ws, c) for c in args.candidate or []]
        found += [sources.from_kernel_file(ws, k) for k in args.kernel or []]
    if args.seeds:
        from wholemodel.loader import load
        from wholemodel.profile import profile_model

        print("profiling once to find the model's shapes for the seed kernels...", file=sys.stderr)
        lm = load(args.model, device=device, dtype=args.dtype)
        found += sources.seed_sources(profile_model(lm, reps=1, warmup=1), args.seeds)
        del lm  # the verification loads it again: none of its memory held meanwhile
        if device == "cuda":
            import torch

            torch.cuda.empty_cache()
    if not found:
        raise ValueError("no kernels: give --run RUN, --candidate ID, --kernel PROBLEM=FILE or --seeds")
    return found


def _isolation(args):
    """Where the job runs: the guard's sandbox, unless this machine has none or the user asks
    for this process; agents' kernels run in this process only with the user's consent."""
    from guard import sandbox

    isolation = sandbox.probe()
    why = None
    if args.in_process:
        why = "with --in-process"
    elif not isolation.available:
        why = f"this machine has no sandbox ({isolation.line()}), so"
    if why is not None and (args.run or args.candidate) and not args.trust_agent_kernels:
        raise ValueError(AGENT_KERNELS_REFUSED.format(why=why))
    return isolation if why is None else None


def cmd_verify(args) -> int:
    from guard.paths import cache_dir
    from guard.workspace import resolve_workspace_path
    from wholemodel import job as verify_job
    from wholemodel import sandboxed, tables
    from wholemodel.loader import model_spec, pick_device

    if (args.reps is not None and args.reps < 1) or not 0 < args.error_factor < math.inf:
        raise ValueError("--reps must be at least 1 and --error-factor a positive number")
    if not 0 < args.timeout_minutes < math.inf or not 0 < args.memory_gb < math.inf:
        raise ValueError("--timeout-minutes and --memory-gb must be positive numbers")
    device = pick_device(args.device)
    if device == "cpu":  # before anything imports triton in this process
        from wholemodel.verify import use_triton_interpreter

        use_triton_interpreter()
    isolation = _isolation(args)
    job = verify_job.VerifyJob(
        model=model_spec(args.model),
        device=device,
        dtype=args.dtype,
        kernels=[verify_job.KernelJob.of(s.problem, s.solution, s.origin) for s in _kernel_sources(args, device)],
        reps=args.reps or (20 if device == "cuda" else 5),
        diagnose=args.diagnose,
        factor=args.error_factor,
    )
    if isolation is not None:
        where = f"in the sandbox ({isolation.line()})"
        print(f"verifying {where}...", file=sys.stderr)
        result = sandboxed.run(
            job,
            protect=[resolve_workspace_path(args.workspace)],
            timeout_s=args.timeout_minutes * 60,
            memory_gb=args.memory_gb,
        )
    else:
        where = "in this process, without a sandbox"
        print(f"verifying {where}...", file=sys.stderr)
        result = verify_job.run(job, cache_dir() / "verify", lambda msg: print(msg + "...", file=sys.stderr))
    if args.json:
        emit_json({**result.to_json(), "ran": where})
        return 0 if result.ok else 1
    for line in tables.verify_summary(result):
        _print(line)
    _print(f"  ran {where}")
    _print()
    render.table(*tables.verify_table(result))
    if result.alone:
        _print()
        render.table(*tables.diagnose_table(result))
    sections = [
        ("", "\n".join([*tables.verify_summary(result), f"  ran {where}"])),
        ("### Per kernel, all plugged in", tables.markdown(tables.verify_table(result))),
    ]
    if result.alone:
        sections.append(("### Each kernel alone", tables.markdown(tables.diagnose_table(result))))
    _write_markdown(args.markdown, sections)
    return 0 if result.ok else 1


def _model_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("model", metavar="MODEL", help="llama_block, gpt2_block (:small/:real) or a Python file")
    device_option(s)
    s.add_argument("--dtype", help="default: bfloat16 on the GPU, float32 on the CPU")
    s.add_argument("--markdown", metavar="FILE", help="also write the tables as Markdown")
    s.add_argument("--json", action="store_true")


def add_parsers(sub) -> None:
    s = sub.add_parser(
        "profile",
        help="where a model's time goes, by op family, with an Amdahl plan",
        description=MODEL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _model_args(s)
    s.add_argument("--reps", type=int, default=5, help="profiled forwards (default 5)")
    s.add_argument("--limit", type=int, default=15, help="rows of the kernel table")
    s.add_argument(
        "--top", type=int, metavar="K", help="write the K largest kernels that have a site as problems and import them"
    )
    s.add_argument("--out", help="folder for the problems (default: a temporary folder)")
    s.add_argument("--prefix", help="problem name prefix (default: the model's name)")
    s.add_argument("--no-import", action="store_true", help="write the problems, do not import them")
    s.add_argument("--replace", action="store_true", help="replace imported problems of the same name")
    s.set_defaults(fn=cmd_profile)

    s = sub.add_parser(
        "verify",
        help="plug kernels into a model: end-to-end check and speedup",
        description=MODEL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _model_args(s)
    s.add_argument("--run", action="append", metavar="RUN", help="the best accepted kernel of a swarm run")
    s.add_argument("--candidate", action="append", metavar="ID", help="an accepted candidate, by id")
    s.add_argument("--kernel", action="append", metavar="PROBLEM=FILE", help="a kernel file for a problem")
    s.add_argument(
        "--seeds",
        nargs="?",
        const="triton",
        choices=["triton", "cuda"],
        help="the seed kernels (triton or cuda) on this model's shapes",
    )
    s.add_argument(
        "--in-process",
        action="store_true",
        help="run the model and kernels in this process rather than in the guard's sandbox (for a "
        "model that reads files beside its own, which the sandbox does not show); the default where "
        "there is no sandbox",
    )
    s.add_argument(
        "--trust-agent-kernels",
        action="store_true",
        help="allow --run and --candidate in this process (--in-process, or no sandbox here): "
        "their agent-written kernels are built and run with your permissions",
    )
    s.add_argument(
        "--timeout-minutes",
        type=float,
        default=VERIFY_TIMEOUT_S / 60,
        help="in the sandbox: stop the verification after this long (default %(default)g)",
    )
    s.add_argument(
        "--memory-gb",
        type=float,
        default=VERIFY_MEMORY_GB,
        help="in the sandbox: what its processes may hold together, where the machine has a memory "
        "cgroup (default %(default)g)",
    )
    s.add_argument("--diagnose", action="store_true", help="also try each kernel alone")
    s.add_argument("--reps", type=int, help="timed forwards of each kind (default 20 on the GPU, 5 on the CPU)")
    s.add_argument(
        "--error-factor",
        type=float,
        default=2.0,
        help="pass while the output's error (vs the model in higher precision) is within this "
        "many times the model's own, in relative L2 (twice that in max abs); default 2",
    )
    s.set_defaults(fn=cmd_verify)
