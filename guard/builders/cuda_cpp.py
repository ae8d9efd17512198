"""CUDA C++ (and plain C++) candidates with a torch binding, through torch's extension
loader. A source without ``PYBIND11_MODULE`` gets a generated binding for its entry
function.

Identical sources and flags share one build: the guard copies a finished build of the
candidate's own digest from the shared cache into the worker's folder (``hand_build``), which
the worker loads, else the worker builds in its own folder, and the guard then copies that
build into the cache with ``publish_build`` under the digest it computed itself
(``extension_digest``). A sandboxed candidate never sees the shared cache: its other builds
are other candidates' compiled kernels, of every workspace of the user (red team, session
39), and no candidate can replace another source's library there.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ..candidates.c_text import blanked, without_comments
from ..candidates.solution import framed
from .base import BuildError, write_sources
from .trim import trim_compiler_output

log = logging.getLogger(__name__)

EXT_PREFIX = "kernelarc_ext_"
BINDING_NAME = "kernelarc_binding.cpp"
COMPILE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")
MAX_LIBRARY_BYTES = 1 << 30
_DIGEST = re.compile(r"[0-9a-f]{16}")

# A host function's return type: names (with template arguments) and their * and &; matched on
# at most MAX_RETURN_TYPE characters before the name, so a crafted source costs linear time
_RETURN_TYPE = re.compile(r"[ \t]*((?:[\w:]+(?:<(?:[^;{}()<>]|<[^;{}()<>]*>)*>)?[\s\*&]+)+)")
MAX_RETURN_TYPE = 300
_PUNCTUATION = re.compile(r"[(){};]")
_BODY = re.compile(r"\s*\{")


def _closing_parens(text: str) -> dict[int, int]:
    """Each ``(`` whose ``)`` comes before any ``;``, ``{`` or ``}``, mapped to that ``)``: one
    pass over the text."""
    pairs: dict[int, int] = {}
    open_at: list[int] = []
    for m in _PUNCTUATION.finditer(text):
        c = m.group()
        if c == "(":
            open_at.append(m.start())
        elif c == ")":
            if open_at:
                pairs[open_at.pop()] = m.start()
        else:  # a declaration ends or a block begins: nothing before it is still open
            open_at.clear()
    return pairs


def _signature(text: str, symbol: str) -> tuple[str, str] | None:
    """The return type and parameters of the definition of host function ``symbol`` (not a
    ``__global__`` kernel of that name) in ``text``, or None. Linear in the text: a regular
    expression over the whole source once took quadratic time in the guard's own process,
    holding its other threads (a red team's 128 KB of ``a b(`` lines: 30 s)."""
    # structure is read with comments and literals blanked (same offsets): a ``;`` or ``(`` in
    # a comment above or inside the signature is not code; the parameters are taken from the
    # text itself, without their comments
    code = blanked(text)
    closing = _closing_parens(code)
    for m in re.finditer(rf"\b{re.escape(symbol)}\s*\(", code):
        close = closing.get(m.end() - 1)
        if close is None or _BODY.match(code, close + 1) is None:
            continue
        before = code[max(0, m.start() - MAX_RETURN_TYPE) : m.start()]
        # from a line start after the last ; { } (a declaration's beginning) on
        lines = before[max(before.rfind(c) for c in ";{}") + 1 :].split("\n")
        for k in range(len(lines)):  # the longest tail of whole lines that is a return type
            tail = "\n".join(lines[k:])
            ret = None if tail.lstrip().startswith("#") else _RETURN_TYPE.fullmatch(tail)
            if ret is not None:
                if "__global__" in ret.group(1):  # a kernel of that name, not the host function
                    break
                return " ".join(ret.group(1).split()), without_comments(text[m.end() : close]).strip()
    return None


def _binding_source(texts: list[str], symbol: str) -> str:
    for text in texts:
        found = _signature(text, symbol)
        if found is not None:
            ret, args = found
            return (
                "#include <torch/extension.h>\n"
                f"{ret} {symbol}({args});\n"
                "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
                f'  m.def("{symbol}", &{symbol});\n'
                "}\n"
            )
    raise BuildError(
        f"no host function {symbol}(...) found to bind; define it (returning torch::Tensor) "
        "or add your own PYBIND11_MODULE"
    )


@dataclass(frozen=True)
class _Plan:
    """What is compiled, as relative paths in the source folder, and the build's digest."""

    units: list[str]
    binding: str | None  # generated PYBIND11_MODULE source, when the candidate has none
    digest: str


def _plan(solution: dict[str, Any]) -> _Plan:
    """From the solution alone (no torch, no files), so that the guard computes the same
    digest as the worker without trusting what the worker says."""
    files: dict[str, str] = {}
    for src in solution["sources"]:
        files[posixpath.normpath(src["path"])] = src["content"]  # as write_sources lays them out
    symbol = solution["spec"]["entry_point"].split("::")[1]
    units = list(
        dict.fromkeys(
            posixpath.normpath(s["path"])
            for s in solution["sources"]
            if posixpath.splitext(s["path"])[1] in COMPILE_SUFFIXES
        )
    )
    if not units:
        raise BuildError("no .cu/.cpp source to compile")
    binding = None
    if not any("PYBIND11_MODULE" in files[u] for u in units):
        binding = _binding_source([files[u] for u in units], symbol)
        files[BINDING_NAME] = binding
        units.append(BINDING_NAME)
    opts = solution["spec"].get("compile_options") or {}
    # every part with its length: no two different sets of files and options make one key
    # (with separators alone, a file's content could end in the next file's name; red team)
    digest = hashlib.sha256(
        b"".join(framed(part) for rel in sorted(files) for part in (rel, files[rel])) + framed(repr(opts))
    ).hexdigest()[:16]
    return _Plan(units, binding, digest)


def extension_digest(solution: dict[str, Any]) -> str | None:
    """The cache key of a CUDA C++ solution's build (None when it cannot be built)."""
    try:
        return _plan(solution).digest
    except (BuildError, KeyError, IndexError, TypeError, AttributeError):
        return None


def _load_built(name: str, path: Path) -> ModuleType:
    """Import a finished extension without torch's loader, which would lock and maybe
    rebuild in its (here read-only) folder."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no loader for {path.name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CudaCppBuilder:
    languages = ("cuda_cpp",)

    def build(self, solution: dict[str, Any], srcdir: Path, builddir: Path, device: str) -> Callable[..., Any]:
        """``builddir``: the shared cache of finished builds (only read); a new build goes
        into ``build/`` beside ``srcdir``, in the worker's own folder."""
        import torch
        from torch.utils import cpp_extension

        plan = _plan(solution)
        write_sources(solution, srcdir)
        if plan.binding is not None:
            (srcdir / BINDING_NAME).write_text(plan.binding)
        symbol = solution["spec"]["entry_point"].split("::")[1]
        compile_units = [srcdir / u for u in plan.units]
        has_cuda_sources = any(p.suffix == ".cu" for p in compile_units)
        if has_cuda_sources and not torch.cuda.is_available():
            self._syntax_check(compile_units, srcdir)
            raise BuildError(
                "CUDA C++ compiles but cannot run here: this guard has no CUDA device",
                status="RUNTIME_ERROR",
            )
        opts = solution["spec"].get("compile_options") or {}
        name = EXT_PREFIX + plan.digest
        cached = Path(builddir) / plan.digest / f"{name}.so"
        own = srcdir.parent / "build" / plan.digest
        if cached.is_file():
            try:
                module = _load_built(name, cached)
            except ImportError as exc:
                raise BuildError(f"loading the cached build failed: {exc}") from None
        else:
            own.mkdir(parents=True, exist_ok=True)
            cuda_flags = list(opts.get("cuda_cflags") or ["-O3"])
            if has_cuda_sources and not any("arch" in f for f in cuda_flags):
                major, minor = torch.cuda.get_device_capability()
                cuda_flags.append(f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}")
            try:
                module = cpp_extension.load(
                    name=name,
                    sources=[str(p) for p in compile_units],
                    extra_cflags=list(opts.get("cflags") or ["-O3"]),
                    extra_cuda_cflags=cuda_flags,
                    extra_ldflags=list(opts.get("ld_flags") or []),
                    build_directory=str(own),
                    verbose=False,
                )
            except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
                text = str(exc)
                out = getattr(exc, "output", None)
                if isinstance(out, (bytes, str)):
                    text += "\n" + (out.decode(errors="replace") if isinstance(out, bytes) else out)
                raise BuildError(trim_compiler_output(text, [srcdir, own])) from None
        fn: object = getattr(module, symbol, None)
        if not callable(fn):
            raise BuildError(f"the extension exports no function {symbol!r}")
        return fn

    @staticmethod
    def _syntax_check(units: list[Path], srcdir: Path) -> None:
        """Without a GPU, still report compile errors: nvcc -fsyntax-only style check."""
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            return
        from torch.utils import cpp_extension

        import sysconfig

        includes = [f"-I{p}" for p in cpp_extension.include_paths()]
        includes.append(f"-I{sysconfig.get_paths()['include']}")
        for unit in units:
            if unit.suffix != ".cu":
                continue
            proc = subprocess.run(
                [nvcc, "-std=c++17", "-c", "-o", "/dev/null", *includes, str(unit)],
                capture_output=True,
                text=True,
                timeout=300,
                cwd=srcdir,
            )
            if proc.returncode != 0:
                text = proc.stdout + proc.stderr
                missing = re.findall(r"^(\S+?):\d+:\d+: fatal error: (\S+): No such file", text, re.M)
                if missing and all(not f.startswith(str(srcdir)) for f, _ in missing):
                    # the machine's toolkit lacks a header torch needs: not the candidate's fault
                    raise BuildError(
                        "CUDA C++ cannot be built or run here: no CUDA device, and this machine's "
                        f"CUDA toolkit lacks {missing[0][1]} (needed by torch's headers)",
                        status="RUNTIME_ERROR",
                    )
                raise BuildError(trim_compiler_output(text, [srcdir]))


def publish_build(worker_dir: Path, digest: str, cache: Path) -> bool:
    """Copy the extension that the candidate worker in ``worker_dir`` built for ``digest``
    into the shared ``cache``, where later workers load it read-only. The guard calls it
    with the digest it computed from the solution itself (``extension_digest``), never one
    a worker reported, so a worker cannot plant a library under another source's digest.
    Returns whether the cache has the build now."""
    if not _DIGEST.fullmatch(digest or ""):
        raise ValueError(f"not a build digest: {digest!r}")
    cache = Path(cache)
    name = f"{EXT_PREFIX}{digest}.so"
    target = cache / digest
    if (target / name).is_file():
        return True
    data = _read_own_file(Path(worker_dir) / "build" / digest / name, Path(worker_dir))
    if data is None:
        return False
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=cache))
    try:
        (tmp / name).write_bytes(data)
        os.chmod(tmp / name, 0o755)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, target)  # whole folder at once: a reader never sees half a library
        except OSError:
            if not (target / name).is_file():  # not another publisher's: a stale folder
                log.warning("cannot publish build %s: %s exists without %s", digest, target, name)
                return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def hand_build(cache: Path, digest: str, worker_dir: Path) -> Path | None:
    """Copy the finished build of ``digest`` from the shared ``cache`` into a new folder of the
    worker's own, and return that folder (the ``builddir`` its builder reads: ``<it>/<digest>/``);
    None when the cache has no such build or it cannot be copied (the worker then builds).
    The folder's name is new and random, and made with ``mkdir``, which never follows a link:
    the worker controls its folder and could have left one there."""
    if not _DIGEST.fullmatch(digest or ""):
        raise ValueError(f"not a build digest: {digest!r}")
    name = f"{EXT_PREFIX}{digest}.so"
    data = _read_own_file(Path(cache) / digest / name, Path(cache))
    if data is None:
        return None
    folder = Path(worker_dir) / f".built-{os.urandom(8).hex()}"
    try:
        os.mkdir(folder, 0o755)
        os.mkdir(folder / digest, 0o755)
        fd = os.open(folder / digest / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except OSError as exc:
        log.warning("the cached build %s was not handed to the worker: %s", digest, exc)
        return None
    return folder


def _read_own_file(path: Path, root: Path) -> bytes | None:
    """The bytes of ``path`` if it is a plain file really inside ``root``: a worker controls
    its folder, and could leave a link (or a hard link) to a file of the guard's there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        real = os.readlink(f"/proc/self/fd/{fd}")
        inside = real.startswith(os.path.realpath(root) + os.sep)
        if not (stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and inside and st.st_size <= MAX_LIBRARY_BYTES):
            log.warning("not publishing %s: not a plain file of the worker's own", path)
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_LIBRARY_BYTES + 1)
    finally:
        os.close(fd)
