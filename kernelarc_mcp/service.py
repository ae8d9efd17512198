"""The service behind the MCP tools (and the CLI's server commands): one workspace, one
guard on one device, the job queue, memory and the leaderboard. Every method takes the
calling agent as an argument from the transport, never from the model's arguments."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Sequence

from guard.archive.db import Database
from guard.candidates.load import CandidateError, from_solution_json, from_source
from guard.candidates.solution import Solution
from guard.cascade import Guard, ceilings_cache_dir
from guard.config import GuardConfig
from guard.jobs import JobQueue, Stopping, StorageSpent, TooManyJobs
from guard.leaderboard import leaderboard
from guard.problems.derive import workload_set
from guard.problems.dtypes import dtype_info
from guard.problems.problem import ProblemError
from guard.problems.summary import summarize
from guard.problems.tolerance import view as tolerance_view
from guard.runner.device import resolve_all
from guard.scoring import flops_rate_for, sol_time_ms
from guard.verdict import Verdict
from guard.workspace import Workspace
from memory.conclusions import MemoryError_, Retention
from memory.policy import State, rank
from memory.store import Memory

from . import __version__
from . import views as V

log = logging.getLogger(__name__)

MAX_WAIT_S = 40.0
# what a solution.json may hold beside its sources (names, spec, description): it is stored
# with every verdict, accepted or not (a red team's 60 MB of padding was)
SOLUTION_METADATA_BYTES = 64 * 1024

CONTRACT = """\
Submit a candidate as Python source defining run(...) with the reference's signature (the
problem's inputs, in order) that returns the outputs (one tensor, or a tuple in the order of
the outputs), in PyTorch, Triton, or CUDA launched through cuda-python; or CUDA C++ source
defining torch::Tensor run(...) (language cuda_cpp; a torch binding is generated when the
file has none); or a SOL-ExecBench solution.json. Outputs must be new tensors with exactly
the declared dtype and shape; inputs are read-only.
The guard checks every visible workload and hidden held-out ones (other, often odd sizes)
with several rounds of fresh random inputs and adversarial values (mixed scales, large and
tiny magnitudes; an output far smaller than its atol is held to at most 10 x rtol x the
reference output's root mean square instead), demands bitwise-identical results on a repeat, then times the visible
workloads on the GPU (CUDA-graph replay, L2 flushed before each call, inputs rotated) and
compares with your best: ACCEPT / KEEP / REVERT / REJECT, plus advice
(continue / redraft / stop).
Not allowed (REJECT, REWARD_HACK): threads, processes, files, the environment, new CUDA
streams, reading frames or the garbage collector, monkey-patching, tensor subclasses,
torch function modes, try/except (no fallbacks), caching results across calls.
"""


class ServiceError(ValueError):
    """A request that cannot be served; the message is meant for the agent."""


class Service:
    def __init__(
        self,
        workspace: Workspace,
        config: GuardConfig | None = None,
        device: str = "auto",
        retention: Retention | None = None,
        max_wait_s: float = MAX_WAIT_S,
        prestart: bool = True,
        evaluator: bool = True,
        devices: int | None = 1,
        prepare: Sequence[str] = (),
        server: str | None = None,
    ):
        """``evaluator=False``: this process only reads and queues; another one evaluates
        (``server``: its id, ``service.jobs.server`` there, so that the jobs queued here are
        that server's to resolve when it stops).
        ``devices``: how many GPUs of the host judge (``None``: all), one guard each.
        ``prepare``: problems whose baselines each guard measures as soon as it has started
        (a launch names its problem, so that its agents' first verdicts do not wait for them)."""
        self.ws = workspace
        store = workspace.problems()
        for name in prepare:  # an unknown name fails here, before any worker starts
            try:
                store.get(name)
            except ValueError as exc:  # ProblemError, or a definition that does not validate
                raise ServiceError(f"cannot prepare {name!r}: {exc}") from None
        cfg = config or workspace.config()
        choices = resolve_all(device, devices if evaluator else 1)
        if len({c.compare_key for c in choices}) > 1:
            # one queue feeds every device: an agent's bests would split between models
            raise ValueError(
                "these GPUs are of different models ("
                + ", ".join(sorted({c.name for c in choices}))
                + "): serve one model per server, chosen with CUDA_VISIBLE_DEVICES"
            )
        self.guards = [Guard(workspace, cfg, device=c, prestart=prestart and evaluator) for c in choices]
        self.guard = self.guards[0]
        self.db: Database = self.guard.db
        self.jobs = JobQueue(self.guards, autostart=evaluator, evaluator=evaluator, server=server)
        self.memory = Memory(self.db, retention)
        self.max_wait_s = max_wait_s
        self._peek_cache: dict[tuple, tuple[int, V.PeekResult]] = {}
        if evaluator:
            for g in self.guards:
                threading.Thread(target=_start_guard, args=(g, list(prepare)), daemon=True).start()

    def close(self, why: str = "closed") -> None:
        """Stop: the job being judged becomes interrupted and those queued here cancelled,
        saying ``why`` (e.g. "stdin closed", "SIGTERM"), then the guards' workers end."""
        self.jobs.stop(why)
        for g in self.guards:
            g.close()
        self.jobs.settle()

    # -- problems --------------------------------------------------------------------------
    def _problem(self, name: str):
        if not isinstance(name, str) or not name or len(name) > 128:
            raise ServiceError("problem must be a problem name (see list_problems)")
        try:
            return self.guard.store.get(name)
        except (ProblemError, ValueError) as exc:
            raise ServiceError(str(exc)) from None

    def list_problems(self) -> V.ProblemList:
        out = []
        for p in self.guard.store.list():
            s = summarize(p)
            out.append(
                V.ProblemSummary(
                    name=s["name"],
                    origin=s["origin"],
                    op_family=s["op_family"],
                    workloads=s["workloads"],
                    dtypes=s["dtypes"],
                    description=s["description"],
                    seed_kernels=s["seed_kernels"],
                )
            )
        return V.ProblemList(problems=out, device=self._device_label())

    def _device_label(self) -> str:
        d = self.guard.device
        return f"{d.kind}: {d.name}" if len(self.guards) == 1 else f"{d.kind}: {len(self.guards)} x {d.name}"

    def get_problem(self, name: str) -> V.ProblemView:
        p = self._problem(name)
        d = p.definition
        wset = workload_set(p, self.guard.device.kind, self.guard._secret, self.guard.cfg.cpu_workloads)
        ceilings = _cached_ceilings(self.guard.device.key)
        dhash = d.content_hash()
        float_inputs = [s.dtype for s in d.inputs.values() if s.shape is not None and dtype_info(s.dtype).is_float]
        main_dtype = float_inputs[0] if float_inputs else next(iter(d.outputs.values())).dtype
        workloads = []
        for w in wset.visible:
            base = self.db.baseline(dhash, w.uuid, self.guard.device.key) or {}
            axes = d.resolve_axes(w.axes)
            sol = bound = None
            if ceilings:
                flops = d.flops(axes) if d.flops(axes) is not None else base.get("flops")
                sol, bound = sol_time_ms(
                    flops, d.bytes_moved(axes), flops_rate_for(main_dtype, ceilings), ceilings["copy_bytes_per_s"]
                )
            workloads.append(
                V.WorkloadView(
                    uuid=w.uuid,
                    axes=w.axes,
                    eager_ms=(base.get("eager") or {}).get("median_ms"),
                    compile_ms=(base.get("compiled") or {}).get("median_ms"),
                    sol_ms=sol,
                    bound=bound,
                )
            )
        seeds = {}
        for fname, path in p.seed_kernels().items():
            seeds[fname] = path.read_text()
        return V.ProblemView(
            name=d.name,
            description=d.description,
            op_type=d.op_type,
            op_family=d.kernelarc.op_family or "other",
            axes={k: v.model_dump(exclude_none=True) for k, v in d.axes.items()},
            inputs={k: v.model_dump(exclude_none=True) for k, v in d.inputs.items()},
            outputs={k: v.model_dump(exclude_none=True) for k, v in d.outputs.items()},
            reference=d.reference,
            tolerances=tolerance_view(d, wset.visible),
            not_honoured=summarize(p)["not_honoured"],
            flops_formula=d.kernelarc.flops,
            bytes_formula=d.kernelarc.bytes,
            workloads=workloads,
            heldout_workloads=len(wset.heldout),
            seed_kernels=seeds,
            device=self._device_label(),
            contract=CONTRACT,
        )

    # -- submissions ---------------------------------------------------------------------------
    def submit(
        self,
        agent: str,
        problem: str,
        source: str | None = None,
        solution: dict | str | None = None,
        language: str | None = None,
        notes: str | None = None,
        parent: str | None = None,
    ) -> str:
        self._problem(problem)
        if (source is None) == (solution is None):
            raise ServiceError("give exactly one of source (a kernel file's text) or solution (a solution.json)")
        if notes is not None and len(notes) > 2000:
            raise ServiceError("notes are limited to 2000 characters")
        if parent is not None and (not isinstance(parent, str) or self.db.candidate(parent) is None):
            raise ServiceError(f"parent {parent!r} is not a candidate id of this workspace")
        try:
            if source is not None:
                if not isinstance(source, str):
                    raise ServiceError("source must be text")
                if len(source.encode()) > self.guard.cfg.max_source_bytes:
                    raise ServiceError(f"source larger than {self.guard.cfg.max_source_bytes} bytes")
                sol: Solution = from_source(source, language)
            else:
                # as it came, not escaped: non-ASCII comments count their own bytes, not six each
                text = solution if isinstance(solution, str) else json.dumps(solution, ensure_ascii=False)
                sol = self._bounded(text)
        except (CandidateError, ValueError) as exc:
            raise ServiceError(f"not a candidate: {exc}") from None
        try:
            return self.jobs.submit(agent, problem, sol, notes=notes, parent=parent)
        except (Stopping, StorageSpent, TooManyJobs) as exc:
            raise ServiceError(str(exc)) from None

    def _bounded(self, text: str) -> Solution:
        """The solution in ``text``, which may hold ``SOLUTION_METADATA_BYTES`` beside its
        sources' own limit (the screen's): every byte is stored with its verdict."""
        limit = self.guard.cfg.max_source_bytes + SOLUTION_METADATA_BYTES
        if len(text.encode()) > limit:
            raise CandidateError(f"the solution is larger than {limit} bytes as JSON")
        return from_solution_json(text)

    def result(self, agent: str, job_id: str, wait_s: float, on_progress=None) -> V.SubmitResult:
        if not isinstance(job_id, str) or not job_id.startswith("j-") or len(job_id) > 40:
            raise ServiceError("job_id must be an id returned by submit_candidate")
        wait_s = max(0.0, min(float(wait_s) if math.isfinite(wait_s) else 0.0, self.max_wait_s))
        owner = self.jobs.get(job_id)  # before any wait: another agent's job tells nothing, not even when it ends
        if owner is None:
            raise ServiceError(f"no job {job_id!r}")
        if owner.agent != agent:
            raise ServiceError(f"job {job_id} belongs to another agent")
        view = self.jobs.wait(job_id, wait_s, on_progress)
        if view is None:
            raise ServiceError(f"no job {job_id!r}")
        if view.state == "done":
            v = view.verdict
            msg = f"{v.decision} ({v.status}): {v.reason}" if v else "done"
            return V.SubmitResult(state="done", job_id=job_id, candidate_id=view.candidate_id, verdict=v, message=msg)
        if view.state == "error":
            return V.SubmitResult(state="error", job_id=job_id, message=f"the evaluation failed: {view.error}")
        if view.state in ("interrupted", "cancelled"):  # its server stopped: no verdict, nothing judged
            return V.SubmitResult(state=view.state, job_id=job_id, message=f"no verdict: {view.error}")
        where = f"{view.position} evaluation(s) ahead" if view.state == "queued" else "being evaluated"
        return V.SubmitResult(
            state=view.state,
            job_id=job_id,
            position=view.position,
            progress=view.progress,
            message=f"still {where}; call get_result with this job_id to keep waiting",
        )

    # -- memory --------------------------------------------------------------------------------
    def _verdict(self, cid: str | None) -> Verdict | None:
        if not cid:
            return None
        row = self.db.candidate(cid)
        return Verdict.model_validate_json(row["verdict_json"]) if row is not None and row["verdict_json"] else None

    def recall(self, agent: str, problem: str, query: str = "", scope: str = "problem", k: int = 8) -> V.RecallResult:
        p = self._problem(problem)
        if not isinstance(query, str) or len(query) > 2000:
            raise ServiceError("query must be text of at most 2000 characters")
        try:
            found = self.memory.recall(p, query, scope, k)
        except MemoryError_ as exc:
            raise ServiceError(str(exc)) from None
        traj = self.memory.trajectory(agent, p.name)
        dhash = p.definition.content_hash()
        best_row = self.db.agent_best(self.db.reader(), p.name, dhash, agent, self.guard.device.compare_key)
        best = self._verdict(best_row["id"]) if best_row else None
        last = self._verdict(traj[-1]["id"]) if traj else None
        lang = (best_row["language"] if best_row else None) or (traj[-1]["language"] if traj else None)
        ranked, fired = rank(State(p.definition.kernelarc.op_family or "other", best, last, lang), k=5)
        methods = [
            V.MethodView(
                id=r.method.id,
                name=r.method.name,
                category=r.method.category,
                tier=r.method.tier,
                score=r.score,
                why=[f"{f.rule}: {f.because} -> {f.signal}" for f in r.rules],
                rationale=r.method.rationale,
                how_triton=r.method.how_triton,
                how_cuda=r.method.how_cuda,
                pitfalls=r.method.pitfalls,
            )
            for r in ranked
        ]
        warnings = _repetition_warnings(traj)
        return V.RecallResult(
            problem=p.name,
            conclusions=[V.ConclusionView(**{k: c[k] for k in V.ConclusionView.model_fields if k in c}) for c in found],
            methods=methods,
            signals=sorted({f.signal for f in fired}),
            trajectory=[
                V.TrajectoryEntry(
                    candidate_id=t["id"],
                    language=t["language"],
                    decision=t["decision"],
                    status=t["status"],
                    reason=t["reason"],
                    notes=t["notes"],
                    speedup_eager=t["speedup_eager"],
                    duplicate_of=t["duplicate_of"],
                )
                for t in traj
            ],
            warnings=warnings,
        )

    def record(
        self, agent: str, problem: str, text: str, kind: str, evidence: str, tags: list[str] | None = None
    ) -> V.RecordResult:
        p = self._problem(problem)
        if tags is not None and (not isinstance(tags, list) or not all(isinstance(t, str) for t in tags)):
            raise ServiceError("tags must be a list of strings")
        try:
            c = self.memory.record(agent, p, text, kind, evidence, tags)
        except MemoryError_ as exc:
            raise ServiceError(str(exc)) from None
        msg = "merged into an existing near-identical conclusion" if c["merged"] else "recorded"
        return V.RecordResult(
            id=c["id"], merged=c["merged"], support=c.get("support", 1), strength=c.get("strength", 0.0), message=msg
        )

    # -- leaderboard and status ------------------------------------------------------------------
    def peek_best(self, problem: str, k: int = 3) -> V.PeekResult:
        """The leaderboard view, recomputed only when the database has changed."""
        p = self._problem(problem)
        k = max(1, min(int(k), 20))
        version = self.db.version()
        key = (p.name, k)
        hit = self._peek_cache.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        result = self._peek(p, k)
        self._peek_cache[key] = (version, result)
        return result

    def _peek(self, p, k: int) -> V.PeekResult:
        board = leaderboard(
            self.db, p.name, device_key=self.guard.device.compare_key, definition_hash=p.definition.content_hash()
        )

        def entry(e: dict, global_best: bool = False) -> V.BestEntry:
            row = self.db.candidate(e["candidate_id"])
            solution = json.loads(row["solution_json"]) if row else {}
            sources = {s["path"]: s["content"] for s in solution.get("sources", [])}
            ws = [
                {
                    kk: w.get(kk)
                    for kk in ("uuid", "latency_ms", "eager_ms", "compile_ms", "sol_ms", "sol_score", "speedup_eager")
                }
                for w in self.db.workload_results(e["candidate_id"])
            ]
            return V.BestEntry(
                agent=e["agent"],
                candidate_id=e["candidate_id"],
                language=e.get("language"),
                score=e.get("score"),
                speedup_eager=e.get("speedup_eager"),
                speedup_compile=e.get("speedup_compile"),
                sol_fraction=e.get("sol_fraction"),
                latency_ms=e.get("latency_ms"),
                is_global_best=global_best or e.get("is_global_best", False),
                workloads=ws,
                source=sources,
                entry_point=solution.get("spec", {}).get("entry_point"),
            )

        gb = board["global_best"]
        global_entry = None
        if gb:
            match = next((e for e in board["agents"] if e["candidate_id"] == gb["candidate_id"]), None)
            row = self.db.candidate(gb["candidate_id"])
            base = match or {
                "agent": gb["agent"],
                "candidate_id": gb["candidate_id"],
                "language": row["language"] if row else None,
                "score": gb["score"],
                "speedup_eager": gb["speedup_eager"],
                "speedup_compile": row["speedup_compile"] if row else None,
                "sol_fraction": row["sol_fraction"] if row else None,
                "latency_ms": gb["latency_ms"],
            }
            global_entry = entry(base, True)
        return V.PeekResult(
            problem=p.name,
            global_best=global_entry,
            agents=[entry(e) for e in board["agents"][:k]],
            candidates=board["candidates"],
        )

    def status(self, agent: str) -> V.StatusView:
        rows = self.db.query(
            "SELECT agent, problem, COUNT(*) AS n, MAX(created_at) AS last FROM candidates GROUP BY agent, problem"
        )
        agents = []
        for r in rows:
            last = self.db.query(
                "SELECT decision, verdict_json FROM candidates WHERE agent = ? AND problem = ? AND state = 'done'"
                " ORDER BY created_at DESC LIMIT 1",
                (r["agent"], r["problem"]),
            )
            best = self.db.query(
                "SELECT id, score FROM candidates WHERE agent = ? AND problem = ? AND decision = 'ACCEPT'"
                " ORDER BY finished_at DESC LIMIT 1",
                (r["agent"], r["problem"]),
            )
            advice = None
            if last and last[0]["verdict_json"]:
                advice = json.loads(last[0]["verdict_json"]).get("advice", {}).get("message")
            agents.append(
                V.AgentStatus(
                    agent=r["agent"],
                    problem=r["problem"],
                    attempts=r["n"],
                    best_candidate=best[0]["id"] if best else None,
                    best_score=best[0]["score"] if best else None,
                    last_decision=last[0]["decision"] if last else None,
                    advice=advice,
                )
            )
        cfg = self.guard.cfg
        return V.StatusView(
            version=__version__,
            you=agent,
            device=dict(self.guard.device_info(), devices=[g.device_info() for g in self.guards]),
            queue=self.jobs.pending(),
            problems=len(self.guard.store.names()),
            agents=agents,
            budgets={
                "max_attempts": cfg.max_attempts,
                "time_budget_s": cfg.time_budget_s,
                "redraft_after": cfg.redraft_after,
                "stop_sol_fraction": cfg.stop_sol_fraction,
                "noise_floor": cfg.noise_floor,
            },
        )


def _cached_ceilings(device_key: str) -> dict | None:
    path = ceilings_cache_dir() / f"{device_key}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _repetition_warnings(traj: list[dict]) -> list[str]:
    """Your recent submissions that repeated earlier work (the guard's own findings)."""
    out = []
    seen: dict[str, str] = {}
    for t in traj:
        h = t.get("normalized_hash") or t.get("source_hash")
        if t.get("duplicate_of"):
            out.append(f"{t['id']} was identical to {t['duplicate_of']}")
        elif h and h in seen:
            out.append(f"{t['id']} repeated the code of {seen[h]} (up to comments and layout)")
        elif h:
            seen[h] = t["id"]
        out += [f"{t['id']}: {r}" for r in t.get("repeats", []) if "plan like this" in r]
    return out[-5:]


def _start_guard(guard, prepare: list[str]) -> None:
    """Start a guard's workers, then measure the baselines of the problems named."""
    guard.warm_up()
    for name in prepare:
        t0 = time.monotonic()
        try:
            guard.prepare(name)
        except Exception as exc:  # noqa: BLE001 - the first candidate will measure them instead
            log.warning("baselines of %s on %s not prepared: %s", name, guard.device.key, exc)
            continue
        log.info("baselines of %s on %s ready after %.1f s", name, guard.device.key, time.monotonic() - t0)
