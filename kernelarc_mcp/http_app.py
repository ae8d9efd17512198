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
STOP_GRACE_S = 10.0  # how long stopping workers may finish the requests they have
# A worker that ends after it was serving is started again, after a pause that doubles with
# each recent crash; one that crashes this often within CRASH_WINDOW_S stops the server.
RESTART_PAUSE_S = (0.5, 30.0)
CRASH_BUDGET, CRASH_WINDOW_S = 5, 60.0
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
        # uvicorn shuts down gracefully on SIGTERM, then raises the signal again: as an exit,
        # so that the caller still closes the service (its guard workers, its job threads)
        signal.signal(signal.SIGTERM, _exit_quietly)
        uvicorn.run(build_app(service, options), **common)
        return
    os.environ[ENV] = json.dumps(options)
    if not (sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")):
        # elsewhere SO_REUSEPORT does not balance (or does not exist): one shared socket
        uvicorn.run("kernelarc_mcp.http_app:create_app", factory=True, workers=workers, **common)
        return
    _Workers(options["host"], options["port"], workers, common).run()


def _exit_quietly(*_) -> None:
    raise SystemExit(0)


def check_port_free(host: str, port: int) -> None:
    """Raise OSError when something listens on ``host:port`` (port 0 is always free). Called
    before the server touches the workspace, so that a second server started by mistake
    changes nothing; SO_REUSEPORT sockets would otherwise join another server on the port."""
    if not port:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


def _listeners(host: str, port: int, n: int, backlog: int = 2048) -> list[socket.socket]:
    """``n`` listening sockets on one port, with SO_REUSEPORT: the kernel gives each new
    connection to one of them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    check_port_free(host, port)  # again: the port may have been taken since the first check
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


def _http_worker(sock: socket.socket, common: dict, parent: int, ready) -> None:
    """One HTTP worker process: the app from ``create_app`` served on its own socket;
    ``ready`` is set once it answers."""
    # a terminal's Ctrl-C while this worker starts: ignored (the parent stops it with SIGTERM);
    # once serving, uvicorn's own handler takes over and shuts down gracefully
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import uvicorn

    threading.Thread(target=_exit_with_parent, args=(parent,), name="kernelarc-parent-watch", daemon=True).start()
    server = uvicorn.Server(uvicorn.Config("kernelarc_mcp.http_app:create_app", factory=True, **common))
    threading.Thread(target=_report_ready, args=(server, ready), name="kernelarc-ready", daemon=True).start()
    server.run(sockets=[sock])


def _report_ready(server, ready) -> None:
    while not server.started and not server.should_exit:
        time.sleep(0.05)
    if server.started:
        ready.set()


def _exit_with_parent(parent: int) -> None:
    """Stop this worker when the serving process is gone (killed without stopping us)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(STOP_GRACE_S)
    os._exit(1)


class _Workers:
    """The HTTP worker processes, each on its own listening socket. A worker that ends
    before it ever served stops the server (it would fail again); one that ends later is
    started again on the same socket (connections that arrive meanwhile wait in its queue),
    unless workers crash more than CRASH_BUDGET times in CRASH_WINDOW_S."""

    def __init__(self, host: str, port: int, n: int, common: dict):
        import multiprocessing

        try:
            self.socks = _listeners(host, port, n)
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", host, port, exc)
            raise SystemExit(STARTUP_FAILURE) from None
        log.info("HTTP workers listening on %s:%d", host, self.socks[0].getsockname()[1])
        self.common = common
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: list = [None] * n
        self.ready: list = [None] * n
        self.restart_at: list[float | None] = [None] * n
        self.crashes: list[float] = []
        self.stopping = False  # set by the signal handler (an Event's lock could deadlock there)

    def _start(self, i: int) -> None:
        self.ready[i] = self.ctx.Event()
        p = self.ctx.Process(target=_http_worker, args=(self.socks[i], self.common, os.getpid(), self.ready[i]),
                             name=f"kernelarc-http-{i}")
        p.start()
        self.procs[i], self.restart_at[i] = p, None

    def _on_signal(self, *_) -> None:
        self.stopping = True

    def _ended(self, i: int) -> bool:
        """Worker ``i`` has ended: schedule its restart; False when the server must stop."""
        p = self.procs[i]
        if not self.ready[i].is_set():
            log.error("HTTP worker %d (pid %s) ended with status %s before it could serve; stopping",
                      i, p.pid, p.exitcode)
            return False
        now = time.monotonic()
        self.crashes = [t for t in self.crashes if now - t < CRASH_WINDOW_S] + [now]
        if len(self.crashes) > CRASH_BUDGET:
            log.error("HTTP workers ended %d times in %.0f s (last: worker %d, status %s); stopping",
                      len(self.crashes), CRASH_WINDOW_S, i, p.exitcode)
            return False
        pause = min(RESTART_PAUSE_S[1], RESTART_PAUSE_S[0] * 2 ** (len(self.crashes) - 1))
        log.warning("HTTP worker %d (pid %s) ended with status %s; starting another in %.1f s",
                    i, p.pid, p.exitcode, pause)
        self.procs[i], self.restart_at[i] = None, now + pause
        return True

    def run(self) -> None:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        failed = False
        try:
            for i in range(len(self.socks)):
                if not self.stopping:
                    self._start(i)
            while not self.stopping and not failed:
                time.sleep(0.2)  # the flag set by a signal is seen at the next turn
                for i, p in enumerate(self.procs):
                    if self.stopping:
                        break
                    if p is None:
                        if self.restart_at[i] is not None and time.monotonic() >= self.restart_at[i]:
                            self._start(i)
                    elif not p.is_alive() and not self._ended(i):
                        failed = True
                        break
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
