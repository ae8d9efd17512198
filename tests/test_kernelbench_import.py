"""KernelBench import at any size, on the CPU: every level 1-3 file imports without running
at its full size, its CPU workload is small and was run once, and a file that cannot be
imported says which construct and why.

The 250 KernelBench files are read from ``../shared/datasets/kernelbench`` beside the
repository (not copied into it); those tests are skipped when it is absent. Import times are
recorded (``record_property``, and a summary line at the end) but not asserted on: the
figures come from ``benchmarks/kernelbench_import_bench.py`` (docs/kernelbench.md).
"""

from __future__ import annotations

import math
import statistics
import textwrap
import time
from pathlib import Path

import pytest

from guard.problems.derive import (
    CPU_ELEMENT_BUDGET,
    _over_budget_axes,
    cpu_budget,
    dependent_axes,
    largest_tensor,
    lower_bounds,
)
from guard.problems.kernelbench_import import KernelBenchProber, import_kernelbench_file
from guard.problems.problem import ProblemError
from guard.problems.schema import ConstAxis, ExprAxis, VarAxis
from guard.problems.store import ProblemStore

from helpers import DATA

KERNELBENCH = Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets" / "kernelbench"
FILES = sorted(p for level in ("level1", "level2", "level3") for p in (KERNELBENCH / level).glob("*.py"))
_TIMES: dict[str, float] = {}


@pytest.fixture(scope="module")
def prober(request):
    """One probe process for the module: torch is imported once (before the first timed
    import: the probe of a small file waits for it)."""
    with KernelBenchProber() as p:
        p.probe(DATA / "kernelbench" / "1_Square_matmul.py")
        yield p
    if _TIMES:
        secs = sorted(_TIMES.values())
        slowest = max(_TIMES, key=_TIMES.get)
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(
                    f"\nKernelBench import: {len(secs)} files, median {statistics.median(secs):.2f} s, "
                    f"max {secs[-1]:.2f} s ({slowest}), over 5 s: {sum(s > 5 for s in secs)}"
                )


def _write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def _largest(problem, axes) -> int:
    return largest_tensor(problem.definition, axes)


def _full_bytes(problem) -> int:
    d = problem.definition
    axes = d.resolve_axes(problem.workloads[0].axes)
    return max(
        math.prod(d.shape_of(s, axes)) * 4
        for s in list(d.inputs.values()) + list(d.outputs.values())
        if s.shape is not None
    )


def _run_reference(problem, axes: dict) -> dict:
    """The generated reference's generate_inputs at ``axes``, as the guard calls it."""
    ns: dict = {"__name__": "kb_reference"}
    exec(compile(problem.definition.reference, "<reference>", "exec"), ns)
    return ns["generate_inputs"](problem.definition.resolve_axes(axes), "cpu")


# --------------------------------------------------------------------- all 250 files


def _ids(p: Path) -> str:
    return f"{p.parent.name}/{p.stem}"


