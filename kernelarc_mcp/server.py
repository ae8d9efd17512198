"""The MCP server: a thin layer of tools, resources and prompts over ``Service``.

Identity comes from the transport, never from tool arguments: over HTTP from the bearer
token (``kernelarc token create NAME``), over stdio from ``--agent`` or
``$KERNELARC_AGENT``. Blocking work (an evaluation) runs off the event loop, so the server
keeps answering other clients while the guard works.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Annotated, Any, Literal

import anyio
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

import playbooks
from guard.archive.tokens import TokenStore

from . import compact as C
from . import views as V
from .service import Service, ServiceError

log = logging.getLogger(__name__)
READ_ONLY = ToolAnnotations(read_only_hint=True)
Detail = C.Detail
Language = Literal["pytorch", "triton", "cuda_cpp", "cute_dsl", "cutile", "tilelang"]
VERDICT_DETAIL = (
    "brief (default): decision, reason, advice, per-workload latency, speedups and SOL; full: the "
    "whole verdict (timing internals, device, phases, paired medians)"
)
INSTRUCTIONS = """\
KernelArc judges GPU kernels. Read a problem (get_problem), write a kernel, submit it
(submit_candidate; if it answers with a job_id, call get_result), read the verdict and its
advice. Use recall before you start and after a setback: verified conclusions of all
agents, methods ranked for your measured bottleneck, and your own history. record what you
learned, citing the candidate_id that shows it. peek_best shows the leaders' code."""


class _Tokens(TokenVerifier):
    """Bearer token -> agent, remembered for a few seconds (a revoked token stops working
    within TTL_S)."""

    TTL_S = 10.0

    def __init__(self, store: TokenStore):
        self.store = store
        self._seen: dict[str, tuple[float, str | None]] = {}

    async def verify_token(self, token: str) -> AccessToken | None:
        now = time.monotonic()
        hit = self._seen.get(token)
        if hit is not None and now - hit[0] < self.TTL_S:
            agent = hit[1]
        else:
            agent = await anyio.to_thread.run_sync(self.store.agent_for, token)
            if len(self._seen) > 10_000:
                self._seen.clear()
            self._seen[token] = (now, agent)
        return AccessToken(token=token, client_id=agent, scopes=["agent"]) if agent else None


