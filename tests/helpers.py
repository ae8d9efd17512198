"""The tests' shared helpers, in one place: paths, the fast guard settings, guards and
services made with them, the ``kernelarc`` command in a subprocess, a served workspace,
the cheat files. What the benchmarks use too is defined in ``benchmarks/harness.py`` (the
benchmarks may not import the tests) and offered here under the same names."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    CHEATS,
    FAST,
    REPO,
    RMS,
    HttpServer,
    Staller,
    cheat_source,
    expectation,
    fast_config,
    fast_workspace,
    free_port,
    honest_source,
    kernelarc,
    submit_cheat,
    token,
    unique,
)

__all__ = [
    "CHEATS",
    "DATA",
    "FAST",
    "REPO",
    "RMS",
    "SCALE_DEF",
    "SHRINKS_ITS_MEDIANS",
    "SOL_EXAMPLES",
    "TEST_MAX_WAIT_S",
    "HttpServer",
    "Staller",
    "StdioServer",
    "cheat_files",
    "cheat_source",
    "expectation",
    "fake_workspace",
    "row_problem_folder",
    "write_safetensors",
    "add_judged_candidate",
    "add_running_candidate",
    "fast_config",
    "fast_workspace",
    "free_port",
    "honest_source",
    "host_pids_with",
    "hung_call_s",
    "kernelarc",
    "make_guard",
    "make_service",
    "prepare_candidate",
    "rms_definition_and_workload",
    "speed_of_light_out_of_reach",
    "submit_cheat",
    "token",
    "unique",
    "WRITABLE_SCAN",
    "SYSCALLS",
    "orphan_source",
]

DATA = REPO / "tests" / "data"
SOL_EXAMPLES = DATA / "sol-execbench-examples"

# The smallest problem a worker can be handed directly (a definition as JSON): ``y = 2 x`` on
# rows of 64 floats. Tests of the trusted worker's requests and the CPU loop's held outputs.
SCALE_DEF = {
    "name": "scale",
    "reference": "def run(x):\n    return x * 2\n",
    "axes": {"n": {"type": "var"}},
    "inputs": {"x": {"shape": ["n", 64], "dtype": "float32"}},
    "outputs": {"y": {"shape": ["n", 64], "dtype": "float32"}},
}


def cheat_files(device: str) -> list[Path]:
    """The cheats a guard on ``device`` can judge: every one but the honest control, the
    GPU-only ones (``DEVICE=cuda``) on a GPU only, CUDA C++ (``.cu``) on a GPU only."""
    out = []
    for p in sorted([*CHEATS.glob("*.py"), *CHEATS.glob("*.cu")]):
        if p.name == "honest_torch.py":
            continue
        if device != "cuda" and (p.suffix == ".cu" or expectation(p).get("DEVICE") == "cuda"):
            continue
        out.append(p)
    return out


# For a test that checks a verdict, not its figures: 1-3 timed calls per workload instead of
# the fast settings' 3-10 (the benchmark gate still runs every check, on fewer calls, while
# holding the timing slot).
FEW_TIMED_CALLS = {"min_iters": 1, "max_iters": 3}


def add_running_candidate(db, cid: str, problem: str = RMS, agent: str = "a") -> None:
    """A candidate row as the guard makes one when an evaluation begins (no verdict yet)."""
    db.insert_candidate(
        id=cid,
        problem=problem,
        definition_hash="h",
        agent=agent,
        language="triton",
        source_hash=cid,
        solution_json="{}",
        device_key="cpu",
        device_kind="cpu",
        state="running",
    )


def add_judged_candidate(
    db,
    cid: str,
    problem: str = RMS,
    decision: str = "ACCEPT",
    status: str = "PASSED",
    speedup: float | None = 2.0,
    agent: str = "a",
    duplicate_of: str | None = None,
) -> None:
    """A candidate row as the guard leaves one it judged (no worker, no verdict JSON): for
    tests of what reads the table (memory, advice, reports)."""
    add_running_candidate(db, cid, problem, agent)
    with db.transaction() as c:
        c.execute(
            "UPDATE candidates SET state='done', decision=?, status=?, speedup_eager=?, finished_at=?,"
            " duplicate_of=? WHERE id=?",
            (decision, status, speedup, time.time(), duplicate_of, cid),
        )


def make_guard(path: Path, prestart: bool = False, **overrides):
    """A guard on the CPU over the workspace at ``path``, with the fast settings.

    Its candidate workers start when a candidate needs one (``prestart=False``): a test's
    guard judges a few candidates, and the spare a guard starts ahead for its next one (an
    import of torch, about 3 s of a core) would be thrown away when the test closes it. The
    spare is the servers' way (``make_service``, ``kernelarc serve``), tested there."""
    from guard.cascade import Guard
    from guard.workspace import Workspace

    return Guard(Workspace.open(path), fast_config(**overrides), device="cpu", prestart=prestart)


