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
        ready, _, _ = select.select([self._pidfd], [], [], max(0.0, timeout))
        return bool(ready)

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
                log.warning("exit status of worker %s unknown: %s", self.pid, exc)
                code = None
            self.returncode = code if code is not None else -9


class Zygote:
    """One zygote process for one worker environment."""

    def __init__(self, env: dict[str, str], log_path: Path):
        self.env = dict(env)
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as logf:
            try:
                self.proc = spawner.popen(
                    [sys.executable, "-m", "guard.runner.zygote_main", "--fd", str(theirs.fileno())],
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    pass_fds=[theirs.fileno()],
                    start_new_session=True,
                )
            finally:
                theirs.close()
        self.sock = ours
        if self._reply(START_TIMEOUT_S).get("ready") is not True:
            self.close()
            raise ZygoteError(f"the zygote did not start (log: {log_path})")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _reply(self, timeout: float) -> dict[str, Any]:
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            raise ZygoteError(f"no answer from the zygote within {timeout:.0f} s")
        data = self.sock.recv(MAX_REPLY)
        if not data:
            raise ZygoteError(f"the zygote ended ({self.proc.poll()})")
        reply: dict[str, Any] = json.loads(data)
        return reply

    def _ask(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        with self._lock:
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
                return self._reply(REPLY_TIMEOUT_S)
            except (OSError, ValueError) as exc:
                raise ZygoteError(f"{type(exc).__name__}: {exc}") from None

    def fork(self, argv: list[str], cwd: Path, env: dict[str, str], worker_fd: int, log_fd: int) -> ForkedWorker:
        """A worker forked with ``argv`` (``worker_main``'s arguments but ``--fd``), its socket
        ``worker_fd`` and its log file ``log_fd``, in its own session."""
        reply = self._ask({"op": "fork", "argv": argv, "cwd": str(cwd), "env": env}, [worker_fd, log_fd])
        if "pid" not in reply:
            raise ZygoteError(f"fork refused: {reply}")
        return ForkedWorker(int(reply["pid"]), self)

    def reap(self, pid: int) -> int | None:
        code = self._ask({"op": "reap", "pid": pid}, [])["returncode"]
        return None if code is None else int(code)

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_zygotes: dict[tuple[tuple[str, str], ...], Zygote] = {}
_registry_lock = threading.Lock()


def for_env(env: dict[str, str], log_dir: Path) -> Zygote:
    """This process's zygote for ``env``, started on first use (and again if it died)."""
    key = tuple(sorted(env.items()))
    with _registry_lock:
        z = _zygotes.get(key)
        if z is None or not z.alive:
            t0 = time.monotonic()
            z = Zygote(env, log_dir / f"zygote-{os.getpid()}-{len(_zygotes)}.log")
            log.debug("zygote started in %.2f s", time.monotonic() - t0)
            _zygotes[key] = z
        return z