def build_server(
    service: Service, *, http_auth: bool, stdio_agent: str | None = None, host: str = "127.0.0.1", port: int = 8765
) -> MCPServer:
    kwargs: dict[str, Any] = {}
    if http_auth:
        kwargs["token_verifier"] = _Tokens(TokenStore(service.db))
        kwargs["auth"] = AuthSettings(issuer_url=f"http://{host}:{port}", resource_server_url=None)
    from . import __version__

    mcp = MCPServer("kernelarc", instructions=INSTRUCTIONS, version=__version__, **kwargs)

    def agent() -> str:
        tok = get_access_token()
        if tok is not None and tok.client_id:
            return tok.client_id
        if stdio_agent:
            return stdio_agent
        raise ToolError("no agent identity: connect with a bearer token (kernelarc token create NAME)")

    async def call(fn, *args):
        """Run a service call off the event loop; service errors become tool errors."""
        try:
            return await anyio.to_thread.run_sync(fn, *args)
        except ServiceError as exc:
            raise ToolError(str(exc)) from None

    # -- tools ---------------------------------------------------------------------------
    # Each tool answers through compact.result: one copy of the data (structuredContent,
    # which Claude Code and Codex hand to the model), rounded, internals behind detail="full".
    @mcp.tool(annotations=READ_ONLY)
    async def list_problems(ctx: Context) -> Annotated[CallToolResult, V.ProblemList]:
        """List the problems this server judges: name, op family, number of workloads, dtypes,
        and the seed kernels shipped with each."""
        view = await call(service.list_problems)
        return C.result(view, f"{len(view.problems)} problems, judged on {view.device}", protocol=ctx.protocol_version)

    @mcp.tool(annotations=READ_ONLY)
    async def get_problem(
        problem: Annotated[str, Field(max_length=128, description="problem name")],
        ctx: Context,
        detail: Annotated[
            Detail, Field(description="brief (default): the seed kernels by name; full: also their source")
        ] = "brief",
    ) -> Annotated[CallToolResult, V.ProblemView]:
        """Everything needed to write a candidate for one problem: the reference code (your
        run(...) must take the same inputs in the same order and return the same outputs),
        input/output shapes and dtypes, tolerances, the visible workloads with their baseline
        and speed-of-light times (once measured), the seed kernels' names (their source with
        detail="full"), and the candidate contract (what is allowed)."""
        view = await call(service.get_problem, problem)
        view = view.model_copy(update={"seed_files": list(view.seed_kernels)})
        full = detail == "full"
        include = None if full else set(V.ProblemView.model_fields) - {"seed_kernels"}
        seeds = ", ".join(view.seed_files) or "none"
        summary = (
            f"{view.name} ({view.op_family}): {len(view.workloads)} visible workloads, "
            f"{view.heldout_workloads} held out; seed kernels: {seeds}"
            + ("" if full or not view.seed_files else " (source with detail='full')")
        )
        return C.result(view, summary, include=include, protocol=ctx.protocol_version)

    @mcp.tool()
    async def submit_candidate(
        problem: Annotated[str, Field(max_length=128, description="problem name")],
        ctx: Context,
        source: Annotated[
            str | None, Field(max_length=300_000, description="kernel source: Python defining run(...), or CUDA C++")
        ] = None,
        solution: Annotated[
            dict[str, Any] | None, Field(description="a SOL-ExecBench solution.json object, instead of source")
        ] = None,
        language: Annotated[Language | None, Field(description="guessed from source if omitted")] = None,
        notes: Annotated[
            str | None, Field(max_length=2000, description="what this candidate tries; kept with it")
        ] = None,
        parent: Annotated[str | None, Field(max_length=40, description="candidate_id this one derives from")] = None,
        wait_s: Annotated[
            float,
            Field(
                ge=0,
                le=600,
                description="seconds to wait for the verdict (capped at the server's limit, 40 s by default)",
            ),
        ] = 40.0,
        detail: Annotated[Detail, Field(description=VERDICT_DETAIL)] = "brief",
    ) -> Annotated[CallToolResult, V.SubmitResult]:
        """Submit a kernel for judgement. Waits up to wait_s (at most the server's limit)
        while reporting progress, then returns the verdict, or a job_id to pass to
        get_result. The verdict says ACCEPT / KEEP / REVERT / REJECT with the reason, the
        per-workload times and scores, and advice: continue, redraft or stop."""
        me = agent()
        job_id = await call(service.submit, me, problem, source, solution, language, notes, parent)
        return _answer(await _wait(ctx, me, job_id, wait_s), detail, ctx)

    @mcp.tool()
    async def get_result(
        job_id: Annotated[str, Field(max_length=40, description="the job_id returned by submit_candidate")],
        ctx: Context,
        wait_s: Annotated[
            float, Field(ge=0, le=600, description="seconds to wait (capped at the server's limit)")
        ] = 40.0,
        detail: Annotated[Detail, Field(description=VERDICT_DETAIL)] = "brief",
    ) -> Annotated[CallToolResult, V.SubmitResult]:
        """Keep waiting for a submission's verdict (same answer as submit_candidate); with
        detail="full", the whole verdict of a finished job (timing internals included)."""
        return _answer(await _wait(ctx, agent(), job_id, wait_s), detail, ctx)

    def _answer(res: V.SubmitResult, detail: str, ctx: Context) -> CallToolResult:
        v = res.verdict
        if v is not None:
            summary = f"{res.message} | candidate {v.candidate_id}, advice: {v.advice.action}"
        else:
            summary = f"{res.message} | job_id {res.job_id}"
        include = None
        if detail != "full":
            include = C.SUBMIT_BRIEF
            if v is not None:  # the message repeats the verdict's decision, status and reason
                res = res.model_copy(update={"message": ""})
        return C.result(res, summary, include=include, protocol=ctx.protocol_version)

    async def _wait(ctx: Context, me: str, job_id: str, wait_s: float) -> V.SubmitResult:
        deadline = time.monotonic() + min(wait_s, service.max_wait_s)
        step = 0
        while True:
            slice_s = max(0.0, min(2.0, deadline - time.monotonic()))
            res = await call(service.result, me, job_id, slice_s)
            if res.state not in ("queued", "running") or time.monotonic() >= deadline:
                return res
            step += 1
            p = res.progress
            msg = f"{p.get('phase', res.state)}: {p.get('detail', res.message)}" if p else res.message
            await ctx.report_progress(step, None, msg[:200])

    @mcp.tool(annotations=READ_ONLY)
    async def recall(
        problem: Annotated[str, Field(max_length=128)],
        ctx: Context,
        query: Annotated[str, Field(max_length=2000, description="what you want to know, in words")] = "",
        scope: Annotated[
            Literal["problem", "family", "any"], Field(description="this problem, its op family, or all problems")
        ] = "problem",
        k: Annotated[int, Field(ge=1, le=50, description="how many conclusions")] = 8,
        detail: Annotated[
            Detail,
            Field(
                description=f"brief (default): each method's rationale, your last "
                f"{C.TRAJECTORY_BRIEF} submissions; full: also how to apply "
                f"each method (Triton, CUDA) and its pitfalls, and every "
                f"submission"
            ),
        ] = "brief",
    ) -> Annotated[CallToolResult, V.RecallResult]:
        """What is known: verified conclusions of all agents (each tied to an evaluated
        candidate), optimization methods ranked for your measured bottleneck by a
        deterministic policy (with the rules that chose them), and your own submissions on
        this problem (with warnings when you repeat yourself)."""
        res = await call(service.recall, agent(), problem, query, scope, k)
        include = None
        if detail != "full":
            traj = res.trajectory[-C.TRAJECTORY_BRIEF :]
            traj = [
                t
                if not t.notes or len(t.notes) <= C.NOTES_BRIEF
                else t.model_copy(update={"notes": t.notes[: C.NOTES_BRIEF - 1] + "…"})
                for t in traj
            ]
            res = res.model_copy(update={"trajectory": traj, "trajectory_omitted": len(res.trajectory) - len(traj)})
            include = {**dict.fromkeys(V.RecallResult.model_fields, True), "methods": {"__all__": C.METHOD_BRIEF}}
        top = res.methods[0].id if res.methods else "none"
        summary = (
            f"{len(res.conclusions)} conclusions, {len(res.methods)} methods (first: {top}), "
            f"{len(res.trajectory) + res.trajectory_omitted} of your submissions, {len(res.warnings)} warnings"
        )
        return C.result(res, summary, include=include, protocol=ctx.protocol_version)

    @mcp.tool()
    async def record(
        problem: Annotated[str, Field(max_length=128)],
        text: Annotated[str, Field(max_length=1000, description="one short, specific statement")],
        kind: Annotated[
            Literal["insight", "pitfall"], Field(description="insight (what worked) or pitfall (what to avoid)")
        ],
        evidence: Annotated[
            str, Field(max_length=40, description="candidate_id of one of your own judged submissions that shows it")
        ],
        ctx: Context,
        tags: Annotated[list[str] | None, Field(max_length=10)] = None,
    ) -> Annotated[CallToolResult, V.RecordResult]:
        """Share a verified conclusion with the other agents. Refused unless the evidence is
        one of your own candidates the guard has judged on this problem; a near-identical
        conclusion of yours strengthens it instead of adding another."""
        res = await call(service.record, agent(), problem, text, kind, evidence, tags)
        return C.result(
            res, f"{res.message}: conclusion {res.id}, support {res.support}", protocol=ctx.protocol_version
        )

    @mcp.tool(annotations=READ_ONLY)
    async def peek_best(
        problem: Annotated[str, Field(max_length=128)],
        ctx: Context,
        k: Annotated[int, Field(ge=1, le=20, description="how many agents' bests")] = 3,
        detail: Annotated[
            Detail,
            Field(
                description="brief (default): the global best with its source and "
                "per-workload figures, the other agents' bests in figures; "
                "full: their source and workloads too"
            ),
        ] = "brief",
    ) -> Annotated[CallToolResult, V.PeekResult]:
        """Read-only leaderboard: the global best (with its source code and per-workload
        figures) and each agent's best on a problem."""
        res = await call(service.peek_best, problem, k)
        include = None
        if detail != "full":
            entry = set(V.BestEntry.model_fields) - {"source", "workloads"}
            include = {"problem": True, "candidates": True, "global_best": True, "agents": {"__all__": entry}}
        gb = res.global_best
        score = C.sig(gb.score, 3) if gb and gb.score is not None else "-"
        lead = f"global best {gb.candidate_id} by {gb.agent} (score {score})" if gb else "no correct candidate yet"
        summary = f"{lead}; {len(res.agents)} agents shown, {res.candidates} candidates"
        return C.result(res, summary, include=include, protocol=ctx.protocol_version)

    @mcp.tool(annotations=READ_ONLY)
    async def status(
        ctx: Context,
        detail: Annotated[
            Detail, Field(description="brief (default): the device by name; full: each device's measured ceilings")
        ] = "brief",
    ) -> Annotated[CallToolResult, V.StatusView]:
        """Who you are to this server, the device, the evaluation queue, every agent's
        attempts, best and latest advice, and the budgets in force."""
        res = await call(service.status, agent())
        if detail != "full":
            d = res.device
            brief = {k: d[k] for k in ("kind", "name", "group", "isolation") if d.get(k) is not None}
            res = res.model_copy(update={"device": {**brief, "device_count": len(d.get("devices") or [d])}})
        summary = (
            f"you are {res.you}; {res.device.get('kind')}: {res.device.get('name')}; "
            f"{res.queue} evaluations queued; {len(res.agents)} agent/problem entries"
        )
        return C.result(res, summary, protocol=ctx.protocol_version)

    # -- resources -------------------------------------------------------------------------
    @mcp.resource("kernelarc://problems", mime_type="application/json")
    def problems_resource() -> str:
        """The problem list."""
        return service.list_problems().model_dump_json()

    @mcp.resource("kernelarc://problem/{name}", mime_type="application/json")
    def problem_resource(name: str) -> str:
        """One problem, as get_problem returns it."""
        try:
            return service.get_problem(name).model_dump_json()
        except ServiceError as exc:
            raise ValueError(str(exc)) from None

    @mcp.resource("kernelarc://playbook", mime_type="application/json")
    def playbook_resource() -> str:
        """All optimization methods of the playbook."""
        from memory.playbook import load_methods

        return json.dumps([m.model_dump() for m in load_methods()])

    @mcp.resource("kernelarc://playbook/{method_id}", mime_type="application/json")
    def method_resource(method_id: str) -> str:
        """One optimization method."""
        from memory.playbook import load_methods

        for m in load_methods():
            if m.id == method_id:
                return m.model_dump_json()
        raise ValueError(f"no method {method_id!r}")

    # -- prompts: the swarm strategies ------------------------------------------------------
    for name, template in playbooks.strategies().items():
        _add_strategy_prompt(mcp, name, template)
    return mcp


def _add_strategy_prompt(mcp: MCPServer, name: str, template: str) -> None:
    title = template.splitlines()[0].lstrip("# ").strip()

    @mcp.prompt(name=f"strategy_{name}", description=f"Swarm strategy: {title}")
    def prompt(problem: str) -> str:
        return template.replace("{problem}", problem)
