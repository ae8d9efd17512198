"""The launcher's supervisor: prepares a run, starts the server (unless one is given) and
the agents, watches them, enforces the budgets, restarts a plateaued or stalled agent, and
stops everything on STOP, at the budget, or on Ctrl-C, leaving no process behind."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import playbooks
from guard.archive.db import Database
from guard.archive.tokens import TokenStore, check_agent_name
from guard.workspace import Workspace

from . import confine
from .clients import AgentContext, get_client
from .limits import AgentLimits, Limited
from .repo import clone_for_agent, create_repo
from .run import AgentSpec, RunConfig, RunFolder, new_run_id

log = logging.getLogger(__name__)
POLL_S = 2.0
# after the agents stop, how long queued submissions may still be judged
GRACE_MIN_S = 30.0
GRACE_MAX_S = 120.0
MAX_RESTARTS = 3
# an agent that has submitted its last allowed candidate keeps running this long, to read its
# verdict and record what it learned, before it is stopped
WRAP_UP_S = 90.0

REDRAFT_PROMPT = """\
The guard advised a redraft: {message}
What you tried recently:
{tried}
Change the design, not its parameters: another algorithm, another DSL (Triton, CUDA C++,
library dispatch) or another data layout. Use recall and peek_best, then continue."""

START_PROMPT = """\
Optimize the GPU kernel for the problem {problem} with the KernelArc tools. Read GUIDE.md
and BRIEF.md in this folder, call get_problem and recall, then write, submit and improve
kernels until the guard advises you to stop. Your strategy is in your instructions."""


@dataclass
class AgentRun:
    spec: AgentSpec
    ctx: AgentContext
    proc: subprocess.Popen | None = None
    limited: Limited | None = None  # its limits' cgroup, while it runs
    state: str = "starting"  # running, restarting, wrapping (at its candidate cap), done, stopped, failed
    wrap_up_until: float | None = None  # monotonic deadline once at its candidate cap
    restarts: int = 0
    attempts: int = 0
    last_attempt_at: float = field(default_factory=time.time)
    redrafted_at_attempt: int = 0
    last_decision: str | None = None
    advice: str | None = None
    best_score: float | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assign_strategies(n: int, named: list[str] | None) -> list[str]:
    available = list(playbooks.strategies())
    if named:
        unknown = [s for s in named if s not in available]
        if unknown:
            raise ValueError(f"unknown strategies {unknown}; available: {', '.join(available)}")
        pool = named
    else:
        pool = available
    return [pool[i % len(pool)] for i in range(n)]


class Swarm:
    def __init__(
        self,
        workspace: Workspace,
        problem: str,
        agents: int,
        client: str,
        strategies: list[str] | None = None,
        model: str | None = None,
        budget_minutes: float = 30.0,
        max_candidates: int | None = None,
        device: str = "auto",
        devices: str = "1",
        server_url: str | None = None,
        agent_env: dict[str, str] | None = None,
        on_update: Callable[..., None] | None = None,
        stall_minutes: float = 10.0,
        agent_limits: AgentLimits | None = None,
    ):
        if agents < 1:
            raise ValueError("--agents must be at least 1")
        workspace.problems().get(problem)  # a clear error for an unknown problem, before anything starts
        get_client(client)
        self.ws = workspace
        run_id = new_run_id(problem)
        short = run_id.rsplit("-", 1)[-1]
        names = [check_agent_name(f"{s}-{short}-{i + 1}") for i, s in enumerate(assign_strategies(agents, strategies))]
        self.config = RunConfig(
            run_id=run_id,
            problem=problem,
            client=client,
            budget_minutes=budget_minutes,
            max_candidates=max_candidates,
            device=device,
            devices=str(devices),
            server_url=server_url,
            stall_minutes=stall_minutes,
            agent_limits=agent_limits or AgentLimits(),
            agents=[AgentSpec(name=n, strategy=n.rsplit("-", 2)[0], client=client, model=model) for n in names],
        )
        self.folder = RunFolder(workspace.root, run_id)
        self.agent_env = agent_env or {}
        self.on_update = on_update
        self.runs: list[AgentRun] = []
        self.server: subprocess.Popen | None = None
        self.db = Database(workspace.db_path)
        self._stopping = False

    # -- preparation ---------------------------------------------------------------------------
    def prepare(self) -> None:
        problem = self.ws.problems().get(self.config.problem)
        self.folder.save(self.config, state="preparing")
        create_repo(self.folder.repo, problem)
        tokens = TokenStore(self.db)
        strategies = playbooks.strategies()
        for spec in self.config.agents:
            adir = self.folder.agent_dir(spec.name)
            adir.mkdir(parents=True, exist_ok=True)
            # the agent's files are its own: nobody else may reach a program it left there (its
            # HOME and clone are writable, and a set-user-ID file made inside keeps its bit)
            adir.chmod(0o700)
            worktree = adir / "worktree"
            clone_for_agent(self.folder.repo, worktree, spec.name)
            text = strategies[spec.strategy].replace("{problem}", problem.name)
            ctx = AgentContext(
                name=spec.name,
                strategy=spec.strategy,
                strategy_text=text,
                problem=problem.name,
                worktree=worktree,
                folder=adir,
                server_url="",
                token=tokens.create(spec.name, replace=True),
                model=spec.model,
                max_candidates=self.config.max_candidates,
                budget_s=self.config.budget_minutes * 60,
                extra_env=self.agent_env,
            )
            ctx.home.mkdir(parents=True, exist_ok=True)
            (adir / "strategy.md").write_text(text)
            self.runs.append(AgentRun(spec, ctx))

    def start_server(self) -> str:
        if self.config.server_url:
            return self.config.server_url
        port = _free_port()
        logf = open(self.folder.root / "server.log", "ab")
        self.server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kernelarc_mcp.cli",
                "--workspace",
                str(self.ws.root),
                "serve",
                "--transport",
                "http",
                "--port",
                str(port),
                "--device",
                self.config.device,
                "--devices",
                self.config.devices,
                "--prepare",
                self.config.problem,
            ],
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        logf.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError(f"the server exited: {(self.folder.root / 'server.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.1)
        return f"http://127.0.0.1:{port}/mcp"

    # -- agents ---------------------------------------------------------------------------------
    def _start(self, run: AgentRun, prompt: str, resume: str | None = None) -> None:
        client = get_client(run.spec.client)
        launch = client.command(run.ctx, prompt, resume)
        argv = launch.argv
        confinement = confine.probe()
        if confinement.binary is not None:  # its clone and its HOME; its log and command out of reach
            argv = confine.command(confinement.binary, argv, self.ws.root, [run.ctx.worktree, run.ctx.home])
        env = confine.environment(launch.env) if confinement.binary is not None else launch.env
        limited = Limited(argv, self.config.agent_limits)
        command = {"argv": launch.argv, "cwd": str(launch.cwd), "confinement": confinement.line, "limits": limited.line}
        try:
            (run.ctx.folder / "command.json").write_text(json.dumps(command, indent=2))
            with open(run.ctx.log, "ab") as logf:
                run.proc = subprocess.Popen(
                    limited.argv,
                    cwd=launch.cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except BaseException:
            limited.close()
            raise
        run.limited = limited
        run.state = "running"
        run.last_attempt_at = time.time()

    def _stop(self, run: AgentRun) -> None:
        """End an agent: its process, then whatever is left in its cgroup."""
        self._kill(run.proc)
        if run.limited is not None:
            run.limited.close()
            run.limited = None

    @staticmethod
    def _kill(proc: subprocess.Popen | None, grace: float = 5.0) -> None:
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace)
        except (ProcessLookupError, PermissionError):
            return
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)

    def _refresh(self, run: AgentRun) -> dict | None:
        """Update the agent's figures from the database; returns its newest verdict."""
        # judged candidates only: one still being evaluated counts once it has its verdict
        rows = self.db.query(
            "SELECT COUNT(*) AS n, MAX(created_at) AS last FROM candidates WHERE agent = ? AND problem = ?"
            " AND state = 'done'",
            (run.spec.name, self.config.problem),
        )
        n, last = rows[0]["n"], rows[0]["last"]
        if n != run.attempts and last:
            run.last_attempt_at = max(run.last_attempt_at, last)
        run.attempts = n
        best = self.db.query(
            "SELECT score, speedup_eager FROM candidates WHERE agent = ? AND problem = ? AND decision = 'ACCEPT'"
            " ORDER BY finished_at DESC LIMIT 1",
            (run.spec.name, self.config.problem),
        )
        if best:
            run.best_score = best[0]["score"] if best[0]["score"] is not None else best[0]["speedup_eager"]
        newest = self.db.query(
            "SELECT verdict_json FROM candidates WHERE agent = ? AND problem = ? AND state = 'done'"
            " ORDER BY finished_at DESC LIMIT 1",
            (run.spec.name, self.config.problem),
        )
        if not newest or not newest[0]["verdict_json"]:
            return None
        v = json.loads(newest[0]["verdict_json"])
        run.last_decision = f"{v['decision']} {v['status']}"
        run.advice = v["advice"]["action"]
        return v

    def _watched(self, run: AgentRun, deadline: float) -> str | None:
        """``_step``, where a failure to watch or restart one agent (what it wrote, read back,
        was not what the launcher expected) ends that agent, not the swarm (a red team's
        agent once stopped every agent and the server this way)."""
        try:
            return self._step(run, deadline)
        except (ValueError, TypeError, KeyError, OSError):  # what reading back its files can raise
            log.exception("%s: stopped, the launcher could not watch or restart it", run.spec.name)
            self._stop(run)
            run.state = "failed"
            return None

    def _step(self, run: AgentRun, deadline: float) -> str | None:
        """Watch one agent; returns a reason to stop the whole swarm, if any."""
        if run.state in ("done", "stopped", "failed"):
            return None
        verdict = self._refresh(run)
        client = get_client(run.spec.client)
        if verdict is not None and verdict["advice"]["action"] == "stop":
            self._stop(run)
            run.state = "done"
            if "speed of light" in verdict["advice"]["message"]:
                return f"{run.spec.name} reached the target fraction of speed of light"
            return None
        if self.config.max_candidates and run.attempts >= self.config.max_candidates:
            # Stopped at once, an agent lost what it had learned: the call that submitted its
            # last candidate was still waiting for the verdict, and it never recorded a
            # conclusion. It gets a bounded wrap-up (a submission it makes meanwhile is judged
            # like any other), then is stopped if still running.
            if run.wrap_up_until is None:
                run.wrap_up_until = time.monotonic() + WRAP_UP_S
                run.state = "wrapping"
            exited = run.proc is None or run.proc.poll() is not None
            if exited or time.monotonic() > run.wrap_up_until:
                self._stop(run)
                run.state = "done"
            return None
        if (
            verdict is not None
            and verdict["advice"]["action"] == "redraft"
            and client.restarts_on_redraft
            and run.attempts >= run.redrafted_at_attempt + 5
        ):
            run.redrafted_at_attempt = run.attempts
            tried = "\n".join(f"- {t}" for t in verdict["advice"].get("tried", [])) or "- (see recall)"
            resume = client.session_id(run.ctx)
            self._stop(run)
            run.restarts += 1
            self._start(run, REDRAFT_PROMPT.format(message=verdict["advice"]["message"], tried=tried), resume)
            return None
        exited = run.proc is not None and run.proc.poll() is not None
        stalled = time.time() - run.last_attempt_at > self.config.stall_minutes * 60
        if exited or stalled:
            if not client.restarts_on_redraft:  # the scripted agent ends on its own terms
                if not exited:  # stalled
                    self._stop(run)
                    run.state = "failed"
                else:
                    run.state = "done" if run.proc.returncode == 0 else "failed"
                    self._stop(run)  # what it left running in its cgroup ends with it
                return None
            if run.restarts >= MAX_RESTARTS or time.monotonic() > deadline:
                self._stop(run)
                run.state = "stopped"
                return None
            self._stop(run)
            run.restarts += 1
            why = "stalled" if stalled and not exited else "ended early"
            log.info("%s %s; restarting", run.spec.name, why)
            self._start(
                run, f"You {why}. Continue: call recall and status, then keep optimizing.", client.session_id(run.ctx)
            )
        return None

    # -- the whole run ---------------------------------------------------------------------------
    def run(self) -> Path:
        self.prepare()
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        reason = "all agents finished"

        def interrupt(signum, frame):
            raise KeyboardInterrupt

        # SIGINT too: a shell starting the launcher in the background sets it to "ignore",
        # and `kill -INT` must still end the swarm cleanly
        signal.signal(signal.SIGTERM, interrupt)
        signal.signal(signal.SIGINT, interrupt)
        try:
            url = self.start_server()
            self.folder.save(
                self.config, state="running", server_url=url, server_pid=self.server.pid if self.server else None
            )
            confinement = confine.probe()
            (log.info if confinement.binary is not None else log.warning)("%s", confinement.line)
            for run in self.runs:
                run.ctx.server_url = url
                get_client(run.spec.client).prepare(run.ctx)
                self._start(run, START_PROMPT.format(problem=self.config.problem))
            deadline = time.monotonic() + self.config.budget_minutes * 60
            while True:
                if self.on_update:
                    self.on_update(self.runs)
                if self.folder.stop_file.exists():
                    reason = "stopped by kernelarc stop"
                    break
                if time.monotonic() > deadline:
                    reason = f"time budget of {self.config.budget_minutes} min spent"
                    break
                stop = None
                for run in self.runs:
                    stop = self._watched(run, deadline) or stop
                if stop:
                    reason = stop
                    break
                if all(r.state in ("done", "stopped", "failed") for r in self.runs):
                    break
                time.sleep(POLL_S)
            if self.config.server_url is None:  # our own server: judge what was submitted, then stop
                self._judge_pending()
        except KeyboardInterrupt:
            reason = "interrupted"
        finally:
            self.shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for run in self.runs:
                self._refresh(run)
            if self.on_update:
                self.on_update(self.runs)
            self.folder.save(self.config, state="finished", ended_reason=reason, ended_at=time.time())
        from .report import build_report

        return build_report(self.ws.root, self.config.run_id)

    def _pending_jobs(self) -> int:
        """Jobs of this run's agents still queued or running in the server's queue."""
        names = [r.spec.name for r in self.runs]
        try:
            rows = self.db.query(
                f"SELECT COUNT(*) AS n FROM jobs WHERE state IN ('queued', 'running') "
                f"AND agent IN ({','.join('?' * len(names))})",
                tuple(names),
            )
        except Exception:  # noqa: BLE001 - no jobs table yet: nothing was submitted
            return 0
        return int(rows[0]["n"]) if rows else 0

    def _judge_pending(self) -> None:
        """The agents are done or out of time, but what they submitted may still be queued:
        give the server a bounded grace period to judge it (shown in the live view), so that
        the report holds every verdict and no job of this run is left behind."""
        for run in self.runs:  # no new submissions
            if run.state in ("running", "starting", "restarting", "wrapping"):
                self._stop(run)
                run.state = "stopped"
        grace = min(GRACE_MAX_S, max(GRACE_MIN_S, 0.25 * self.config.budget_minutes * 60))
        end = time.monotonic() + grace
        while (pending := self._pending_jobs()) and time.monotonic() < end:
            if self.on_update:
                self.on_update(
                    self.runs, f"judging {pending} submitted candidate(s), up to {end - time.monotonic():.0f} s more"
                )
            time.sleep(POLL_S)
        if pending:
            log.warning("%d job(s) still unjudged after a grace period of %.0f s", pending, grace)
        for run in self.runs:
            self._refresh(run)

    def shutdown(self) -> None:
        tokens = TokenStore(self.db)
        for run in self.runs:
            self._stop(run)
            if run.state in ("running", "starting", "restarting", "wrapping"):
                run.state = "stopped"
            # its token ends with it: one an agent leaked would have served anyone, later, as it
            tokens.revoke(run.spec.name)
        self._kill(self.server, grace=10)
