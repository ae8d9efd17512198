"""Several HTTP worker processes behind one port (``kernelarc serve --workers N``).

The serving process (the one that evaluates) accepts every connection on the port and passes
it (its file descriptor, over a Unix socket) to the worker that holds the fewest; each worker
reports back when a connection of its own ends. Clients keep their connection alive, so
where a connection lands decides a worker's load for as long as the client stays: with one
socket shared by all workers (``uvicorn.run(workers=N)``) a burst went to whichever worker
woke first (splits of 16/0/0/0 were seen), and with one SO_REUSEPORT socket per worker the
kernel's hash of the client's port put up to 6 of 16 clients on one of 8 workers, whose
clients then waited on each other while other workers were idle.

Imported only when workers are asked for (it imports uvicorn).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import multiprocessing
import os
import selectors
import signal
import socket
import threading
import time

import uvicorn

from .app import FACTORY
from .sockets import STARTUP_FAILURE, address_family

STOP_GRACE_S = 10.0  # how long stopping workers may finish the requests they have
# At the start, connections wait until every worker serves (at most this long): clients that
# connect early keep their connection, and all of them would stay with the first worker up.
ALL_READY_WAIT_S = 60.0
# A worker that ends after it was serving is started again, after a pause that doubles with
# each recent crash; one that crashes this often within CRASH_WINDOW_S stops the server.
RESTART_PAUSE_S = (0.5, 30.0)
CRASH_BUDGET, CRASH_WINDOW_S = 5, 60.0
log = logging.getLogger(__name__)


def _listener(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """The server's one listening socket; connections wait in its queue until dispatched."""
    sock = socket.socket(address_family(host))  # its bind fails if something listens there
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _http_worker(control: socket.socket, common: dict, parent: int, ready) -> None:
    """One HTTP worker process: the app from ``create_app``, serving the connections the
    parent passes over ``control``; ``ready`` is set once it can answer."""
    # a terminal's Ctrl-C while this worker starts: ignored (the parent stops it with SIGTERM);
    # once serving, uvicorn's own handler takes over and shuts down gracefully
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(parent,), name="kernelarc-parent-watch", daemon=True).start()
    server = DispatchedServer(uvicorn.Config(FACTORY, factory=True, **common), control)
    threading.Thread(target=_report_ready, args=(server, ready), name="kernelarc-ready", daemon=True).start()
    server.run(sockets=[])


