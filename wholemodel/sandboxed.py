"""A ``VerifyJob`` run in the guard's candidate sandbox (``guard.sandbox``).

``kernelarc verify`` builds and runs kernels that agents wrote, and a load-time constructor
or a compile flag of theirs runs with the permissions of the process that builds them (red
team, session 42). So the job runs in a sandboxed child (``wholemodel.sandboxed_main``) with
a candidate worker's view: no workspace, no secret, no other process, no network, none of
the user's folders (the model file's text travels with the job). What it may write is a
size-capped tmpfs of its own, gone with it: nothing it does reaches the host's disk. Its
processes are capped in number and memory, and the whole of it in time.

Nothing of it reaches the user's terminal: the job goes in on stdin, the child's messages
come back through a pipe and are relayed with control characters removed, and its result
comes through another pipe, bounded, and is validated (``job.VerificationResult``) before a
figure of it is shown. A red team of the first version (session 43) hung it with a FIFO for
a result, crashed it with a deep folder tree left to delete and with malformed results,
cleared the terminal and set its clipboard from a kernel's name, and read what the user typed.

What the sandbox protects is the user's machine and workspaces. The figures still come from
the process the kernels run in, as they would in this one: they are a check of the model,
not a guard's verdict.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pydantic import ValidationError

from guard import sandbox
from guard.paths import CHECKOUT, PROJECT_ROOT
from guard.printable import printable
from guard.runner.worker_environment import worker_env

from . import VERIFY_MEMORY_GB, VERIFY_TIMEOUT_S
from .job import VerificationResult, VerifyJob
from .verify import Verification

log = logging.getLogger(__name__)

# the child's folder inside the sandbox: a tmpfs of SCRATCH_BYTES, which the host never sees
WORKDIR = Path("/kernelarc-verify")
SCRATCH_BYTES = 4 << 30  # builds of a few kernels (a CUDA one's objects are tens of MB)
# a verification's JSON is a few KB a kernel; anything near this is not one
MAX_RESULT_BYTES = 16 << 20
MAX_MESSAGE_BYTES = 1 << 20  # what of the child's messages is relayed; the rest is dropped
MAX_LINE = 2000


class SandboxedVerifyFailed(ValueError):
    """The sandboxed verification ended without a result (its messages went to stderr)."""


PREFIX = "[sandbox] "  # on each line of the child's: none passes for one of verify's own


def clean_line(raw: bytes) -> str:
    """A line of the child's for the user's terminal: printable characters and tabs only."""
    return PREFIX + printable(raw[:MAX_LINE].decode("utf-8", "replace").rstrip("\r\n"), keep="\t")


def parse_result(data: bytes, job: VerifyJob) -> Verification:
    """The child's result, believed only as a verification of ``job``."""
    if len(data) > MAX_RESULT_BYTES:
        raise SandboxedVerifyFailed("the sandboxed verification's result is too large to be one")
    if not data:
        raise SandboxedVerifyFailed("the sandboxed verification sent no result")
    try:
        return VerificationResult.model_validate(json.loads(data)).for_job(job)
    except (ValueError, RecursionError, ValidationError) as exc:
        first = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else type(exc).__name__
        raise SandboxedVerifyFailed(f"the sandboxed verification's result is not one ({first})") from None


def _readonly() -> list[Path]:
    """This package where the project is a checkout (a worker is shown the guard package alone
    there); installed, it lies with the interpreter's packages, which every worker is shown."""
    return [PROJECT_ROOT / "wholemodel"] if CHECKOUT is not None else []


def _environment(job: VerifyJob) -> dict[str, str]:
    env = worker_env(job.device)
    env.update(sandbox.scratch_env(WORKDIR, env))
    env["KERNELARC_CACHE_DIR"] = str(WORKDIR / ".kernelarc-cache")  # the builders' cache: its own
    return env


def _sandboxed_job(job: VerifyJob) -> VerifyJob:
    """The job as it enters the sandbox: a model file's text goes with it."""
    model_file = job.model_file()
    if model_file is None:
        return job
    try:
        source = model_file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{model_file}: cannot read the model file ({exc})") from None
    return job.model_copy(update={"model_source": source})


def _relay(fd: int, say) -> None:
    """The child's messages, line by line, cleaned, up to ``MAX_MESSAGE_BYTES`` in all and
    ``MAX_LINE`` bytes a line; the rest is read and dropped, so that the child never blocks on
    a full pipe and nothing it writes is held here beyond that (a 3 GiB line without a newline,
    read whole, took this process past 6 GB: red team, session 43)."""
    relayed, line, full = 0, b"", False
    while chunk := os.read(fd, 1 << 16):
        while chunk and not full:
            head, newline, chunk = chunk.partition(b"\n")
            line = (line + head)[: MAX_LINE + 1]
            if not newline:
                break
            relayed += len(line) + 1
            full = relayed > MAX_MESSAGE_BYTES
            say(clean_line(line) if not full else "(more messages of the sandboxed verification dropped)")
            line = b""
    if line and not full:
        say(clean_line(line))


