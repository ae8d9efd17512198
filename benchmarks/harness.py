"""What the benchmarks share with the tests: the fast guard settings, a workspace that uses
them, the ``kernelarc`` command in a subprocess, a served workspace over HTTP, the cheat
files of ``tests/cheats`` (read as data, with their EXPECT lines), and a staller that holds
a process off its core as a busy machine would. The tests import these
through ``tests/helpers.py``; nothing here imports the tests."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHEATS = REPO / "tests" / "cheats"
RMS = "rmsnorm_llama3_8b"
# The documented pipeline with fewer iterations, so the suite stays quick on 2 cores: the one
# set of fast settings, for a guard made in-process (fast_config) and for a workspace a
# ``kernelarc`` subprocess opens (fast_workspace).
FAST = {
    "compile_baseline": False,
    "min_iters": 3,
    "max_iters": 10,
    "target_time_s": 0.01,
    "warmup_time_s": 0.0,
    # budgets a loaded 2-core machine meets (a hung call's test sets its own, shorter timeout)
    "call_timeout_s": 120,
    "build_timeout_s": 900,
    "correctness_rounds": 2,
    # CPU outside-clock windows of 15 ms, not 50: a pairing re-measures both candidates' windows
    # many times (at 50 ms a verdict with a pairing took 13.7 s against 9.8 s), and the tests
    # check the mechanisms, which do not depend on the length
    "outside_window_s_cpu": 0.015,
    # two CPU workloads per problem, not four: the smallest two, where a call is shortest and
    # timing is hardest; the larger ones cost most of an RMSNorm verdict's draws and checks
    "cpu_workloads": 2,
}


def fast_config(**overrides):
    from guard.config import GuardConfig

    return GuardConfig(**{**FAST, **overrides})


def fast_workspace(path: Path, **overrides) -> Path:
    """A workspace folder whose config.json holds the fast settings (and ``overrides``)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**FAST, **overrides}))
    return path


