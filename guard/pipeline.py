"""The guard's cascade: static screen, build, correctness, benchmark, score, decision,
archive. ``Guard.evaluate`` is the one entry point the CLI, the MCP server and the tests
share. The parent process never imports torch: candidates, references, comparisons and
timing all run in worker processes (guard.runner)."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from . import decision as decision_mod
from . import scoring
from .archive.db import Database
from .archive.git_archive import GitArchive
from .candidates.solution import Solution
from .config import GuardConfig
from .pairing import needs_pairing, paired_comparison
from .paths import cache_dir
from .problems.derive import largest_tensor, workload_set
from .repetition import normalized_hash, repeats
from .problems.dtypes import dtype_info
from .problems.problem import Problem
from .problems.schema import Definition, Workload
from .runner import device as device_mod
from .runner.pool import WorkerPool
from .runner.process import WorkerDied, WorkerProcess, WorkerTimeout
from .runner.slot import TimingSlot
from .screen import screen_solution
from .verdict import Verdict, WorkloadResult
from .workspace import Workspace

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int, str], None]
ROUND_LABEL = {
    "normal": "random inputs",
    "mixed": "mixed scales (1e-3..1e3 per row)",
    "large": "large magnitudes",
    "tiny": "values near zero",
}


ADVERSARIAL_MAX_ELEMENTS = 1 << 24


def _scratch_root() -> str | None:
    """/dev/shm when it has room: candidate outputs travel through files there."""
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize > (4 << 30):
            return "/dev/shm"
    except OSError:
        pass
    return None


# what a trusted worker's baseline reply carries that the guard keeps
BASELINE_FIELDS = ("eager", "compiled", "compile_error", "compile_counters", "compile_checked", "compile_fell_back",
                   "flops", "flops_error")


class GuardError(RuntimeError):
    """Not the candidate's fault: a broken problem, a worker that cannot start, bad input."""


class _Unpaired(Exception):
    """The incumbent could not be timed again; the stored measurement decides."""


class _Reject(Exception):
    def __init__(self, gate: str, status: str, reason: str, diagnostic: str | None = None, workload: str | None = None):
        super().__init__(reason)
        self.gate, self.status, self.reason = gate, status, reason
        self.diagnostic, self.workload = diagnostic, workload


def _noop(phase: str, done: int, total: int, detail: str) -> None:
    pass


