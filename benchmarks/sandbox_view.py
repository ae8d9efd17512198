"""What a sandboxed candidate sees of the guard, worker after worker: the names of variables
with KERNELARC in them, its folder, and which of the names the ``reads_environment`` cheat
looks for (``.kernelarc``, ``secret.key``, ``workspace.db``) exist in its folder or above.

Each probe candidate reports through the one channel a rejected verdict keeps, its error;
an honest Triton seed is judged between two probes, so that later probes get the spare
workers the pool starts meanwhile. The static screen is off, as for a cheat's run-time test.

Usage: python benchmarks/sandbox_view.py [cpu|cuda] [PROBES]
(found, session 38 on an H100: a spare worker's environment named KERNELARC_WORKER_SPARE)
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import RMS, fast_config  # noqa: E402
from guard.candidates.load import from_source  # noqa: E402
from guard.cascade import Guard  # noqa: E402
from guard.workspace import Workspace  # noqa: E402
from seeds import SEEDS_DIR  # noqa: E402

PROBE = """
import os, pathlib
def run(hidden_states, weight):
    keys = [k for k in os.environ if "KERNELARC" in k.upper()]
    here = pathlib.Path.cwd()
    names = (".kernelarc", "secret.key", "workspace.db")
    hits = [str(f / n) for f in [here, *here.parents] for n in names if (f / n).exists()]
    raise RuntimeError(f"PROBE cwd={here} keys={keys} hits={hits}")
"""


def main() -> int:
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    probes = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    honest = (SEEDS_DIR / RMS / "seed_triton.py").read_text()
    g = Guard(Workspace.open(Path(tempfile.mkdtemp()) / "ws"), fast_config(static_screen=False), device=device)
    try:
        for i in range(probes):
            v = g.evaluate(from_source(PROBE + f"# {i}\n", "pytorch", "kernel.py"), RMS, agent=f"probe{i}")
            print("PROBE", i, v.status, (v.reason or "")[:400], flush=True)
            h = g.evaluate(from_source(honest + f"# {i}\n", "triton", "kernel.py"), RMS, agent=f"honest{i}")
            print("HONEST", i, h.status, flush=True)
    finally:
        g.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
