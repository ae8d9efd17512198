"""KernelBench candidates as KernelBench writes them: a file defining ``class ModelNew``
(the Model's constructor arguments, its weights under the Model's names) is judged through
the whole cascade for a problem imported from KernelBench, on the CPU: one problem of each
level, one ``load_inline`` C++ build, and the errors a ModelNew author can act on.

The KernelBench files are read from ``../shared/datasets/kernelbench`` beside the repository;
the tests are skipped when it is absent.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from guard.candidates.load import from_file, from_source
from guard.problems.kernelbench_import import KernelBenchProber, import_kernelbench_file
from guard.screen import screen_solution

from helpers import make_guard

KERNELBENCH = Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets" / "kernelbench"
FILES = {
    "relu": "level1/19_ReLU.py",
    "conv": "level2/1_Conv2D_ReLU_BiasAdd.py",
    "bn": "level2/33_Gemm_Scale_BatchNorm.py",
    "mlp": "level3/1_MLP.py",
}
pytestmark = pytest.mark.skipif(
    not all((KERNELBENCH / f).is_file() for f in FILES.values()),
    reason=f"KernelBench files not found under {KERNELBENCH}",
)


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    """A CPU guard with the three KernelBench problems imported; yields (guard, names)."""
    g = make_guard(tmp_path_factory.mktemp("ws-modelnew"), correctness_rounds=1)
    names = {}
    try:
        with KernelBenchProber() as prober:
            for key, rel in FILES.items():
                problem, _ = import_kernelbench_file(KERNELBENCH / rel, prober)
                problem.save(g.store.workspace_problems / problem.name)
                names[key] = problem.name
        yield g, names
    finally:
        g.close()


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip()


def _judge(kb, key: str, source: str, language: str | None = None):
    g, names = kb
    solution = from_source(_src(source), language, "model_new.py")
    assert solution.spec.entry_point == "model_new.py::ModelNew"
    return g.evaluate(solution, names[key], agent="modelnew")


def _passed(v) -> None:
    assert v.status == "PASSED", f"{v.status}: {v.reason}\n{v.diagnostic}"


RELU = """
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def __init__(self):
            super(ModelNew, self).__init__()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.clamp_min(x, 0.0)
"""

CONV = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class ModelNew(nn.Module):
        def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
            super().__init__()
            self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
            self.bias = nn.Parameter(torch.randn(bias_shape))

        def forward(self, x):
            y = F.conv2d(x, self.conv.weight, self.conv.bias)
            return y.relu_().add_(self.bias)
"""

# BatchNorm in training mode, as the Model runs: its running statistics (buffers the problem
# passes as inputs) are updated in ModelNew's own buffers, never in an input
BN = """
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def __init__(self, in_features, out_features, scale_shape, eps=1e-5, momentum=0.1):
            super().__init__()
            self.gemm = nn.Linear(in_features, out_features)
            self.scale = nn.Parameter(torch.randn(scale_shape))
            self.bn = nn.BatchNorm1d(out_features, eps=eps, momentum=momentum)

        def forward(self, x):
            y = torch.addmm(self.gemm.bias, x, self.gemm.weight.t()).mul_(self.scale)
            return self.bn(y)
"""

# the Model's layers under other names (network.0 -> layers.0, ...): matched by order and shape
MLP = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class ModelNew(nn.Module):
        def __init__(self, input_size, layer_sizes, output_size):
            super().__init__()
            sizes = [input_size, *layer_sizes, output_size]
            self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))

        def forward(self, x):
            for layer in self.layers[:-1]:
                x = F.relu(F.linear(x, layer.weight, layer.bias))
            last = self.layers[-1]
            return torch.addmm(last.bias, x, last.weight.t())
