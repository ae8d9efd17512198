"""One worker process seen from the parent: start, request with a deadline, kill.

Workers run ``python -m guard.runner.worker_main`` in their own session (so a kill takes
their children too), with a scrubbed environment (no workspace path, no secret), their own
working folder, and stdout/stderr sent to a log file: nothing a candidate prints can reach
the parent's stdout or the protocol. Candidate workers run inside the OS sandbox
(``guard.sandbox``) where the machine allows it: their own folder is the only place they
can write, and the workspace, other processes and the network are out of sight.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .. import sandbox
from . import nvml, pacing, proc_tree, protocol, request_profile, spawner, worker_files, zygote
from .fds import host_pid, readable
from .worker_environment import worker_env

log = logging.getLogger(__name__)


class WorkerDied(RuntimeError):
    def __init__(self, message: str, returncode: int | None, log_tail: str):
        super().__init__(message)
        self.returncode = returncode
        self.log_tail = log_tail


class MalformedReply(WorkerDied):
    """The worker sent bytes that are no message (they do not decode): it is killed, as if it
    had died; a candidate's worker that does so answered out of protocol (``reasons.died``)."""


class WorkerTimeout(RuntimeError):
    pass


# OSErrors that a worker's socket never raises here (its sockets block, without timeouts, and
# Python retries a read that a signal interrupted): only a caller's signal handler or timer
# raises them in the middle of an exchange. They leave the worker out of step, as any
# interruption does, and are not its death: reported as "the worker died", they blamed the
# candidate for the caller's own timeout (a review's, session 49).
CALLER_INTERRUPTIONS = (TimeoutError, InterruptedError)


