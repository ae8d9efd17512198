"""The sandboxed side of ``wholemodel.sandboxed``: ``python -m wholemodel.sandboxed_main --result-fd N``.

Reads its job (JSON) on stdin, runs it in its own folder (a tmpfs of the sandbox's), says what
it does on stdout, writes the verification's JSON to descriptor N and exits 0, or says why not
and exits 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from guard.sandbox.rlimits import limit_open_files

from .job import VerifyJob, run

BUILD_DIR = "build"  # in the job's folder, which is the current one


def _with_model_file(job: VerifyJob) -> VerifyJob:
    """A model file's text that came with the job, written here and loaded from here."""
    if job.model_source is None:
        return job
    path = Path.cwd() / Path(job.model).name
    path.write_text(job.model_source)
    return job.model_copy(update={"model": str(path), "model_source": None})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wholemodel.sandboxed_main")
    ap.add_argument("--result-fd", type=int, required=True)
    args = ap.parse_args(argv)
    limit_open_files()  # as a candidate worker's: the host's file table is shared (guard.sandbox.rlimits)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        job = _with_model_file(VerifyJob.model_validate_json(sys.stdin.buffer.read()))
        verification = run(job, Path.cwd() / BUILD_DIR, lambda msg: print(msg + "...", flush=True))
    except (ValueError, ValidationError) as exc:
        print(f"error: {exc}", flush=True)
        return 2
    with os.fdopen(args.result_fd, "wb") as out:
        out.write(json.dumps(verification.to_json()).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
