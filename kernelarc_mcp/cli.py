"""The ``kernelarc`` command line. Every command is a thin layer over the library (guard/),
the same one the MCP server and the tests use. Human output goes to stdout, logs and
progress to stderr; with ``--json`` the last line of stdout is one JSON object.

This module only builds the parser and runs a command: the commands live in ``commands/``,
one module per group, and what they share in ``common.py``."""

from __future__ import annotations

import argparse
import logging
import sys

from . import __version__
from .commands import GROUPS
from .common import emit_json


def _setup_logging(verbosity: int) -> None:
    level = logging.WARNING - 10 * min(verbosity, 2)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kernelarc",
        description="Deterministic guard and MCP server for agents that optimize GPU kernels.",
    )
    p.add_argument("--version", action="version", version=f"kernelarc {__version__}")
    p.add_argument("--workspace", help="workspace folder (default $KERNELARC_WORKSPACE or ./.kernelarc)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging on stderr")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for group in GROUPS:
        group.add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "token" and args.action in ("create", "revoke") and not args.name:
        parser.error(f"token {args.action} needs an agent NAME")
    _setup_logging(args.verbose)
    from guard.candidates.load import CandidateError
    from guard.cascade import GuardError
    from guard.problems.problem import ProblemError

    try:
        return args.fn(args)
    except (ProblemError, CandidateError, ValueError) as exc:
        print(f"kernelarc: {exc}", file=sys.stderr)
        if getattr(args, "json", False):
            emit_json({"error": str(exc)})
        return 2
    except GuardError as exc:
        print(f"kernelarc: {exc}", file=sys.stderr)
        if getattr(args, "json", False):
            emit_json({"error": str(exc)})
        return 1
    except KeyboardInterrupt:
        print("kernelarc: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
