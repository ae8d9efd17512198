"""``kernelarc verify`` runs the kernels it plugs in inside the guard's sandbox: a kernel
cannot read the workspace it came from, write outside its scratch folder or leave anything
behind, and what it reports back is checked before it is believed."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from guard.candidates.load import from_file
from guard.workspace import Workspace
from wholemodel.job import KernelJob, VerifyJob
from wholemodel.loader import load
from wholemodel.problems import write_problems
from wholemodel.profile import profile_model
from wholemodel.verify import Verification

from helpers import DATA, fast_workspace, kernelarc

PROBLEM = "llama_block_small_rmsnorm"

# what each kernel below computes: an RMSNorm that works
RMS_RUN = """

def run(hidden_states, weight):
    x = hidden_states.float()
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * weight.float()
    return y.to(hidden_states.dtype)
"""

# An RMSNorm that works, and at import looks for what it must not reach: the workspace's
# secret and database, the user's home, and a file to write beside the workspace.
PROBING_KERNEL = (
    """
import os, sys, torch

reached = []
for path in {targets!r}:
    try:
        with open(path, "rb") as f:
            f.read(1)
        reached.append("read " + path)
    except OSError:
        pass
try:  # what it writes where /tmp is its own is lost with it: the host's file is what counts
    with open({outside!r}, "w") as f:
        f.write("escaped")
except OSError:
    pass
print("PROBE " + ";".join(reached), file=sys.stderr)
"""
    + RMS_RUN
)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A workspace holding the small Llama block's RMSNorm problem, with its secret made."""
    root = tmp_path_factory.mktemp("verify-sandbox")
    ws = Workspace.open(fast_workspace(root / "ws"))
    folders, _ = write_problems(profile_model(load("llama_block", device="cpu"), reps=1, warmup=1), 10, root / "p")
    (folder,) = [f for f in folders if f.name == PROBLEM]
    ws.problems().import_path(folder)
    assert len(ws.secret) == 32  # made on first use
    return ws


def _probe_file(ws: Workspace, tmp_path) -> tuple:
    outside = tmp_path / "outside.txt"
    targets = [str(ws.secret_path), str(ws.db_path), str(ws.config_path), os.path.expanduser("~/.bashrc")]
    targets = [t for t in targets if os.path.exists(t)]
    kernel = tmp_path / "rmsnorm_probe.py"
    kernel.write_text(PROBING_KERNEL.format(targets=targets, outside=str(outside)))
    return kernel, outside


def _state(ws: Workspace) -> dict:
    return {p: p.read_bytes() for p in (ws.secret_path, ws.db_path) if p.exists()}


def _verify(ws: Workspace, kernel, *extra, check: bool = True, stdin: int | None = None):
    plug = ["--kernel", f"{PROBLEM}={kernel}"]
    return kernelarc(ws.root, "verify", "llama_block", "--device", "cpu", *plug, *extra, check=check, stdin=stdin)


@contextmanager
def a_terminal() -> Iterator[int]:
    """A pseudo-terminal's user side, with echo on, as a user's verify has for its input."""
    import pty
    import termios

    main, user = pty.openpty()
    try:
        attrs = termios.tcgetattr(user)
        attrs[3] |= termios.ECHO
        termios.tcsetattr(user, termios.TCSANOW, attrs)
        yield user
    finally:
        os.close(user)
        os.close(main)


def echo_on(fd: int) -> bool:
    import termios

    return bool(termios.tcgetattr(fd)[3] & termios.ECHO)


@pytest.mark.slow
def test_a_plugged_kernel_reaches_nothing_of_the_workspace(workspace, tmp_path, needs_bwrap, monkeypatch):
    monkeypatch.setenv("KERNELARC_CACHE_DIR", str(tmp_path / "cache"))
    kernel, outside = _probe_file(workspace, tmp_path)
    before = _state(workspace)
    proc = _verify(workspace, kernel, "--reps", "1", "--json")
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["ok"] and doc["ran"].startswith("in the sandbox (isolation: bubblewrap")
    assert doc["total"]["use"][PROBLEM]["served"] == 2
    probes = [line for line in proc.stderr.splitlines() if "PROBE" in line]
    assert probes == ["[sandbox] PROBE "], proc.stderr  # it ran, and reached nothing
    assert not outside.exists()
    assert _state(workspace) == before
    assert not (tmp_path / "cache").exists()  # its folder was the sandbox's own: nothing on the host
    # the same kernel in this process reaches it all: the probe is able to see what it looks for
    proc = _verify(workspace, kernel, "--reps", "1", "--json", "--in-process")
    probes = [line for line in proc.stderr.splitlines() if line.startswith("PROBE")]
    assert len(probes) == 1 and f"read {workspace.secret_path}" in probes[0]
    assert outside.read_text() == "escaped"


