"""Run by the KernelBench importer in a subprocess: find a file's interface without running it
at full size. Needs torch; never imported by the server.

``python -m guard.problems.kernelbench_probe`` (``serving``) reads one JSON request per line on stdin
(``{"path": ...}``) and answers one JSON line per request on stdout. torch is imported once;
each file is probed in a forked child with an address-space limit and a time limit, so one
file's memory, crash or global changes never reach the next.

How a file is probed:

1. Shapes and dtypes at the full KernelBench size come from torch's meta device: the inputs,
   the model (its parameters and buffers) and the forward run under ``torch.device("meta")``,
   so nothing is allocated or computed. Where the model cannot be built on meta (its
   constructor calls ``.item()``), it is built on the CPU and moved to meta. Where the forward
   cannot run on meta (``.item()``, data-dependent shapes, ops without meta kernels), a
   reduced-size probe runs the model for real on the CPU with the size constants shrunk.
2. Each size constant is halved in turn (what the CPU derivation does): the dims that follow
   it become that axis; dims that follow it through arithmetic (convolution and pooling
   outputs) become expression axes fitted on a few more sizes; a constant whose halving
   breaks the model or changes its structure (layer counts, kernel sizes) stays fixed.
3. The CPU workload is derived as for every problem (``derive.cpu_workloads``) and the
   generated reference is run once, for real, on the CPU at that workload, through the same
   ``generate_inputs``/``run`` the guard calls. A constant whose shrinking makes that run fail
   is fixed and the workload derived again.

The package, one module per step: ``failures`` (a failure in words, time and memory limits),
``meta_patches`` (shape-only shortcuts on the meta device), ``interface`` (one run of the
file: its arguments, state and outputs), ``axes`` (which constants are axes and how dims follow
them), ``verify`` (the reference run once on the CPU), ``analyze`` (the steps together) and
``serving`` (one forked child per file, the stdin/stdout protocol).
"""

from .analyze import analyze
from .failures import ProbeFailure
from .serving import probe_in_child, serve

__all__ = ["ProbeFailure", "analyze", "probe_in_child", "serve"]