def speed_of_light_out_of_reach(guard) -> None:
    """Give ``guard`` ceilings no kernel comes near, for tests of what the advice counts
    (redrafts, attempt budgets). The CPU's measured ceilings (a 64 MB copy) put an honest
    kernel on a small, cache-resident workload at 0.5 to 0.9 of its speed of light, so with
    them "stop: 90% of speed of light reached" would depend on how loaded the machine was
    when the ceilings, the baseline and the kernel were measured."""
    guard.reference.ceilings = {
        "copy_bytes_per_s": 1e18,
        "matmul_flops_per_s": {"bfloat16": 1e21, "float16": 1e21, "float32": 1e21},
        "device": "cpu",
        "note": "tests: out of any kernel's reach",
    }


def hung_call_s(verdict) -> float:
    """How long the candidate's longest request took, from the verdict's phases: for a hung
    candidate, the time until the guard cut it off. Worker start-up and baselines, whose
    duration depends on the machine's load, are other phases."""
    return max(s for k, s in verdict.phases_s.items() if k.startswith("candidate."))


# How long a test's tool call may wait for a verdict: the server's default (40 s) is a
# client's comfort, and on a loaded 2-core machine a verdict took longer (a call then answered
# "running" where the test expected "done"); what these tests check is not a time.
TEST_MAX_WAIT_S = 600.0


def make_service(path: Path, **overrides):
    """The MCP server's service on the CPU, with the fast settings and one correctness round,
    waiting for a verdict as long as a loaded machine needs (``TEST_MAX_WAIT_S``)."""
    from guard.workspace import Workspace
    from kernelarc_mcp.service import Service

    config = fast_config(**{"correctness_rounds": 1, **overrides})
    return Service(Workspace.open(path), config, device="cpu", max_wait_s=TEST_MAX_WAIT_S)


