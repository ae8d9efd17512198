"""The sandboxed side of ``wholemodel.sandboxed``: ``python -m wholemodel.sandboxed_main JOB RESULT``.

Runs in its own scratch folder, inside the sandbox; says what it does on stderr, writes the
verification's JSON to RESULT and exits 0, or says why not and exits 2.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from pydantic import ValidationError

from .job import VerifyJob, run

BUILD_DIR = "build"  # in the scratch folder, which is the current one


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m wholemodel.sandboxed_main JOB RESULT", file=sys.stderr)
        return 2
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    job_path, result_path = map(Path, args)
    try:
        job = VerifyJob.model_validate_json(job_path.read_text())
        verification = run(job, Path.cwd() / BUILD_DIR, lambda msg: print(msg + "...", file=sys.stderr))
    except (ValueError, ValidationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result_path.write_text(json.dumps(verification.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
