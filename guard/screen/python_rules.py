"""Banned constructs in Python candidates, found on the syntax tree."""

from __future__ import annotations

import ast
import codecs
import io
import tokenize

from . import cpp_rules
from .findings import Finding
from ..pyparse import parse

BANNED_MODULES = {
    "threading": "threads run work outside the timed call",
    "_thread": "threads run work outside the timed call",
    "concurrent": "threads/processes run work outside the timed call",
    "multiprocessing": "other processes run work outside the timed call",
    "subprocess": "other processes are not allowed",
    "asyncio": "deferred work is not allowed",
    "sched": "deferred work is not allowed",
    "socket": "network access is not allowed",
    "signal": "signal handlers are not allowed",
    "ctypes": "raw memory access is not allowed",
    "cffi": "raw memory access is not allowed",
    "gc": "walking the garbage collector is not allowed",
    "inspect": "reading frames is not allowed",
    "importlib": "dynamic imports are not allowed",
    "builtins": "changing builtins is not allowed",
    "pickle": "unpickling is not allowed",
    "marshal": "loading code objects is not allowed",
    "os": "the environment, files and processes are off limits",
    "sys": "the interpreter's internals are off limits",
    "pathlib": "reading files is not allowed",
    "io": "reading files is not allowed",
    "shutil": "file access is not allowed",
    "tempfile": "file access is not allowed",
    "glob": "file access is not allowed",
    "mmap": "file access is not allowed",
    "fcntl": "file access is not allowed",
    "guard": "the guard's own code is off limits",
    "kernelarc_mcp": "the server's code is off limits",
    "launcher": "the launcher's code is off limits",
    "wholemodel": "not for kernels",
    "time": "timers are the guard's; a kernel needs none",
    "timeit": "timers are the guard's; a kernel needs none",
    "atexit": "exit hooks are not allowed",
    "faulthandler": "not allowed in a kernel",
    "resource": "not allowed in a kernel",
    "traceback": "reading frames is not allowed",
    "contextlib": "suppressing errors hides a failing kernel",
    "unittest": "mocking is not allowed",
    "urllib": "network access is not allowed",
    "http": "network access is not allowed",
    "requests": "network access is not allowed",
    "runpy": "running other code is not allowed",
    "code": "running other code is not allowed",
}
BANNED_CALLS = {
    "open": "reading or writing files is not allowed",
    "eval": "eval is not allowed",
    "exec": "exec is not allowed",
    "compile": "compiling Python code at run time is not allowed",
    "__import__": "dynamic imports are not allowed",
    "globals": "reaching into module namespaces is not allowed",
    "locals": "reaching into frames is not allowed",
    "vars": "reaching into namespaces is not allowed",
    "setattr": "setting attributes by name can patch torch or the harness",
    "delattr": "deleting attributes can patch torch or the harness",
    "breakpoint": "not allowed",
    "input": "not allowed",
    "exit": "exiting the process is not allowed",
    "quit": "exiting the process is not allowed",
}
BANNED_ATTRIBUTES = {
    # frames and interpreter internals: where the answer or the harness could be found
    **{
        a: "reading frames is not allowed"
        for a in (
            "f_back",
            "f_locals",
            "f_globals",
            "f_code",
            "f_builtins",
            "gi_frame",
            "cr_frame",
            "tb_frame",
            "tb_next",
            "_getframe",
            "currentframe",
            "getouterframes",
            "settrace",
            "setprofile",
        )
    },
    **{
        a: "introspecting objects' internals is not allowed"
        for a in (
            "__globals__",
            "__builtins__",
            "__subclasses__",
            "__bases__",
            "__base__",
            "__mro__",
            "__dict__",
            "__code__",
            "__closure__",
            "__getattribute__",
            "__import__",
            "__loader__",
            "__spec__",
            "__reduce__",
            "__reduce_ex__",
        )
    },
    **{
        a: "walking the garbage collector is not allowed"
        for a in (
            "get_objects",
            "get_referrers",
            "get_referents",
        )
    },
    # the interpreter's modules reached as attributes of allowed ones (torch.sys, typing.sys,
    # torch.os, len.__self__ for builtins): what the banned imports would have given
    **{
        a: "the interpreter's modules are off limits, through another module too"
        for a in ("sys", "os", "builtins", "__self__")
    },
    # environment, files and processes
    **{a: "the environment is off limits" for a in ("environ", "getenv", "putenv", "unsetenv")},
    **{
        a: "other processes are not allowed"
        for a in (
            "popen",
            "fork",
            "forkpty",
            "execv",
            "execve",
            "execvp",
            "spawnv",
            "_exit",
        )
    },
    **{
        a: "reading files is not allowed"
        for a in (
            "read_text",
            "read_bytes",
            "write_text",
            "write_bytes",
            "listdir",
            "scandir",
            "fromfile",
            "tofile",
        )
    },
    # streams and dispatch: work outside the timed stream, or torch patched underneath
    **{
        a: "new CUDA streams are not allowed: work must run on the current stream"
        for a in (
            "Stream",
            "ExternalStream",
            "stream",
            "set_stream",
            "cuStreamCreate",
            "cudaStreamCreate",
            "cudaStreamCreateWithFlags",
            "cuStreamCreateWithPriority",
            "cudaStreamCreateWithPriority",
        )
    },
    **{
        a: "torch function/dispatch modes and tensor subclasses are not allowed"
        for a in (
            "TorchFunctionMode",
            "TorchDispatchMode",
            "_make_subclass",
            "as_subclass",
            "_set_torch_function_mode",
            "_push_on_torch_function_stack",
            "_push_on_torch_dispatch_stack",
        )
    },
    "_C": "torch's C internals are off limits",
}
# Names too common to ban everywhere (torch.stack, model.modules()), banned where they
# mean what a cheat would use them for.
BANNED_DOTTED = {
    "inspect.stack": "reading frames is not allowed",
    "sys.modules": "sys.modules is off limits",
    "os.walk": "reading files is not allowed",
    "os.system": "other processes are not allowed",
    "os.kill": "other processes are not allowed",
    "os.abort": "exiting the process is not allowed",
    "torch.load": "reading files is not allowed",
    "torch.save": "writing files is not allowed",
    "numpy.load": "reading files is not allowed",
    "numpy.save": "writing files is not allowed",
    "torch.hub": "downloads are not allowed",
}
# The workspace's own names: a kernel has no reason to spell them.
SUSPICIOUS_STRINGS = ("KERNELARC_", "secret.key", "workspace.db", ".kernelarc")