# the model's first lines look beside it, as a model loading its weights would
SIBLING_PROBE = """
import os as _os
try:
    _seen = open(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), ".env")).read().strip()
except OSError:
    _seen = "hidden"
print("SIBLING " + _seen, flush=True)
"""


@pytest.mark.slow
def test_a_model_file_travels_into_the_sandbox_without_its_folder(tmp_path, needs_bwrap, monkeypatch):
    """The model's text goes with the job and is loaded inside; no folder of the user's is
    shown (its folder once was, and a red team read a project's .env and another workspace's
    secret beside the model). It gives what the same job gives in this process."""
    monkeypatch.setenv("KERNELARC_CACHE_DIR", str(tmp_path / "cache"))
    project = tmp_path / "project"
    project.mkdir()
    (project / ".env").write_text("API_KEY=beside-the-model\n")
    model = project / "custom_model.py"
    model.write_text(SIBLING_PROBE + (DATA / "wholemodel" / "custom_model.py").read_text())
    args = ["verify", str(model), "--device", "cpu", "--dtype", "bfloat16", "--seeds", "--reps", "1", "--json"]
    inside, here = (kernelarc(tmp_path / "ws", *args, *extra) for extra in ([], ["--in-process"]))
    # the sandbox's messages come to stderr; the model loaded here (to profile it for the seeds,
    # and --in-process) prints to stdout
    assert "SIBLING hidden" in inside.stderr and "beside-the-model" not in inside.stderr, inside.stderr
    assert "SIBLING API_KEY=beside-the-model" in here.stdout  # the probe sees it where it is shown
    inside, here = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (inside, here))
    assert inside["ran"].startswith("in the sandbox") and here["ran"].startswith("in this process")
    assert inside["ok"] and inside["model"] == "custom_model"
    served = {n: u["served"] for n, u in inside["total"]["use"].items()}
    assert served == {"custom_model_rmsnorm": 1, "custom_model_matmul": 1}
    assert served == {n: u["served"] for n, u in here["total"]["use"].items()}
    assert inside["total"]["check"] == here["total"]["check"]  # the same kernels, the same numbers


def _job(ws: Workspace, diagnose: bool = False) -> VerifyJob:
    problem = ws.problems().get(PROBLEM)
    kernel = KernelJob.of(problem, from_file(DATA / "wholemodel" / "rmsnorm_ok.py"), "file rmsnorm_ok.py")
    return VerifyJob(model="llama_block", device="cpu", dtype="bfloat16", kernels=[kernel], reps=3, diagnose=diagnose)


def _verification(origin: str = "file rmsnorm_ok.py") -> Verification:
    from wholemodel.accuracy import Errors, judged
    from wholemodel.verify import KernelUse, Trial

    use = {PROBLEM: KernelUse(3, 1, [0.5, 0.25], [0.125])}
    check = judged(Errors(float("inf"), 2.0, 4), Errors(0.01, 0.5, 0), 0.02, 1.0)
    trial = Trial([PROBLEM], check, 2.0, 1.0, use)
    return Verification("llama_block_small", "cpu", "bfloat16", 2.0, 3, trial, [trial], {PROBLEM: origin})


def test_a_verification_crosses_as_json_unchanged(workspace):
    from wholemodel.sandboxed import parse_result

    v = _verification()
    assert parse_result(json.dumps(v.to_json()).encode(), _job(workspace, diagnose=True)) == v


