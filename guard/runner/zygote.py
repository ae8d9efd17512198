"""Trusted workers forked from a process that imported torch once (``zygote_main``).

Every worker used to start as a new interpreter importing torch: about 1.3 s of a core each,
paid again for every guard a process opens (a test suite opens dozens; a server one per
device) and for every trusted worker that dies and is replaced. A zygote pays that once per
guard process and worker environment; each trusted worker is then a fork of it.

Workers on the CPU are forked, by two kinds of zygote. Trusted workers hold references, never
candidate code, and run unconfined: their zygote is a plain process, one per guard process and
environment. Candidate workers are forked by a zygote inside the OS sandbox, one per worker
pool (``pool``), and each enters a cell of its own before it runs anything of the candidate's
(``guard.sandbox.cell``): its own folder, /proc, /tmp and network, no capability, PID 1 of its
own PID namespace. On a GPU the harness's import asks torch whether CUDA is there, which
initialises the driver, and a process forked after that cannot use the device: there every
worker starts from a new interpreter.

A zygote serves one environment (torch reads some variables, such as ``OMP_NUM_THREADS``, when
it is imported), so the guard process keeps one per distinct worker environment, for its whole
life, like the spawner thread (``spawner``). Where a zygote cannot start or fork, the worker
starts as before, from a new interpreter, and the log says why.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..sandbox.cgroups import SandboxGroup
from . import spawner
from . import zygote_messages as zm
from .fds import close_quietly, host_pid, readable

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
REPLY_TIMEOUT_S = 30.0
MAX_REPLY = 1 << 16


class ZygoteError(RuntimeError):
    pass


class RequestFailed(ZygoteError):
    """The zygote could not do what was asked (a fork with no process to be had), and serves on."""


# (worker_main's arguments, folder, environment, socket, log) -> (the child, a pidfd of the
# worker where it is not that child): ``Zygote.fork``'s signature
Fork = Callable[[list[str], Path, dict[str, str], int, int], "tuple[ForkedWorker, int | None]"]


class ForkedWorker:
    """The part of ``subprocess.Popen`` a ``WorkerProcess`` uses, for a child of the zygote:
    the guard is not its parent, so it watches the child through a pidfd and asks the zygote
    for the exit status once it has ended. Several threads may poll and wait at once (a
    server's job and its stop)."""

    def __init__(self, ns_pid: int, pidfd: int, zygote: "Zygote"):
        """``ns_pid``: the child's pid where the zygote sees it (what it reaps); ``pidfd``: a
        pidfd of it, which this object now owns."""
        self.ns_pid = ns_pid
        # the child stays a zombie until the zygote reaps it on request, so its pid is not
        # reused before; the pidfd stays open as long as this object (another thread may wait on it)
        self._pidfd = pidfd
        self.pid = host_pid(pidfd)  # in this process's PID namespace, for /proc and signals
        self.returncode: int | None = None
        self._zygote = zygote
        self._lock = threading.Lock()

    def __del__(self) -> None:
        fd, self._pidfd = getattr(self, "_pidfd", -1), -1
        if fd >= 0:
            os.close(fd)

    def _ended(self, timeout: float) -> bool:
        return readable(self._pidfd, timeout)

    def send_signal(self, sig: int) -> None:
        """Signal the child through its pidfd, never another process that took its pid."""
        if self.returncode is None:
            signal.pidfd_send_signal(self._pidfd, sig)

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
                code = self._zygote.reap(self.ns_pid)
            except ZygoteError as exc:  # the zygote is gone, and with it the exit status
                log.warning("exit status of worker %s unknown (taken as killed): %s", self.pid, exc)
                code = None
            self.returncode = code if code is not None else -9


class Zygote:
    """One zygote process for one worker environment. Any failure to talk to it (no answer
    in time, an answer out of turn, a closed socket) ends it: its children end with it (their
    watchdog sees their parent change), so none is left holding a socket that the guard then
    gives to a worker started another way."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        args: Sequence[str] = (),
        wrap: Callable[[list[str]], list[str]] | None = None,
        tasks: SandboxGroup | None = None,
    ):
        """``args``: more of ``zygote_main``'s arguments (``--cells``); ``wrap``: turns its
        command into the one to run (the OS sandbox's); ``tasks``: the cgroups the zygote
        starts in, its workers with it, removed when it ends (owned from here on)."""
        self.env = dict(env)
        self.tasks = tasks
        self.broken: str | None = None
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "guard.runner.zygote_main", "--fd", str(theirs.fileno()), *args]
        cmd = wrap(cmd) if wrap is not None else cmd
        cmd = tasks.enter(cmd) if tasks is not None else cmd
        try:
            with open(log_path, "ab") as logf:
                self.proc = spawner.popen(
                    cmd,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    pass_fds=[theirs.fileno()],
                    start_new_session=True,
                )
        except OSError as exc:
            ours.close()
            if tasks is not None:
                tasks.close()
            raise ZygoteError(f"the zygote could not start: {exc}") from None
        finally:
            theirs.close()
        try:
            said = self._reply(START_TIMEOUT_S, zm.Started)[0]
        except ZygoteError as exc:
            self._end(str(exc))
            raise
        if isinstance(said, zm.Failed) or not said.ready:
            why = said.error or f"it did not say ready (log: {log_path})"
            self._end(why)
            raise ZygoteError(f"the zygote did not start: {why}")

    @property
    def alive(self) -> bool:
        return self.broken is None and self.proc.poll() is None

    def _reply(self, timeout: float, expected: type[zm.R]) -> tuple[zm.R | zm.Failed, list[int]]:
        """A reply and the descriptors that came with it (the caller's to close)."""
        if not readable(self.sock.fileno(), timeout):
            raise ZygoteError(f"no answer from the zygote within {timeout:.0f} s")
        data, fds, _, _ = socket.recv_fds(self.sock, MAX_REPLY, 2)
        try:
            if not data:
                raise ZygoteError(f"the zygote ended ({self.proc.poll()})")
            return zm.reply_of(data, expected), list(fds)
        except zm.ValidationError:
            close_quietly(*fds)
            raise ZygoteError(f"an answer out of turn to one expecting {expected.__name__}: {data[:200]!r}") from None
        except BaseException:
            close_quietly(*fds)
            raise

    def _ask(self, request: zm.Fork | zm.Reap, fds: list[int], expected: type[zm.R]) -> tuple[zm.R, list[int]]:
        with self._lock:
            if self.broken is not None:
                raise ZygoteError(f"the zygote was ended: {self.broken}")
            try:
                socket.send_fds(self.sock, [zm.encode(request)], fds)
                reply, got = self._reply(REPLY_TIMEOUT_S, expected)
            except (OSError, ZygoteError) as exc:
                why = f"{type(exc).__name__}: {exc}"
                self._end(why)
                raise ZygoteError(why) from None
            if isinstance(reply, zm.Failed):  # it is well, the request failed
                close_quietly(*got)
                raise RequestFailed(f"{request.op}: {reply.error}")
            return reply, got

    def fork(
        self, argv: list[str], cwd: Path, env: dict[str, str], worker_fd: int, log_fd: int
    ) -> tuple[ForkedWorker, int | None]:
        """A worker forked with ``argv`` (``worker_main``'s arguments but ``--fd``), its socket
        ``worker_fd`` and its log file ``log_fd``, in its own session; with a pidfd of the
        worker itself where that is not the zygote's child (a cell's PID 1: killing it kills
        everything the candidate made), which the caller then owns."""
        request = zm.Fork(argv=argv, cwd=str(cwd), env=env)
        forked, pidfds = self._ask(request, [worker_fd, log_fd], zm.Forked)
        pid = forked.pid
        try:
            if not pidfds:
                raise OSError("no pidfd came with the reply")
            child = ForkedWorker(pid, pidfds[0], self)
            return child, (pidfds[1] if len(pidfds) > 1 else None)
        except (OSError, ValueError) as exc:  # a child that cannot be watched must not live
            close_quietly(*pidfds)
            self._end(f"no pidfd for worker {pid}: {exc}")
            raise ZygoteError(f"no pidfd for worker {pid}: {exc}") from None

    def reap(self, pid: int) -> int | None:
        reaped, fds = self._ask(zm.Reap(pid=pid), [], zm.Reaped)
        close_quietly(*fds)
        return reaped.returncode

    def close(self) -> None:
        """End the zygote (its pool is done with it). Workers it forked end with it."""
        with self._lock:
            self._end("closed")

    def _end(self, why: str) -> None:
        self.broken = self.broken or why
        self.sock.close()
        if self.proc.poll() is None:
            try:  # its group: a sandbox's bwrap, and the sandbox's init dies with it
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        self.proc.wait()
        tasks, self.tasks = self.tasks, None
        if tasks is not None:  # anything of its workers still there, then the group
            tasks.close()


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
    child, init = z.fork(argv, cwd, env, worker_fd, log_fd)
    if init is not None:
        close_quietly(init)
    return child
