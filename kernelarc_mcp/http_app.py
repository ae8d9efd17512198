"""Serving MCP over streamable HTTP, in one process or several.

The HTTP layer is stateless (each request carries its bearer token; no sessions), so any
number of worker processes can answer. Exactly one process evaluates: the one that runs
``serve_http`` owns the job queue and the guard's GPU workers; the HTTP workers only read
the workspace and put submissions in the queue (the database), then wait for the verdict
there. With ``workers=1`` the same process does both.

With several HTTP workers each one listens on its own socket, all bound to the one port with
SO_REUSEPORT (on Linux), and the kernel gives each new connection to one of them by a hash of
the client's address and port: uniformly, whatever the workers are doing. With one socket
shared by all, as ``uvicorn.run(workers=N)`` does, a connection goes to whichever worker is
woken first, and that one accepts every connection waiting; clients keep their connection
alive, so where they land decides the load of each worker for as long as they stay.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import socket
import sys
import threading
import time

from memory.conclusions import Retention

ENV = "KERNELARC_SERVE_OPTIONS"
STARTUP_FAILURE = 3  # uvicorn's exit status when a server cannot start
MIN_LIFE_S = 10.0  # an HTTP worker that ends sooner (not told to) is not started again
STOP_GRACE_S = 10.0  # how long stopping workers may finish the requests they have
log = logging.getLogger(__name__)


def _uvicorn_speedups() -> dict:
    fast = importlib.util.find_spec("uvloop") and importlib.util.find_spec("httptools")
    return {"loop": "uvloop" if fast else "asyncio", "http": "httptools" if fast else "h11"}


def build_app(service, options: dict):
    from .server import build_server

    mcp = build_server(service, http_auth=not options["allow_anonymous"], host=options["host"],
                       port=options["port"], stdio_agent="anonymous" if options["allow_anonymous"] else None)
    return mcp.streamable_http_app(host=options["host"], stateless_http=True)


def create_app():
    """Factory each HTTP worker process calls (options come through the environment)."""
    from guard.workspace import Workspace

    from .service import Service

    options = json.loads(os.environ[ENV])
    logging.basicConfig(level=options.get("log_level", logging.WARNING))
    ws = Workspace.open(options["workspace"])
    service = Service(ws, ws.config(), device=options["device"],
                      retention=Retention(options["retention_days"], options["retention_per_problem"]),
                      max_wait_s=options["max_wait"], evaluator=False)
    return build_app(service, options)


def serve_http(service, options: dict, workers: int) -> None:
    """Serve until interrupted (SIGINT or SIGTERM); ``service`` is the evaluating one (this
    process). With ``workers`` > 1 this process serves no HTTP itself: it listens on one
    socket per worker and starts the workers, which answer on them."""
    import uvicorn

    common = dict(host=options["host"], port=options["port"], log_level="warning", access_log=False,
                  **_uvicorn_speedups())
    if workers <= 1:
        uvicorn.run(build_app(service, options), **common)
        return
    os.environ[ENV] = json.dumps(options)
    if not (sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")):
        # elsewhere SO_REUSEPORT does not balance (or does not exist): one shared socket
        uvicorn.run("kernelarc_mcp.http_app:create_app", factory=True, workers=workers, **common)
        return
    _Workers(options["host"], options["port"], workers, common).run()


def _listeners(host: str, port: int, n: int, backlog: int = 2048) -> list[socket.socket]:
    """``n`` listening sockets on one port, with SO_REUSEPORT: the kernel gives each new
    connection to one of them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if port:
        # SO_REUSEPORT would also let these join another server of this user on the port:
        # a plain bind fails if anything listens there
        with socket.socket(family) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.socket(family)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]  # port 0: the others take the one the first was given
            # listening from now on: a client that connects before its worker has started
            # waits in this socket's queue
            sock.listen(backlog)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


def _http_worker(sock: socket.socket, common: dict, parent: int) -> None:
    """One HTTP worker process: the app from ``create_app`` served on its own socket."""
    import uvicorn

    threading.Thread(target=_exit_with_parent, args=(parent,), name="kernelarc-parent-watch", daemon=True).start()
    config = uvicorn.Config("kernelarc_mcp.http_app:create_app", factory=True, **common)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # an interrupt before the server caught signals; the parent stops us
        pass


def _exit_with_parent(parent: int) -> None:
    """Stop this worker when the serving process is gone (killed without stopping us)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(STOP_GRACE_S)
    os._exit(1)


class _Workers:
    """The HTTP worker processes, each on its own listening socket; a worker that ends is
    started again on the same socket (connections that arrive meanwhile wait in its queue)."""

    def __init__(self, host: str, port: int, n: int, common: dict):
        import multiprocessing

        try:
            self.socks = _listeners(host, port, n)
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", host, port, exc)
            raise SystemExit(STARTUP_FAILURE) from None
        self.common = common
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: list = [None] * n
        self.started = [0.0] * n
        self.stopping = False  # set by the signal handler (an Event's lock could deadlock there)

    def _start(self, i: int) -> None:
        p = self.ctx.Process(target=_http_worker, args=(self.socks[i], self.common, os.getpid()),
                             name=f"kernelarc-http-{i}")
        p.start()
        self.procs[i], self.started[i] = p, time.monotonic()

    def _on_signal(self, *_) -> None:
        self.stopping = True

    def run(self) -> None:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        failed = False
        try:
            for i in range(len(self.socks)):
                if not self.stopping:
                    self._start(i)
            while not self.stopping:
                time.sleep(0.5)  # a signal ends the sleep early
                for i, p in enumerate(self.procs):
                    if self.stopping or p is None or p.is_alive():
                        continue
                    if time.monotonic() - self.started[i] < MIN_LIFE_S:
                        log.error("HTTP worker %d (pid %s) ended with status %s while starting; stopping",
                                  i, p.pid, p.exitcode)
                        failed = self.stopping = True
                        break
                    log.warning("HTTP worker %d (pid %s) ended with status %s; starting another", i, p.pid, p.exitcode)
                    self._start(i)
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if failed:
            raise SystemExit(STARTUP_FAILURE)

    def _stop_all(self) -> None:
        """SIGTERM to every worker (they finish the requests in hand), SIGKILL to those still
        there after STOP_GRACE_S."""
        for sock in self.socks:
            sock.close()
        live = [p for p in self.procs if p is not None]
        for p in live:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for p in live:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in live:
            if p.is_alive():
                log.warning("HTTP worker pid %s did not stop in %.0f s; killing it", p.pid, STOP_GRACE_S)
                p.kill()
                p.join()