def _tampered(kind: str) -> bytes:
    doc = _verification(origin="reviewed and approved").to_json()
    if kind == "huge":
        return b" " * (20 << 20)
    if kind == "not_json":
        return b"{"
    if kind == "deep":
        return b"[" * 200_000 + b"]" * 200_000
    if kind == "wrong_type":
        doc["total"]["model_ms"] = [1, 2]
    elif kind == "nan_time":
        doc["total"]["plugged_ms"] = float("nan")
    elif kind == "escape_in_name":
        doc["model"] = "llama\x1b]52;c;Y3VybCB4fHNo\x07"
    elif kind == "other_model":
        doc["model"] = "llama_block_real"
    elif kind == "other_dtype":
        doc["dtype"] = "float32"
    elif kind == "foreign_kernel":
        doc["total"]["use"]["other_problem"] = doc["total"]["use"][PROBLEM]
        doc["total"]["kernels"].append("other_problem")
    elif kind == "alone_names_none":
        doc["alone"][0]["kernels"], doc["alone"][0]["use"] = [], {}
    elif kind == "alone_missing":
        doc["alone"] = []
    elif kind == "passes_against_its_figures":
        doc["total"]["check"]["ok"] = True
    elif kind == "other_device":
        doc["device"] = "cuda"
    return json.dumps(doc).encode()


TAMPERED = [
    "huge",
    "not_json",
    "deep",
    "wrong_type",
    "nan_time",
    "escape_in_name",
    "other_model",
    "other_dtype",
    "foreign_kernel",
    "alone_names_none",
    "alone_missing",
    "passes_against_its_figures",
    "other_device",
]


@pytest.mark.parametrize("kind", TAMPERED)
def test_a_result_the_sandbox_sends_is_checked_before_it_is_believed(workspace, kind):
    """It comes from the process the kernels ran in: what is not a verification of this job is
    an error, never a figure or a string on the user's terminal (red teams, session 43: a
    directory, a FIFO, 200 KB of brackets and a list for a number crashed or hung the first
    version; a kernel's name cleared the terminal and set its clipboard; another model's name
    was shown as PASSED; an empty trial crashed the diagnose table)."""
    from wholemodel import sandboxed

    with pytest.raises(sandboxed.SandboxedVerifyFailed):
        sandboxed.parse_result(_tampered(kind), _job(workspace, diagnose=True))


def test_what_a_result_shows_as_text_is_made_here(workspace):
    """The origins are the job's, and the check's message is made from its figures: a message
    of the child's (markup for a Markdown viewer, invisible characters) is never shown."""
    from wholemodel import sandboxed

    doc = json.loads(_tampered("none"))
    doc["total"]["check"]["message"] = "fine <img src=https://example.invalid/x.png> \u3164"
    v = sandboxed.parse_result(json.dumps(doc).encode(), _job(workspace, diagnose=True))
    assert v.origins == {PROBLEM: "file rmsnorm_ok.py"}
    assert v.total.check.message.startswith("4 NaN/Inf elements where the model is finite; relative L2 error inf")


HOSTILE_KERNEL = (
    """
import os, sys, torch

# at its terminal: clear the screen, set the clipboard, switch echo off
for stream in (sys.stdout, sys.stderr):
    stream.write("HOSTILE \\x1b[2J\\x1b]52;c;Y3VybCB4fHNo\\x07 done\\n")
    stream.flush()
try:
    import termios
    for fd in (0, 1, 2):
        attrs = termios.tcgetattr(fd)
        attrs[3] &= ~termios.ECHO
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
    print("HOSTILE reached a terminal")
except Exception:
    pass
# a folder tree too deep for a recursive delete, and a file in its HOME, to outlive it
top = os.getcwd()
for _ in range(3000):
    os.mkdir("d")
    os.chdir("d")
open("SURVIVOR", "w").write("x")
os.chdir(top)
open(os.path.join(os.path.expanduser("~"), "SURVIVOR"), "w").write("x")
print("HOSTILE cwd", top)
"""
    + RMS_RUN
)