class Guard:
    def __init__(
        self,
        workspace: Workspace,
        config: GuardConfig | None = None,
        device: "str | device_mod.DeviceChoice" = "auto",
        prestart: bool = True,
    ):
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
        self.scratch = Path(tempfile.mkdtemp(prefix="kernelarc-", dir=_scratch_root()))
        self.pool = WorkerPool(self.device.kind, self.scratch / "workers", self.cfg.cpu_memory_limit_gb, prestart,
                               env=self.device.worker_env())
        # simulated CPU devices share the cores, hence one slot
        self.slot = TimingSlot(self.device.compare_key if self.device.simulated else self.device.key)
        self._lock = threading.Lock()  # one evaluation at a time on this device
        self._ceilings: dict | None = None
        self._secret = workspace.secret

    # -- lifecycle ------------------------------------------------------------------------
    def warm_up(self) -> None:
        self.pool.warm_up()

    def prepare(self, problem_name: str, progress: Progress | None = None) -> None:
        """Measure the device's ceilings and the problem's eager and compile baselines now,
        before any candidate (both are cached), so that the first verdict does not wait for
        them."""
        problem = self.store.get(problem_name)
        with self._lock:
            self._reference_side(problem, workload_set(problem, self.device.kind, self._secret).visible,
                                 progress or _noop)

    def close(self) -> None:
        self.pool.close()
        self.db.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> "Guard":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- helpers --------------------------------------------------------------------------
    def _seed(self, *parts: object) -> int:
        msg = "|".join(str(p) for p in parts).encode()
        return int.from_bytes(hmac.new(self._secret, msg, hashlib.sha256).digest()[:6], "big")

    def device_info(self) -> dict:
        info = {"kind": self.device.kind, "key": self.device.key, "group": self.device.compare_key,
                "name": self.device.name}
        if self._ceilings:
            info["ceilings"] = self._ceilings
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
        progress = progress or _noop
        t_start = time.monotonic()
        problem = self.store.get(problem_name)
        d = problem.definition
        dhash = d.content_hash()
        source_hash = solution.source_hash()
        language = solution.spec.primary_language
        solution_json = solution.model_dump(mode="json", exclude_none=True)
        common = dict(
            problem=d.name, definition_hash=dhash, agent=agent, parent=parent, notes=notes,
            language=language, source_hash=source_hash, normalized_hash=normalized_hash(solution),
            solution_json=json.dumps(solution_json), device_key=self.device.compare_key,
            device_kind=self.device.kind, measured_on=self.device.key,
        )

        # Gate 1: static screen (pure Python, no worker needed).
        if self.cfg.static_screen:
            progress("screen", 0, 1, "static screen")
            res = screen_solution(solution, self.cfg.max_source_bytes, self.cfg.max_source_files)
            if not res.ok:
                cid = self.db.insert_candidate(state="running", **common)
                first = res.findings[0]
                return self._record_reject(
                    cid, problem, agent, _Reject("screen", res.status, first.render(), res.message()),
                    {"screen": time.monotonic() - t_start}, notes, parent,
                )

        prior = self.db.find_evaluated(d.name, dhash, source_hash, self.device.compare_key)
        if prior is not None:  # judged from the prior's measurements: taken where it was measured
            common["measured_on"] = self._measured_on(prior)
            cid = self.db.insert_candidate(state="running", **common)
            return self._record_duplicate(cid, prior, problem, agent, notes, parent)

        cid = self.db.insert_candidate(state="running", **common)
        try:
            if not self._lock.acquire(blocking=False):
                # another evaluation, or the baselines of a problem being prepared
                progress("waiting", 0, 1, "this device's guard is busy (another evaluation, or baselines being measured)")
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

    def _run(self, cid, problem: Problem, solution_json: dict, language: str, agent: str,
             notes, parent, progress: Progress, t_start: float) -> Verdict:
        d = problem.definition
        dhash = d.content_hash()
        wset = workload_set(problem, self.device.kind, self._secret)
        phases: dict[str, float] = {"screen": time.monotonic() - t_start}
        eval_seed = self._seed("eval", cid, dhash)
        outdir = self.scratch / "outputs" / cid
        outdir.mkdir(parents=True, exist_ok=True)

        t = time.monotonic()
        progress("start", 0, 1, "starting workers")
        trusted, key, ceilings, baselines = self._reference_side(problem, wset.visible, progress)
        phases["baseline"] = time.monotonic() - t

        t = time.monotonic()
        cand = self.pool.take_candidate()
        gate = "build"
        try:
            try:
                cand.wait_ready(180)
            except WorkerDied as exc:
                raise GuardError(f"a candidate worker could not start: {exc}\n{exc.log_tail}") from None
            phases["start"] = time.monotonic() - t

            # Gate 2: build.
            t = time.monotonic()
            progress("build", 0, 1, f"building ({language})")
            reply = cand.request(
                {"op": "prepare", "definition": d.to_json(), "solution": solution_json,
                 "language": language, "blob_root": str(problem.root) if problem.root else None,
                 "build_cache": str(cache_dir() / "torch_extensions")},
                self.cfg.build_timeout_s,
            )
            if not reply.get("ok"):
                raise _Reject("build", reply.get("status", "COMPILE_ERROR"),
                              _first_line(reply.get("message", "build failed")), reply.get("message"))
            phases["build"] = time.monotonic() - t

            # Gate 3: correctness on the visible and held-out workloads.
            t = time.monotonic()
            gate = "correctness"
            checked = self._correctness(cand, trusted, key, d, wset, eval_seed, outdir, progress)
            phases["correctness"] = time.monotonic() - t

            # Gate 4: benchmark.
            t = time.monotonic()
            gate = "benchmark"
            timings = self._benchmark(cand, trusted, key, d, wset.visible, eval_seed, outdir, progress)
            phases["benchmark"] = time.monotonic() - t

            # Gate 5: score; then, when a comparison is close, re-measure side by side.
            workloads = self._score(d, wset.visible, timings, baselines, ceilings)
            t = time.monotonic()
            paired = self._pairings(cand, trusted, key, problem, wset.visible, workloads, agent,
                                    eval_seed, outdir, progress)
            if paired:
                phases["pairing"] = time.monotonic() - t
        except _Reject as rej:
            phases["total"] = time.monotonic() - t_start
            return self._record_reject(cid, problem, agent, rej, phases, notes, parent)
        except WorkerTimeout as exc:
            phases["total"] = time.monotonic() - t_start
            rej = _Reject(gate, "TIMEOUT", f"{exc} (limit {self.cfg.call_timeout_s:.0f} s per call)",
                          "the candidate was stopped; look for an infinite loop or a hang")
            return self._record_reject(cid, problem, agent, rej, phases, notes, parent)
        except WorkerDied as exc:
            phases["total"] = time.monotonic() - t_start
            rej = _Reject(gate, "RUNTIME_ERROR", f"the candidate's process died: {exc}",
                          _trim_log(exc.log_tail))
            return self._record_reject(cid, problem, agent, rej, phases, notes, parent)
        finally:
            self.pool.discard(cand)
            shutil.rmtree(outdir, ignore_errors=True)

        # Gates 6 and 7: decision, archive.
        phases["total"] = time.monotonic() - t_start
        return self._record_measured(cid, problem, agent, workloads, checked, phases, notes, parent,
                                     solution_json, paired=paired)

    # -- workers and caches ----------------------------------------------------------------------
    def _reference_side(self, problem: Problem, visible: list[Workload], progress: Progress):
        """The trusted worker with the problem loaded, the device's ceilings and the visible
        workloads' baselines (measured where not cached): (worker, key, ceilings, baselines)."""
        trusted = self._trusted()
        key = self._load_problem(trusted, problem)
        ceilings = self._ensure_ceilings(trusted, progress)
        return trusted, key, ceilings, self._ensure_baselines(trusted, problem, key, visible, progress)

    def _trusted(self) -> WorkerProcess:
        try:
            return self.pool.trusted()
        except (WorkerDied, WorkerTimeout) as exc:
            tail = getattr(exc, "log_tail", "")
            raise GuardError(f"the trusted worker could not start: {exc}\n{tail}") from None

    def _trusted_request(self, trusted: WorkerProcess, msg: dict, timeout: float | None = None) -> dict:
        try:
            reply = trusted.request(msg, timeout or max(self.cfg.call_timeout_s, 120))
        except (WorkerDied, WorkerTimeout) as exc:
            raise GuardError(f"the trusted worker failed during {msg.get('op')}: {exc}") from None
        return reply

    def _load_problem(self, trusted: WorkerProcess, problem: Problem) -> str:
        key = problem.definition.content_hash()
        reply = self._trusted_request(trusted, {
            "op": "problem", "key": key, "definition": problem.definition.to_json(),
            "blob_root": str(problem.root) if problem.root else None,
        })
        if not reply.get("ok"):
            raise GuardError(f"problem {problem.name}: the reference does not load: {reply.get('message')}")
        return key

    def _hold(self, exclusive: bool, progress: Progress):
        """The device's timing slot; says so when another process holds it."""
        return self.slot.hold(exclusive, on_wait=lambda: progress("wait", 0, 1, "waiting for the timing slot"))

    def _ensure_ceilings(self, trusted: WorkerProcess, progress: Progress = _noop) -> dict:
        if self._ceilings is not None:
            return self._ceilings
        path = ceilings_cache_dir() / f"{self.device.key}.json"
        if path.is_file():
            self._ceilings = json.loads(path.read_text())
            return self._ceilings
        with self._hold(True, progress):
            progress("ceilings", 0, 1, "measuring the device's bandwidth and matmul rates")
            reply = self._trusted_request(trusted, {"op": "ceilings"}, 600)
        if not reply.get("ok"):
            raise GuardError(f"measuring the device ceilings failed: {reply.get('message')}")
        self._ceilings = dict(reply["ceilings"], measured_at=time.time(), device_key=self.device.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self._ceilings, indent=2))
        tmp.replace(path)
        return self._ceilings

    def _timing_config(self) -> dict:
        c = self.cfg
        return {"min_iters": c.min_iters, "max_iters": c.max_iters, "max_timing_s": c.max_timing_s,
                "target_time_s": c.target_time_s, "warmup_time_s": c.warmup_time_s}

    def _set_seeds(self, d: Definition, w: Workload, purpose: str, salt: object) -> list[int]:
        axes = d.resolve_axes(w.axes)
        in_bytes = sum(
            dtype_info(s.dtype).bytes * _prod(d.shape_of(s, axes))
            for s in d.inputs.values() if s.shape is not None
        )
        n = 4 if in_bytes < (256 << 20) else 2
        if self.device.kind == "cpu":
            n = 2
        return [self._seed(purpose, salt, w.uuid, k) for k in range(n)]

    def _ensure_baselines(self, trusted, problem: Problem, key: str, visible: list[Workload], progress: Progress) -> dict:
        d = problem.definition
        dhash = d.content_hash()
        out, missing = {}, []
        for w in visible:
            cached = self.db.baseline(dhash, w.uuid, self.device.key)
            if cached is not None and (cached.get("compile_checked") or not self.cfg.compile_baseline):
                out[w.uuid] = cached
            else:  # a compile time made without the fall-back check is not trusted: measured again
                missing.append(w)
        if not missing:
            return out
        with self._hold(True, progress):
            for i, w in enumerate(missing):
                progress("baseline", i, len(missing), f"timing the reference on {w.uuid}")
                # once dynamo fell back to eager on a workload of the problem, it may skip the
                # function silently: no later compile time of that problem is asked for
                fell_back = any(b.get("compile_fell_back") for b in out.values())
                reply = self._trusted_request(trusted, {
                    "op": "baseline", "key": key, "workload": w.model_dump(mode="json"),
                    "axes": d.resolve_axes(w.axes), "sets": self._set_seeds(d, w, "baseline", 0),
                    "config": self._timing_config(), "compile": self.cfg.compile_baseline and not fell_back,
                    "compile_mode": self.cfg.compile_mode, "count_flops": d.kernelarc.flops is None,
                }, max(600, self.cfg.call_timeout_s))
                if not reply.get("ok"):
                    raise GuardError(
                        f"problem {d.name}: the reference fails on workload {w.uuid}: {reply.get('message')}"
                    )
                result = {k: reply.get(k) for k in BASELINE_FIELDS}
                if fell_back and self.cfg.compile_baseline:
                    result |= {"compile_checked": True, "compile_fell_back": True,
                               "compile_error": "torch.compile fell back to eager on an earlier workload of this problem"}
                self.db.put_baseline(dhash, w.uuid, self.device.key, result)
                out[w.uuid] = result
        progress("baseline", len(missing), len(missing), "baselines cached")
        return out

    # -- gate 3 ----------------------------------------------------------------------------------
    def _rounds(self, d: Definition, w: Workload, visible: bool) -> list[str]:
        c = self.cfg
        kinds = ["normal"] * (c.correctness_rounds if visible else c.heldout_rounds)
        # Adversarial values test numerics, not size: the largest workloads (whose outputs
        # dominate the transfer time) get the random rounds only.
        if c.adversarial_rounds and d.kernelarc.adversarial and largest_tensor(d, w.axes) <= ADVERSARIAL_MAX_ELEMENTS:
            kinds += ["mixed", "large", "tiny"] if visible else ["mixed"]
        return kinds

    def _correctness(self, cand, trusted, key, d: Definition, wset, eval_seed, outdir, progress) -> dict:
        plan = [(w, True, w.uuid) for w in wset.visible] + [
            (w, False, f"held-out workload {i + 1} of {len(wset.heldout)}")
            for i, w in enumerate(wset.heldout)
        ]
        names = list(d.outputs)
        tolerances = [d.tolerance_for(s.dtype).model_dump() for s in d.outputs.values()]
        rounds_run = skipped = 0
        for idx, (w, visible, label) in enumerate(plan):
            progress("correctness", idx, len(plan), label)
            axes = d.resolve_axes(w.axes)
            rounds = [
                {"seed": self._seed("round", eval_seed, w.uuid, r), "kind": kind, "tag": f"w{idx}r{r}"}
                for r, kind in enumerate(self._rounds(d, w, visible))
            ]
            ref = self._trusted_request(trusted, {
                "op": "reference", "key": key, "workload": w.model_dump(mode="json"),
                "axes": axes, "rounds": rounds,
            })
            kept = []
            for rnd, info in zip(rounds, ref.get("rounds", [])):
                if not info.get("ok"):
                    if visible and self.device.kind != "cpu" and rnd["kind"] == "normal":
                        raise GuardError(f"problem {d.name}: the reference fails on {w.uuid}: {info.get('message')}")
                    log.warning("reference failed on %s (%s): %s; round skipped", label, rnd["kind"], info.get("message"))
                    skipped += 1
                    continue
                if rnd["kind"] != "normal" and not info.get("finite"):
                    skipped += 1  # the op does not allow these values: the reference overflows
                    self._trusted_request(trusted, {"op": "release", "tags": [rnd["tag"]]})
                    continue
                kept.append(rnd)
            if not kept:
                continue
            with self._hold(False, progress):
                reply = cand.request({
                    "op": "check", "workload": w.model_dump(mode="json"), "axes": axes,
                    "rounds": kept, "determinism": self.cfg.check_determinism and visible,
                    "outdir": str(outdir),
                }, self.cfg.call_timeout_s)
            if not reply.get("ok"):
                self._trusted_request(trusted, {"op": "release", "tags": [r["tag"] for r in kept]})
                if reply.get("status") == "INTERNAL":
                    raise GuardError(f"worker error on {label}: {reply.get('message')}")
                raise self._failure("correctness", reply["status"], reply.get("message", ""), w, visible, label)
            for rnd, got in zip(kept, reply["rounds"]):
                cmp = self._trusted_request(trusted, {
                    "op": "compare", "tag": rnd["tag"], "outputs": got["outputs"],
                    "tolerances": tolerances, "names": names,
                })
                for meta in got["outputs"]:
                    Path(meta["file"]).unlink(missing_ok=True)
                if not cmp.get("ok"):
                    raise GuardError(f"comparison failed on {label}: {cmp.get('message')}")
                rounds_run += 1
                if not cmp.get("passed"):
                    self._trusted_request(trusted, {"op": "release", "tags": None})
                    msg = f"{cmp.get('message')} [round {rnd['tag'][rnd['tag'].index('r') + 1:]}: {ROUND_LABEL[rnd['kind']]}]"
                    raise self._failure("correctness", cmp["status"], msg, w, visible, label)
        progress("correctness", len(plan), len(plan), "all workloads passed")
        return {"visible_workloads": len(wset.visible), "heldout_workloads": len(wset.heldout),
                "rounds": rounds_run, "rounds_skipped": skipped, "determinism": self.cfg.check_determinism}

    def _failure(self, gate, status, message, w: Workload, visible: bool, label: str) -> _Reject:
        if visible:
            where = f"workload {w.uuid} {w.axes}"
            return _Reject(gate, status, f"{status} on {where}: {_first_line(message)}", message, w.uuid)
        # Held-out workloads stay hidden: say what failed, not the shape or positions.
        hint = ("it passes the visible workloads, so look at sizes that are odd, not powers of two, "
                "or outside the shapes you tuned for (masking, tails, strides)")
        return _Reject(gate, status, f"{status} on a {label} (shape not shown): {hint}", None, label)

    # -- gate 4 ----------------------------------------------------------------------------------
    def _time_workload(self, worker, trusted, key, d: Definition, w: Workload, sets, audit_at,
                       outdir, tag: str) -> dict:
        """Time one workload in ``worker``; the outputs of the audited timed calls are
        checked against the reference (a candidate may not behave differently when timed)."""
        axes = d.resolve_axes(w.axes)
        reply = worker.request({
            "op": "time", "workload": w.model_dump(mode="json"), "axes": axes, "sets": sets,
            "audit_at": audit_at, "config": self._timing_config(), "outdir": str(outdir),
            "gpu_uuid": self.device.uuid,
        }, self.cfg.call_timeout_s + self.cfg.max_timing_s)
        if not reply.get("ok"):
            raise _Reject("benchmark", reply.get("status", "RUNTIME_ERROR"),
                          f"{reply.get('status')} while timing {w.uuid}: {_first_line(reply.get('message', ''))}",
                          reply.get("message"), w.uuid)
        names = list(d.outputs)
        tolerances = [d.tolerance_for(s.dtype).model_dump() for s in d.outputs.values()]
        for audit in reply.get("audits", []):
            atag = f"{tag}-audit{audit['iteration']}"
            self._trusted_request(trusted, {
                "op": "reference", "key": key, "workload": w.model_dump(mode="json"), "axes": axes,
                "rounds": [{"seed": sets[audit["set"]], "kind": "normal", "tag": atag}],
            })
            cmp = self._trusted_request(trusted, {
                "op": "compare", "tag": atag, "outputs": audit["outputs"],
                "tolerances": tolerances, "names": names,
            })
            for meta in audit["outputs"]:
                Path(meta["file"]).unlink(missing_ok=True)
            if not cmp.get("passed"):
                raise _Reject(
                    "benchmark", "REWARD_HACK",
                    f"a timed call on {w.uuid} returned a wrong result: the candidate behaves differently while timed",
                    cmp.get("message"), w.uuid,
                )
        return {"stats": reply["stats"], "nvml": reply.get("nvml")}

    def _benchmark(self, cand, trusted, key, d: Definition, visible: list[Workload], eval_seed, outdir, progress) -> dict:
        rng = random.Random(eval_seed)
        results = {}
        with self._hold(True, progress):
            for i, w in enumerate(visible):
                progress("benchmark", i, len(visible), w.uuid)
                sets = self._set_seeds(d, w, "timing", eval_seed)
                audit_at = [rng.randrange(0, self.cfg.max_iters) for _ in range(self.cfg.audits)]
                results[w.uuid] = self._time_workload(cand, trusted, key, d, w, sets, audit_at, outdir, f"w{i}")
        progress("benchmark", len(visible), len(visible), "timed")
        return results

    def _remeasure(self, cand, trusted, key, problem: Problem, visible, incumbent, eval_seed, outdir,
                   progress, rounds: int = 2) -> dict:
        """Time the incumbent and the challenger turn about (I C C I ...) on the same inputs.
        Returns workload -> paired samples, or raises _Unpaired when the incumbent cannot be
        run again (then the stored measurement decides)."""
        d = problem.definition
        inc = self.pool.take_candidate()
        try:
            inc.wait_ready(180)
            reply = inc.request(
                {"op": "prepare", "definition": d.to_json(), "solution": json.loads(incumbent["solution_json"]),
                 "language": incumbent["language"], "blob_root": str(problem.root) if problem.root else None,
                 "build_cache": str(cache_dir() / "torch_extensions")},
                self.cfg.build_timeout_s,
            )
            if not reply.get("ok"):
                raise _Unpaired(f"the incumbent {incumbent['id']} does not build here: {_first_line(reply.get('message', ''))}")
            rng = random.Random(eval_seed ^ 0x5A5A)
            samples: dict[str, dict] = {}
            with self._hold(True, progress):
                for i, w in enumerate(visible):
                    progress("pairing", i, len(visible), f"{w.uuid} against {incumbent['id']}")
                    sets = self._set_seeds(d, w, "pairing", eval_seed)
                    s = samples[w.uuid] = {"incumbent": [], "challenger": []}
                    for rep in range(rounds):
                        order = [("incumbent", inc), ("challenger", cand)]
                        for role, worker in (order if rep % 2 == 0 else order[::-1]):
                            audit_at = [rng.randrange(0, self.cfg.max_iters)] if role == "challenger" and rep == 0 else []
                            try:
                                t = self._time_workload(worker, trusted, key, d, w, sets, audit_at, outdir, f"p{i}{role[0]}{rep}")
                            except _Reject as rej:
                                if role == "challenger":
                                    raise
                                raise _Unpaired(f"the incumbent failed to run again: {rej.reason}") from None
                            s[role].append((t["stats"]["median_ms"], t["stats"].get("rel_se") or 0.0))
            progress("pairing", len(visible), len(visible), "paired")
            return samples
        except (WorkerDied, WorkerTimeout) as exc:
            raise _Unpaired(f"re-measuring {incumbent['id']} failed: {exc}") from None
        finally:
            self.pool.discard(inc)

    def _pairings(self, cand, trusted, key, problem: Problem, visible, workloads, agent, eval_seed,
                  outdir, progress) -> dict:
        """Paired re-measurements against the agent's best and, for a likely ACCEPT, the
        global best, when the stored comparison is not clear-cut."""
        dhash = problem.definition.content_hash()
        new = {w.uuid: (w.latency_ms, w.rel_se or 0.0) for w in workloads}
        conn = self.db.reader()
        best = self.db.agent_best(conn, problem.name, dhash, agent, self.device.compare_key)
        gbest = self.db.global_best(conn, problem.name, dhash, self.device.compare_key)
        out: dict = {}
        for label, row in (("agent", best), ("global", gbest)):
            if row is None:
                continue
            if label == "global":
                if best is not None and row["id"] == best["id"]:
                    if "agent" in out:
                        out["global"] = out["agent"]
                    continue
                agent_cmp = (out.get("agent") or {}).get("comparison")
                if agent_cmp is None and best is not None:
                    agent_cmp = decision_mod.compare(new, self._measurements(conn, best["id"]), self.cfg)
                if decision_mod.decide(agent_cmp) != "ACCEPT":
                    continue
            stored = decision_mod.compare(new, self._measurements(conn, row["id"]), self.cfg)
            if self._measured_elsewhere(row):
                # Measured on another device of the group: compare only what was measured
                # here, unless the difference is clear-cut even across devices.
                if not self._elsewhere_unclear(row, stored):
                    continue
                why = f"the incumbent was measured on another device ({self._measured_on(row)})"
            elif needs_pairing(stored, self._pairing_band):
                why = "the stored comparison is not clear-cut"
            else:
                continue
            entry = {"incumbent": row["id"], "stored_speedup": stored.speedup, "comparison": None, "why": why}
            try:
                entry["samples"] = self._remeasure(cand, trusted, key, problem, visible, row, eval_seed,
                                                   outdir, progress)
                entry["comparison"] = paired_comparison(entry["samples"], self.cfg)
            except _Unpaired as exc:
                entry["note"] = str(exc)
                log.warning("paired re-measurement skipped: %s", exc)
            out[label] = entry
        return out

    # -- gate 5 ----------------------------------------------------------------------------------
    def _score(self, d: Definition, visible, timings, baselines, ceilings) -> list[WorkloadResult]:
        float_inputs = [s.dtype for s in d.inputs.values() if s.shape is not None and dtype_info(s.dtype).is_float]
        main_dtype = float_inputs[0] if float_inputs else next(iter(d.outputs.values())).dtype
        rate = scoring.flops_rate_for(main_dtype, ceilings)
        out = []
        for w in visible:
            stats = timings[w.uuid]["stats"]
            base = baselines.get(w.uuid) or {}
            axes = d.resolve_axes(w.axes)
            t = stats["median_ms"]
            eager = (base.get("eager") or {}).get("median_ms")
            comp = (base.get("compiled") or {}).get("median_ms")
            flops = d.flops(axes)
            if flops is None:
                flops = base.get("flops")
            t_sol, bound = scoring.sol_time_ms(flops, d.bytes_moved(axes), rate, ceilings["copy_bytes_per_s"])
            out.append(WorkloadResult(
                uuid=w.uuid, axes=w.axes, latency_ms=t, eager_ms=eager, compile_ms=comp,
                sol_ms=t_sol, bound=bound,
                speedup_eager=eager / t if eager else None,
                speedup_compile=comp / t if comp else None,
                sol_score=scoring.sol_score(t, t_sol, eager) if eager else None,
                sol_fraction=t_sol / t if t > 0 else None,
                rel_se=stats.get("rel_se"), iterations=stats.get("n"), timing=stats,
                nvml=timings[w.uuid].get("nvml"),
            ))
        return out

    # -- gates 6 and 7 ------------------------------------------------------------------------------
    def _history(self, c, problem: str, agent: str) -> list[dict]:
        return [dict(r) for r in self.db.agent_history(c, problem, agent)]

    def _measurements(self, c, cid: str) -> dict[str, tuple[float, float]]:
        rows = c.execute(
            "SELECT workload, latency_ms, rel_se FROM workload_results WHERE candidate_id = ?", (cid,)
        ).fetchall()
        return {r["workload"]: (r["latency_ms"], r["rel_se"] or 0.0) for r in rows if r["latency_ms"]}

    def _record_reject(self, cid, problem: Problem, agent, rej: _Reject, phases, notes, parent) -> Verdict:
        with self.db.transaction() as c:
            history = self._history(c, problem.name, agent)
            best = self.db.agent_best(c, problem.name, problem.definition.content_hash(), agent,
                                      self.device.compare_key)
            gbest = self.db.global_best(c, problem.name, problem.definition.content_hash(), self.device.compare_key)
            advice = decision_mod.advise("REJECT", history, None, best["sol_fraction"] if best else None, self.cfg)
            row = c.execute("SELECT source_hash, normalized_hash, notes FROM candidates WHERE id = ?", (cid,)).fetchone()
            verdict = Verdict(
                candidate_id=cid, problem=problem.name, agent=agent, decision="REJECT",
                status=rej.status, gate=rej.gate, reason=rej.reason, diagnostic=rej.diagnostic,
                first_failing_workload=rej.workload, advice=advice, phases_s=phases,
                agent_best_id=best["id"] if best else None, global_best_id=gbest["id"] if gbest else None,
                device=self.device_info(), notes=notes, parent=parent,
                repeats=repeats(c, problem.name, agent, row["source_hash"], row["normalized_hash"], notes, cid),
            )
            self.db.finish(c, cid, _row_fields(verdict), [])
        return verdict

    @property
    def _pairing_band(self) -> float:
        return self.cfg.pairing_band_gpu if self.device.kind == "cuda" else self.cfg.pairing_band_cpu

    @staticmethod
    def _measured_on(row) -> str:
        return row["measured_on"] or row["device_key"]  # rows from before measured_on: their key

    def _measured_elsewhere(self, row) -> bool:
        return row is not None and self._measured_on(row) != self.device.key

    def _elsewhere_unclear(self, row, cmp) -> bool:
        """A stored comparison with a row measured on another device, inside the pairing band."""
        if cmp is None or not self._measured_elsewhere(row):
            return False
        return 1 / self._pairing_band < cmp.speedup < self._pairing_band

    @staticmethod
    def _paired_for(paired: dict | None, label: str, row) -> "decision_mod.Comparison | None":
        entry = (paired or {}).get(label)
        if row is None or not entry or entry["incumbent"] != row["id"]:
            return None
        return entry["comparison"]

    def _record_measured(self, cid, problem: Problem, agent, workloads: list[WorkloadResult], checked,
                         phases, notes, parent, solution_json, duplicate_of: str | None = None,
                         paired: dict | None = None) -> Verdict:
        dhash = problem.definition.content_hash()
        new = {w.uuid: (w.latency_ms, w.rel_se or 0.0) for w in workloads}
        sol_fraction = scoring.geomean([w.sol_fraction for w in workloads])
        with self.db.transaction() as c:
            best = self.db.agent_best(c, problem.name, dhash, agent, self.device.compare_key)
            gbest = self.db.global_best(c, problem.name, dhash, self.device.compare_key)
            cmp = self._paired_for(paired, "agent", best)
            was_paired = cmp is not None
            unsure = False  # an unpaired, unclear comparison with a best measured on another device
            if cmp is None and best:
                cmp = decision_mod.compare(new, self._measurements(c, best["id"]), self.cfg)
                unsure = self._elsewhere_unclear(best, cmp)
            decision = decision_mod.decide(cmp)
            if unsure and decision != "KEEP":
                # The best changed (on another device) while this one was measured: no ACCEPT or
                # REVERT from figures taken on two devices; a resubmission is compared properly.
                decision = "KEEP"
            is_global = False
            if decision == "ACCEPT":
                cmp_g = self._paired_for(paired, "global", gbest)
                if cmp_g is None and gbest:
                    cmp_g = decision_mod.compare(new, self._measurements(c, gbest["id"]), self.cfg)
                    # not decidable from figures of two devices: the global best stays
                    is_global = not self._elsewhere_unclear(gbest, cmp_g) and decision_mod.beats(cmp_g)
                else:
                    is_global = decision_mod.beats(cmp_g)
            history = self._history(c, problem.name, agent)
            advice = decision_mod.advise(decision, history, sol_fraction, best["sol_fraction"] if best else None, self.cfg)
            row = c.execute("SELECT source_hash, normalized_hash FROM candidates WHERE id = ?", (cid,)).fetchone()
            repeated = repeats(c, problem.name, agent, row["source_hash"], row["normalized_hash"], notes, cid)
            if cmp is None:
                reason = "first correct candidate of this agent: it becomes the agent's best"
            else:
                word = {"ACCEPT": "faster than", "KEEP": "within the noise of", "REVERT": "slower than"}[decision]
                reason = (f"{word} the agent's best {best['id']}: speedup {cmp.speedup:.3f}x "
                          f"(threshold {cmp.threshold:.1%}"
                          + (", re-measured side by side)" if was_paired else ")"))
                if decision == "REVERT":
                    reason += f"; go back to {best['id']}"
                if unsure:
                    reason += ("; the best was measured on another device and changed during this evaluation, "
                               "so no ACCEPT or REVERT is drawn from it: resubmit to compare on one device")
            if is_global:
                reason += "; new global best"
            verdict = Verdict(
                candidate_id=cid, problem=problem.name, agent=agent, decision=decision, status="PASSED",
                reason=reason, score=scoring.mean([w.sol_score for w in workloads]),
                speedup_eager=scoring.geomean([w.speedup_eager for w in workloads]),
                speedup_compile=scoring.geomean([w.speedup_compile for w in workloads]),
                sol_fraction=sol_fraction,
                latency_ms=scoring.geomean([w.latency_ms for w in workloads]),
                speedup_vs_best=cmp.speedup if cmp else None, threshold=cmp.threshold if cmp else None,
                agent_best_id=cid if decision == "ACCEPT" else (best["id"] if best else None),
                global_best_id=cid if is_global else (gbest["id"] if gbest else None),
                is_global_best=is_global, duplicate_of=duplicate_of, advice=advice,
                workloads=workloads, checked=checked, phases_s=phases, device=self.device_info(),
                notes=notes, parent=parent, paired=_paired_summary(paired), repeats=repeated,
            )
            self.db.finish(c, cid, _row_fields(verdict), [w.model_dump() for w in workloads])
        if decision == "ACCEPT" and duplicate_of is None:
            self.archive.commit(problem.name, agent, cid, solution_json, _summary(verdict))
        return verdict

    def _record_duplicate(self, cid, prior, problem: Problem, agent, notes, parent) -> Verdict:
        prior_verdict = Verdict.model_validate_json(prior["verdict_json"])
        if prior_verdict.decision == "REJECT":
            rej = _Reject(prior_verdict.gate or "correctness", prior_verdict.status,
                          f"identical to {prior['id']}, already rejected: {prior_verdict.reason}",
                          prior_verdict.diagnostic, prior_verdict.first_failing_workload)
            v = self._record_reject(cid, problem, agent, rej, {}, notes, parent)
        else:
            v = self._record_measured(
                cid, problem, agent, prior_verdict.workloads, prior_verdict.checked, {}, notes, parent,
                json.loads(prior["solution_json"]), duplicate_of=prior["id"],
            )
        with self.db.transaction() as c:
            c.execute("UPDATE candidates SET duplicate_of = ? WHERE id = ?", (prior["id"], cid))
        v.duplicate_of = prior["id"]
        v.reason = f"identical source already evaluated as {prior['id']} (not measured again); " + v.reason
        return v


