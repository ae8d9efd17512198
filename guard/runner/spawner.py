"""Every worker process is forked from one thread that lives as long as the guard's process.

bwrap's ``--die-with-parent`` (``PR_SET_PDEATHSIG``) sends SIGKILL when the *thread* that
forked it ends, not the process. A server starts its guard's first workers from a start-up
thread that ends once the baselines are measured: the spare candidate worker it had started
was killed then, in the middle of a verdict that had taken it ("candidate worker killed by
signal SIGKILL during 'setup'", seen in a loaded test run). Forking from one long-lived
thread keeps the signal for what it is for: the guard's process dying.
"""

from __future__ import annotations

import queue
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
_lock = threading.Lock()
_thread: threading.Thread | None = None


def _serve() -> None:
    while True:
        fn, done = _jobs.get()
        if done.set_running_or_notify_cancel():
            try:
                done.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                done.set_exception(exc)


def _ensure_thread() -> None:
    global _thread
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_serve, name="kernelarc-worker-spawner", daemon=True)
            _thread.start()


def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(*args, **kwargs)``, forked from the spawner thread."""
    _ensure_thread()
    done: Future[subprocess.Popen[bytes]] = Future()
    _jobs.put((lambda: subprocess.Popen(*args, **kwargs), done))
    return done.result()