@pytest.mark.slow
def test_a_hostile_kernel_reaches_neither_the_terminal_nor_the_disk(workspace, tmp_path, needs_bwrap, monkeypatch):
    monkeypatch.setenv("KERNELARC_CACHE_DIR", str(tmp_path / "cache"))
    kernel = tmp_path / "hostile.py"
    kernel.write_text(HOSTILE_KERNEL)
    with a_terminal() as terminal:
        proc = _verify(workspace, kernel, "--reps", "1", "--json", stdin=terminal)
        assert echo_on(terminal)  # what the user types is still shown
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["ok"] and doc["ran"].startswith("in the sandbox")
    hostile = [line.removeprefix("[sandbox] ") for line in proc.stderr.splitlines() if "HOSTILE" in line]
    assert len(hostile) >= 3, proc.stderr  # it ran, and said so
    assert "\x1b" not in proc.stderr + proc.stdout and "\x07" not in proc.stderr
    assert "HOSTILE reached a terminal" not in proc.stderr
    cwd = next(line.split(" ", 2)[2] for line in hostile if line.startswith("HOSTILE cwd"))
    assert not Path(cwd).exists()  # its folder was the sandbox's own
    assert not list(tmp_path.rglob("SURVIVOR")) and not (Path.home() / "SURVIVOR").exists()


TERMINAL_KERNEL = (
    """
import sys, termios, torch

attrs = termios.tcgetattr(0)
attrs[3] &= ~termios.ECHO
termios.tcsetattr(0, termios.TCSANOW, attrs)
print("HOSTILE reached a terminal", file=sys.stderr)
"""
    + RMS_RUN
)


@pytest.mark.slow
def test_a_kernel_cannot_reach_the_users_terminal(workspace, tmp_path, needs_bwrap, monkeypatch):
    """verify's input is the user's terminal; the sandboxed kernel's is the job's pipe. The
    same kernel run in verify's own process (``--in-process``) does reach it: the probe finds
    a terminal where there is one to find."""
    monkeypatch.setenv("KERNELARC_CACHE_DIR", str(tmp_path / "cache"))
    kernel = tmp_path / "terminal.py"
    kernel.write_text(TERMINAL_KERNEL)
    with a_terminal() as terminal:
        proc = _verify(workspace, kernel, "--reps", "1", "--json", stdin=terminal, check=False)
        assert echo_on(terminal)
    assert "HOSTILE reached a terminal" not in proc.stderr
    assert "Inappropriate ioctl for device" in proc.stderr, proc.stderr  # it ran, and found none
    with a_terminal() as terminal:
        trusted = ("--in-process", "--trust-agent-kernels")
        proc = _verify(workspace, kernel, "--reps", "1", "--json", *trusted, stdin=terminal, check=False)
        assert not echo_on(terminal)
    assert "HOSTILE reached a terminal" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_kernel_that_never_ends_is_stopped_at_the_timeout(workspace, tmp_path, needs_bwrap):
    kernel = tmp_path / "sleeper.py"
    kernel.write_text("import time\ntime.sleep(3600)\n\ndef run(hidden_states, weight):\n    return hidden_states\n")
    t0 = time.monotonic()
    proc = _verify(workspace, kernel, "--timeout-minutes", "0.1", check=False)
    assert proc.returncode == 2 and "took longer than 6 s" in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 60


def test_the_sandboxs_messages_are_relayed_within_bounds():
    """A line without a newline was read whole: 3 GiB of one took verify past 6.5 GB (red
    team, session 43). A line is cut at ``MAX_LINE`` bytes, and all of them at
    ``MAX_MESSAGE_BYTES``, while the rest is read and dropped."""
    import threading

    from wholemodel import sandboxed

    said: list[str] = []
    read, write = os.pipe()
    relay = threading.Thread(target=sandboxed._relay, args=(read, said.append))
    relay.start()
    with os.fdopen(write, "wb") as pipe:
        pipe.write(b"x" * (8 << 20))  # one line of 8 MiB, no newline yet
        pipe.write(b"\n\x1b[2Jshort\n")
        for _ in range(2000):
            pipe.write(b"y" * 1000 + b"\n")  # 2 MB of lines: past the total
    relay.join(timeout=30)
    assert not relay.is_alive()
    os.close(read)
    assert len(said[0]) == len(sandboxed.PREFIX) + sandboxed.MAX_LINE
    assert said[1] == sandboxed.PREFIX + "?[2Jshort"
    assert said[-1] == "(more messages of the sandboxed verification dropped)"
    assert sum(len(s) for s in said) < 1.1 * sandboxed.MAX_MESSAGE_BYTES