def ceilings_cache_dir() -> Path:
    return cache_dir() / "ceilings"


def _prod(shape) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def _first_line(text: str) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:400]
    return ""


def _trim_log(text: str) -> str:
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    return "\n".join(lines[-15:])[-3000:]


def _row_fields(v: Verdict) -> dict:
    return {
        "decision": v.decision, "status": v.status, "gate": v.gate, "reason": v.reason,
        "diagnostic": v.diagnostic, "first_failing_workload": v.first_failing_workload,
        "score": v.score, "speedup_eager": v.speedup_eager, "speedup_compile": v.speedup_compile,
        "sol_fraction": v.sol_fraction, "latency_ms": v.latency_ms,
        "speedup_vs_best": v.speedup_vs_best, "threshold": v.threshold,
        "global_best": int(v.is_global_best), "duplicate_of": v.duplicate_of,
        "verdict_json": v.model_dump_json(),
    }


def _paired_summary(paired: dict | None) -> dict | None:
    if not paired:
        return None
    out = {}
    for label, e in paired.items():
        cmp = e.get("comparison")
        out[label] = {
            "incumbent": e["incumbent"],
            "stored_speedup": e.get("stored_speedup"),
            "why": e.get("why"),
            "paired_speedup": cmp.speedup if cmp else None,
            "threshold": cmp.threshold if cmp else None,
            "note": e.get("note"),
            "workloads": {
                u: {"incumbent_ms": [x[0] for x in s["incumbent"]], "challenger_ms": [x[0] for x in s["challenger"]]}
                for u, s in (e.get("samples") or {}).items()
            },
        }
    return out


def _summary(v: Verdict) -> dict:
    return {k: getattr(v, k) for k in (
        "candidate_id", "problem", "agent", "decision", "status", "score", "speedup_eager",
        "speedup_compile", "sol_fraction", "latency_ms", "is_global_best", "reason",
    )}
