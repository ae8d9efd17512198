"""The Guard: one device's workers, caches and records, and ``evaluate``, which runs the
cascade's gates in order (each in its own module of this package)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..archive.db import Database
from ..archive.git_archive import GitArchive
from ..builders import dsl_refusal
from ..candidates.solution import Solution
from ..config import GuardConfig
from ..problems.derive import workload_set
from ..problems.problem import Problem
from ..problems.schema import Workload
from ..repetition import normalized_hash
from ..runner import device as device_mod
from ..runner.pool import WorkerPool
from ..runner.process import WorkerDied, WorkerProcess, WorkerTimeout
from ..runner.slot import TimingSlot
from ..sandbox import isolation_line
from ..screen import screen_solution
from ..verdict import Checked, PairedLabel, Verdict, WorkloadResult
from ..workspace import Workspace
from ..runner import messages as m
from ..runner import nvml
from ..runner.scratch import Scratch
from . import benchmark_gate, build_gate, correctness_gate, memory_plan, pairing_gate, scoring_gate
from .pairing_gate import PairedRun
from .slot_tenure import SlotTenure
from .context import EvalContext, Progress, noop
from .reasons import GuardError, Rejection, first_line, worker_failed
from .recording import Recorder
from .reference_side import ReferenceSide

log = logging.getLogger(__name__)


@dataclass
class _Tracking:
    """An evaluation's slot tenure, peak memory and phase seconds, and the gate it is in: with
    whose peak memory a rejection there reads (from the held-out workloads on, the trusted
    worker's only: the candidate's own figure could carry what it saw there)."""

    tenure: SlotTenure
    peaks: memory_plan.PeakWatch
    phases: dict[str, float]
    gate: str = "build"
    readable: tuple[str, ...] = ("trusted", "candidate")


@dataclass
class _Measured:
    """What the gates measured of a candidate that passed them all."""

    workloads: list[WorkloadResult]
    checked: Checked
    paired: dict[PairedLabel, PairedRun]


class Guard:
    def __init__(
        self,
        workspace: Workspace,
        config: GuardConfig | None = None,
        device: "str | device_mod.DeviceChoice" = "auto",
        prestart: bool = True,
        keep_spare: bool = True,
    ):
        """``prestart``: start the trusted worker and a spare candidate worker at ``warm_up``;
        ``keep_spare``: start the next spare after each evaluation (a server's guard; a
        one-shot command judges one candidate)."""
        self.ws = workspace
        self.cfg = config or workspace.config()
        self.device = device if isinstance(device, device_mod.DeviceChoice) else device_mod.resolve(device)
        self.db = Database(workspace.db_path)
        # Rows written before devices had groups carry the physical key: adopt them.
        self.db.adopt_device(self.device.key, self.device.compare_key)
        self.store = workspace.problems()
        self.archive = GitArchive(workspace.archive_dir)
        # Worker folders live outside the workspace: a candidate's working directory must
        # not lead it to the database, the secret or the held-out workloads.
        self._scratch = Scratch()
        self.scratch = self._scratch.path
        # candidate workers are sandboxed: the workspace is hidden, its problem folders and the
        # seeds' (data files of the problems) readable
        self.pool = WorkerPool(
            self.device.kind,
            self.scratch / "workers",
            self.cfg.cpu_memory_limit_gb,
            prestart,
            keep_spare,
            env=self.device.worker_env(),
            protect=[workspace.root],
            expose=[workspace.problems_dir, self.store.seeds_dir],
            tasks_limit=self.cfg.sandbox_tasks_limit,
            files_stop_fraction=self.cfg.host_files_stop_fraction,
            spares=self.cfg.spare_workers_gpu if self.device.kind == "cuda" else 1,
        )
        # simulated CPU devices share the cores, hence one slot
        self.slot = TimingSlot(self.device.compare_key if self.device.simulated else self.device.key)
        self._lock = threading.Lock()  # one evaluation at a time on this device
        self._secret = workspace.secret
        self.reference = ReferenceSide(self.pool, self.db, self.cfg, self.device, self.slot, self._secret)
        self.recorder = Recorder(self.db, self.cfg, self.device, self.archive, self.device_info)

    # -- lifecycle ------------------------------------------------------------------------
    def warm_up(self) -> None:
        self.pool.warm_up()

    def prepare(self, problem_name: str, progress: Progress | None = None) -> None:
        """Measure the device's ceilings and the problem's eager and compile baselines now,
        before any candidate (both are cached), so that the first verdict does not wait for
        them."""
        problem = self.store.get(problem_name)
        wset = workload_set(problem, self.device.kind, self._secret, self.cfg.cpu_workloads)
        self._check_fits(problem, wset.visible + wset.heldout)
        with self._lock:
            self.reference.prepare(problem, wset.visible, progress or noop)

    def close(self) -> None:
        self.pool.close()
        self.db.close()
        self._scratch.remove()

    def __enter__(self) -> "Guard":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def device_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "kind": self.device.kind,
            "key": self.device.key,
            "group": self.device.compare_key,
            "name": self.device.name,
            "isolation": isolation_line(),
        }
        if self.reference.ceilings:
            info["ceilings"] = self.reference.ceilings
        return info

    # -- the cascade ------------------------------------------------------------------------
    def evaluate(
        self,
        solution: Solution,
        problem_name: str,
        agent: str = "cli",
        notes: str | None = None,
        parent: str | None = None,
        progress: Progress | None = None,
    ) -> Verdict:
        progress = progress or noop
        t_start = time.monotonic()
        problem = self.store.get(problem_name)
        d = problem.definition
        dhash = d.content_hash()
        source_hash = solution.source_hash()
        language = solution.spec.primary_language
        solution_json = solution.model_dump(mode="json", exclude_none=True)
        common = dict(
            problem=d.name,
            definition_hash=dhash,
            agent=agent,
            parent=parent,
            notes=notes,
            language=language,
            source_hash=source_hash,
            normalized_hash=normalized_hash(solution),
            solution_json=json.dumps(solution_json),
            device_key=self.device.compare_key,
            device_kind=self.device.kind,
            measured_on=self.device.key,
        )

        why = dsl_refusal(language, self.device.kind)
        if why:  # this guard cannot judge the language at all: refused, nothing recorded
            raise GuardError(why)

        # Gate 1: static screen (pure Python, no worker needed).
        if self.cfg.static_screen:
            progress("screen", 0, 1, "static screen")
            res = screen_solution(solution, self.cfg.max_source_bytes, self.cfg.max_source_files)
            if not res.ok:
                cid = self.db.insert_candidate(state="running", **common)
                first = res.findings[0]
                return self.recorder.reject(
                    cid,
                    problem,
                    agent,
                    Rejection("screen", res.status, first.render(), res.message()),
                    {"screen": time.monotonic() - t_start},
                    notes,
                    parent,
                )

        prior = self.db.find_evaluated(d.name, dhash, source_hash, self.device.compare_key)
        if prior is not None:  # judged from the prior's measurements: taken where it was measured
            common["measured_on"] = pairing_gate.measured_on(prior)
            cid = self.db.insert_candidate(state="running", **common)
            return self.recorder.duplicate(cid, prior, problem, agent, notes, parent)

        cid = self.db.insert_candidate(state="running", **common)
        try:
            if not self._lock.acquire(blocking=False):
                # another evaluation, or the baselines of a problem being prepared
                progress(
                    "waiting", 0, 1, "this device's guard is busy (another evaluation, or baselines being measured)"
                )
                self._lock.acquire()
            try:
                return self._run(cid, problem, solution_json, language, agent, notes, parent, progress, t_start)
            finally:
                self._lock.release()
        except GuardError as exc:
            self.db.set_state(cid, "error", reason=str(exc)[:2000])
            raise
        except BaseException:
            self.db.set_state(cid, "interrupted", reason="the evaluation was interrupted")
            raise

    def _run(
        self,
        cid: str,
        problem: Problem,
        solution_json: dict[str, Any],
        language: str,
        agent: str,
        notes: str | None,
        parent: str | None,
        progress: Progress,
        t_start: float,
    ) -> Verdict:
        d = problem.definition
        wset = workload_set(problem, self.device.kind, self._secret, self.cfg.cpu_workloads)
        phases: dict[str, float] = {"screen": time.monotonic() - t_start}
        eval_seed = self.reference.seed("eval", cid, d.content_hash())
        self._check_fits(problem, wset.visible + wset.heldout)

        t = time.monotonic()
        progress("start", 0, 1, "starting workers")
        trusted, key, ceilings, baselines = self.reference.prepare(problem, wset.visible, progress)
        phases["baseline"] = time.monotonic() - t
        trusted_ops = dict(trusted.op_seconds)

        # the candidate's code runs only while this evaluation holds the timing slot
        # (``slot_tenure``): shared for the build and correctness, exclusive from the benchmark on
        with SlotTenure(self.reference, progress) as tenure:
            t = time.monotonic()
            cand = self.pool.take_candidate()  # no spare starts until the timing is over
            age = time.monotonic() - cand.started_at  # about 0: none was ready, this one starts now
            workers: dict[str, WorkerProcess | None] = {"trusted": trusted, "candidate": cand}
            peaks = memory_plan.PeakWatch(lambda role, reset: self._peak_memory(workers[role], reset))
            peaks.start("trusted")  # this evaluation's peak, not the baselines'
            track = _Tracking(tenure, peaks, phases)
            try:
                try:
                    cand.wait_ready(180)
                except WorkerDied as exc:
                    raise GuardError(f"a candidate worker could not start: {exc}\n{exc.log_tail}") from None
                phases["start"] = time.monotonic() - t
                if phases["start"] > 2.0:  # a verdict that waited for a start: whose, and why
                    log.warning(
                        "%s waited %.1f s for its candidate worker, started %.1f s before it was taken",
                        cid,
                        phases["start"],
                        age,
                    )
                ctx = EvalContext(
                    cid,
                    problem,
                    wset,
                    eval_seed,
                    cand,
                    trusted,
                    key,
                    progress,
                    self.reference,
                    dps=bool(solution_json.get("spec", {}).get("destination_passing_style", False)),
                )
                measured = self._gates(ctx, track, solution_json, language, agent, baselines, ceilings)
                if cand.stopped_for is not None:  # after its last request: no reply carried it
                    raise WorkerDied(f"candidate worker {cand.stopped_for}", None, "")
            except (Rejection, WorkerTimeout, WorkerDied) as exc:
                self._finish_phases(phases, t_start, trusted, trusted_ops, cand)
                # a worker that hung or died has no peak to read: the trusted one's only
                peaks.mark(track.gate, *(track.readable if isinstance(exc, Rejection) else ("trusted",)))
                rej = self._rejection(exc, track.gate)
                return self.recorder.reject(cid, problem, agent, rej, phases, notes, parent, memory=peaks)
            finally:
                self.pool.discard(cand)  # its folder goes with it, outputs included
                self._let_go(trusted)
                self.pool.replenish()

            # Gates 6 and 7: decision, archive.
            self._finish_phases(phases, t_start, trusted, trusted_ops, cand)
            return self.recorder.measured(
                cid,
                problem,
                agent,
                measured.workloads,
                measured.checked,
                phases,
                notes,
                parent,
                solution_json,
                paired=measured.paired,
                memory=peaks,
            )

    def _gates(
        self,
        ctx: EvalContext,
        track: "_Tracking",
        solution_json: dict[str, Any],
        language: str,
        agent: str,
        baselines: dict[str, dict[str, Any]],
        ceilings: dict[str, Any],
    ) -> "_Measured":
        """Gates 2 to 5 and the held-out workloads, in order, each one's seconds in
        ``track.phases``; ``track`` follows them, for the rejection any of them may raise."""
        tenure, peaks, phases = track.tenure, track.peaks, track.phases
        # Gate 2: build.
        tenure.share()
        phases["slot"] = tenure.waited_s
        t = time.monotonic()
        ctx.progress("build", 0, 1, f"building ({language})")
        reply = build_gate.build(ctx.cand, ctx.problem, solution_json, language, self.cfg)
        if not reply.ok:
            raise Rejection(
                "build", reply.status or "COMPILE_ERROR", first_line(reply.message or "build failed"), reply.message
            )
        phases["build"] = time.monotonic() - t

        # Gate 3: correctness on the visible workloads (the held-out ones come last, below).
        t = time.monotonic()
        track.gate = "correctness"
        peaks.mark("build", "trusted", "candidate")
        checked = correctness_gate.check(ctx, "visible")
        phases["correctness"] = time.monotonic() - t
        peaks.mark(track.gate, "trusted", "candidate")

        # Gate 4: benchmark.
        track.gate = "benchmark"
        wait_for_starts = self.cfg.wait_for_starts_before_timing
        tenure.to_exclusive(ctx.cand, self.pool.quiet_spare if wait_for_starts else None)
        phases["slot"] = tenure.waited_s
        if wait_for_starts:
            # again, holding the slot: a start of this pool's spares begun meanwhile (by a
            # server's warm-up, which runs beside its first evaluations); almost always 0
            phases["spare_wait"] = tenure.settled_s + (self.pool.quiet_spare() or 0.0)
        t = time.monotonic()
        timings = benchmark_gate.benchmark(ctx)
        phases["benchmark"] = time.monotonic() - t
        peaks.mark(track.gate, "trusted", "candidate")

        # Gate 5: score; then, when a comparison is close, re-measure side by side.
        workloads = scoring_gate.score(ctx.definition, ctx.visible, timings, baselines, ceilings)
        t = time.monotonic()
        track.gate = "pairing"
        paired = pairing_gate.pairings(ctx, self.db, self.pool, workloads, agent)
        # nothing is timed from here on: the spares this verdict took start now, beside the
        # held-out checks (``WorkerPool.take_candidate``)
        self.pool.start_beside()
        if paired:
            phases["pairing"] = time.monotonic() - t
            peaks.mark(track.gate, "trusted", "candidate")

        # Gate 3, last part: the held-out workloads, after everything the candidate's process
        # reports that is shown (``correctness_gate.check``). Its own peak there is not read:
        # the figure comes from its process and could carry what it saw.
        t = time.monotonic()
        track.gate, track.readable = "correctness", ("trusted",)
        checked = correctness_gate.merged(checked, correctness_gate.check(ctx, "heldout"))
        phases["heldout"] = time.monotonic() - t
        peaks.mark(track.gate, "trusted")
        return _Measured(workloads, checked, paired)

    def _rejection(self, exc: Rejection | WorkerTimeout | WorkerDied, gate: str) -> Rejection:
        """What ended an evaluation at ``gate``, as the rejection recorded."""
        if isinstance(exc, Rejection):
            return exc
        return worker_failed(gate, exc, self.cfg.call_timeout_s)  # a hung worker was killed

    # -- memory -------------------------------------------------------------------------------
    def _capacity_bytes(self) -> int | None:
        if self.device.kind == "cuda":
            return nvml.total_memory(self.device.uuid)
        return int(self.cfg.cpu_memory_limit_gb * (1 << 30))

    def _check_fits(self, problem: Problem, workloads: Iterable[Workload]) -> None:
        """A problem too large for this device is refused with the figures, before any work."""
        d = problem.definition
        l2 = int((self.reference.ceilings or {}).get("l2_bytes") or (60 << 20))
        flush = 2 * l2 if self.device.kind == "cuda" else (8 << 20)
        why = memory_plan.does_not_fit(
            d,
            list(workloads),
            self._capacity_bytes(),
            self.device.kind,
            lambda w: len(self.reference.set_seeds(d, w, "timing", 0)),
            flush,
        )
        if why:
            raise GuardError(why)

    @staticmethod
    def _finish_phases(
        phases: dict[str, float],
        t_start: float,
        trusted: WorkerProcess,
        trusted_before: dict[str, float],
        cand: WorkerProcess,
    ) -> None:
        """The total, and the seconds this evaluation spent waiting on each request to each
        worker (``trusted.confirm``...): where a slow verdict's time went."""
        phases["total"] = time.monotonic() - t_start
        for op, secs in trusted.op_seconds.items():
            spent = secs - trusted_before.get(op, 0.0)
            if spent > 0.0005:
                phases[f"trusted.{op}"] = round(spent, 4)
        for op, secs in cand.op_seconds.items():
            if secs > 0.0005:
                phases[f"candidate.{op}"] = round(secs, 4)

    @staticmethod
    def _let_go(trusted: WorkerProcess) -> None:
        """The trusted worker drops what this evaluation left it holding (the outside clock's
        loop and its input sets, reference outputs) and empties its allocator's cache: the
        next evaluation, another problem's perhaps, starts with none of it."""
        if not trusted.alive:
            return
        try:
            trusted.request(m.Release(tags=None).model_dump(), 60)
        except (WorkerDied, WorkerTimeout):
            log.warning("the trusted worker did not answer a release; it is replaced when next needed")

    @staticmethod
    def _peak_memory(worker: WorkerProcess | None, reset: bool = False) -> tuple[int, dict[str, int]] | None:
        """A worker's peak memory and the peak of each kind of request since its last reset."""
        if worker is None or not worker.alive:
            return None
        try:
            raw = worker.request(m.Memory(reset=reset).model_dump(), 30)
            reply = m.parse_reply(raw, m.MemoryReply)
            return (reply.peak_bytes, reply.by_op) if reply.ok else None  # failed: unknown, not 0
        except m.MessageError:
            # out of protocol, as bytes that do not decode are (MalformedReply kills the worker):
            # the same end for both, so the verdict does not depend on which the decoder saw
            worker.kill()
            return None
        except (WorkerDied, WorkerTimeout):
            return None
