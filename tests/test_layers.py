"""The layers of the code base, read from its imports (``ast``, imports inside functions
included, so that a late import cannot hide a cycle):

- the modules of ``kernelarc_mcp`` import each other without a cycle;
- the top-level packages import each other without a cycle (the launcher and the server do
  not import each other), and the server's modules do not import the launcher;
- ``guard`` imports neither ``kernelarc_mcp`` nor ``launcher``;
- nothing outside ``tests/`` imports the tests.

The checker is tried once on a small package with a cycle, so that a check that finds
nothing is known to be able to find something.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("kernelarc_mcp", "guard", "memory", "playbooks", "seeds", "launcher", "wholemodel", "benchmarks")
# the modules that make up the MCP server (the rest of kernelarc_mcp is the command line,
# which may start a swarm and so import the launcher)
SERVER = (
    "kernelarc_mcp.server",
    "kernelarc_mcp.service",
    "kernelarc_mcp.serving",
    "kernelarc_mcp.views",
    "kernelarc_mcp.compact",
)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file of ``packages`` under ``root``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            found[module_name(root, path)] = path
    return found


def imported_names(name: str, path: Path) -> set[str]:
    """Every module name the file imports, anywhere in it, with relative imports resolved
    (``from x import y`` gives both ``x`` and ``x.y``: ``y`` may be a module)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            out.add(origin)
            out.update(f"{origin}.{alias.name}" for alias in node.names)
    return out


def resolve(imported: str, known: set[str]) -> str | None:
    """The known module an import name stands for: itself, or its nearest known parent."""
    parts = imported.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Module -> the modules of the same packages it imports (itself left out)."""
    found = modules(root, packages)
    known = set(found)
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        targets = {resolve(i, known) for i in imported_names(name, path)}
        graph[name] = {t for t in targets if t and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Top-level package -> the other top-level packages its modules import."""
    out: dict[str, set[str]] = {}
    for name, targets in graph.items():
        top = name.split(".")[0]
        out.setdefault(top, set()).update(t.split(".")[0] for t in targets if t.split(".")[0] != top)
    return out


def imports_between(graph: dict[str, set[str]], sources: tuple[str, ...], targets: tuple[str, ...]) -> list[str]:
    def within(name: str, prefixes: tuple[str, ...]) -> bool:
        return any(name == p or name.startswith(p + ".") for p in prefixes)

    return sorted(f"{s} -> {t}" for s, ts in graph.items() if within(s, sources) for t in ts if within(t, targets))


def test_checker_finds_a_cycle_hidden_in_a_function(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("from . import helpers\n")
    (pkg / "helpers.py").write_text("def late():\n    from .sub.cmd import run\n    return run\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "cmd.py").write_text("from ..cli import main\n")
    (pkg / "leaf.py").write_text("import os\nfrom pkg import helpers\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.sub.cmd"] == {"pkg.cli"}
    assert graph["pkg.leaf"] == {"pkg", "pkg.helpers"}
    assert cycles(graph) == [["pkg.cli", "pkg.helpers", "pkg.sub.cmd"]]
    (pkg / "sub" / "cmd.py").write_text("def main():\n    return 0\n")
    assert cycles(import_graph(tmp_path, ["pkg"])) == []


def test_checker_names_imports_between_layers():
    graph = {"a.x": {"b.y", "a.z"}, "a.z": set(), "b.y": {"a.z"}}
    assert imports_between(graph, ("a",), ("b",)) == ["a.x -> b.y"]
    assert cycles(package_graph(graph)) == [["a", "b"]]


def test_kernelarc_mcp_has_no_import_cycle():
    assert cycles(import_graph(REPO, ["kernelarc_mcp"])) == []


def test_packages_import_each_other_without_a_cycle():
    graph = import_graph(REPO, PACKAGES)
    assert cycles(package_graph(graph)) == []
    assert imports_between(graph, ("launcher",), ("kernelarc_mcp",)) == []
    assert imports_between(graph, SERVER, ("launcher",)) == []


def test_guard_imports_neither_the_server_nor_the_launcher():
    graph = import_graph(REPO, PACKAGES)
    assert imports_between(graph, ("guard",), ("kernelarc_mcp", "launcher")) == []


def test_nothing_outside_the_tests_imports_them():
    """Also the names a script reaches by putting ``tests/`` on ``sys.path`` (``conftest``,
    ``serving.util``): every top-level name under ``tests/``."""
    test_names = {"tests"} | {p.stem for p in (REPO / "tests").iterdir() if p.suffix == ".py" or p.is_dir()}
    offenders = []
    for name, path in modules(REPO, PACKAGES).items():
        for imported in imported_names(name, path):
            top = imported.split(".")[0]
            if top in test_names and top not in PACKAGES:
                offenders.append(f"{name} -> {imported}")
    assert offenders == []


def test_the_server_and_the_cascade_load_without_torch():
    """torch belongs to the workers: the server, the guard's cascade and the worker protocol
    load without it (importing torch costs seconds of every server's start-up, and a module
    that pulled it in unnoticed made start-up 11 s at load 7)."""
    import subprocess
    import sys

    code = (
        "import sys, kernelarc_mcp.serving.http, guard.cascade, guard.runner.messages; "
        "print([m for m in ('torch', 'triton', 'numpy') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert "torch" not in out.stdout, out.stdout


def test_python_sources_are_parsed_behind_the_parsers_lock():
    """CPython 3.11's ``ast.parse`` fails ("AST constructor recursion depth mismatch") when two
    threads parse at once, and a server takes tool calls on several threads: a swarm's agent
    lost a submission to it. Every parse of the project's own code goes through
    ``guard.pyparse.parse``, which holds one lock."""
    import re

    repo = Path(__file__).resolve().parents[1]
    direct = []
    for package in ("guard", "kernelarc_mcp", "launcher", "memory", "playbooks", "wholemodel"):
        for path in (repo / package).rglob("*.py"):
            if path.name == "pyparse.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\bast\.parse\(", line):
                    direct.append(f"{path.relative_to(repo)}:{n}")
    assert not direct, direct