def kernelarc(
    ws: Path, *args: str, check: bool = True, timeout: float = 600, stdin: int | None = None
) -> subprocess.CompletedProcess:
    """``kernelarc --workspace WS ARGS`` as a user runs it; with ``check`` it must succeed.
    ``stdin``: a descriptor for its standard input (a terminal's, say); else none."""
    proc = subprocess.run(
        [sys.executable, "-m", "kernelarc_mcp.cli", "--workspace", str(ws), *args],
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ),
        timeout=timeout,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def in_fresh_process(module: str, env: dict[str, str]) -> tuple[Any, str | None]:
    """Run ``python -m MODULE --child`` with ``env`` and read the JSON its last stdout line
    holds, for a probe whose every measurement needs a new process (a setting read once at
    start-up, an empty cache): (the result, None), or (None, the tail of its stderr)."""
    proc = subprocess.run([sys.executable, "-m", module, "--child"], env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        return None, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def token(ws: Path, agent: str) -> str:
    out = kernelarc(ws, "token", "create", agent, "--json")
    return json.loads(out.stdout.strip().splitlines()[-1])["token"]


class HttpServer:
    """`kernelarc serve --transport http` in a subprocess; ``ready_s`` is how long the
    port took to accept connections."""

    def __init__(self, ws: Path, *extra: str):
        self.port = free_port()
        self.log = open(ws / f"serve-{self.port}.log", "w")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kernelarc_mcp.cli",
                "--workspace",
                str(ws),
                "serve",
                "--transport",
                "http",
                "--port",
                str(self.port),
                "--device",
                "cpu",
                *extra,
            ],
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )
        deadline = time.monotonic() + 120  # a loaded 2-core machine: 5.5 s seen, idle under 2
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {(ws / f'serve-{self.port}.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        self.ready_s = time.monotonic() - t0
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            # a clean stop ends its evaluation's workers and waits for its job threads: about
            # 5 s on an idle 2-core machine, past 15 s on one loaded twice over (session 50)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def expectation(path) -> dict:
    """The fields of a cheat's EXPECT line (screen=, runtime=, PROBLEM=; flags: HELDOUT, DPS, PARALLEL)."""
    text = path.read_text()
    m = re.search(r"EXPECT ([^\"\n]*)", text)
    assert m, f"{path.name} has no EXPECT line"
    words = m.group(1).replace("//", " ").split()
    fields = dict(kv.split("=") for kv in words if "=" in kv)
    fields["heldout"] = "HELDOUT" in words
    fields["dps"] = "DPS" in words
    fields["parallel"] = "PARALLEL" in words
    return fields


def submit_cheat(guard, path: Path, agent: str):
    """Evaluate a cheat as its EXPECT line says: on its problem, as a destination-passing
    solution when it says DPS, as CUDA C++ when it is a .cu file."""
    from guard.candidates.load import from_solution_json, from_source

    exp = expectation(path)
    problem = exp.get("PROBLEM", RMS)
    if path.suffix == ".cu":
        solution = from_source(unique(path.read_text(), "//"), "cuda_cpp", path.name)
    elif exp["dps"]:
        solution = from_solution_json(
            json.dumps(
                {
                    "name": path.stem,
                    "spec": {"languages": ["pytorch"], "entry_point": "k.py::run", "destination_passing_style": True},
                    "sources": [{"path": "k.py", "content": cheat_source(path, guard)}],
                }
            )
        )
    else:
        solution = from_source(cheat_source(path, guard), None, "kernel.py")
    return guard.evaluate(solution, problem, agent=agent)


def cheat_source(path, guard) -> str:
    """A cheat's source, made unique, with the visible shapes filled in where it asks."""
    source = path.read_text()
    if "{VISIBLE}" in source:  # the cheat knows the visible shapes, as an agent would
        from guard.problems.derive import workload_set

        wset = workload_set(guard.store.get(RMS), guard.device.kind, guard._secret, guard.cfg.cpu_workloads)
        rows = sorted({w.axes["num_tokens"] for w in wset.visible})
        source = source.replace("{VISIBLE}", repr(set(rows)))
    return unique(source)


_counter = [0]


def unique(source: str, comment: str = "#") -> str:
    """The same code with a new comment, so the guard measures it again."""
    _counter[0] += 1
    return source + f"\n{comment} variant {_counter[0]} {os.getpid()}\n"


def honest_source() -> str:
    return unique((CHEATS / "honest_torch.py").read_text())


class Staller:
    """While entered: stops ``pid`` for ``stop_s`` and lets it run for ``run_s``, in turn, as a
    machine whose other work holds the process's core would. SIGSTOP takes wall time and no
    CPU time, as a descheduled process's stall does."""

    def __init__(self, pid: int, stop_s: float = 0.02, run_s: float = 0.004) -> None:
        self.pid, self.stop_s, self.run_s = pid, stop_s, run_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.is_set():
            os.kill(self.pid, signal.SIGSTOP)
            self.done.wait(self.stop_s)
            os.kill(self.pid, signal.SIGCONT)
            self.done.wait(self.run_s)

    def __enter__(self) -> Staller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        os.kill(self.pid, signal.SIGCONT)


def stalling_trusted_windows():
    """Patches the guard's outside clock so that every trusted window of a CPU runs under a
    ``Staller``; returns the function that undoes it, whose ``stalled`` list has one entry per
    stalled window. Since session 34 a trusted window is a paced request
    (``guard/cascade/paced_calls.py``); before, one ``Overhead`` request: both are patched,
    whichever the checkout has, so that commits before and after can be compared."""
    stalled: list[int] = []
    try:
        from guard.cascade import paced_calls
    except ImportError:
        paced_calls = None
    if paced_calls is not None:
        real_run = paced_calls.run

        def run(worker, *args, **kwargs):
            if worker.role != "trusted":
                return real_run(worker, *args, **kwargs)
            stalled.append(worker.proc.pid)
            with Staller(worker.proc.pid):
                return real_run(worker, *args, **kwargs)

        paced_calls.run = run

        def undo() -> None:
            paced_calls.run = real_run

    else:
        from guard.cascade import outside_windows
        from guard.runner import messages as m

        real_call = outside_windows.call

        def call(worker, message, reply_type, timeout):
            if not isinstance(message, m.Overhead):
                return real_call(worker, message, reply_type, timeout)
            stalled.append(worker.proc.pid)
            with Staller(worker.proc.pid):
                return real_call(worker, message, reply_type, timeout)

        outside_windows.call = call

        def undo() -> None:
            outside_windows.call = real_call

    undo.stalled = stalled  # type: ignore[attr-defined]
    return undo
