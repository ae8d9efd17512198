"""CUDA C++ (and plain C++) candidates with a torch binding, through torch's extension
loader. A source without ``PYBIND11_MODULE`` gets a generated binding for its entry
function."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from .base import BuildError, write_sources
from .trim import trim_compiler_output

_SIGNATURE = re.compile(
    r"^[ \t]*((?:[\w:]+(?:<[^;{}()]*>)?[\s\*&]+)+?)(\w+)\s*\(([^;{}]*?)\)\s*\{", re.M
)


def _binding_source(sources: list[Path], symbol: str) -> str:
    for path in sources:
        text = path.read_text()
        for m in _SIGNATURE.finditer(text):
            if m.group(2) == symbol and "__global__" not in m.group(1):
                ret, args = m.group(1).strip(), m.group(3).strip()
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


class CudaCppBuilder:
    languages = ("cuda_cpp",)

    def build(self, solution: dict, srcdir: Path, builddir: Path, device: str) -> Callable:
        import torch
        from torch.utils import cpp_extension

        paths = write_sources(solution, srcdir)
        symbol = solution["spec"]["entry_point"].split("::")[1]
        compile_units = [p for p in paths if p.suffix in (".cu", ".cpp", ".cc", ".cxx", ".c")]
        if not compile_units:
            raise BuildError("no .cu/.cpp source to compile")
        if not any("PYBIND11_MODULE" in p.read_text() for p in compile_units):
            binding = srcdir / "kernelarc_binding.cpp"
            binding.write_text(_binding_source(compile_units, symbol))
            compile_units.append(binding)
        has_cuda_sources = any(p.suffix == ".cu" for p in compile_units)
        if has_cuda_sources and not torch.cuda.is_available():
            self._syntax_check(compile_units, srcdir)
            raise BuildError(
                "CUDA C++ compiles but cannot run here: this guard has no CUDA device",
                status="RUNTIME_ERROR",
            )
        opts = solution["spec"].get("compile_options") or {}
        everything = sorted(set(paths) | set(compile_units))
        digest = hashlib.sha256(
            b"".join(str(p.relative_to(srcdir)).encode() + b"\0" + p.read_bytes() for p in everything)
            + repr(opts).encode()
        ).hexdigest()[:16]
        # Identical sources and flags share one build folder (torch locks it while building),
        # so a resubmission or a parallel pre-build does not compile again. The sources are
        # copied there so that their paths, and so ninja's commands, are the same each time.
        builddir = builddir / digest
        stable = builddir / "src"
        if not stable.exists():
            shutil.copytree(srcdir, stable, dirs_exist_ok=True)
        compile_units = [stable / p.relative_to(srcdir) for p in compile_units]
        cuda_flags = list(opts.get("cuda_cflags") or ["-O3"])
        if has_cuda_sources and not any("arch" in f for f in cuda_flags):
            major, minor = torch.cuda.get_device_capability()
            cuda_flags.append(f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}")
        try:
            module = cpp_extension.load(
                name=f"kernelarc_ext_{digest}",
                sources=[str(p) for p in compile_units],
                extra_cflags=list(opts.get("cflags") or ["-O3"]),
                extra_cuda_cflags=cuda_flags,
                extra_ldflags=list(opts.get("ld_flags") or []),
                build_directory=str(builddir),
                verbose=False,
            )
        except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
            text = str(exc)
            out = getattr(exc, "output", None)
            if isinstance(out, (bytes, str)):
                text += "\n" + (out.decode(errors="replace") if isinstance(out, bytes) else out)
            raise BuildError(trim_compiler_output(text, [stable, srcdir, builddir])) from None
        fn = getattr(module, symbol, None)
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
                capture_output=True, text=True, timeout=300, cwd=srcdir,
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
