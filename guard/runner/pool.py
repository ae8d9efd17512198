"""Worker pool for one device: a long-lived trusted worker and use-once candidate workers,
with the next ones started ahead (spares) so a verdict does not wait for torch's import.
Candidate workers run in the OS sandbox when this machine allows it (``self.isolation``)."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
import weakref
from pathlib import Path

from .. import sandbox
from . import cells, request_profile, worker_files, zygote
from .host_files import FileTableWatch
from .process import WorkerDied, WorkerProcess, WorkerTimeout, describe_exit
from .worker_environment import worker_env

log = logging.getLogger(__name__)


class WorkerPool:
    def __init__(
        self,
        device: str,
        root: Path,
        memory_limit_gb: float | None = None,
        prestart: bool = True,
        keep_spare: bool = True,
        env: dict[str, str] | None = None,
        protect: list[Path] | None = None,
        expose: list[Path] | None = None,
        tasks_limit: int | None = None,
        files_stop_fraction: float | None = None,
        spares: int = 1,
    ):
        """``protect``: what candidates must not see (the workspace); ``expose``: read-only
        folders they may see even inside it (problem folders with safetensors inputs);
        ``prestart``: ``warm_up``
        starts the spare candidate workers; ``keep_spare``: ``replenish`` starts the next ones
        after each evaluation (a server's; a one-shot command's would only be killed);
        ``tasks_limit``: the processes and threads one candidate worker's sandbox may hold
        (``sandbox.pids``; by default from the number of cores); ``files_stop_fraction``: the
        host's open-file table's fill at which the candidate worker that holds most of it is
        stopped (``host_files``; None: not watched); ``spares``: the spare candidate workers a
        pool that keeps spares holds started (``GuardConfig.spare_workers_gpu``). Raises
        ``sandbox.SandboxUnavailable`` under ``KERNELARC_SANDBOX=require`` without a sandbox."""
        self.device = device
        self.env = dict(env or {})  # e.g. the GPU this pool's workers are pinned to
        self.root = Path(root)
        self.protect = list(protect or [])
        self.expose = list(expose or [])
        self.isolation = sandbox.ensure_isolation()
        self.memory_limit_gb = memory_limit_gb
        self.tasks_limit = tasks_limit or sandbox.cgroups.default_limit()
        self.prestart = prestart
        self.keep_spare = prestart and keep_spare
        if spares < 1:
            raise ValueError(f"a pool keeps at least one spare, not {spares}")
        self.spares = spares
        self._trusted: WorkerProcess | None = None
        self._spares: list[WorkerProcess] = []  # oldest first: the likeliest to be ready
        self._closed = False  # no spare starts after ``close``: nobody would discard it
        self._cells: zygote.Zygote | None = None  # the candidates' zygote (``cells``), once started
        self._cells_failed: str | None = None  # why it could not start: not tried again
        self._lock = threading.Lock()
        self._candidates: weakref.WeakSet[WorkerProcess] = weakref.WeakSet()  # started, for the watch
        self._files_watch: FileTableWatch | None = None
        if files_stop_fraction is not None:
            # the watch's thread holds the pool weakly: a pool no one closed still goes, and its watch with it
            live = weakref.WeakMethod(self._live_candidates)
            self._files_watch = FileTableWatch(lambda: (live() or list)(), files_stop_fraction).start()
            weakref.finalize(self, self._files_watch.close, wait=False)

    def _live_candidates(self) -> list[WorkerProcess]:
        with self._lock:  # workers are added under it (``_new``'s callers): a set that changes while read raises
            workers = list(self._candidates)
        return [w for w in workers if w.alive]

    def _new(self, role: str, spare: bool = False) -> WorkerProcess:
        workdir = self.root / f"{role}-{uuid.uuid4().hex[:10]}"
        worker = WorkerProcess(
            role,
            self.device,
            workdir,
            self.memory_limit_gb,
            dict(self.env),
            protect=self.protect,
            expose=self.expose,
            isolation=self.isolation,
            cells=self._candidate_zygote() if role == "candidate" else None,
            tasks_limit=self.tasks_limit,
            spare=spare,  # started ahead of its candidate (spare_setup)
        )
        if role == "candidate":
            self._candidates.add(worker)
        return worker.start()

    def _candidate_zygote(self) -> zygote.Zygote | None:
        """The zygote that forks this pool's candidate workers into their cells, started on
        first use (and again if it ended); None where there is none (``cells.usable``), or it
        failed to start: the workers then start from new interpreters. Called with the lock."""
        if not cells.usable(self.device, self.isolation) or self._cells_failed is not None:
            return None
        if self._cells is None or not self._cells.alive:
            try:
                self._cells = cells.start(
                    self.root,
                    self.device,
                    worker_env(self.device, self.env),
                    self.protect,
                    self.expose,
                    tasks_limit=cells.CELLS_TASKS * self.tasks_limit,
                    memory_bytes=int(cells.CELLS_TASKS * self.memory_limit_gb * (1 << 30))
                    if self.memory_limit_gb
                    else None,
                )
            except zygote.ZygoteError as exc:
                self._cells_failed = str(exc)
                log.warning("candidate workers start without a zygote: %s", exc)
                return None
        return self._cells

    def trusted(self, timeout: float = 180.0) -> WorkerProcess:
        with self._lock:
            if self._trusted is None or not self._trusted.alive:
                if self._trusted is not None:
                    log.warning("trusted worker died (%s); starting another", self._trusted.log_tail(5))
                    self._discard(self._trusted)
                self._trusted = self._new("trusted")
            worker = self._trusted
        worker.wait_ready(timeout)
        return worker

    def take_candidate(self) -> WorkerProcess:
        """A fresh candidate worker (the warm spare if there is one). No spare starts now: on a
        GPU the evaluation calls ``start_beside`` once its timing is over, on the CPU ``replenish``
        once it is over. A spare's start (torch's import, the CUDA driver's set-up, Triton's)
        beside the benchmark lengthened the outside clock's windows: two honest incumbents were
        accused on the H200 (session 16), and on the H100 one honest Triton kernel had about one
        workload figure in eight floored by such pauses, which made most of its warm verdicts
        pairings (session 47); a figure measured again after ``quiet_spare`` then waited seconds
        for the start. A GPU's pool keeps more than one spare (``spares``) so that the next
        verdict still finds one ready: a spare started after the last timing is ready long
        before the verdict after next, and a paired verdict, which takes one for the incumbent
        too, leaves one."""
        with self._lock:
            worker = None
            while self._spares and worker is None:
                taken = self._spares.pop(0)
                if taken.alive:
                    worker = taken
                else:  # said, with why: its successor's start is then the verdict's to wait for
                    log.warning(
                        "a spare candidate worker started %.1f s ago had ended (%s): %s",
                        time.monotonic() - taken.started_at,
                        describe_exit(taken.returncode),
                        taken.log_tail(5),
                    )
                    self._discard(taken)
            if worker is None:
                worker = self._new("candidate")
        return worker

    def start_beside(self) -> None:
        """Start the spares missing now, where a start may run beside the rest of an evaluation:
        on a GPU, called once the evaluation's timing is over (its held-out checks then run
        beside the starts, and the next verdict finds them ready); on the CPU only ``replenish``
        does, after the evaluation."""
        if self.device != "cpu":
            self.replenish()

    def quiet_spare(self, timeout: float = 180.0) -> float | None:
        """Wait until the spares that are starting are ready: from then on they only wait for
        a request, and nothing of their start runs while the guard times a candidate. Seconds
        waited, or None where none was starting. A spare that fails to start is dropped (the
        next evaluation starts another)."""
        with self._lock:
            spares = [s for s in self._spares if not s.ready]  # a start not yet seen through
        t0 = time.monotonic()
        for spare in spares:
            try:  # each its own time: one slow start must not get a healthy one killed
                spare.wait_ready(timeout)
            except (WorkerDied, WorkerTimeout) as exc:
                log.warning("a spare candidate worker failed to start: %s", exc)
                with self._lock:
                    if spare in self._spares:
                        self._spares.remove(spare)
                self._discard(spare)
        return time.monotonic() - t0 if spares else None

    def replenish(self) -> None:
        """Start spare candidate workers up to ``spares``, where the pool keeps them."""
        if self.keep_spare:
            self._fill(self.spares)

    def warm_up(self) -> None:
        """Start the trusted worker and the spare candidate workers without waiting (one for a
        pool that keeps none after it: a one-shot command's, which serves one candidate)."""
        with self._lock:
            if self._closed:  # nobody would discard what started now
                return
            if self._trusted is None:
                self._trusted = self._new("trusted")
        if self.prestart:
            self._fill(self.spares if self.keep_spare else 1)

    def _fill(self, wanted: int) -> None:
        with self._lock:
            while not self._closed and len(self._spares) < wanted:
                try:
                    self._spares.append(self._new("candidate", spare=True))
                except OSError as exc:  # the next evaluation starts its own and reports why
                    log.warning("could not start a spare candidate worker: %s", exc)
                    return

    def discard(self, worker: WorkerProcess) -> None:
        self._discard(worker)

    @staticmethod
    def _discard(worker: WorkerProcess) -> None:
        keep = os.environ.get(request_profile.ENV)
        if keep:
            worker.close(grace=10.0)  # a profiled worker writes its report as it exits
            try:  # the worker's folder is its own to write: the report is read as a plain file only
                report = worker_files.read_plain(worker.workdir, request_profile.FILE_NAME, 1 << 24)
            except OSError as exc:
                log.warning("no profile of worker %s: %s", worker.workdir.name, exc)
            else:
                Path(keep).mkdir(parents=True, exist_ok=True)
                (Path(keep) / f"{worker.workdir.name}.txt").write_bytes(report)
        else:
            # nothing of a discarded worker is wanted: asked to exit, it spent about 0.5 s in
            # torch's teardown, which every verdict waited for
            worker.kill()
        shutil.rmtree(worker.workdir, ignore_errors=True)

    def close(self) -> None:
        if self._files_watch is not None:
            self._files_watch.close()
        with self._lock:
            self._closed = True
            for w in (*self._spares, self._trusted):
                if w is not None:
                    self._discard(w)
            self._spares, self._trusted = [], None
            if self._cells is not None:
                self._cells.close()
                self._cells = None
            (self.root / cells.LOG_NAME).unlink(missing_ok=True)
