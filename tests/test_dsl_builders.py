"""CuTe DSL, cuTile and TileLang: builders behind the registry, the languages in solutions, and
the error paths a machine without the packages or without a suitable GPU takes (all on the
CPU; the kernels themselves run on a GPU only)."""

from __future__ import annotations

import ast
import json

import pytest
from pydantic import ValidationError

from guard.builders import BuildError, dsl, dsl_refusal, get_builder
from guard.builders.dsl import DslBuilder, Requirement, refusal
from guard.candidates.load import from_solution_json, from_source, guess_language
from guard.candidates.solution import normalize_language
from guard.cascade import GuardError
from guard.export.sol_solution import export_solution

from helpers import RMS, make_guard

PACKAGES = {"cute_dsl": "nvidia-cutlass-dsl", "cutile": "cuda-tile", "tilelang": "tilelang"}
MISSING = Requirement(
    language="fakedsl", title="FakeDSL", package="kernelarc-no-such-package", module="kernelarc_no_such_module"
)
PRESENT = Requirement(language="fakedsl", title="FakeDSL", package="pydantic", module="pydantic")


class _Fake(DslBuilder):
    def __init__(self, req: Requirement):
        self.requirement = req


@pytest.mark.parametrize("language", sorted(PACKAGES))
def test_each_dsl_has_its_builder_and_package(language):
    builder = get_builder(language)
    assert isinstance(builder, DslBuilder) and builder.languages == (language,)
    assert builder.requirement.package == PACKAGES[language]
    assert type(builder).__module__ == f"guard.builders.{language}"


def test_languages_normalize_and_are_detected_from_imports():
    assert [normalize_language(x) for x in ("CuTe-DSL", "cuda_tile", "tile_lang")] == ["cute_dsl", "cutile", "tilelang"]
    with pytest.raises(ValueError, match="cute_dsl, cutile, tilelang"):
        normalize_language("cudnn_frontend")
    assert guess_language("import cutlass.cute as cute\nimport torch\n", "k.py") == "cute_dsl"
    assert guess_language("import cuda.tile as ct\n", "k.py") == "cutile"
    assert guess_language("from cuda import tile\n", "k.py") == "cutile"
    assert guess_language("import tilelang\nimport tilelang.language as T\n", "k.py") == "tilelang"
    assert guess_language("import triton\n# cutlass in a comment\n", "k.py") == "triton"
    sol = from_solution_json(
        json.dumps(
            {
                "name": "jamba",
                "spec": {"languages": ["cute_dsl"], "entry_point": "kernel.py::run"},
                "sources": [{"path": "kernel.py", "content": "import cutlass\n\ndef run(x, out):\n    pass\n"}],
            }
        )
    )
    assert sol.spec.primary_language == "cute_dsl"
    assert from_source("import cuda.tile as ct\n\ndef run(x):\n    return x\n").spec.primary_language == "cutile"


def test_a_missing_package_is_named_with_the_extra_that_installs_it():
    msg = refusal(MISSING, "cuda")
    assert "kernelarc-no-such-package" in msg and "pip install 'kernelarc-mcp[dsl]'" in msg
    with pytest.raises(BuildError) as exc:
        _Fake(MISSING).build({}, None, None, "cpu")
    assert exc.value.status == "COMPILE_ERROR" and "kernelarc-mcp[dsl]" in str(exc.value)
    for language, package in PACKAGES.items():  # none of them is installed on this machine
        if not dsl.package_installed(package, get_builder(language).requirement.module):
            assert package in dsl_refusal(language, "cuda")
    assert dsl_refusal("pytorch", "cpu") is None and dsl_refusal("cuda_cpp", "cpu") is None


def test_a_device_the_dsl_cannot_run_on_is_said_so():
    assert "run on an NVIDIA GPU only" in refusal(PRESENT, "cpu")
    with pytest.raises(BuildError) as exc:
        _Fake(PRESENT).build({}, None, None, "cpu")
    assert exc.value.status == "RUNTIME_ERROR"
    cutile = get_builder("cutile").requirement
    volta = dsl.unsupported_device(cutile, "cuda", (7, 0))
    assert "compute capability 7.0" in volta and "tileiras 13.3" in volta
    for capability in ((8, 0), (9, 0), (10, 0), (12, 0)):  # Hopper since tileiras 13.3
        assert dsl.unsupported_device(cutile, "cuda", capability) is None
    assert dsl.unsupported_device(get_builder("cute_dsl").requirement, "cuda", (9, 0)) is None


def test_a_supported_setup_builds_through_the_python_builder(tmp_path, monkeypatch):
    monkeypatch.setattr(dsl, "_capability", lambda device: (9, 0))
    solution = {
        "spec": {"entry_point": "k.py::run"},
        "sources": [{"path": "k.py", "content": "def run(x):\n    return x + 1\n"}],
    }
    fn = _Fake(PRESENT).build(solution, tmp_path / "src", tmp_path / "build", "cuda:0")
    assert fn(1) == 2
    only_blackwell = Requirement(
        language="fakedsl", title="FakeDSL", package="pydantic", module="pydantic", capability_majors=(10,)
    )
    with pytest.raises(BuildError, match="does not run on this GPU"):
        _Fake(only_blackwell).build(solution, tmp_path / "src2", tmp_path / "build", "cuda:0")


