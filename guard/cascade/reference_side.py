"""The reference side of one device: the trusted worker (problem loading, requests), the
device's ceilings and the problems' eager and compile baselines (both cached), and what
candidate and baseline timing share so both are measured alike: the seeds of the input
sets (from the workspace secret), the timing configuration and the device's timing slot."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import time
import weakref
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ..archive.db import Database
from ..config import GuardConfig
from ..paths import cache_dir
from . import baseline_cache
from ..problems.problem import Problem
from ..problems.schema import Definition, Workload
from ..runner import device as device_mod
from ..runner.pool import WorkerPool
from ..runner.process import WorkerDied, WorkerProcess, WorkerTimeout
from ..runner.slot import TimingSlot
from . import memory_plan
from ..runner import messages as m
from .asking import ask
from .context import Progress, noop
from .reasons import GuardError

# what a trusted worker's baseline reply carries that the guard keeps
BASELINE_FIELDS = (
    "eager",
    "compiled",
    "compile_error",
    "compile_counters",
    "compile_checked",
    "compile_fell_back",
    "flops",
    "flops_error",
)

log = logging.getLogger(__name__)


# raised when how ceilings are measured changes: older files are measured again (2: a CPU
# sample is the lesser of its wall and its CPU time, session 33)
CEILINGS_FORMAT = 2


def ceilings_cache_dir() -> Path:
    return cache_dir() / "ceilings"


class ReferenceSide:
    def __init__(
        self,
        pool: WorkerPool,
        db: Database,
        cfg: GuardConfig,
        device: "device_mod.DeviceChoice",
        slot: TimingSlot,
        secret: bytes,
    ):
        self.pool, self.db, self.cfg, self.device, self.slot = pool, db, cfg, device, slot
        self._secret = secret
        self.ceilings: dict[str, Any] | None = None  # measured once per device, cached on disk
        # the trusted workers whose idle reference (``ensure_idle_reference``) is taken
        self._idle_referenced: weakref.WeakSet[WorkerProcess] = weakref.WeakSet()

    # -- seeds, timing configuration, the slot ----------------------------------------------
    def seed(self, *parts: object) -> int:
        msg = "|".join(str(p) for p in parts).encode()
        return int.from_bytes(hmac.new(self._secret, msg, hashlib.sha256).digest()[:6], "big")

    def set_seeds(self, d: Definition, w: Workload, purpose: str, salt: object) -> list[int]:
        """The seeds of the input sets a timed loop rotates over (``memory_plan.input_sets``)."""
        n = memory_plan.input_sets(sum(memory_plan.tensor_bytes(d, w)), self.device.kind)
        return [self.seed(purpose, salt, w.uuid, k) for k in range(n)]

    def timing_config(self) -> m.TimingConfig:
        c = self.cfg
        return m.TimingConfig(
            min_iters=c.min_iters,
            max_iters=c.max_iters,
            max_timing_s=c.max_timing_s,
            target_time_s=c.target_time_s,
            warmup_time_s=c.warmup_time_s,
        )

    def _baseline_settings(self) -> dict[str, Any]:
        """What shapes a baseline's measurement besides the problem and the device."""
        return {
            "timing": self.timing_config().model_dump(mode="json"),
            "compile": self.cfg.compile_baseline,
            "compile_mode": self.cfg.compile_mode,
        }

    def hold(self, exclusive: bool, progress: Progress) -> AbstractContextManager[float]:
        """The device's timing slot; says so when another process holds it."""
        return self.slot.hold(exclusive, on_wait=lambda: progress("wait", 0, 1, "waiting for the timing slot"))

    # -- the trusted worker -------------------------------------------------------------------
    def prepare(
        self, problem: Problem, visible: list[Workload], progress: Progress
    ) -> tuple[WorkerProcess, str, dict[str, Any], dict[str, dict[str, Any]]]:
        """The trusted worker with the problem loaded, the device's ceilings and the visible
        workloads' baselines (measured where not cached): (worker, key, ceilings, baselines)."""
        trusted = self.trusted()
        key = self.load_problem(trusted, problem)
        ceilings = self.ensure_ceilings(trusted, progress)
        self.ensure_idle_reference(trusted, progress)
        return trusted, key, ceilings, self.ensure_baselines(trusted, problem, key, visible, progress)

    def ensure_idle_reference(self, trusted: WorkerProcess, progress: Progress = noop) -> None:
        """On a GPU: the trusted worker's idle reference (how long a flush pass takes on an idle
        device, measured once when its timer is made, and what ``wait_device_idle`` holds every
        later probe to) taken while this guard holds the slot alone and no candidate of its own
        is alive. Made lazily, it was taken beside a live candidate (the first window's drain
        probe, then the trusted loop built during ``stats``): a candidate that kept the device
        busy then raised it, and work it left queued later passed for idle (review, session 47)."""
        if self.device.kind != "cuda" or trusted in self._idle_referenced:
            return
        with self.hold(True, progress):
            self.pool.quiet_spare()  # nor a worker's start beside it
            reply = self.request(trusted, m.DeviceIdle(), m.DeviceIdleReply)
        if not reply.ok:
            raise GuardError(f"the trusted worker could not measure the idle device: {reply.message}")
        self._idle_referenced.add(trusted)

    def trusted(self) -> WorkerProcess:
        try:
            return self.pool.trusted()
        except (WorkerDied, WorkerTimeout) as exc:
            tail = getattr(exc, "log_tail", "")
            raise GuardError(f"the trusted worker could not start: {exc}\n{tail}") from None

    def request(
        self, trusted: WorkerProcess, msg: m.TrustedRequest, reply_model: type[m.R], timeout: float | None = None
    ) -> m.R:
        """``msg`` to the trusted worker, its reply as ``reply_model``; any failure is the guard's."""
        return ask(trusted, msg, reply_model, timeout or max(self.cfg.call_timeout_s, 120), "build")

    def load_problem(self, trusted: WorkerProcess, problem: Problem) -> str:
        key = problem.definition.content_hash()
        reply = self.request(
            trusted,
            m.LoadProblem(
                key=key,
                definition=problem.definition.to_json(),
                blob_root=str(problem.root) if problem.root else None,
            ),
            m.Reply,
        )
        if not reply.ok:
            raise GuardError(f"problem {problem.name}: the reference does not load: {reply.message}")
        return key

    # -- caches -------------------------------------------------------------------------------
    def ensure_ceilings(self, trusted: WorkerProcess, progress: Progress = noop) -> dict[str, Any]:
        if self.ceilings is not None:
            return self.ceilings
        path = ceilings_cache_dir() / f"{self.device.key}.json"
        # a device the guard cannot tell from others of its kind keeps its figures in memory only
        persist = self.device.identified
        if persist and path.is_file():
            try:
                found = json.loads(path.read_text())
            except (OSError, ValueError):
                found = None
            if isinstance(found, dict) and found.get("device_key") == self.device.key:
                if found.get("format") == CEILINGS_FORMAT:
                    self.ceilings = found
                    return found
                log.info("measuring the device ceilings again: %s was measured the old way", path)
            else:
                log.warning("measuring the device ceilings again: %s holds none of this device", path)
        with self.hold(True, progress):
            progress("ceilings", 0, 1, "measuring the device's bandwidth and matmul rates")
            reply = self.request(trusted, m.Ceilings(), m.CeilingsReply, 600)
        if not reply.ok:
            raise GuardError(f"measuring the device ceilings failed: {reply.message}")
        self.ceilings = dict(
            reply.ceilings, measured_at=time.time(), device_key=self.device.key, format=CEILINGS_FORMAT
        )
        if persist:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.ceilings, indent=2))
            tmp.replace(path)
        return self.ceilings

    def ensure_baselines(
        self, trusted: WorkerProcess, problem: Problem, key: str, visible: list[Workload], progress: Progress
    ) -> dict[str, dict[str, Any]]:
        d = problem.definition
        dhash = d.content_hash()
        out: dict[str, dict[str, Any]] = {}
        missing: list[Workload] = []
        settings = self._baseline_settings()
        share = self.device.identified
        keys: dict[str, str] = {}

        def usable(cached: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
            found = baseline_cache.matches(cached, name)
            # a compile time made without the fall-back check is not trusted: measured again
            ok = found is not None and bool(found.get("compile_checked") or not self.cfg.compile_baseline)
            return found if ok else None

        for w in visible:
            wjson = w.model_dump(mode="json")
            name = keys[w.uuid] = baseline_cache.baseline_key(
                dhash, wjson, baseline_cache.input_files(problem.root, wjson), self.device.key, settings
            )
            found = usable(self.db.baseline(dhash, w.uuid, self.device.key), name)
            if found is None and share:  # another workspace of this machine may have measured it
                found = usable(baseline_cache.load(name), name)
                if found is not None:
                    self.db.put_baseline(dhash, w.uuid, self.device.key, found)
            if found is not None:
                out[w.uuid] = found
            else:
                missing.append(w)
        if not missing:
            return out
        with self.hold(True, progress):
            # cached for good: never timed beside a worker's start (a spare of the last verdict)
            self.pool.quiet_spare()
            for i, w in enumerate(missing):
                progress("baseline", i, len(missing), f"timing the reference on {w.uuid}")
                # once dynamo fell back to eager on a workload of the problem, it may skip the
                # function silently: no later compile time of that problem is asked for
                fell_back = any(b.get("compile_fell_back") for b in out.values())
                reply = self.request(
                    trusted,
                    m.Baseline(
                        key=key,
                        workload=w.model_dump(mode="json"),
                        axes=d.resolve_axes(w.axes),
                        sets=self.set_seeds(d, w, "baseline", 0),
                        config=self.timing_config(),
                        compile=self.cfg.compile_baseline and not fell_back,
                        compile_mode=self.cfg.compile_mode,
                        count_flops=d.kernelarc.flops is None,
                    ),
                    m.BaselineReply,
                    max(600, self.cfg.call_timeout_s),
                )
                if not reply.ok:
                    raise GuardError(f"problem {d.name}: the reference fails on workload {w.uuid}: {reply.message}")
                result = {k: getattr(reply, k) for k in BASELINE_FIELDS}
                if fell_back and self.cfg.compile_baseline:
                    result |= {
                        "compile_checked": True,
                        "compile_fell_back": True,
                        "compile_error": "torch.compile fell back to eager on an earlier workload of this problem",
                    }
                result["key"] = keys[w.uuid]
                self.db.put_baseline(dhash, w.uuid, self.device.key, result)
                if share:
                    baseline_cache.store(keys[w.uuid], result)
                out[w.uuid] = result
        progress("baseline", len(missing), len(missing), "baselines cached")
        return out
