"""``kernelarc serve`` (the MCP server over stdio or HTTP) and ``kernelarc token`` (the bearer
tokens HTTP agents present)."""

from __future__ import annotations

import logging
import os
import signal
import sys

from ..common import device_option, emit_json, open_workspace

log = logging.getLogger("kernelarc")


def cmd_serve(args) -> int:
    from guard.archive.tokens import check_agent_name
    from guard.runner.device import parse_count
    from memory.conclusions import Retention

    from ..server import build_server
    from ..service import Service, ServiceError
    from ..serving.http import serve_http
    from ..serving.sockets import check_port_free

    ws = open_workspace(args)
    retention = Retention(args.retention_days, args.retention_per_problem)
    if args.transport == "http" and args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s: reachable beyond this machine", args.host)
    if args.transport == "http":
        try:  # before the service re-queues interrupted jobs: a second server must change nothing
            check_port_free(args.host, args.port)
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", args.host, args.port, exc)
            return 3
    try:
        service = Service(
            ws,
            ws.config(),
            device=args.device,
            retention=retention,
            max_wait_s=args.max_wait,
            devices=parse_count(args.devices),
            prepare=args.prepare or (),
        )
    except ServiceError as exc:  # an unknown problem to prepare
        log.error("%s", exc)
        return 2
    if len(service.guards) > 1:
        log.info("judging on %d devices: %s", len(service.guards), ", ".join(g.device.key for g in service.guards))
    why = "a failure"  # what the jobs it leaves unfinished say stopped it
    try:
        if args.transport == "http":
            if args.allow_anonymous:
                log.warning("anonymous HTTP allowed: every caller is agent 'anonymous'")
            options = {
                "workspace": str(ws.root),
                "device": args.device,
                "host": args.host,
                "port": args.port,
                "allow_anonymous": args.allow_anonymous,
                "max_wait": args.max_wait,
                "retention_days": args.retention_days,
                "retention_per_problem": args.retention_per_problem,
                "log_level": logging.getLogger().level,
                "server": service.jobs.server,  # the HTTP workers queue jobs for this server
            }
            log.info("serving MCP on http://%s:%d/mcp with %d worker(s)", args.host, args.port, args.workers)
            why = serve_http(service, options, args.workers)
        else:
            agent = args.agent or os.environ.get("KERNELARC_AGENT") or "stdio"
            mcp = build_server(service, http_auth=False, stdio_agent=check_agent_name(agent))
            _stop_on_signals(service)
            mcp.run(transport="stdio")  # returns when stdin closes
            for sig in STOP_SIGNALS:  # a client that closed stdin may signal next: the stop below is bounded
                signal.signal(sig, signal.SIG_IGN)
            why = "stdin closed"
    except KeyboardInterrupt:
        why = "SIGINT"
        raise
    finally:
        service.close(why)
    return 0


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _stop_on_signals(service) -> None:
    """A stdio server stops on SIGTERM, SIGINT or SIGHUP (what a client that exits may send)
    as it does when stdin closes: its running job interrupted and its queued ones cancelled,
    each saying so, its workers ended. The stop runs in the handler, then the process exits at
    once: the thread blocked reading stdin would hold a normal exit until the next line."""
    stopping = []

    def stop(signum, _frame) -> None:
        if stopping:  # a second signal while stopping: the stop is bounded, let it finish
            return
        stopping.append(signum)
        name = signal.Signals(signum).name
        log.info("%s: stopping", name)
        try:
            service.close(name)
        except BaseException:  # noqa: BLE001 - exit all the same
            log.exception("stopping after %s", name)
        finally:
            logging.shutdown()
            os._exit(0)

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)


def cmd_token(args) -> int:
    from guard.archive.db import Database
    from guard.archive.tokens import TokenStore

    ws = open_workspace(args)
    store = TokenStore(Database(ws.db_path))
    if args.action == "create":
        token = store.create(args.name, replace=args.replace)
        if args.json:
            emit_json({"agent": args.name, "token": token})
        else:
            print(token)
            print(
                f"token for agent {args.name!r}: shown once; present it as 'Authorization: Bearer <token>'",
                file=sys.stderr,
            )
    elif args.action == "revoke":
        if not store.revoke(args.name):
            print(f"kernelarc: no token for {args.name!r}", file=sys.stderr)
            return 2
        print(f"revoked {args.name}")
    else:
        agents = store.agents()
        if args.json:
            emit_json({"agents": agents})
        else:
            for a in agents:
                print(a["agent"])
    return 0


def add_parsers(sub) -> None:
    s = sub.add_parser("serve", help="run the MCP server (stdio or streamable HTTP)")
    s.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    s.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default loopback)")
    s.add_argument("--port", type=int, default=8765)
    s.add_argument("--agent", help="stdio: the agent this connection speaks for (default $KERNELARC_AGENT)")
    s.add_argument("--allow-anonymous", action="store_true", help="HTTP without tokens (every caller is 'anonymous')")
    device_option(s)
    s.add_argument("--max-wait", type=float, default=40.0, help="longest a tool call waits for a verdict (s)")
    s.add_argument(
        "--devices",
        default="1",
        help="how many GPUs of this host judge, one worker and timing slot each: N or 'all' "
        "(default 1; on a CPU, N > 1 simulates devices that share the cores)",
    )
    s.add_argument(
        "--workers", type=int, default=1, help="HTTP worker processes (reads scale with them; one process evaluates)"
    )
    s.add_argument("--retention-days", type=float, help="forget conclusions older than this")
    s.add_argument("--retention-per-problem", type=int, help="keep only the newest N conclusions per problem")
    s.add_argument(
        "--prepare",
        action="append",
        metavar="PROBLEM",
        help="measure this problem's eager and compile baselines at start, before any candidate "
        "(repeatable; kernelarc launch passes its problem)",
    )
    s.set_defaults(fn=cmd_serve)

    s = sub.add_parser("token", help="bearer tokens for agents (HTTP)")
    s.add_argument("action", choices=["create", "list", "revoke"])
    s.add_argument("name", nargs="?")
    s.add_argument("--replace", action="store_true", help="create: issue a new token for an existing agent")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_token)