class StdioServer:
    """``kernelarc serve`` (stdio, on the CPU) in a subprocess, spoken to as an MCP client does:
    one JSON-RPC message a line. Its log is ``ws/serve-stdio-<pid>.log``."""

    def __init__(self, ws: Path, agent: str = "alice", *extra: str, timeout: float = 120):
        self.log_path = ws / f"serve-stdio-{os.getpid()}-{id(self)}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kernelarc_mcp.cli", "-v", "--workspace", str(ws), "serve"]
                + ["--device", "cpu", "--agent", agent, *extra],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=REPO,
                env=dict(os.environ),
                text=True,
            )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._id = 0
        self.request(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "tests", "version": "0"}},
            timeout,
        )
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")  # stdout closed: the server ended

    def _send(self, message: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def log(self) -> str:
        return self.log_path.read_text()[-3000:]

    def request(self, method: str, params: dict, timeout: float = 60) -> dict:
        self._id += 1
        self._send({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params})
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no answer to {method} in {timeout} s: {self.log()}") from None
            if not line:
                raise RuntimeError(f"the server ended before answering {method}: {self.log()}")
            message = json.loads(line)
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def call_tool(self, name: str, arguments: dict, timeout: float = 60) -> dict:
        """The tool's structured result; a tool error raises."""
        result = self.request("tools/call", {"name": name, "arguments": arguments}, timeout)
        if result.get("isError"):
            raise RuntimeError(f"{name}: {result['content']}")
        return result["structuredContent"]

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the server did not end within {timeout} s: {self.log()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# -- the OS sandbox's tests (test_sandbox.py, test_cells.py) --------------------------------------
def write_safetensors(path: Path, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> None:
    """A safetensors file of ``tensors``: name -> a torch tensor, or a shape (a list) for a
    float32 tensor of zeros. The format by hand: the header's length, its JSON, the data."""
    import json
    import math
    import struct

    import torch

    dtypes = {torch.float32: "F32", torch.int64: "I64", torch.bfloat16: "BF16"}
    header: dict[str, object] = {}
    chunks: list[bytes] = []
    offset = 0
    for key, value in tensors.items():
        if isinstance(value, torch.Tensor):
            dtype, shape = dtypes[value.dtype], list(value.shape)
            raw = value.contiguous().view(torch.uint8).numpy().tobytes()
        else:
            dtype, shape, raw = "F32", list(value), bytes(4 * math.prod(value))
        header[key] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def row_problem_folder(
    tmp_path: Path, name: str, reference: str, width: int, reduce: bool, adversarial: bool = False
) -> Path:
    """A SOL-ExecBench folder ``tmp_path / name`` of a float32 problem over ``x`` of shape
    (n, ``width``): ``y`` of shape (n,) where ``reduce``, else (n, ``width``); two workloads,
    n = 16 and 33, one held-out workload; ``reference`` its source."""
    import json

    folder = tmp_path / name
    folder.mkdir()
    definition = {
        "name": name,
        "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": width}},
        "inputs": {"x": {"shape": ["n", "h"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n"] if reduce else ["n", "h"], "dtype": "float32"}},
        "reference": reference,
        "kernelarc": {"heldout_count": 1, "adversarial": adversarial},
    }
    (folder / "definition.json").write_text(json.dumps(definition))
    rows = [{"uuid": f"w{n}", "axes": {"n": n}, "inputs": {"x": {"type": "random"}}} for n in (16, 33)]
    (folder / "workload.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def fake_workspace(parent: Path) -> Path:
    """A folder shaped like a workspace (secret, database, a problem folder) in ``parent``."""
    ws = parent / "ws"
    (ws / "problems" / "p").mkdir(parents=True)
    (ws / "secret.key").write_text("ab" * 32)
    (ws / "workspace.db").write_text("records")
    (ws / "problems" / "p" / "definition.json").write_text("{}")
    return ws


def host_pids_with(marker: str) -> list[int]:
    """Processes of this machine whose command line holds ``marker``."""
    found = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{p}/cmdline").read_bytes():
                    found.append(int(p))
            except OSError:
                pass
    return found


def rms_definition_and_workload():
    """The RMSNorm seed problem, its definition and its first visible CPU workload."""
    from guard.problems.derive import workload_set
    from guard.problems.store import ProblemStore

    problem = ProblemStore(Path("/nonexistent-kernelarc-problems")).get(RMS)
    w = workload_set(problem, "cpu", b"\0" * 32).visible[0]
    d = problem.definition
    return problem, d, w


def prepare_candidate(worker, source: str, build_cache: Path) -> dict:
    """Hand a candidate worker the RMSNorm seed problem, then ``source`` as its kernel (which
    its worker imports): the reply to ``prepare``."""
    from guard.candidates.load import from_source
    from guard.runner import messages as m

    problem, d, _ = rms_definition_and_workload()
    solution = from_source(source, "pytorch", "kernel.py").model_dump(mode="json", exclude_none=True)
    blob_root = str(problem.root) if problem.root else None
    ready = worker.request(m.Setup(definition=d.to_json(), blob_root=blob_root).model_dump(mode="json"), 60)
    assert ready.get("ok"), ready
    prepare = m.Prepare(solution=solution, language="pytorch", build_cache=str(build_cache))
    return worker.request(prepare.model_dump(mode="json"), 60)


# Python source for a sandboxed process: ``writable_outside(own)``, the files it could write
# outside ``own`` (its folders) and the harmless /dev nodes: procfs and sysfs knobs owned by
# root above all (the sandbox's uid is the host's root when root runs the guard).
WRITABLE_SCAN = """
import os, stat
HARMLESS = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/pts/ptmx"}
def writable_outside(own):
    found = []
    def scan(top, depth):
        try:
            names = os.listdir(top)
        except OSError:
            return
        for name in names:
            path = os.path.join(top, name)
            if top == "/proc" and (name.isdigit() or name in ("self", "thread-self")):
                continue  # its own processes' files
            if any(path == o or path.startswith(o + "/") for o in own):
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if depth < 6:
                    scan(path, depth + 1)
            elif not stat.S_ISLNK(st.st_mode) and path not in HARMLESS:
                try:
                    read_only = os.statvfs(path).f_flag & os.ST_RDONLY
                except OSError:
                    continue
                if not read_only and os.access(path, os.W_OK):
                    found.append(path)
    scan("/", 0)
    return sorted(found)
"""


# add_key, unshare and ptrace, by machine: written out here, not taken from
# guard.sandbox.seccomp, so that a wrong number there fails the tests instead of agreeing
SYSCALLS = {"x86_64": (248, 272, 101), "aarch64": (217, 97, 117)}


def orphan_source(marker: str) -> str:
    """A candidate whose import leaves a grandchild in a session of its own, orphaned at once,
    running ``sleep marker`` (``host_pids_with(marker)`` finds it)."""
    return textwrap.dedent(f"""
        import os
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "{marker}"])
            os._exit(0)
        import torch
        def run(x, w):
            return x
    """)


# An RMSNorm candidate that divides the medians its own process reports by 100 (reached as
# torch.sys): the outside clock's floor, not the band, keeps such a figure from deciding.
SHRINKS_ITS_MEDIANS = """
import torch

_timer = torch.sys.modules["guard.runner.timing"]
_summary = _timer.summarize


def _shrunk(samples_ms):
    stats = _summary(samples_ms)
    stats["median_ms"] = stats["median_ms"] / 100
    stats["rel_se"] = 0.001
    return stats


_timer.summarize = _shrunk


def run(hidden_states, weight):
    x = hidden_states.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(hidden_states.dtype)
"""


def shadow_with_fewer_workloads(workspace: Path, problem: str, count: int) -> list[str]:
    """Put a copy of the shipped problem ``problem`` with only ``count`` of its workloads (the
    first, the last and evenly between, as listed) into ``workspace``'s problems, where it
    shadows the shipped one for that workspace's guard; the uuids kept."""
    import json

    from guard.workspace import Workspace
    from seeds import SEEDS_DIR

    if count < 1:
        raise ValueError(f"{count} workloads: at least one")
    source = SEEDS_DIR / problem
    rows = [ln for ln in (source / "workload.jsonl").read_text().splitlines() if ln.strip()]
    picks = sorted({round(i * (len(rows) - 1) / max(1, count - 1)) for i in range(count)}) if count > 1 else [0]
    target = Workspace.open(workspace).problems_dir / problem
    target.mkdir(parents=True, exist_ok=True)
    (target / "definition.json").write_text((source / "definition.json").read_text())
    (target / "workload.jsonl").write_text("".join(rows[i] + "\n" for i in picks))
    return [json.loads(rows[i])["uuid"] for i in picks]


def in_shard(nodeid: str, k: int, n: int) -> bool:
    """Whether the test ``nodeid`` is in part ``k`` of ``n``: a hash of the id, not its place in
    the run, so adding a test moves no other."""
    return zlib.crc32(nodeid.encode()) % n == k - 1


class MadeHere:
    """The descriptors this thread makes while recording (pipes, socket pairs, opened
    files), each known by its inode, so that a number another thread opens in between (the
    spawner thread's, another test's worker) is not taken for one of them: a count of the
    whole process's descriptors was, and failed once in a full run."""

    def __init__(self) -> None:
        self.ends: dict[int, tuple[int, int]] = {}
        self._thread = threading.get_ident()

    def record(self, *fds: int) -> None:
        if threading.get_ident() == self._thread:
            for fd in fds:
                st = os.fstat(fd)
                self.ends[fd] = (st.st_dev, st.st_ino)

    def still_open(self) -> list[int]:
        left = []
        for fd, identity in self.ends.items():
            try:
                st = os.fstat(fd)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == identity:
                left.append(fd)
        return left