class DispatchedServer(uvicorn.Server):
    """A uvicorn server that listens on no socket of its own: it serves the connections that
    arrive as file descriptors over a Unix socket, and reports each one's end back on it
    (b"d"), so that the dispatcher knows how many each worker holds. Every b"c" the parent
    sends is answered by exactly one b"d", whatever becomes of its connection."""

    def __init__(self, config, control: socket.socket):
        super().__init__(config)
        self.control = control
        self.unreported = 0  # ends not yet sent (the Unix socket was full)
        self.retry_pending = False
        self.loop = None

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if self.should_exit:
            return
        self.loop = asyncio.get_running_loop()
        self.control.setblocking(False)
        self.loop.add_reader(self.control.fileno(), self._receive)

    async def shutdown(self, sockets=None) -> None:
        # take no more connections: the parent sees the end of the Unix socket and stops
        # sending, instead of queueing connections this process will never serve
        self._close_control()
        await super().shutdown(sockets=sockets)

    def _close_control(self) -> None:
        if self.control.fileno() >= 0:
            if self.loop is not None:
                self.loop.remove_reader(self.control.fileno())
            self.control.close()

    def _report_ends(self, n: int = 1) -> None:
        self.unreported += n
        if self.control.fileno() < 0 or not self.unreported:
            return
        try:
            self.unreported -= self.control.send(b"d" * self.unreported)
        except BlockingIOError:
            pass
        except OSError:  # the parent is gone; _exit_with_parent stops this worker
            return
        if self.unreported and self.loop is not None and not self.retry_pending:
            self.retry_pending = True
            self.loop.call_later(0.05, self._retry_reports)

    def _retry_reports(self) -> None:
        self.retry_pending = False
        self._report_ends(0)

    def _protocol(self):
        # what uvicorn's own startup builds for each connection of a listening socket
        protocol = self.config.http_protocol_class(
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state, _loop=self.loop
        )
        lost = protocol.connection_lost

        def connection_lost(exc):
            try:
                lost(exc)
            finally:
                self._report_ends()

        protocol.connection_lost = connection_lost
        return protocol

    async def _adopt(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self._protocol, conn)
        except Exception as exc:  # noqa: BLE001 - the connection is lost, not the worker
            log.warning("a dispatched connection could not be served: %s", exc)
            conn.close()
            self._report_ends()

    def _receive(self) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(self.control, 64, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        if not data:  # the parent closed its end: nothing more will come
            self._close_control()
            return
        for fd in fds:
            conn = socket.socket(fileno=fd)
            conn.setblocking(False)
            self.loop.create_task(self._adopt(conn))
        if data.count(b"c") > len(fds):
            # descriptors that did not arrive (this process at its limit of open files):
            # their clients see the connection closed; the parent must not count them
            self._report_ends(data.count(b"c") - len(fds))


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


class Workers:
    """The HTTP worker processes and the dispatcher: this process accepts every connection on
    the one listening socket and passes it to the worker holding the fewest (ties: in turn).
    A worker that ends before it ever served stops the server (it would fail again); one that
    ends later is started again (connections that arrive meanwhile go to the others, or wait
    in the queue), unless workers crash more than CRASH_BUDGET times in CRASH_WINDOW_S."""

    def __init__(self, host: str, port: int, n: int, common: dict):
        try:
            self.listener = _listener(host, port)
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", host, port, exc)
            raise SystemExit(STARTUP_FAILURE) from None
        port = self.listener.getsockname()[1]
        log.info("HTTP workers listening on %s:%d", host, port)
        self.common = dict(common, port=port)
        self.ctx = multiprocessing.get_context("spawn")  # a fork would copy the service's threads
        self.procs: list = [None] * n
        self.ready: list = [None] * n
        self.control: list[socket.socket | None] = [None] * n
        self.held = [0] * n  # connections each worker holds
        self.serving = [False] * n  # has said it serves (a worker stays so until it is dropped)
        self.full: set[int] = set()  # could not take a descriptor: wait until its socket is writable
        self.turn = 0
        self.all_ready_by: float | None = None  # set when the workers start; None once all served
        self.restart_at: list[float | None] = [None] * n
        self.crashes: list[float] = []
        self.stopping = False  # set by the signal handler (an Event's lock could deadlock there)
        self.stopped_by = "shut down"  # the signal's name, once one came

    def _start(self, i: int) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ready[i] = self.ctx.Event()
        p = self.ctx.Process(
            target=_http_worker, args=(theirs, self.common, os.getpid(), self.ready[i]), name=f"kernelarc-http-{i}"
        )
        p.start()
        theirs.close()
        ours.setblocking(False)
        self.procs[i], self.control[i], self.held[i], self.restart_at[i] = p, ours, 0, None
        self.serving[i] = False
        self.full.discard(i)

    def _on_signal(self, signum, _frame) -> None:
        self.stopped_by = signal.Signals(signum).name
        self.stopping = True

    def _ended(self, i: int) -> bool:
        """Worker ``i`` has ended: schedule its restart; False when the server must stop."""
        p = self.procs[i]
        self._drop(i)
        if not self.ready[i].is_set():
            log.error(
                "HTTP worker %d (pid %s) ended with status %s before it could serve; stopping", i, p.pid, p.exitcode
            )
            return False
        now = time.monotonic()
        self.crashes = [t for t in self.crashes if now - t < CRASH_WINDOW_S] + [now]
        if len(self.crashes) > CRASH_BUDGET:
            log.error(
                "HTTP workers ended %d times in %.0f s (last: worker %d, status %s); stopping",
                len(self.crashes),
                CRASH_WINDOW_S,
                i,
                p.exitcode,
            )
            return False
        pause = min(RESTART_PAUSE_S[1], RESTART_PAUSE_S[0] * 2 ** (len(self.crashes) - 1))
        log.warning(
            "HTTP worker %d (pid %s) ended with status %s; starting another in %.1f s", i, p.pid, p.exitcode, pause
        )
        self.procs[i], self.restart_at[i] = None, now + pause
        return True

    def _drop(self, i: int) -> None:
        if self.control[i] is not None:
            self.control[i].close()
        self.control[i], self.held[i], self.serving[i] = None, 0, False
        self.full.discard(i)

    def _serving(self) -> list[int]:
        for i, p in enumerate(self.procs):
            if not self.serving[i] and p is not None and self.control[i] is not None and self.ready[i].is_set():
                self.serving[i] = True
        serving = [i for i, ok in enumerate(self.serving) if ok]
        if self.all_ready_by is not None:
            if len(serving) < len(self.procs) and time.monotonic() < self.all_ready_by:
                return []
            self.all_ready_by = None
        return serving

    def _dispatch(self, timeout: float) -> None:
        """Wait up to ``timeout`` for connections and for workers' reports; pass each new
        connection to the least loaded serving worker. Connections are accepted only while a
        serving worker can take one; the rest wait in the listening socket's queue."""
        # Only a worker that could not take a descriptor is watched for writability: an empty
        # Unix socket is always writable, and watching every one would never let select() wait.
        open_ = [i for i in self._serving() if i not in self.full]
        with selectors.DefaultSelector() as sel:  # select() fails on descriptors past 1023
            for i, ctl in enumerate(self.control):
                if ctl is not None:
                    sel.register(ctl, selectors.EVENT_READ | (selectors.EVENT_WRITE if i in self.full else 0), i)
            if open_:
                sel.register(self.listener, selectors.EVENT_READ, None)
            events = sel.select(timeout)
        incoming = False
        for key, mask in events:
            if key.data is None:
                incoming = True
                continue
            i = key.data
            if mask & selectors.EVENT_WRITE:
                self.full.discard(i)  # offered again from the next turn on
            if mask & selectors.EVENT_READ:
                self._read_reports(i)
        while incoming:
            candidates = [i for i in open_ if i not in self.full and self.control[i] is not None]
            if not candidates:
                return
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. too many open files: leave the rest queued
                log.warning("accepting a connection failed: %s", exc)
                return
            with conn:
                if self._hand_over(conn, candidates) is not None:
                    continue
                # every worker's Unix socket is full: this one is closed, the rest stay queued
                log.warning("no HTTP worker could take a connection; it is closed")
                return

    def _read_reports(self, i: int) -> None:
        try:
            data = self.control[i].recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the worker is gone or stopping; the main loop restarts it once it ends
            self._drop(i)
        else:
            self.held[i] = max(0, self.held[i] - data.count(b"d"))

    def _hand_over(self, conn: socket.socket, candidates: list[int]) -> int | None:
        """Pass ``conn`` to the least loaded of ``candidates`` (ties: in turn); the worker that
        took it, or None. A worker that cannot take one now (its Unix socket full, too many
        descriptors in flight) is passed over; one whose socket is broken is dropped and
        stopped, and the main loop starts another."""
        while candidates:
            least = min(self.held[i] for i in candidates)
            tied = [i for i in candidates if self.held[i] == least]
            i = tied[self.turn % len(tied)]
            self.turn += 1
            candidates.remove(i)
            try:
                socket.send_fds(self.control[i], [b"c"], [conn.fileno()])
                self.held[i] += 1
                return i
            except OSError as exc:
                if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.EBADF):
                    log.warning("HTTP worker %d did not take a connection (%s); stopping it", i, exc)
                    self._drop(i)
                    if self.procs[i] is not None and self.procs[i].is_alive():
                        self.procs[i].terminate()
                else:  # EAGAIN, ETOOMANYREFS, ENOBUFS: try another worker, this one once writable
                    self.full.add(i)
        return None

    def run(self) -> None:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        failed = False
        try:
            for i in range(len(self.procs)):
                if not self.stopping:
                    self._start(i)
            self.all_ready_by = time.monotonic() + ALL_READY_WAIT_S
            while not self.stopping and not failed:
                self._dispatch(0.2)  # a flag set by a signal is seen at the next turn at the latest
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
        self.listener.close()
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
        for i in range(len(self.procs)):
            self._drop(i)