def _kill_group(proc: "subprocess.Popen[bytes] | zygote.ForkedWorker") -> None:
    """SIGKILL a worker's process group, which it leads (its setsid). Where there is no group
    of that number (a worker forked a moment ago, before its setsid: a guard closed during its
    warm-up), the worker itself: unreaped, its pid is still its own. Before, nothing killed
    it, and ``_kill``'s wait held a server's stop for 10 s (session 50)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
    except PermissionError:
        pass


def _gpu_minor(env: dict[str, str]) -> int | None:
    """The device node's minor number of the one GPU a worker is pinned to (its
    ``CUDA_VISIBLE_DEVICES`` names it by UUID), or None."""
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    return nvml.minor_number(visible) if visible.startswith("GPU-") and "," not in visible else None


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


class WorkerProcess:
    def __init__(
        self,
        role: str,
        device: str,
        workdir: Path,
        memory_limit_gb: float | None = None,
        env_extra: dict[str, str] | None = None,
        *,
        protect: Sequence[Path] = (),
        expose: Sequence[Path] = (),
        isolation: "sandbox.Isolation | None" = None,
        cells: zygote.Zygote | None = None,
        tasks_limit: int | None = None,
        spare: bool = False,
    ):
        """``protect``: paths a candidate must not see (the workspace, the secret);
        ``expose``: read-only paths it may see even inside those (problem folders);
        ``isolation``: the pool's probe result (probed here when not given);
        ``cells``: the pool's candidates' zygote (``runner.cells``), whose sandbox holds
        ``workdir``'s folder: a candidate worker is forked by it into a cell of its own;
        ``tasks_limit``: the processes and threads a sandbox of its own may hold (its pids
        cgroup's cap; a cell's are capped with its zygote's, ``cells.start``);
        ``spare``: a candidate worker started ahead of its candidate (``spare_setup``)."""
        self.role = role
        self.device = device
        self.workdir = Path(workdir).absolute()
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Outputs a candidate hands to the trusted worker: inside its own folder, the only
        # place a sandboxed worker can write.
        self.outdir = self.workdir / "out"
        self.outdir.mkdir(exist_ok=True)
        self.log_path = self.workdir / "worker.log"
        self.memory_limit_gb = memory_limit_gb
        self.env_extra = env_extra
        self.spare = spare
        self.protect = [Path(p) for p in protect]
        self.expose = [Path(p) for p in expose]
        self.cells = cells if role == "candidate" else None
        self.tasks_limit = tasks_limit or sandbox.cgroups.default_limit()
        self._cgroup: sandbox.cgroups.SandboxGroup | None = (
            None  # the sandbox's cgroups (tasks capped, CPU counted), if any
        )
        if role == "candidate":
            iso = isolation or sandbox.probe()
            self.isolation = iso.mechanism if iso.available else "none"
        else:  # the trusted worker holds references, never candidate code: unconfined
            self.isolation = "none"
        self.proc: subprocess.Popen[bytes] | zygote.ForkedWorker | None = None
        # the worker's process id in its PID namespace, as its set-up said before any candidate
        # code ran (``SetupReply``): the process a CPU's loops are read from and written into
        self.ns_pid: int | None = None
        self.sock: socket.socket | None = None
        self.info: dict[str, Any] = {}
        self.started_at = 0.0
        # Seconds spent waiting on each request kind, summed over the worker's life: the
        # verdict reports the part each evaluation added (where a verdict's time goes).
        self.op_seconds: dict[str, float] = {}
        self._outstanding: tuple[str, float] | None = None  # (op, when sent) of the request awaiting its reply
        self._sandbox_init: int | None = None  # pidfd of the sandbox's init (PID 1 inside)
        self.stopped_for: str | None = None  # why the guard stopped it from outside (``stop_for``)
        # held by ``kill`` and by another thread's ``stop_for``/``process_ids``: the sandbox's
        # pidfd and cgroup are closed under it, never while the other uses them
        self._life = threading.RLock()
        # The log, opened by the guard before the worker exists and read back through this
        # descriptor only: the path lies in the worker's folder, where a candidate may replace
        # the file by a link to the workspace's secret or by a FIFO (red team, session 32).
        self._log_fd: int | None = None

    def __del__(self) -> None:
        fd, self._log_fd = getattr(self, "_log_fd", None), None
        if fd is not None:
            os.close(fd)

    def _log(self) -> int:
        if self._log_fd is None:
            flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            self._log_fd = os.open(self.log_path, flags, 0o644)
        return self._log_fd

    # -- lifecycle ----------------------------------------------------------------
    def _args(self) -> list[str]:
        """``worker_main``'s arguments but ``--fd``. What the guard tells a worker about
        itself goes here, never into its environment, which keeps nothing of the guard's
        (``worker_env``)."""
        args = ["--role", self.role, "--device", self.device]
        if self.memory_limit_gb and self.device == "cpu":
            args += ["--memory-limit-gb", str(self.memory_limit_gb)]
        if self.spare and self.role == "candidate":
            args.append("--spare")
        if request_profile.enabled():
            args.append("--profile")
        return args

    def start(self) -> "WorkerProcess":
        self.started_at = time.monotonic()
        # a GPU's trusted worker starts from a new interpreter: the harness asks torch whether
        # CUDA is there when it is imported, which initialises the driver, and a process forked
        # after that cannot use the GPU (``zygote``)
        env = worker_env(self.device, self.env_extra)
        if self.role == "candidate":
            env.update(sandbox.scratch_env(self.workdir, env))
        if self.role == "trusted" and self.device == "cpu" and self._start_forked(env, self._fork_trusted):
            return self
        if self.cells is not None and self._start_forked(env, self.cells.fork):
            self._cap_cell()
            return self
        logf = self._log()
        parent_sock, child_sock = socket.socketpair()
        launch = None
        try:
            cmd = [sys.executable, "-m", "guard.runner.worker_main", "--fd", str(child_sock.fileno()), *self._args()]
            if self.isolation != "none":
                launch = sandbox.launch.prepare(
                    self._policy(env),
                    cmd,
                    env,
                    tag="worker",
                    tasks_limit=self.tasks_limit,
                    memory_bytes=self._memory_bytes(),
                    want_info=True,
                )
                cmd = launch.cmd
            # forked from a thread that outlives this one: bwrap's --die-with-parent follows it
            self.proc = spawner.popen(
                cmd,
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                pass_fds=[child_sock.fileno(), *(launch.pass_fds if launch else [])],
                start_new_session=True,
            )
        except BaseException:
            if launch is not None:
                launch.abandon()
            parent_sock.close()
            raise
        finally:
            child_sock.close()
            if launch is not None:
                launch.started()
        self._cgroup = launch.group if launch else None
        info_r = launch.info_r if launch else None
        self.sock = parent_sock
        if info_r is not None:
            self._sandbox_init = self._open_sandbox_init(info_r)
        return self

    def _policy(self, env: dict[str, str]) -> sandbox.SandboxPolicy:
        """What a candidate worker's sandbox shows it (``SandboxPolicy.for_worker``)."""
        return sandbox.SandboxPolicy.for_worker(
            self.workdir,
            self.device,
            protect=self.protect,
            expose=self.expose,
            env=env,
            gpu_minor=_gpu_minor(env) if self.device.startswith("cuda") else None,
        )

    def _fork_trusted(
        self, argv: list[str], cwd: Path, env: dict[str, str], worker_fd: int, log_fd: int
    ) -> tuple[zygote.ForkedWorker, int | None]:
        return zygote.fork_worker(env, self.log_path, argv, cwd, worker_fd, log_fd), None

    def _start_forked(self, env: dict[str, str], fork: zygote.Fork) -> bool:
        """Start as a fork of a zygote, which has imported torch already (``zygote``): this
        process's for a trusted worker, the pool's for a candidate's. False where it cannot
        (the caller starts the worker from a new interpreter, on a socket of its own: a child
        the failed zygote may have forked dies with it, and must not share the new worker's)."""
        parent_sock, child_sock = socket.socketpair()
        try:
            self.proc, self._sandbox_init = fork(self._args(), self.workdir, env, child_sock.fileno(), self._log())
        except zygote.ZygoteError as exc:
            log.warning("%s worker started without a zygote: %s", self.role, exc)
            parent_sock.close()
            return False
        finally:
            child_sock.close()
        self.sock = parent_sock
        return True

    def _cap_cell(self) -> None:
        """Move a cell's worker out of its zygote's pids group into one of its own, before
        the guard sends it anything (no candidate code has run in it yet). A group shared by
        the cells let them pass messages: its count, which one cell's threads raise and
        another sees when its own fork fails at the cap, while both live (a challenger and
        the incumbent it is paired with). Where that cannot be done the worker stays in the
        zygote's group, which caps it too."""
        if self._sandbox_init is None:
            return
        group = sandbox.cgroups.SandboxGroup.make(self.tasks_limit, "cell", self._memory_bytes())
        if group is None:
            return
        try:
            group.adopt(host_pid(self._sandbox_init))
        except OSError as exc:
            log.warning("a cell's worker stays in its zygote's pids group: %s", exc)
            group.close()
            return
        self._cgroup = group

    @staticmethod
    def _open_sandbox_init(info_r: int) -> int | None:
        """A pidfd on the sandbox's init, read from bwrap's --info-fd right after start
        (before its pid could be reused): ``kill`` waits on it, since the kernel has killed
        every process of the sandbox by the time its init is gone."""
        try:
            data = b""
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if not readable(info_r, deadline - time.monotonic()):
                    break
                chunk = os.read(info_r, 4096)
                if not chunk:
                    break
                data += chunk
                pid = sandbox.bwrap.child_pid(data)
                if pid is not None:
                    return os.pidfd_open(pid)
            log.warning("bwrap gave no sandbox pid (%r); kill relies on --die-with-parent", data[:200])
        except OSError as exc:  # the sandbox failed to start; the first request says so
            log.warning("cannot watch the sandbox's init: %s", exc)
        finally:
            os.close(info_r)
        return None

    @property
    def ready(self) -> bool:
        """Whether its start is over (its ready message read: ``wait_ready``)."""
        return bool(self.info)

    def wait_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        if not self.info:
            self.info = self._recv(timeout, "start")
            if not self.info.get("ready"):
                raise WorkerDied(f"{self.role} worker failed to start: {self.info}", None, self.log_tail())
        return self.info

    def remove_output(self, name: str) -> None:
        """Delete one of the output files the guard named in the worker's ``out`` folder. The
        folder is the candidate's to write: it is opened without following a link, so that a
        folder replaced by a link to another (another candidate's, say) cannot make the guard
        delete a file there (red team, session 27)."""
        try:
            worker_files.remove(self.outdir, name)
        except OSError as exc:  # replaced by a link or a file, or gone: nothing of ours to delete
            log.warning("%s worker's output folder cannot be opened (%s): %s not deleted", self.role, exc, name)

    @property
    def sandbox_pid(self) -> int | None:
        """The host pid of the process whose PID namespace holds the candidate's processes: the
        sandbox's init, or a cell's PID 1 (the worker itself); else the worker's own pid. The
        processes it names by pid (its held outputs) are looked for from there, not from a
        process above it, which the candidate's reply could otherwise name too."""
        if self._sandbox_init is not None:
            try:
                return host_pid(self._sandbox_init)
            except OSError:
                return None
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def process_ids(self) -> list[int]:
        """The host pids of the worker's processes now: its cgroup's, or the tree below its
        sandbox's init (or below the worker itself, without a sandbox); none once it is killed.
        For counting, not killing: a pid may be another process's by the time it is used."""
        with self._life:
            if not self.alive:
                return []
            if self._cgroup is not None:
                return self._cgroup.tasks()
            top = self.sandbox_pid
        return proc_tree.tree(top) if top is not None else []

    def stop_for(self, reason: str) -> None:
        """Kill the worker from another thread than the one that talks to it, for ``reason``,
        which the message of its death gives (``_died``); that thread finds it dead and cleans
        up as after any death. Through what pins its processes: the sandbox's init by its pidfd
        (the kernel then kills its PID namespace; a cell's worker is PID 1 of its own) and the
        cgroup's members each by a pidfd; without a sandbox, its process group. Nothing once
        ``kill`` has begun, whose lock this holds."""
        with self._life:
            proc = self.proc
            if proc is None or proc.poll() is not None:
                return
            self.stopped_for = reason
            if self._sandbox_init is not None:
                try:
                    signal.pidfd_send_signal(self._sandbox_init, signal.SIGKILL)
                except OSError:
                    pass
            if self._cgroup is not None:
                self._cgroup.kill_all()
            if self._sandbox_init is None and self._cgroup is None:
                # no sandbox: its group by pid, unreaped a moment ago (the one unpinned route,
                # which needs the pid reaped and reused within microseconds to miss)
                _kill_group(proc)

    def kill(self) -> None:
        with self._life:
            self._kill()

    def _kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            _kill_group(self.proc)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("worker %s did not die after SIGKILL", self.proc.pid)
        self._end_sandbox()
        self._end_cgroup()
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _memory_bytes(self) -> int | None:
        """A CPU worker's sandbox holds at most its address-space cap, all processes together."""
        return int(self.memory_limit_gb * (1 << 30)) if self.memory_limit_gb and self.device == "cpu" else None

    @property
    def cgroup_dir(self) -> Path | None:
        """The folder of the cgroup that holds the worker's processes and no others (its
        sandbox's, or its cell's own), in the pids hierarchy; None where it has none."""
        return self._cgroup.path if self._cgroup is not None else None

    def cpu_ns(self) -> int | None:
        """CPU time the candidate's sandbox (or cell) has used, every task that was ever in it
        counted by the kernel, reaped or not; None where it is not counted."""
        return self._cgroup.cpu_ns() if self._cgroup is not None else None

    def _end_cgroup(self) -> None:
        """Kill what is left in the sandbox's cgroups, then remove them."""
        group, self._cgroup = self._cgroup, None
        if group is not None:
            group.close()

    def _end_sandbox(self, timeout: float = 10.0) -> None:
        """Kill the sandbox's init (the kernel then kills its whole PID namespace: a
        candidate's children and grandchildren, whatever session they made) and wait for it."""
        fd, self._sandbox_init = self._sandbox_init, None
        if fd is None:
            return
        try:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass  # already gone
            if not readable(fd, timeout):
                log.warning("the sandbox of worker %s outlived its kill", self.proc.pid if self.proc else "?")
        except OSError as exc:
            log.warning("waiting for the sandbox failed: %s", exc)
        finally:
            os.close(fd)

    def close(self, grace: float = 2.0) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.alive and self.proc is not None and self.sock is not None:
            try:
                protocol.send(self.sock, {"op": "exit"})
                self.proc.wait(timeout=grace)
            except (OSError, subprocess.TimeoutExpired, protocol.ProtocolError):
                pass
        self.kill()

    # -- requests -------------------------------------------------------------------
    @contextlib.contextmanager
    def _in_step(self) -> Iterator[None]:
        """An exchange cut short by an exception from outside the protocol (a signal's, a
        caller's own timeout) leaves the worker out of step: the reply on its way would answer
        the next request (a trusted worker answered 'problem' with a build's reply after a test's
        timeout, on the H100 in session 49). Such a worker is killed: the pool starts another
        when one is needed, and a candidate's dies as any worker that fails."""
        try:
            yield
        except CALLER_INTERRUPTIONS:  # OSErrors, but the caller's
            self.kill()
            raise
        except (WorkerDied, WorkerTimeout, protocol.ProtocolError, OSError):
            raise  # the protocol's own failures: each already ends or kills the worker
        except BaseException:
            self.kill()
            raise

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.send(message)
        return self.receive(timeout)

    def send(self, message: dict[str, Any]) -> None:
        """Send a request without waiting for its reply (``receive`` gets it): the guard lets a
        worker work while it does something else. One request at a time is outstanding."""
        self.wait_ready()
        if self.sock is None:
            raise WorkerDied("worker socket closed", self.returncode, self.log_tail())
        if self._outstanding is not None:
            # out of step (an interruption between a send and its wait, say): its reply would
            # answer this request, so the worker goes, and the pool starts another
            self.kill()
            raise RuntimeError(
                f"{self.role} worker: {message.get('op')!r} sent before {self._outstanding[0]!r} was answered"
            )
        op = message.get("op", "?")
        self._outstanding = (op, time.monotonic())
        with self._in_step():
            try:
                protocol.send(self.sock, message)
            except CALLER_INTERRUPTIONS:
                raise
            except OSError:
                self._outstanding = None
                raise self._died(op) from None
            except protocol.ProtocolError:
                self._outstanding = None  # refused before a byte went out (too large): in step
                raise

    def receive(self, timeout: float) -> dict[str, Any]:
        """The reply to the outstanding request."""
        if self._outstanding is None:
            raise RuntimeError(f"{self.role} worker: no request is waiting for its reply")
        op, t0 = self._outstanding
        try:
            with self._in_step():
                return self._recv(timeout, op)
        finally:
            self._outstanding = None
            self.op_seconds[op] = self.op_seconds.get(op, 0.0) + time.monotonic() - t0

    def pace_done(self, size: int, deadline: float) -> bytes | dict[str, Any]:
        """In a paced loop (``pacing``): the payload of the worker's next DONE, or, where the
        loop ended first (a failure, a loop cut short), the outstanding request's reply."""
        if self._outstanding is None or self.sock is None:
            raise RuntimeError(f"{self.role} worker: no paced loop is outstanding")
        op, t0 = self._outstanding
        try:
            with self._in_step():
                first = protocol.recv_raw(self.sock, 1, deadline)
                if first == pacing.DONE:
                    return protocol.recv_raw(self.sock, size, deadline)
                reply = protocol.recv_rest(self.sock, first, deadline)
        except protocol.ReplyTimeout:
            self.kill()
            raise WorkerTimeout(f"{self.role} worker gave no answer to {op!r} in time") from None
        except CALLER_INTERRUPTIONS:
            raise
        except (protocol.PeerGone, OSError):
            raise self._died(op) from None
        except protocol.ProtocolError as exc:
            self.kill()
            raise MalformedReply(
                f"{self.role} worker answered {op!r} out of protocol: {exc}", None, self.log_tail()
            ) from None
        self._outstanding = None
        self.op_seconds[op] = self.op_seconds.get(op, 0.0) + time.monotonic() - t0
        return reply

    def pace_go(self, deadline: float) -> None:
        """In a paced loop: the next call's inputs are written. The GO before it must have been
        read: a loop that said a call was done without waiting for its GO left the guard's GOs
        piling up in the socket, until a send blocked for good (red team, session 34)."""
        if self.sock is None or self._outstanding is None:
            raise RuntimeError(f"{self.role} worker: no paced loop is outstanding")
        op = self._outstanding[0]
        if (protocol.unread(self.sock) or 0) > 0:
            self.kill()
            raise MalformedReply(
                f"{self.role} worker said a call of {op!r} was done before reading the guard's go-ahead for it",
                None,
                self.log_tail(),
            )
        try:
            protocol.send_raw(self.sock, pacing.GO, deadline)
        except protocol.ReplyTimeout:
            self.kill()
            raise WorkerTimeout(f"{self.role} worker read nothing of {op!r} in time") from None
        except CALLER_INTERRUPTIONS:
            self.kill()  # perhaps half a GO sent: out of step
            raise
        except OSError:
            raise self._died(op) from None

    def _recv(self, timeout: float, op: str) -> dict[str, Any]:
        assert self.sock is not None, "the worker was killed before it was ready"
        try:
            return protocol.recv(self.sock, timeout)
        except protocol.ReplyTimeout:
            self.kill()
            raise WorkerTimeout(f"{self.role} worker gave no answer to {op!r} within {timeout:.0f} s") from None
        except CALLER_INTERRUPTIONS:
            raise
        except (protocol.PeerGone, OSError):  # PeerGone first: it is a ProtocolError too
            raise self._died(op) from None
        except protocol.ProtocolError as exc:  # alive, perhaps, but no longer in the protocol
            self.kill()
            raise MalformedReply(
                f"{self.role} worker sent a malformed reply to {op!r}: {exc}", None, self.log_tail()
            ) from None

    def _died(self, op: str) -> WorkerDied:
        try:
            if self.proc is not None:
                self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        rc = self.returncode
        why = f"{self.role} worker {describe_exit(rc)} during {op!r}"
        if self.stopped_for is not None:
            why += f": {self.stopped_for}"
        elif self._cgroup is not None and self._cgroup.oom_kills():
            why += (
                f": the kernel killed it, its sandbox's processes holding {self.memory_limit_gb:g} GB "
                "together (the sandbox's memory cap)"
            )
        self.kill()
        return WorkerDied(why, rc, self.log_tail())

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 30, max_chars: int = 4000) -> str:
        """The end of the worker's log, read through the guard's own descriptor (``_log_fd``)."""
        if self._log_fd is None:
            return ""
        try:
            size = os.fstat(self._log_fd).st_size
            data = os.pread(self._log_fd, 64_000, max(0, size - 64_000))
        except OSError:
            return ""
        tail = "\n".join(data.decode(errors="replace").splitlines()[-lines:])
        return tail[-max_chars:]
