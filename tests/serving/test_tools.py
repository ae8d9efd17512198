"""The tools through the SDK's in-memory client, as a real client would call them."""

from __future__ import annotations

import time

import anyio
import pytest
from mcp import Client

from kernelarc_mcp.server import build_server

from helpers import RMS, TEST_MAX_WAIT_S, honest_source

pytestmark = pytest.mark.anyio


def server_for(service, agent):
    return build_server(service, http_auth=False, stdio_agent=agent)


async def test_tools_have_schemas_and_descriptions(service):
    async with Client(server_for(service, "a"), mode="legacy") as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    assert set(tools) == {
        "list_problems",
        "get_problem",
        "submit_candidate",
        "get_result",
        "recall",
        "record",
        "peek_best",
        "status",
    }
    for t in tools.values():
        assert t.description and len(t.description) > 40
        assert t.output_schema and t.output_schema.get("type") == "object"
    assert "agent" not in str(tools["submit_candidate"].input_schema["properties"])


async def test_get_problem_shows_no_heldout_shape(service):
    from guard.problems.derive import workload_set

    async with Client(server_for(service, "a"), mode="legacy") as c:
        r = await c.call_tool("get_problem", {"problem": RMS})
    view = r.structured_content
    hidden = workload_set(
        service.guard.store.get(RMS), "cpu", service.guard._secret, service.guard.cfg.cpu_workloads
    ).heldout
    assert not r.is_error and hidden and view["heldout_workloads"] == len(hidden)
    assert "seed_triton.py" in view["seed_files"] and "def run" in view["reference"]
    visible_uuids = {w["uuid"] for w in view["workloads"]}
    for w in hidden:
        assert w.uuid not in visible_uuids and w.uuid not in r.content[0].text


async def test_submit_record_recall_peek_status(service):
    progress = []

    async def on_progress(p, total, message):
        progress.append(message)

    async with Client(server_for(service, "alice"), mode="legacy") as c:
        r = await c.call_tool(
            "submit_candidate",
            {"problem": RMS, "source": honest_source(), "notes": "fp32 torch", "wait_s": TEST_MAX_WAIT_S},
            progress_callback=on_progress,
        )
        res = r.structured_content
        assert res["state"] == "done", res
        assert res["verdict"]["decision"] == "ACCEPT" and res["verdict"]["agent"] == "alice"
        cid = res["candidate_id"]
        assert progress, "progress notifications were sent while waiting"

        bad = await c.call_tool("record", {"problem": RMS, "text": "x", "kind": "insight", "evidence": "c-nothing"})
        assert bad.is_error and "not a candidate" in bad.content[0].text
        ok = await c.call_tool(
            "record",
            {
                "problem": RMS,
                "text": "computing in float32 passes the adversarial rounds",
                "kind": "insight",
                "evidence": cid,
                "tags": ["precision"],
            },
        )
        assert not ok.is_error and ok.structured_content["merged"] is False
        again = await c.call_tool(
            "record",
            {
                "problem": RMS,
                "kind": "insight",
                "evidence": cid,
                "text": "computing in float32 passes the adversarial rounds!",
            },
        )
        # the same candidate cited again: merged, and no more support than it gave the first time
        assert again.structured_content["merged"] is True and again.structured_content["support"] == 1

        rec = (await c.call_tool("recall", {"problem": RMS, "query": "float32 adversarial"})).structured_content
        assert rec["conclusions"][0]["evidence"] == cid
        assert rec["trajectory"][-1]["candidate_id"] == cid
        # the bound of most workloads at speed of light, whichever this machine's ceilings make it
        # (a CPU's slow bf16 matmul rate makes RMSNorm compute-bound on some machines)
        bounds = [w["bound"] for w in res["verdict"]["workloads"] if w.get("bound")]
        assert f"{max(set(bounds), key=bounds.count)}_bound" in rec["signals"], (bounds, rec["signals"])

        peek = (await c.call_tool("peek_best", {"problem": RMS})).structured_content
        assert peek["global_best"]["candidate_id"] == cid and "kernel.py" in peek["global_best"]["source"]

        st = (await c.call_tool("status", {})).structured_content
        assert st["you"] == "alice" and any(a["agent"] == "alice" for a in st["agents"])


async def test_one_agent_cannot_read_anothers_job(service):
    job = service.submit("bob", RMS, honest_source())
    async with Client(server_for(service, "mallory"), mode="legacy") as c:
        r = await c.call_tool("get_result", {"job_id": job, "wait_s": 0})
    assert r.is_error and "another agent" in r.content[0].text
    assert service.result("bob", job, TEST_MAX_WAIT_S).state == "done"


async def test_bounded_wait_returns_a_job_id_then_get_result(service):
    before, service.max_wait_s = service.max_wait_s, 1.0
    try:
        async with Client(server_for(service, "carol"), mode="legacy") as c:
            r = await c.call_tool("submit_candidate", {"problem": RMS, "source": honest_source(), "wait_s": 1})
            res = r.structured_content
            assert res["state"] in ("queued", "running", "done")
            deadline = time.monotonic() + TEST_MAX_WAIT_S
            while res["state"] != "done" and time.monotonic() < deadline:
                res = (await c.call_tool("get_result", {"job_id": res["job_id"], "wait_s": 1})).structured_content
            assert res["state"] == "done", res
    finally:
        service.max_wait_s = before


async def test_server_answers_while_the_guard_works(service):
    """An evaluation runs off the event loop: other calls are answered meanwhile."""
    async with Client(server_for(service, "dave"), mode="legacy") as c:
        async with anyio.create_task_group() as tg:
            done = {}

            order = []

            async def submit():
                args = {"problem": RMS, "source": honest_source(), "wait_s": TEST_MAX_WAIT_S}
                r = await c.call_tool("submit_candidate", args)
                done["submit"] = r.structured_content["state"]
                order.append("submit")

            tg.start_soon(submit)
            # once the evaluation runs (not merely queued), another call is answered before it ends:
            # an order, not a time, so a loaded machine cannot decide it
            deadline = time.monotonic() + 120
            while not service.guard._lock.locked():
                assert time.monotonic() < deadline and not order, "the evaluation never started"
                await anyio.sleep(0.05)
            r = await c.call_tool("list_problems", {})
            order.append("list")
        assert not r.is_error and done["submit"] == "done"
        assert order == ["list", "submit"], order


async def test_resources_and_prompts(service):
    async with Client(server_for(service, "a"), mode="legacy") as c:
        prompts = {p.name for p in (await c.list_prompts()).prompts}
        assert {
            "strategy_tiling_autotune",
            "strategy_memory_fusion",
            "strategy_library_precision",
            "strategy_algorithm_redraft",
            "strategy_profile_micro",
        } <= prompts
        p = await c.get_prompt("strategy_memory_fusion", {"problem": RMS})
        assert RMS in p.messages[0].content.text
        res = await c.read_resource(f"kernelarc://problem/{RMS}")
        assert RMS in res.contents[0].text
        templates = {t.uri_template for t in (await c.list_resource_templates()).resource_templates}
        assert "kernelarc://playbook/{method_id}" in templates