@pytest.mark.skipif(not FILES, reason=f"KernelBench files not found under {KERNELBENCH}")
@pytest.mark.parametrize("path", FILES, ids=_ids)
def test_every_kernelbench_file_imports_small(prober, path, record_property):
    t0 = time.perf_counter()
    problem, notes = import_kernelbench_file(path, prober)
    seconds = time.perf_counter() - t0
    _TIMES[_ids(path)] = seconds
    record_property("import_seconds", round(seconds, 3))
    d = problem.definition
    assert d.custom_inputs_entrypoint == "generate_inputs"
    assert d.kernelarc.deterministic is False  # repeats judged within the tolerance, as KernelBench does
    assert all(isinstance(a, (VarAxis, ConstAxis, ExprAxis)) for a in d.axes.values())
    (cpu,) = d.kernelarc.cpu_workloads
    checked = [n for n in notes if n.startswith("CPU workload (")]
    heavy = [n for n in notes if "was not run at import" in n]
    assert checked or heavy, "\n".join(notes)
    # the CPU workload (run by the import unless too heavy) has every tensor within the
    # element budget, or every axis sizing a larger one is as small as the model allows
    # (fixed sizes such as a 3x224x224 image or a classifier's weight cannot shrink)
    budget = cpu_budget(d)
    over = _over_budget_axes(d, cpu.axes, budget, dependent_axes(d)) or set()
    floor = lower_bounds(d)
    assert all(cpu.axes[a] // 2 < floor.get(a, 1) for a in over if a in cpu.axes), (cpu.axes, over)
    assert budget <= CPU_ELEMENT_BUDGET


# --------------------------------------------------------------------- sizes


def test_tens_of_gigabytes_import_small(prober, tmp_path):
    """x would be 32 GiB at full size: the import never allocates it and the CPU workload
    (run once by the import) is within the element budget; the generated reference makes
    CPU-sized inputs, also for constants given as ``a = b = ...``, ``a, b = (...)``, tuple
    elements, and constants computed from others."""
    path = _write(
        tmp_path,
        "huge_conv.py",
        """
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
                super().__init__()
                self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
                self.bias = nn.Parameter(torch.randn(bias_shape))

            def forward(self, x, scale):
                return torch.relu(self.conv(x) + self.bias) * scale.sum()


        batch_size = 128
        in_channels, out_channels = (16, 32)
        height = width = 2048
        kernel_size = 3
        bias_shape = (out_channels, 1, 1)
        scale_shape = (4096,)


        def get_inputs():
            return [torch.randn(batch_size, in_channels, height, width), torch.randn(*scale_shape)]


        def get_init_inputs():
            return [in_channels, out_channels, kernel_size, bias_shape]
    """,
    )
    problem, notes = import_kernelbench_file(path, prober)
    d = problem.definition
    assert d.inputs["x"].shape == ["batch_size", "in_channels", "height", "width"]
    assert d.inputs["scale"].shape == ["scale_shape_0"]
    assert d.inputs["bias"].shape == ["out_channels", 1, 1]
    assert isinstance(d.axes["kernel_size"], ConstAxis)  # shrinking it changes the conv
    out = d.outputs["output"].shape
    assert [d.axes[a].expression for a in out[2:]] == ["height - 2", "width - 2"]
    assert _full_bytes(problem) >= 32 << 30
    (cpu,) = d.kernelarc.cpu_workloads
    assert _largest(problem, cpu.axes) <= CPU_ELEMENT_BUDGET
    assert any(n.startswith("CPU workload (") for n in notes), notes
    inputs = _run_reference(problem, cpu.axes)
    assert inputs["x"].numel() <= CPU_ELEMENT_BUDGET
    assert list(inputs["bias"].shape) == [cpu.axes["out_channels"], 1, 1]
    assert list(inputs["scale"].shape) == [cpu.axes["scale_shape_0"]]


def test_equal_constants_that_must_stay_equal_are_tied(prober, tmp_path):
    """predictions (n, n) times targets (n,) only broadcast when both sizes are equal: the
    second constant follows the first (an expression axis) and the CPU workload shrinks both."""
    path = _write(
        tmp_path,
        "hinge.py",
        """
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def forward(self, predictions, targets):
                return torch.mean(torch.clamp(1 - predictions * targets, min=0))


        batch_size = 32768
        input_shape = (32768,)


        def get_inputs():
            return [torch.rand(batch_size, *input_shape), torch.randint(0, 2, (batch_size,)).float() * 2 - 1]


        def get_init_inputs():
            return []
    """,
    )
    problem, notes = import_kernelbench_file(path, prober)
    d = problem.definition
    assert d.axes["input_shape_0"].expression == "batch_size"
    (cpu,) = d.kernelarc.cpu_workloads
    assert cpu.axes["batch_size"] ** 2 <= CPU_ELEMENT_BUDGET
    assert any(n.startswith("CPU workload (") for n in notes), notes


def test_forward_the_meta_device_cannot_run_imports_from_a_reduced_run(prober, tmp_path):
    path = _write(
        tmp_path,
        "reads_a_value.py",
        """
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.proj = nn.Linear(dim, dim)

            def forward(self, x):
                scale = x.abs().max().item()
                return self.proj(x / scale)


        batch_size = 65536
        dim = 16384


        def get_inputs():
            return [torch.randn(batch_size, dim)]


        def get_init_inputs():
            return [dim]
    """,
    )
    problem, notes = import_kernelbench_file(path, prober)
    d = problem.definition
    assert d.inputs["x"].shape == ["batch_size", "dim"]
    assert d.inputs["proj__weight"].shape == ["dim", "dim"]
    assert problem.workloads[0].axes == {"batch_size": 65536, "dim": 16384}
    assert any("calls .item()" in n and "reduced size" in n for n in notes), notes
    (cpu,) = d.kernelarc.cpu_workloads
    assert _largest(problem, cpu.axes) <= CPU_ELEMENT_BUDGET


# --------------------------------------------------------------------- messages


def test_syntax_error_shows_the_line(tmp_path):
    path = _write(
        tmp_path,
        "broken.py",
        """
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def forward(self, x):
                return x * 2


        def get_inputs(:
            return [torch.randn(4, 4)]


        def get_init_inputs():
            return []
    """,
    )
    for attempt in (
        lambda: import_kernelbench_file(path),
        lambda: ProblemStore(tmp_path / "ws", tmp_path / "no-seeds").import_path(path),
    ):
        with pytest.raises(ProblemError) as err:
            attempt()
        msg = str(err.value)
        assert f"{path}:10:" in msg and "syntax error" in msg and "def get_inputs(:" in msg


def test_meta_and_reduced_probe_failing_name_the_construct(prober, tmp_path):
    path = _write(
        tmp_path,
        "never_runs.py",
        """
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def forward(self, x):
                k = int(x.abs().sum().item())
                return x.view(-1, 7) * k


        batch_size = 4096
        dim = 4096


        def get_inputs():
            return [torch.randn(batch_size, dim)]


        def get_init_inputs():
            return []
    """,
    )
    with pytest.raises(ProblemError) as err:
        import_kernelbench_file(path, prober)
    msg = str(err.value)
    assert msg.startswith(f"{path}: forward calls .item() on a tensor")
    assert "meta device cannot evaluate" in msg and "line 7 in forward" in msg
    assert "the reduced-size probe failed with: forward: line 8 in forward" in msg
    assert "shape '[-1, 7]' is invalid" in msg


@pytest.mark.parametrize(
    "body, expected",
    [
        ("import not_a_module_kernelarc\n", "No module named 'not_a_module_kernelarc' (install"),
        ("", "died of SIGKILL"),
    ],
    ids=["missing-module", "killed"],
)
def test_other_failures_are_never_silent(prober, tmp_path, body, expected):
    kill = "" if body else "    os.kill(os.getpid(), signal.SIGKILL)\n"
    source = (
        "import os\nimport signal\n" + body + "import torch\nimport torch.nn as nn\n\n\n"
        "class Model(nn.Module):\n    def forward(self, x):\n        return x * 2\n\n\n"
        "size = 64\n\n\ndef get_inputs():\n" + kill + "    return [torch.randn(size, size)]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    path = tmp_path / "other.py"
    path.write_text(source)
    with pytest.raises(ProblemError) as err:
        import_kernelbench_file(path, prober)
    assert expected in str(err.value)
