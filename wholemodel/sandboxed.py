"""A ``VerifyJob`` run in the guard's candidate sandbox (``guard.sandbox``).

``kernelarc verify`` builds and runs kernels that agents wrote, and a load-time constructor
or a compile flag of theirs runs with the permissions of the process that builds them (red
team, session 42). So the job runs in a sandboxed child (``wholemodel.sandboxed_main``) with
the policy of a candidate worker: no workspace, no secret, no other process, no network; it
writes only its own scratch folder, which is removed afterwards. The model's file is shown
read-only with its folder. The child's messages go to this process's stderr; its result
comes back as JSON in the scratch folder.

What the sandbox protects is the user's machine and workspaces. The figures still come from
the process the kernels run in, as they did in this one: they are a check of the model, not
a guard's verdict.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from guard import sandbox
from guard.paths import CHECKOUT, PROJECT_ROOT, cache_dir
from guard.runner.process import worker_env

from .job import VerifyJob
from .verify import Verification

log = logging.getLogger(__name__)

JOB_FILE = "job.json"
RESULT_FILE = "result.json"
# a verification's JSON is a few KB a kernel; anything near this is not one
MAX_RESULT_BYTES = 16 << 20


class SandboxedVerifyFailed(ValueError):
    """The sandboxed verification ended without a result (its messages went to stderr)."""


def _readonly(job: VerifyJob) -> list[Path]:
    """What the child needs besides a candidate worker's view: this package where the project
    is a checkout (a worker is shown the guard package alone there), and the model's folder."""
    shown = [PROJECT_ROOT / "wholemodel"] if CHECKOUT is not None else []
    model_file = job.model_file()
    if model_file is not None:
        shown.append(model_file.parent)
    return shown


def _environment(job: VerifyJob, scratch: Path) -> dict[str, str]:
    env = worker_env(job.device)
    env.update(sandbox.scratch_env(scratch, env))
    env["KERNELARC_CACHE_DIR"] = str(scratch / ".kernelarc-cache")  # the builders' cache: its own
    return env


def _read_result(path: Path) -> dict:
    """The child's result, read without following a link it may have left there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise SandboxedVerifyFailed(f"the sandboxed verification left no result ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_RESULT_BYTES + 1)
    if len(data) > MAX_RESULT_BYTES:
        raise SandboxedVerifyFailed("the sandboxed verification's result is too large to be one")
    try:
        return json.loads(data)
    except ValueError:
        raise SandboxedVerifyFailed("the sandboxed verification's result is not JSON") from None


def parse_result(path: Path) -> Verification:
    data = _read_result(path)
    try:
        return Verification.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise SandboxedVerifyFailed(f"the sandboxed verification's result is malformed ({exc!r})") from None


def run(job: VerifyJob, protect: Sequence[Path] = ()) -> Verification:
    """Run ``job`` in a sandbox and return its verification. ``protect``: folders the child
    must not see besides those every sandbox hides (the workspace the kernels came from)."""
    isolation = sandbox.probe()
    if not isolation.available:
        raise sandbox.SandboxUnavailable(isolation.line())
    base = cache_dir() / "verify"
    base.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="sandboxed-", dir=base))
    group = None
    try:
        (scratch / JOB_FILE).write_text(job.model_dump_json())
        env = _environment(job, scratch)
        policy = sandbox.SandboxPolicy.for_worker(
            scratch, job.device, protect=protect, readonly=_readonly(job), env=env
        )
        argv = [sys.executable, "-m", "wholemodel.sandboxed_main", str(scratch / JOB_FILE), str(scratch / RESULT_FILE)]
        filter_r = sandbox.seccomp.pipe()
        cmd = sandbox.wrap(policy, argv, env, seccomp_fd=filter_r)
        group = sandbox.cgroups.SandboxGroup.make(sandbox.cgroups.default_limit(), "verify")
        if group is not None:
            cmd = group.enter(cmd)
        try:
            # the child's stdout is ours only for --json: its messages go to stderr
            proc = subprocess.Popen(
                cmd,
                cwd=scratch,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sys.stderr,
                pass_fds=[filter_r] if filter_r is not None else [],
                start_new_session=True,
            )
        finally:
            if filter_r is not None:
                os.close(filter_r)
        try:
            code = proc.wait()
        except BaseException:  # Ctrl-C: the sandbox goes with its process group
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        if code != 0:
            raise SandboxedVerifyFailed(
                f"the sandboxed verification failed (exit status {code}; its messages are above)"
            )
        return parse_result(scratch / RESULT_FILE)
    finally:
        if group is not None:
            group.close()
        shutil.rmtree(scratch, ignore_errors=True)