def test_guard_refuses_a_dsl_it_cannot_judge_and_records_nothing(tmp_path):
    g = make_guard(tmp_path / "ws")
    try:
        sol = from_source("import cutlass.cute as cute\n\ndef run(x, w):\n    return x\n", None, "kernel.py")
        assert sol.spec.primary_language == "cute_dsl"
        with pytest.raises(GuardError, match=r"nvidia-cutlass-dsl.*kernelarc-mcp\[dsl\]"):
            g.evaluate(sol, RMS, agent="a")
        assert g.db.candidates_for(RMS) == []
    finally:
        g.close()


def test_dsl_solutions_export_to_sol_execbench_where_it_has_the_language():
    src = [{"path": "kernel.py", "content": "import cuda.tile as ct\n\ndef run(x, out):\n    pass\n"}]
    for lang in ("cute_dsl", "cutile"):
        spec = {"languages": [lang], "entry_point": "kernel.py::run"}
        sol = from_solution_json(json.dumps({"name": "s", "spec": spec, "sources": src}))
        assert export_solution(sol, "c-1", "p", "a").spec.languages == [lang]
    spec = {"languages": ["tilelang"], "entry_point": "kernel.py::run"}
    tile = from_solution_json(json.dumps({"name": "s", "spec": spec, "sources": src}))
    with pytest.raises(ValidationError):  # not a SOL-ExecBench language
        export_solution(tile, "c-1", "p", "a")


# -- the seed kernels in the three DSLs (judged on a GPU by benchmarks/dsl_seeds.py) ------------
def test_dsl_seeds_are_found_and_pass_the_screen_without_the_dsls():
    from benchmarks import dsl_seeds
    from guard.problems.problem import load_problem
    from guard.screen import screen_solution

    seeds = dsl_seeds.seed_files()
    assert sorted(seeds) == sorted(PACKAGES)
    problem = load_problem(seeds["cutile"].parent, origin="seed")
    assert set(problem.seed_kernels()) >= {p.name for p in seeds.values()}
    for language, path in seeds.items():
        source = path.read_text()
        sol = from_source(source, None, path.name)  # the language is told by the imports
        assert sol.spec.primary_language == language
        tree = ast.parse(source)
        run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
        assert [a.arg for a in run.args.args] == list(problem.definition.inputs)
        result = screen_solution(sol, 256_000, 16)
        assert result.ok, (language, result.message())
    if not any(dsl.package_installed(p, get_builder(lang).requirement.module) for lang, p in PACKAGES.items()):
        assert dsl_seeds.cutlass_path_fix() is None  # nothing to add without the package


def test_dsl_seeds_table_says_what_ran_and_what_did_not():
    from benchmarks import dsl_seeds

    result = {
        "date": "2026-12-01T00:00:00+00:00",
        "problem": dsl_seeds.PROBLEM,
        "device": {"name": "GPU"},
        "languages": {
            "triton": {
                "seed": "seed_triton.py",
                "status": "PASSED",
                "median_ms": 0.0123,
                "eager_median_ms": 0.05,
                "speedup_eager": 4.0,
                "wall_s": 20,
            },
            "tilelang": {
                "seed": "seed_tilelang.py",
                "versions": {"tilelang": "0.1.15"},
                "status": "PASSED",
                "median_ms": 0.0101,
                "eager_median_ms": 0.05,
                "speedup_eager": 4.9,
                "wall_s": 40,
            },
            "cute_dsl": {
                "seed": "seed_cute_dsl.py",
                "versions": {"nvidia-cutlass-dsl": None},
                "status": "NOT_INSTALLED",
                "reason": "need the package nvidia-cutlass-dsl",
            },
        },
    }
    table = dsl_seeds.render(result)
    assert "| TileLang | seed_tilelang.py | tilelang 0.1.15 | PASSED | 10.1 | 50.0 | 4.90x | 40 |" in table
    assert "- CuTe DSL: NOT_INSTALLED: need the package nvidia-cutlass-dsl" in table
    assert dsl_seeds.line("tilelang", result["languages"]["tilelang"]) == "tilelang: PASSED 10.1 us/call (40 s)"
    later = {
        "date": "2026-12-01T01:00:00+00:00",
        "problem": dsl_seeds.PROBLEM,
        "languages": {
            "tilelang": {"status": "NOT_INSTALLED", "reason": "not carried in this call"},
            "cute_dsl": {"seed": "seed_cute_dsl.py", "status": "PASSED", "median_ms": 0.009, "wall_s": 30},
        },
    }
    merged = dsl_seeds.merge([result, later])["languages"]
    assert merged["tilelang"]["status"] == "PASSED" and merged["cute_dsl"]["status"] == "PASSED"