def _send(pipe, data: bytes) -> None:
    """The job on the child's stdin, from a thread: a child that never reads it must not stop
    the wait that times it."""
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError):  # it ended before reading: its messages say why
        pass


def _collect(fd: int, into: bytearray) -> None:
    """The result pipe, read to its end, keeping at most one byte beyond the limit."""
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(1 << 16):
            if len(into) <= MAX_RESULT_BYTES:
                into += chunk[: MAX_RESULT_BYTES + 1 - len(into)]


@contextmanager
def _ended_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP (a ``timeout``, a closed terminal) end the wait as Ctrl-C does, so
    that the sandbox and its cgroup go with it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    before = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def run(
    job: VerifyJob,
    protect: Sequence[Path] = (),
    timeout_s: float = VERIFY_TIMEOUT_S,
    memory_gb: float | None = VERIFY_MEMORY_GB,
    say=lambda line: print(line, file=sys.stderr),
) -> Verification:
    """Run ``job`` in a sandbox and return its verification. ``protect``: folders to hide
    besides those every sandbox hides (the workspace the kernels came from); ``timeout_s``:
    how long it may take before it is killed; ``memory_gb``: what its processes may hold
    together (None: no cap), where this machine has a memory cgroup."""
    isolation = sandbox.probe()
    if not isolation.available:
        raise SandboxedVerifyFailed(f"no sandbox here ({isolation.line()}): add --in-process to run it here")
    inside = _sandboxed_job(job)
    env = _environment(job)
    policy = sandbox.SandboxPolicy.for_worker(WORKDIR, job.device, protect=protect, readonly=_readonly(), env=env)
    memory = int(memory_gb * 2**30) if memory_gb else None
    result_r, result_w = os.pipe()
    try:
        launch = sandbox.launch.prepare(
            policy,
            [sys.executable, "-m", "wholemodel.sandboxed_main", "--result-fd", str(result_w)],
            env,
            tag="verify",
            tasks_limit=sandbox.cgroups.default_limit(),
            memory_bytes=memory,
            hand_over=[result_w],
            workdir_tmpfs_bytes=SCRATCH_BYTES,
        )
    except BaseException:
        os.close(result_r)
        raise
    group = launch.group
    unread = [result_r]  # the result pipe, closed here unless its collector took it
    try:
        if memory and (group is None or group.memory_path is None):
            say(f"its memory is not capped here ({sandbox.cgroups.probe().reason or 'no memory cgroup'})")
        code, result, held_open = _run_child(launch, env, inside, unread, timeout_s, say)
        if code != 0 and group is not None and group.oom_kills():
            raise SandboxedVerifyFailed(
                f"the sandboxed verification was killed at its memory cap (--memory-gb {memory_gb:g}): "
                "raise it, or check what the kernels allocate"
            )
    finally:
        launch.started()  # where the child never started: its ends of the pipes
        for fd in unread:
            os.close(fd)
        if group is not None:
            group.close()  # and whatever of it is left
    if code != 0:
        raise SandboxedVerifyFailed(f"the sandboxed verification failed (exit status {code}; its messages are above)")
    if held_open:
        raise SandboxedVerifyFailed("the sandboxed verification ended, but something of it held its pipes open")
    return parse_result(result, job)


def _run_child(
    launch: sandbox.launch.Launch, env: dict[str, str], inside: VerifyJob, unread: list[int], timeout_s: float, say
) -> tuple[int, bytes, bool]:
    """Start the sandboxed child, give it the job, relay its messages and collect its result
    until it ends or ``timeout_s`` passes (then it is killed, and this raises). The result
    pipe's read end, ``unread[0]``, is taken from the list when its collector starts, which
    closes it; the caller closes it otherwise. Returns the child's exit status, its result,
    and whether something of it still held its pipes a while after it ended."""
    try:
        proc = subprocess.Popen(
            launch.cmd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=launch.pass_fds,
            start_new_session=True,
        )
    finally:
        launch.started()
    try:
        result = bytearray()
        collector = threading.Thread(target=_collect, args=(unread[0], result), daemon=True)
        try:
            collector.start()
        except BaseException as exc:
            if not isinstance(exc, RuntimeError):  # interrupted in its start: it may hold the pipe now
                unread.clear()
            raise  # (no thread at all: the pipe is still the caller's)
        unread.clear()
        readers = [collector, threading.Thread(target=_relay, args=(proc.stdout.fileno(), say), daemon=True)]
        readers[1].start()
        threading.Thread(target=_send, args=(proc.stdin, inside.model_dump_json().encode()), daemon=True).start()
        with _ended_by_signals():
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise SandboxedVerifyFailed(
                    f"the sandboxed verification took longer than {timeout_s:.0f} s and was stopped"
                ) from None
        for t in readers:  # its pipes close when its last process is gone
            t.join(timeout=10)
        return code, bytes(result), any(t.is_alive() for t in readers)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
