"""1000+ malformed tool calls: each gets a clear error, the server survives, nothing is lost."""

from __future__ import annotations

import random
import sqlite3

import pytest
from mcp import Client

from kernelarc_mcp.server import build_server

from helpers import RMS

pytestmark = pytest.mark.anyio

NAMES = [
    "",
    "..",
    "../../etc/passwd",
    "/etc/passwd",
    "a/../b",
    "rmsnorm\x00",
    "x" * 5000,
    "ü" * 50,
    "no_such_problem",
    "rmsnorm_llama3_8b/../../secret.key",
    ".kernelarc",
    " ",
    "\n",
]
JUNK = [None, 1, -1, 3.5, float("nan"), True, [], {}, [1, 2], {"a": 1}, "x" * 400_000, "\x00\x01\x02"]
BAD_SOURCES = [
    "",
    "def run(:",
    "\x00\x01binary",
    "import os\ndef run(x, w):\n    return os.environ\n",
    "def run(hidden_states, weight)\n  pass",
    "try:\n    pass\nexcept:\n    pass\n",
    "x" * 300_001,
    "import threading\n",
    "class T(torch.Tensor): pass\n",
    "exec('1')\n",
]
BAD_SOLUTIONS = [
    {},
    {"spec": {}},
    {"spec": {"languages": ["pytorch"], "entry_point": "main.py::run"}, "sources": []},
    {
        "spec": {"languages": ["pytorch"], "entry_point": "../x.py::run"},
        "sources": [{"path": "../x.py", "content": "def run(): pass"}],
    },
    {"spec": {"languages": ["fortran"], "entry_point": "a.f::run"}, "sources": [{"path": "a.f", "content": "x"}]},
    {"spec": {"languages": ["pytorch"], "entry_point": "main.py"}, "sources": [{"path": "main.py", "content": "x"}]},
]


def malformed_calls(rng: random.Random, n: int):
    tools = [
        "list_problems",
        "get_problem",
        "submit_candidate",
        "get_result",
        "recall",
        "record",
        "peek_best",
        "status",
        "no_such_tool",
        "../../tool",
        "",
    ]
    for i in range(n):
        tool = rng.choice(tools)
        args: dict = {}
        if tool == "get_problem":
            args = rng.choice([{}, {"problem": rng.choice(NAMES + JUNK)}, {"problem": RMS, "extra": rng.choice(JUNK)}])
        elif tool == "submit_candidate":
            kind = rng.randrange(5)
            if kind == 0:
                args = {"problem": rng.choice(NAMES + JUNK), "source": "def run(x):\n    return x\n"}
            elif kind == 1:
                args = {"problem": RMS, "source": rng.choice(BAD_SOURCES + JUNK), "wait_s": 0}
            elif kind == 2:
                args = {"problem": RMS, "solution": rng.choice(BAD_SOLUTIONS + JUNK), "wait_s": 0}
            elif kind == 3:
                args = {"problem": RMS}  # neither source nor solution
            else:
                args = {
                    "problem": RMS,
                    "source": "def run(:",
                    "wait_s": rng.choice([-1, 1e9, float("inf"), "x"]),
                    "parent": rng.choice(["c-nope", "../../x", 5]),
                }
        elif tool == "get_result":
            args = rng.choice(
                [
                    {},
                    {"job_id": rng.choice(NAMES + JUNK + ["j-nonexistent", "j-" + "a" * 50])},
                    {"job_id": "j-123", "wait_s": rng.choice(JUNK)},
                ]
            )
        elif tool == "recall":
            args = rng.choice(
                [
                    {"problem": rng.choice(NAMES + JUNK)},
                    {"problem": RMS, "scope": rng.choice(NAMES + JUNK)},
                    {"problem": RMS, "k": rng.choice([0, -5, 10**9, "x", 2.5])},
                    {"problem": RMS, "query": rng.choice(JUNK + ['"unbalanced', "NEAR(a b)", "*", "a OR"])},
                ]
            )
        elif tool == "record":
            args = {
                "problem": rng.choice([RMS] + NAMES),
                "text": rng.choice(["", "x" * 5000, "fine", 7]),
                "kind": rng.choice(["insight", "pitfall", "rumor", None]),
                "evidence": rng.choice(["c-nope", "", "../../x", None, "' OR 1=1 --"]),
                "tags": rng.choice([None, ["a"] * 50, "notalist", [1, 2]]),
            }
        elif tool == "peek_best":
            args = {"problem": rng.choice(NAMES + JUNK + [RMS]), "k": rng.choice([0, -1, 10**6, "k", 1])}
        elif tool in ("list_problems", "status"):
            args = rng.choice([{"unexpected": rng.choice(JUNK)}, {"x" * 300: 1}])
        yield i, tool, args


async def test_fuzz_1000_malformed_calls(service):
    rng = random.Random(1234)
    mcp = build_server(service, http_auth=False, stdio_agent="fuzzer")
    before_jobs = service.jobs.pending()
    errors = answered = 0
    async with Client(mcp, mode="legacy") as c:
        for _, tool, args in malformed_calls(rng, 1100):
            try:
                r = await c.call_tool(tool, args)
            except Exception as exc:  # a protocol-level error is still an answer, never a crash
                text = str(exc)
                assert text, (tool, args)
                errors += 1
                continue
            if r.is_error:
                text = r.content[0].text if r.content else ""
                # an error with no explanation means an exception escaped a tool
                assert text.strip() and text.strip() != f"Error executing tool {tool}", (tool, str(args)[:200], text)
                errors += 1
            else:  # accepted (a submission that the screen will reject, or ignorable extra arguments)
                assert r.structured_content is not None, (tool, args)
                answered += 1
        assert errors + answered == 1100 and errors > 700, (errors, answered)
        # still serving, and correctly
        r = await c.call_tool("get_problem", {"problem": RMS})
        assert not r.is_error and r.structured_content["name"] == RMS
    # every accepted submission became a job, and every job finishes with a verdict
    import time

    deadline = time.monotonic() + 300
    while service.jobs.pending() > before_jobs and time.monotonic() < deadline:
        time.sleep(0.5)
    jobs = service.db.query("SELECT state, candidate_id, error FROM jobs WHERE agent = 'fuzzer'")
    unfinished = [dict(j) for j in jobs if j["state"] != "done"][:3]
    assert jobs and all(j["state"] == "done" and j["candidate_id"] for j in jobs), unfinished
    for j in jobs:
        row = service.db.candidate(j["candidate_id"])
        assert row["decision"] == "REJECT" and row["gate"] == "screen"
    conn = sqlite3.connect(service.ws.db_path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
