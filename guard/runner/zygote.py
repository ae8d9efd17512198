"""Trusted workers forked from a process that imported torch once (``zygote_main``).

Every worker used to start as a new interpreter importing torch: about 1.3 s of a core each,
paid again for every guard a process opens (a test suite opens dozens; a server one per
device) and for every trusted worker that dies and is replaced. A zygote pays that once per
guard process and worker environment; each trusted worker is then a fork of it.

Only trusted workers on the CPU are forked. Trusted workers hold references, never candidate
code, and run unconfined anyway; a candidate worker starts inside the OS sandbox from a fresh
interpreter, so that nothing of another process's memory is in it and the sandbox is the one
bwrap makes. On a GPU the harness's import asks torch whether CUDA is there, which initialises
the driver, and a process forked after that cannot use the device; a GPU's trusted worker is
started once per server anyway.

A zygote serves one environment (torch reads some variables, such as ``OMP_NUM_THREADS``, when
it is imported), so the guard process keeps one per distinct worker environment, for its whole
life, like the spawner thread (``spawner``). Where a zygote cannot start or fork, the worker
starts as before, from a new interpreter, and the log says why.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import spawner

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
REPLY_TIMEOUT_S = 30.0
MAX_REPLY = 1 << 16


class ZygoteError(RuntimeError):
    pass


class ForkedWorker:
    """The part of ``subprocess.Popen`` a ``WorkerProcess`` uses, for a child of the zygote:
    the guard is not its parent, so it watches the child through a pidfd and asks the zygote
    for the exit status once it has ended. Several threads may poll and wait at once (a
    server's job and its stop)."""

    def __init__(self, pid: int, zygote: "Zygote"):
        self.pid = pid
        self.returncode: int | None = None
        self._zygote = zygote
        self._lock = threading.Lock()
        # the child stays a zombie until the zygote reaps it on request, so its pid is not
        # reused before; the pidfd stays open as long as this object (another thread may wait on it)
        self._pidfd = os.pidfd_open(pid)

    def __del__(self) -> None:
        fd, self._pidfd = getattr(self, "_pidfd", -1), -1
        if fd >= 0:
            os.close(fd)

    def _ended(self, timeout: float) -> bool:
        return _readable(self._pidfd, timeout)

    def poll(self) -> int | None:
        if self.returncode is None and self._ended(0):
            self._reap()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self._ended(timeout if timeout is not None else 1e9):
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            self._reap()
        assert self.returncode is not None
        return self.returncode

    def _reap(self) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            try:
                code = self._zygote.reap(self.pid)
            except ZygoteError as exc:  # the zygote is gone, and with it the exit status
                log.warning("exit status of worker %s unknown (taken as killed): %s", self.pid, exc)
                code = None
            self.returncode = code if code is not None else -9


def _readable(fd: int, timeout: float) -> bool:
    poller = select.poll()  # not select.select: a descriptor may be numbered past 1024
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout) * 1000))


class Zygote:
    """One zygote process for one worker environment. Any failure to talk to it (no answer
    in time, an answer out of turn, a closed socket) ends it: its children end with it (their
    watchdog sees their parent change), so none is left holding a socket that the guard then
    gives to a worker started another way."""

    def __init__(self, env: dict[str, str], log_path: Path):
        self.env = dict(env)
        self.broken: str | None = None
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(log_path, "ab") as logf:
                self.proc = spawner.popen(
                    [sys.executable, "-m", "guard.runner.zygote_main", "--fd", str(theirs.fileno())],
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    pass_fds=[theirs.fileno()],
                    start_new_session=True,
                )
        except OSError as exc:
            ours.close()
            raise ZygoteError(f"the zygote could not start: {exc}") from None
        finally:
            theirs.close()
        try:
            ready = self._reply(START_TIMEOUT_S).get("ready") is True
        except ZygoteError as exc:
            self._end(str(exc))
            raise
        if not ready:
            self._end("it did not say ready")
            raise ZygoteError(f"the zygote did not start (log: {log_path})")

    @property
    def alive(self) -> bool:
        return self.broken is None and self.proc.poll() is None

    def _reply(self, timeout: float) -> dict[str, Any]:
        if not _readable(self.sock.fileno(), timeout):
            raise ZygoteError(f"no answer from the zygote within {timeout:.0f} s")
        data = self.sock.recv(MAX_REPLY)
        if not data:
            raise ZygoteError(f"the zygote ended ({self.proc.poll()})")
        reply: dict[str, Any] = json.loads(data)
        return reply

    def _ask(self, request: dict[str, Any], fds: list[int], expect: str) -> Any:
        with self._lock:
            if self.broken is not None:
                raise ZygoteError(f"the zygote was ended: {self.broken}")
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
                reply = self._reply(REPLY_TIMEOUT_S)
                if expect not in reply:
                    raise ZygoteError(f"{request['op']} answered out of turn: {reply}")
                return reply[expect]
            except (OSError, ValueError, ZygoteError) as exc:
                why = f"{type(exc).__name__}: {exc}"
                self._end(why)
                raise ZygoteError(why) from None

    def fork(self, argv: list[str], cwd: Path, env: dict[str, str], worker_fd: int, log_fd: int) -> ForkedWorker:
        """A worker forked with ``argv`` (``worker_main``'s arguments but ``--fd``), its socket
        ``worker_fd`` and its log file ``log_fd``, in its own session."""
        request = {"op": "fork", "argv": argv, "cwd": str(cwd), "env": env}
        pid = int(self._ask(request, [worker_fd, log_fd], "pid"))
        try:
            return ForkedWorker(pid, self)
        except OSError as exc:  # no pidfd: the child cannot be watched, so it must not live
            self._end(f"no pidfd for worker {pid}: {exc}")
            raise ZygoteError(f"no pidfd for worker {pid}: {exc}") from None

    def reap(self, pid: int) -> int | None:
        code = self._ask({"op": "reap", "pid": pid}, [], "returncode")
        return None if code is None else int(code)

    def _end(self, why: str) -> None:
        self.broken = self.broken or why
        self.sock.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


_zygotes: dict[tuple[tuple[str, str], ...], Zygote] = {}
_failed: dict[tuple[tuple[str, str], ...], str] = {}
_registry_lock = threading.Lock()


def fork_worker(
    env: dict[str, str], log_path: Path, argv: list[str], cwd: Path, worker_fd: int, log_fd: int
) -> ForkedWorker:
    """A worker forked from this process's zygote for ``env`` (started on first use, and again
    if it ended); ``ZygoteError`` where there is none. A zygote that failed to start is not
    tried again in this process: every trusted worker would wait for it first. A zygote
    writes to the log of the worker it was started for (its import errors show there, and it
    leaves no file of its own: the folder goes with that worker)."""
    key = tuple(sorted(env.items()))
    with _registry_lock:
        if key in _failed:
            raise ZygoteError(f"no zygote in this process: {_failed[key]}")
        z = _zygotes.get(key)
        if z is None or not z.alive:
            t0 = time.monotonic()
            try:
                z = Zygote(env, log_path)
            except ZygoteError as exc:
                _failed[key] = str(exc)
                raise
            log.debug("zygote started in %.2f s", time.monotonic() - t0)
            _zygotes[key] = z
    return z.fork(argv, cwd, env, worker_fd, log_fd)