"""

LOAD_INLINE = '''
    import torch
    import torch.nn as nn
    from torch.utils.cpp_extension import load_inline

    relu_cpp_source = """
    torch::Tensor relu_forward(torch::Tensor x) {
        auto xc = x.contiguous();
        auto y = torch::empty_like(xc);
        const float* src = xc.data_ptr<float>();
        float* dst = y.data_ptr<float>();
        const int64_t n = xc.numel();
        for (int64_t i = 0; i < n; ++i) dst[i] = src[i] > 0.0f ? src[i] : 0.0f;
        return y;
    }
    """

    relu_ext = load_inline(
        name="kernelarc_test_relu_cpu",
        cpp_sources=relu_cpp_source,
        functions=["relu_forward"],
        verbose=False,
    )


    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()
            self.relu = relu_ext

        def forward(self, x):
            return self.relu.relu_forward(x)
'''


# --------------------------------------------------------------------- loading, screen


def test_a_modelnew_file_is_a_candidate_as_written(tmp_path):
    path = tmp_path / "model_new.py"
    path.write_text(_src(CONV))
    for language in (None, "pytorch", "triton"):
        solution = from_file(path, language=language)
        assert solution.spec.entry_point == "model_new.py::ModelNew"
        assert solution.sources[0].content == path.read_text()  # kept as written
    # its kernel may be CUDA (load_inline), the file is Python
    cuda = from_source(_src(LOAD_INLINE), "cuda")
    assert cuda.spec.languages == ["pytorch"] and cuda.spec.entry_point == "kernel.py::ModelNew"
    # a file that also defines run() is judged by its run()
    both = _src(CONV) + "\n\ndef run(x, bias, conv__weight, conv__bias):\n    return x\n"
    assert from_source(both, None).spec.entry_point == "kernel.py::run"
    for source in (RELU, CONV, MLP, LOAD_INLINE):
        result = screen_solution(from_source(_src(source), None), 256_000, 16)
        assert result.ok, result.message()


def test_screen_reads_the_cpp_inside_load_inline():
    """load_inline is allowed (the sandbox contains its build); its literal C++ gets the
    rules of a .cu candidate, reported at the Python file's line."""
    bad = LOAD_INLINE.replace("auto xc = x.contiguous();", "auto xc = x.contiguous(); std::thread t([]{}); t.detach();")
    result = screen_solution(from_source(_src(bad), None, "model_new.py"), 256_000, 16)
    assert not result.ok and result.status == "REWARD_HACK"
    (finding,) = result.findings
    line = _src(bad).splitlines()[finding.line - 1]
    assert "std::thread" in line and finding.rule == "thread", finding
    assert finding.message.startswith("load_inline C++: std::thread")
    inline = _src(LOAD_INLINE).replace("cpp_sources=relu_cpp_source", "cpp_sources=[relu_cpp_source]")
    assert (
        screen_solution(
            from_source(inline.replace("int64_t n", "int64_t n = getenv(0) ? 1 : 0; int64_t m"), None), 256_000, 16
        )
        .findings[0]
        .rule
        == "environment"
    )


# --------------------------------------------------------------------- PASSED, each level


@pytest.mark.parametrize(
    "key, source",
    [("relu", RELU), ("conv", CONV), ("bn", BN), ("mlp", MLP)],
    ids=["level1-relu", "level2-conv-relu-bias", "level2-gemm-batchnorm", "level3-mlp-renamed"],
)
def test_modelnew_of_each_level_passes(kb, key, source):
    _passed(_judge(kb, key, source))


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a compile of torch's whole C++ API: ~40 s on 2 idle cores
def test_load_inline_cpu_modelnew_passes(kb):
    """CPU C++ through load_inline, built at import in the worker's own folder (the
    sandbox's TORCH_EXTENSIONS_DIR), judged like any candidate."""
    _passed(_judge(kb, "relu", LOAD_INLINE))


# --------------------------------------------------------------------- errors


def test_missing_modelnew_says_what_a_kernelbench_candidate_is(kb):
    g, names = kb
    source = _src(RELU).replace("ModelNew", "MyModel")
    v = g.evaluate(from_source(source, None, "model_new.py"), names["relu"], agent="modelnew")
    assert v.status == "COMPILE_ERROR"
    assert "defines neither class ModelNew nor a function 'run'" in v.diagnostic


def test_modelnew_for_a_problem_not_from_kernelbench(tmp_path):
    """The builder, where no KernelBench reference was loaded to make the inputs (this
    process has none), refuses a ModelNew with a COMPILE_ERROR (through a Guard it is the
    same build, in the worker)."""
    from guard.builders import BuildError, get_builder

    solution = from_source(_src(RELU), None, "model_new.py").model_dump(mode="json")
    with pytest.raises(BuildError) as err:
        get_builder("pytorch").build(solution, tmp_path / "src", tmp_path / "build", "cpu")
    assert err.value.status == "COMPILE_ERROR"
    assert "candidate for problems imported from KernelBench" in str(err.value)


def test_constructor_that_refuses_the_init_inputs(kb):
    source = CONV.replace(
        "def __init__(self, in_channels, out_channels, kernel_size, bias_shape)",
        "def __init__(self, in_channels, out_channels)",
    )
    v = _judge(kb, "conv", source)
    assert v.status == "COMPILE_ERROR", v.diagnostic
    assert "does not accept the Model's constructor arguments" in v.diagnostic
    assert "in_channels=64, out_channels=128, kernel_size=3, bias_shape=(128, 1, 1)" in v.diagnostic


def test_unmatched_weights_are_named(kb):
    source = CONV.replace(
        "nn.Conv2d(in_channels, out_channels, kernel_size)",
        "nn.Conv2d(in_channels, out_channels, kernel_size, bias=False)",
    )
    source = source.replace("self.conv.bias)", "None)")
    v = _judge(kb, "conv", source)
    assert v.status == "COMPILE_ERROR", v.diagnostic
    assert "conv.bias [128]" in v.diagnostic and "match no parameter or buffer of ModelNew" in v.diagnostic