@pytest.mark.parametrize(
    "args, said",
    [
        (["--timeout-minutes", "nan"], "--timeout-minutes and --memory-gb must be positive numbers"),
        (["--memory-gb", "inf"], "--timeout-minutes and --memory-gb must be positive numbers"),
        (["--error-factor", "inf"], "--error-factor a positive number"),
        (["--dtype", "int8"], "unknown dtype 'int8': not a floating-point dtype"),
    ],
)
def test_verify_refuses_what_is_not_a_setting_in_words(tmp_path, args, said):
    proc = kernelarc(tmp_path / "ws", "verify", "llama_block", "--device", "cpu", "--seeds", *args, check=False)
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_an_unknown_size_of_a_built_in_model_is_named():
    from wholemodel.loader import model_spec

    with pytest.raises(ValueError, match="no size 'bogus'"):
        model_spec("llama_block:bogus")


def test_without_a_sandbox_agents_kernels_need_consent_and_the_output_says_where(workspace, tmp_path, monkeypatch):
    """Where the machine has no sandbox, verify runs here, says so, and takes agents' kernels
    (``--run``, ``--candidate``) only with ``--trust-agent-kernels``."""
    from types import SimpleNamespace

    from guard.sandbox import isolation
    from kernelarc_mcp.commands.model import _isolation

    monkeypatch.setenv(isolation.ENV_MODE, "off")
    agents = SimpleNamespace(in_process=False, run=["r"], candidate=None, trust_agent_kernels=False)
    with pytest.raises(ValueError, match="this machine has no sandbox .* --trust-agent-kernels"):
        _isolation(agents)
    assert _isolation(SimpleNamespace(**{**vars(agents), "trust_agent_kernels": True})) is None
    kernel = tmp_path / "rmsnorm.py"
    kernel.write_text((DATA / "wholemodel" / "rmsnorm_ok.py").read_text())
    doc = json.loads(_verify(workspace, kernel, "--reps", "1", "--json").stdout.strip().splitlines()[-1])
    assert doc["ok"] and doc["ran"] == "in this process, without a sandbox"


def test_an_output_of_another_shape_is_named_so_from_the_sandbox(workspace):
    """The check's message is made here from the figures; an output of another shape or dtype
    than the model's (infinite errors, zero limits) is said as such, not as 'inf > 0'."""
    from wholemodel import sandboxed

    doc = json.loads(_tampered("none"))
    check = doc["total"]["check"]
    check.update(ok=False, mismatch=True, limit_rel_l2=0.0, limit_max_abs=0.0)
    check["plugged"].update(rel_l2=float("inf"), max_abs=float("inf"), nonfinite=0)
    v = sandboxed.parse_result(json.dumps(doc).encode(), _job(workspace, diagnose=True))
    assert not v.total.check.ok and v.total.check.message == "its output's shape or dtype is not the model's"


@pytest.mark.parametrize("fails_at", ["say", "spawn"])
def test_a_sandboxed_verify_that_fails_to_start_leaves_nothing_open(
    workspace, monkeypatch, needs_bwrap, fails_at, made_here
):
    """Its pipes and its cgroup go with a start that fails: a message that cannot be shown (a
    closed stderr), or a spawn that fails (review, session 44: the first sat outside the
    cleanup, and left the result pipe, the filter's and the cgroup)."""
    import subprocess

    from guard import sandbox
    from wholemodel import sandboxed

    def fails(*args, **kwargs):
        raise OSError(5, "Input/output error")

    closed: list[bool] = []
    real_make = sandbox.cgroups.SandboxGroup.make

    def made(*args, **kwargs):
        group = real_make(*args, **kwargs)
        if group is not None:
            real_close = group.close
            group.close = lambda *a, **k: closed.append(True) or real_close(*a, **k)
        return group

    if fails_at == "spawn":
        monkeypatch.setattr(sandbox.cgroups.SandboxGroup, "make", made)
        monkeypatch.setattr(subprocess, "Popen", fails)
        say = print
    else:  # a machine without cgroups, where it says its memory is not capped
        monkeypatch.setattr(sandbox.cgroups.SandboxGroup, "make", lambda *a, **k: None)
        say = fails
    job = _job(workspace)
    made_here.ends.clear()
    with pytest.raises(OSError, match="Input/output error"):
        sandboxed.run(job, memory_gb=1.0, say=say)
    assert made_here.ends, "the run made no descriptor: the test no longer tests a release"
    assert made_here.still_open() == []
    if fails_at == "spawn" and sandbox.cgroups.probe().available:
        assert closed == [True]
