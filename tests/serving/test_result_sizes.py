"""What an agent pays for each tool call: the size of every tool's result, the precision of its
numbers, the enums of its inputs.

The budgets were set from measurement (the CPU guard, the fast test settings, rmsnorm with 4
visible workloads, the 12 shipped problems) with about 15-40% headroom; the figures measured
when they were set are in the comments. Before results were compacted the same calls took
13.2 KB (get_problem) and 16.7 KB (one verdict): pretty-printed JSON twice, 17-digit floats,
every timing internal.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from mcp import Client

from kernelarc_mcp import compact as C
from kernelarc_mcp.server import build_server

from helpers import RMS, TEST_MAX_WAIT_S, honest_source

pytestmark = pytest.mark.anyio

KB = 1024
BUDGET = {  # bytes of all content blocks plus structuredContent, as compact JSON
    "list_problems": int(5.5 * KB),  # 4.6 KB: ~0.38 KB per problem
    "get_problem": int(3.5 * KB),  # 3.0 KB, the contract (1.2 KB) included; seeds' source only with detail=full
    "verdict": int(2.5 * KB),  # submit_candidate / get_result: 1.6 KB with 4 workloads (~0.2 KB each)
    "recall": 6 * KB,  # 4.9 KB: 5 methods (~0.8 KB each), 1 conclusion, 3 submissions
    "record": int(0.4 * KB),  # 0.16 KB
    "peek_best": 2 * KB,  # 1.4 KB with a 0.25 KB source
    "status": 1 * KB,  # 0.63 KB
}


def size(r) -> int:
    blocks = [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in r.content]
    return len(
        json.dumps(
            {"content": blocks, "structuredContent": r.structured_content}, separators=(",", ":"), ensure_ascii=False
        ).encode()
    )


def floats(data, key=None):
    if isinstance(data, dict):
        for k, v in data.items():
            yield from floats(v, k)
    elif isinstance(data, list):
        for v in data:
            yield from floats(v, key)
    elif isinstance(data, float):
        yield key, data


def significant(x: float) -> int:
    digits = re.sub(r"e.*$", "", repr(abs(x))).replace(".", "").lstrip("0").rstrip("0")
    return len(digits)


async def test_every_result_within_its_budget(service):
    sizes: dict[str, list[int]] = {}
    async with Client(build_server(service, http_auth=False, stdio_agent="sizer"), mode="legacy") as c:
        schemas = {t.name: t.output_schema for t in (await c.list_tools()).tools}

        async def call(tool, budget, **args):
            r = await c.call_tool(tool, args)
            assert not r.is_error, (tool, r.content)
            # the client validates structuredContent against the output schema (Claude Code does)
            jsonschema.validate(r.structured_content, schemas[tool])
            assert len(r.content) == 1 and len(r.content[0].text) < 300, "the text is a summary, not the data"
            n = size(r)
            sizes.setdefault(budget, []).append(n)
            assert n <= BUDGET[budget], (tool, args.get("detail"), n, BUDGET[budget])
            return r.structured_content

        await call("list_problems", "list_problems")
        view = await call("get_problem", "get_problem", problem=RMS)
        assert "seed_triton.py" in view["seed_files"] and "seed_kernels" not in view
        assert "def run" in view["reference"] and "Not allowed" in view["contract"]
        notes = "fp32 " * 300
        res = await call(
            "submit_candidate", "verdict", problem=RMS, source=honest_source(), notes=notes, wait_s=TEST_MAX_WAIT_S
        )
        v = res["verdict"]
        assert v["decision"] == "ACCEPT" and v["advice"]["action"] and v["workloads"]
        assert "notes" not in v and "timing" not in v["workloads"][0] and "device" not in v
        for key, x in floats(v):
            limit = 4 if key.endswith("_ms") else 2 if key == "rel_se" else 3
            assert significant(x) <= limit, (key, x)
        cid = res["candidate_id"]
        bad = await call("submit_candidate", "verdict", problem=RMS, source="import os\ndef run(x, w):\n    return x\n")
        assert bad["verdict"]["decision"] == "REJECT" and bad["verdict"]["reason"]
        again = await call("get_result", "verdict", job_id=res["job_id"], wait_s=0)
        assert again["verdict"]["candidate_id"] == cid
        await call("record", "record", problem=RMS, text="float32 arithmetic passes", kind="insight", evidence=cid)
        rec = await call("recall", "recall", problem=RMS, query="float32")
        assert rec["methods"] and all("how_triton" not in m and "pitfalls" not in m for m in rec["methods"])
        assert len(rec["trajectory"][0].get("notes", "")) <= C.NOTES_BRIEF
        peek = await call("peek_best", "peek_best", problem=RMS)
        assert "kernel.py" in peek["global_best"]["source"] and all("source" not in a for a in peek["agents"])
        st = await call("status", "status")
        assert st["device"]["kind"] == "cpu" and "ceilings" not in str(st)

        # detail="full": everything, still one copy and rounded
        full = (
            await c.call_tool("get_result", {"job_id": res["job_id"], "wait_s": 0, "detail": "full"})
        ).structured_content
        w = full["verdict"]["workloads"][0]
        assert w["timing"]["median_ms"] == w["latency_ms"] and full["verdict"]["notes"].startswith("fp32")
        assert all(significant(x) <= 4 for _, x in floats(full))
        seeds = (await c.call_tool("get_problem", {"problem": RMS, "detail": "full"})).structured_content
        assert "def run" in seeds["seed_kernels"]["seed_triton.py"]
        rec_full = (await c.call_tool("recall", {"problem": RMS, "detail": "full"})).structured_content
        assert any("how_triton" in m for m in rec_full["methods"])
    print("result sizes (bytes):", sizes)


async def test_enums_in_input_schemas(service):
    async with Client(build_server(service, http_auth=False, stdio_agent="a"), mode="legacy") as c:
        tools = {t.name: t.input_schema for t in (await c.list_tools()).tools}

    def enum(tool, arg):
        schema = tools[tool]["properties"][arg]
        for alt in [schema, *schema.get("anyOf", [])]:
            if "enum" in alt:
                return set(alt["enum"])
        raise AssertionError(f"{tool}.{arg} has no enum: {schema}")

    assert enum("recall", "scope") == {"problem", "family", "any"}
    assert enum("record", "kind") == {"insight", "pitfall"}
    assert enum("submit_candidate", "language") == {"pytorch", "triton", "cuda_cpp", "cute_dsl", "cutile", "tilelang"}
    for tool in ("get_problem", "submit_candidate", "get_result", "recall", "peek_best", "status"):
        assert enum(tool, "detail") == {"brief", "full"}
        assert tools[tool]["properties"]["detail"]["default"] == "brief"


def test_rounding_by_what_a_number_measures():
    data = {
        "latency_ms": 0.11731849963325658,
        "speedup_eager": 1.0985948549656215,
        "rel_se": 0.16804602126585755,
        "score": 0.5262782959097299,
        "n": 10,
        "measured_at": 1796143999.0332668,
        "timing": {
            "median_ms": 0.117318499,
            "device_ops_per_call": 3.3333333,
            "outside_clock": {"run_wall_s": 0.0508347},
        },
        "tolerances": {"output": {"atol": 0.0123456}},
        "incumbent_ms": [1.23456789, 2.3456789],
    }
    assert C.round_numbers(data) == {
        "latency_ms": 0.1173,
        "speedup_eager": 1.1,
        "rel_se": 0.17,
        "score": 0.526,
        "n": 10,
        "measured_at": 1796143999,
        "timing": {"median_ms": 0.1173, "device_ops_per_call": 3.3, "outside_clock": {"run_wall_s": 0.051}},
        "tolerances": {"output": {"atol": 0.0123456}},
        "incumbent_ms": [1.235, 2.346],
    }


def test_legacy_clients_get_the_data_as_text():
    from kernelarc_mcp.views import RecordResult

    rec = RecordResult(id=1, merged=False, support=1, strength=0.123456, message="recorded")
    modern = C.result(rec, "recorded", protocol="2025-11-25")
    assert modern.content[0].text == "recorded" and modern.structured_content["strength"] == 0.123
    old = C.result(rec, "recorded", protocol="2025-03-26")  # before structuredContent existed
    assert json.loads(old.content[0].text) == old.structured_content