def test_forward_with_the_wrong_arguments(kb):
    source = RELU.replace("def forward(self, x: torch.Tensor)", "def forward(self, x, y)")
    v = _judge(kb, "relu", source)
    assert v.status == "COMPILE_ERROR", v.diagnostic
    assert "must take the Model's forward argument(s) (x)" in v.diagnostic


def test_weights_match_by_name_then_order_then_unique_shape():
    import torch
    import torch.nn as nn

    from guard.builders.modelnew import WeightMismatch, match_weights

    class Ref(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(4, 8)
            self.bn = nn.BatchNorm1d(8)

    class Renamed(nn.Module):  # other names, registered in the same order
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 8)
            self.norm = nn.BatchNorm1d(8)

    class Partial(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(4, 8)
            self.w = nn.Parameter(torch.zeros(8, 4))  # a second [8, 4]: not unique, not ordered
            self.extra = nn.Parameter(torch.zeros(3))

    ref = [(k, tuple(v.shape)) for k, v in Ref().state_dict().items()]
    got = match_weights(ref, Renamed())
    assert got["l1.weight"] == ("fc.weight", True)
    assert got["bn.running_mean"] == ("norm.running_mean", False)
    with pytest.raises(WeightMismatch) as err:
        match_weights(ref, Partial())
    msg = str(err.value)
    assert "the Model's weight(s) bn.weight [8], bn.bias [8]" in msg
    assert "ModelNew's parameter(s) w [8, 4], extra [3] match none of the Model's" in msg


def test_the_parameters_a_call_binds_hold_no_memory_of_their_own():
    """ModelNew's own copy of each weight is dropped: the call binds the problem's inputs, and
    a kept copy doubled a large model's device memory. Tied names each take their own value."""
    import torch
    import torch.nn as nn

    from guard.builders.modelnew import drop_bound_parameters

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(6, 6)
            self.dec = nn.Linear(6, 6)
            self.dec.weight = self.enc.weight
            self.bn = nn.BatchNorm1d(6)

        def forward(self, x):
            return self.bn(self.dec(self.enc(x)))

    torch.manual_seed(0)
    model = Tied().eval()
    x = torch.randn(3, 6)
    weights = {k: v.detach().clone() for k, v in model.named_parameters(remove_duplicate=False)}
    expected = model(x)
    drop_bound_parameters(model, list(weights))
    held = {k: p.numel() for k, p in model.named_parameters(remove_duplicate=False)}
    assert held == dict.fromkeys(weights, 0)
    assert model.bn.running_var.numel() == 6  # buffers are the module's own, kept
    with torch.no_grad():
        got = torch.func.functional_call(model, weights, (x,), tie_weights=False)
    assert torch.equal(got, expected)


def test_a_dropped_parameter_stays_the_object_that_scripts_and_aliases_hold():
    """Parameters shrink in place: a TorchScript submodule and an alias the candidate keeps
    still see the module's parameter, and follow it to another dtype or device."""
    import torch
    import torch.nn as nn

    from guard.builders.modelnew import drop_bound_parameters

    class Held(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.jit.script(nn.Linear(5, 5))
            self.out = nn.Linear(5, 3)
            self.meta = [self.out.weight]  # read for its dtype only, as a launcher might

        def forward(self, x):
            return self.out(self.fc(x).to(self.meta[0].dtype))

    torch.manual_seed(0)
    model = Held()
    x = torch.randn(4, 5, dtype=torch.float64)
    weights = {k: v.detach().to(torch.float64) for k, v in model.named_parameters()}
    drop_bound_parameters(model, list(weights))
    model = model.to(torch.float64)
    assert model.meta[0] is model.out.weight and model.meta[0].dtype == torch.float64
    with torch.no_grad():
        got = torch.func.functional_call(model, weights, (x,), tie_weights=False)
        expected = nn.functional.linear(
            nn.functional.linear(x, weights["fc.weight"], weights["fc.bias"]),
            weights["out.weight"],
            weights["out.bias"],
        )
    assert torch.allclose(got, expected)


def test_a_model_that_ties_weights_passes_them_once(kb):
    """``dec.weight = enc.weight``: the tied weight is one input (under its first name), the
    reference binds it to both layers, and the Model renamed as ModelNew is PASSED (two inputs
    made the reference's ``functional_call`` refuse them)."""
    g, _ = kb
    data = Path(__file__).resolve().parent / "data" / "kernelbench" / "tied_weights.py"
    with KernelBenchProber() as prober:
        problem, _ = import_kernelbench_file(data, prober)
    assert list(problem.definition.inputs) == ["x", "enc__weight", "enc__bias", "dec__bias"]
    problem.save(g.store.workspace_problems / problem.name)
    source = data.read_text().replace("class Model(", "class ModelNew(")
    v = g.evaluate(from_source(source, None, "model_new.py"), problem.name, agent="modelnew")
    _passed(v)
