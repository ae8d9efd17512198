"""One worker process seen from the parent: start, request with a deadline, kill.

Workers run ``python -m guard.runner.worker_main`` in their own session (so a kill takes
their children too), with a scrubbed environment (no workspace path, no secret), their own
working folder, and stdout/stderr sent to a log file: nothing a candidate prints can reach
the parent's stdout or the protocol.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import protocol

log = logging.getLogger(__name__)

# Variables a worker may inherit; everything else (KERNELARC_* above all) is dropped.
ENV_KEEP_PREFIXES = (
    "PATH", "HOME", "LANG", "LC_", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL",
    "LD_LIBRARY_PATH", "CUDA_", "NVIDIA_", "TRITON_", "TORCH_", "TORCHINDUCTOR_",
    "PYTORCH_", "CC", "CXX", "NVCC_", "XDG_CACHE_HOME", "OMP_", "MKL_", "PYTHONPATH",
    "VIRTUAL_ENV", "NCCL_", "NVSHMEM_",
)
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class WorkerDied(RuntimeError):
    def __init__(self, message: str, returncode: int | None, log_tail: str):
        super().__init__(message)
        self.returncode = returncode
        self.log_tail = log_tail


class WorkerTimeout(RuntimeError):
    pass


def worker_env(device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(ENV_KEEP_PREFIXES) and not k.startswith("KERNELARC")
    }
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:  # an interpreter chosen for the caller's own CPU work must not reach GPU workers
        env.pop("TRITON_INTERPRET", None)
    env.update(extra or {})
    return env


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
    ):
        self.role = role
        self.device = device
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "worker.log"
        self.memory_limit_gb = memory_limit_gb
        self.env_extra = env_extra
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.info: dict = {}
        self.started_at = 0.0

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> "WorkerProcess":
        parent_sock, child_sock = socket.socketpair()
        cmd = [
            sys.executable, "-m", "guard.runner.worker_main",
            "--fd", str(child_sock.fileno()), "--role", self.role, "--device", self.device,
        ]
        if self.memory_limit_gb and self.device == "cpu":
            cmd += ["--memory-limit-gb", str(self.memory_limit_gb)]
        logf = open(self.log_path, "ab")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            cwd=self.workdir,
            env=worker_env(self.device, self.env_extra),
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            pass_fds=(child_sock.fileno(),),
            start_new_session=True,
        )
        logf.close()
        child_sock.close()
        self.sock = parent_sock
        return self

    def wait_ready(self, timeout: float = 120.0) -> dict:
        if not self.info:
            self.info = self._recv(timeout, "start")
            if not self.info.get("ready"):
                raise WorkerDied(f"{self.role} worker failed to start: {self.info}", None, self.log_tail())
        return self.info

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("worker %s did not die after SIGKILL", self.proc.pid)
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def close(self, grace: float = 2.0) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.alive and self.sock is not None:
            try:
                protocol.send(self.sock, {"op": "exit"})
                self.proc.wait(timeout=grace)
            except (OSError, subprocess.TimeoutExpired, protocol.ProtocolError):
                pass
        self.kill()

    # -- requests -------------------------------------------------------------------
    def request(self, message: dict, timeout: float) -> dict:
        self.wait_ready()
        if self.sock is None:
            raise WorkerDied("worker socket closed", self.returncode, self.log_tail())
        try:
            protocol.send(self.sock, message)
        except OSError:
            raise self._died(message.get("op", "?")) from None
        return self._recv(timeout, message.get("op", "?"))

    def _recv(self, timeout: float, op: str) -> dict:
        try:
            return protocol.recv(self.sock, timeout)
        except protocol.ReplyTimeout:
            self.kill()
            raise WorkerTimeout(f"{self.role} worker gave no answer to {op!r} within {timeout:.0f} s") from None
        except (protocol.PeerGone, OSError, protocol.ProtocolError):
            raise self._died(op) from None

    def _died(self, op: str) -> WorkerDied:
        try:
            if self.proc is not None:
                self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        rc = self.returncode
        self.kill()
        return WorkerDied(
            f"{self.role} worker {describe_exit(rc)} during {op!r}", rc, self.log_tail()
        )

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 30, max_chars: int = 4000) -> str:
        try:
            text = self.log_path.read_bytes()[-64_000:].decode(errors="replace")
        except OSError:
            return ""
        tail = "\n".join(text.splitlines()[-lines:])
        return tail[-max_chars:]