def foreign_encoding(path: str, source: str) -> Finding | None:
    """A coding declaration other than UTF-8. The worker writes the source as UTF-8 and Python
    imports it by its declaration: under ``# -*- coding: utf-7 -*-`` what this screen reads as
    a comment is code there (red team, session 42: ``import os`` and a frame walk, hidden so,
    were ACCEPTed)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source.encode()).readline)
    except SyntaxError as exc:  # an unknown codec named
        return Finding(path, 1, "encoding", f"sources are UTF-8: {exc}")
    if codecs.lookup(encoding).name not in ("utf-8", "utf-8-sig"):
        return Finding(path, 1, "encoding", f"sources are UTF-8: a declared coding of {encoding!r} is not allowed")
    return None


def syntax_error(path: str, source: str) -> Finding | None:
    try:
        parse(source, filename=path)
    except SyntaxError as exc:
        return Finding(path, exc.lineno or 0, "syntax", f"syntax error: {exc.msg}")
    except ValueError as exc:  # null bytes
        return Finding(path, 0, "syntax", f"cannot parse: {exc}")
    return None


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


# torch.utils.cpp_extension.load_inline's source arguments (keyword, position): their C++
# text gets the rules of a .cu candidate
INLINE_SOURCES = {"cpp_sources": 1, "cuda_sources": 2, "sycl_sources": None}


class _Visitor(ast.NodeVisitor):
    def __init__(self, path: str, strings: dict[str, ast.Constant] | None = None):
        self.path = path
        self.findings: list[Finding] = []
        self.aliases: dict[str, str] = {}  # local name -> dotted module/object path
        self.strings = strings or {}  # module-level NAME = "literal"

    def add(self, node: ast.AST, rule: str, message: str) -> None:
        self.findings.append(Finding(self.path, getattr(node, "lineno", 0), rule, message))

    def _check_module(self, node: ast.AST, module: str) -> None:
        root = module.split(".")[0]
        if root in BANNED_MODULES:
            self.add(node, "import", f"import of {module!r}: {BANNED_MODULES[root]}")
        if module.startswith("torch.multiprocessing"):
            self.add(node, "import", "other processes are not allowed")

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._check_module(node, a.name)
            self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            self.add(node, "import", "relative imports are not allowed in a candidate")
        self._check_module(node, module)
        for a in node.names:
            full = f"{module}.{a.name}" if module else a.name
            self._check_module(node, full)
            if a.name in BANNED_ATTRIBUTES:
                self.add(node, "attribute", f"{a.name}: {BANNED_ATTRIBUTES[a.name]}")
            if a.name in BANNED_CALLS:
                self.add(node, "call", f"{a.name}: {BANNED_CALLS[a.name]}")
            self.aliases[a.asname or a.name] = full
        self.generic_visit(node)

    def _resolve(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        base = self.aliases.get(head, head)
        return f"{base}.{rest}" if rest else base

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in BANNED_ATTRIBUTES:
            self.add(node, "attribute", f".{node.attr}: {BANNED_ATTRIBUTES[node.attr]}")
        dotted = _dotted(node)
        if dotted:
            full = self._resolve(dotted)
            for banned, why in BANNED_DOTTED.items():
                if full == banned or full.startswith(banned + "."):
                    self.add(node, "call", f"{dotted}: {why}")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in ("__builtins__", "__import__", "__loader__", "__spec__"):
            self.add(node, "attribute", f"{node.id}: interpreter internals are off limits")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in BANNED_CALLS:
            self.add(node, "call", f"{node.func.id}(): {BANNED_CALLS[node.func.id]}")
        if isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            name = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                self.add(node, "call", f"{node.func.id}() with a computed name is not allowed")
            elif name.value in BANNED_ATTRIBUTES or name.value.startswith("__"):
                self.add(node, "attribute", f"{node.func.id}(..., {name.value!r}) is not allowed")
        dotted = _dotted(node.func)
        if dotted and self._resolve(dotted).split(".")[-1] == "load_inline":
            self._check_inline_sources(node)
        self.generic_visit(node)

    def _check_inline_sources(self, node: ast.Call) -> None:
        """The C++ of a load_inline call, where it is literal text (or a module-level name
        bound to it), screened as a .cu file is; findings at the Python file's lines."""
        values = [k.value for k in node.keywords if k.arg in INLINE_SOURCES]
        values += [node.args[i] for i in (1, 2) if len(node.args) > i]
        texts: list[tuple[int, str]] = []
        for v in values:
            for item in v.elts if isinstance(v, (ast.List, ast.Tuple)) else [v]:
                if isinstance(item, ast.Name):
                    item = self.strings.get(item.id, item)
                if isinstance(item, ast.Constant) and isinstance(item.value, str):
                    texts.append((item.lineno, item.value))
        for lineno, text in texts:
            for f in cpp_rules.check(self.path, text):
                if f.rule != "workspace":  # Python strings are checked for those already
                    self.findings.append(
                        Finding(self.path, lineno + f.line - 1, f.rule, f"load_inline C++: {f.message}")
                    )

    def _check_target(self, target: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._check_target(elt)
            return
        if isinstance(target, (ast.Attribute, ast.Subscript)):
            root = _root_name(target)
            if root in self.aliases:
                dotted = _dotted(target) if isinstance(target, ast.Attribute) else root
                self.add(
                    target,
                    "monkey-patch",
                    f"assignment to {dotted}: changing imported modules (monkey-patching) is not allowed",
                )

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._check_target(t)
        # `G = torch.cuda.CUDAGraph` makes G an alias: `G.replay = f` is monkey-patching too
        if isinstance(node.value, (ast.Attribute, ast.Name)) and _root_name(node.value) in self.aliases:
            dotted = _dotted(node.value)
            for t in node.targets:
                if isinstance(t, ast.Name) and dotted:
                    self.aliases[t.id] = self._resolve(dotted)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self._check_target(t)
        self.generic_visit(node)

    def visit_Try(self, node: ast.AST) -> None:
        self.add(
            node,
            "try",
            "try/except is not allowed: a fallback (to the reference or anything else) would hide a failing kernel",
        )
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            dotted = _dotted(base) or ""
            full = self._resolve(dotted) if dotted else ""
            if full.endswith("Tensor") or full.endswith("Parameter"):
                self.add(node, "subclass", f"class {node.name}({dotted}): tensor subclasses are not allowed")
            if full.endswith("TorchFunctionMode") or full.endswith("TorchDispatchMode"):
                self.add(node, "subclass", f"class {node.name}: torch modes are not allowed")
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in (
                "__torch_function__",
                "__torch_dispatch__",
            ):
                self.add(item, "subclass", f"{item.name} overrides torch dispatch; not allowed")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            for s in SUSPICIOUS_STRINGS:
                if s in node.value:
                    self.add(node, "workspace", f"string mentions {s!r}: the workspace is off limits")
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        for n in node.names:
            if n in self.aliases:
                self.add(node, "monkey-patch", f"rebinding imported name {n!r} is not allowed")
        self.generic_visit(node)


def check(path: str, source: str) -> list[Finding]:
    tree = parse(source, filename=path)
    strings = {
        t.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    v = _Visitor(path, strings)
    v.visit(tree)
    # one finding per (line, rule) keeps the message short
    seen, out = set(), []
    for f in v.findings:
        if (f.line, f.rule, f.message) not in seen:
            seen.add((f.line, f.rule, f.message))
            out.append(f)
    return out
