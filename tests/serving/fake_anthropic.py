"""A fake Anthropic Messages API on loopback that scripts an agent's turns, so the real
Claude Code CLI can be driven without a model.

Claude Code sends ``POST /v1/messages?beta=true`` with ``stream: true`` once per turn and
names MCP tools ``mcp__<server>__<tool>`` (a step naming a capitalised tool, ``Read``, calls
that built-in tool instead). This fake answers each turn with the next
scripted tool call (as a ``tool_use`` block, streamed as server-sent events), and with a
short final text once the script is done. A step may be a function of the tool results
seen so far, so a later call can use an id an earlier one returned. Instead of a list, the
script may be a plan: a function of the tool results so far that gives the next call, or
None to end, for an agent that must poll until something is done.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Call = tuple[str, dict]
Step = Call | Callable[[list[Any]], Call]
Plan = Callable[[list[Any]], Call | None]


def _sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _tool_results(messages: list[dict]) -> list[Any]:
    """Results of the tool calls so far, parsed as JSON where they are JSON."""
    out = []
    for m in messages:
        if m.get("role") != "user" or not isinstance(m.get("content"), list):
            continue
        for block in m["content"]:
            if block.get("type") == "tool_result":
                content = block.get("content")
                if isinstance(content, list):
                    content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
                try:
                    out.append(json.loads(content))
                except (TypeError, ValueError):
                    out.append(content)
    return out


class FakeAnthropic:
    def __init__(self, script: list[Step] | Plan, server_name: str = "kernelarc"):
        self.plan: Plan = script if callable(script) else _plan_of(script)
        self.server_name = server_name
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self.send_response(200)
                self.end_headers()

            def do_GET(self):
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                if self.path.startswith("/v1/messages/count_tokens"):
                    self._json({"input_tokens": 100})
                    return
                with fake.lock:
                    fake.requests.append(body)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(fake.answer(body))
                self.wfile.flush()

            def _json(self, obj):
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeAnthropic:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()

    # -- one turn ---------------------------------------------------------------------------
    def answer(self, body: dict) -> bytes:
        results = _tool_results(body.get("messages", []))
        n = len(results)
        model = body.get("model", "claude")
        start = {
            "type": "message_start",
            "message": {
                "id": f"msg_{n}",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 1},
            },
        }
        out = [_sse("message_start", start)]
        call = self.plan(results)
        if call is not None:
            tool, args = call
            block = {
                "type": "tool_use",
                "id": f"toolu_{n:03d}",
                # a built-in tool (Read, Grep...) by its own name, one of ours as MCP names it
                "name": tool if tool[:1].isupper() else f"mcp__{self.server_name}__{tool}",
                "input": {},
            }
            out += [
                _sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
                _sse(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "input_json_delta", "partial_json": json.dumps(args)},
                    },
                ),
                _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ]
            stop = "tool_use"
        else:
            out += [
                _sse(
                    "content_block_start",
                    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                ),
                _sse(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Done."}},
                ),
                _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ]
            stop = "end_turn"
        out += [
            _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": 5},
                },
            ),
            _sse("message_stop", {"type": "message_stop"}),
        ]
        return b"".join(out)


def _plan_of(script: list[Step]) -> Plan:
    """The plan that makes the n-th scripted call once n tool results are in."""

    def plan(results: list[Any]) -> Call | None:
        if len(results) >= len(script):
            return None
        step = script[len(results)]
        return step(results) if callable(step) else step

    return plan
