"""Entry point of a zygote: ``python -m guard.runner.zygote_main --fd N``.

It imports torch and the trusted worker's modules once, then forks a trusted worker for each
request on its socket (``zygote.Zygote``): the child starts from that state, in a few
milliseconds instead of the second or more an import of torch takes. It never runs candidate
code, never initialises a GPU (a forked child must make its own CUDA context) and starts no
thread, so that a fork copies a consistent process.

Requests, one JSON message each on a SOCK_SEQPACKET socket, with file descriptors beside it
(``socket.send_fds``):
- ``{"op": "fork", "argv": [...], "cwd": ..., "env": {...}}`` with the worker's socket and its
  log file: replies ``{"pid": N}``;
- ``{"op": "reap", "pid": N}``, once that child has ended: replies ``{"returncode": R}``
  (negative for a signal, as ``subprocess`` gives it).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import traceback
from typing import Any

MAX_REQUEST = 1 << 20


def _child(request: dict[str, Any], worker_fd: int, log_fd: int, control: socket.socket) -> None:
    """In the forked child: become the worker ``worker_main`` would have been after its
    imports. Never returns."""
    code = 1
    try:
        control.close()
        os.setsid()  # its own session: a kill of its group takes its children too
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]  # as ``python -m`` in the worker's folder has it
        os.environ.clear()
        os.environ.update(request["env"])
        from . import worker_main

        code = worker_main.main([*request["argv"], "--fd", str(worker_fd)])
    except BaseException:  # noqa: BLE001 - the log says why; the guard sees the exit
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def serve(control: socket.socket) -> int:
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, MAX_REQUEST, 2)
        except OSError:
            return 0
        if not data:  # the guard is gone: its workers notice through their own sockets
            return 0
        request = json.loads(data)
        if request["op"] == "fork":
            worker_fd, log_fd = fds
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(request, worker_fd, log_fd, control)
            os.close(worker_fd)
            os.close(log_fd)
            reply: dict[str, Any] = {"pid": pid}
        elif request["op"] == "reap":
            for fd in fds:
                os.close(fd)
            try:
                _, status = os.waitpid(int(request["pid"]), 0)
                reply = {"returncode": _returncode(status)}
            except ChildProcessError:
                reply = {"returncode": None}
        else:
            reply = {"error": f"unknown op {request['op']!r}"}
        control.send(json.dumps(reply).encode())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    args = ap.parse_args()
    control = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=args.fd)
    # what a trusted worker imports before it says ready: the harness first, as there
    from . import harness  # noqa: F401
    from . import common, protocol, trusted_role  # noqa: F401

    import torch  # noqa: F401

    control.send(b'{"ready": true}')
    return serve(control)


if __name__ == "__main__":
    sys.exit(main())
