"""The environment a worker process starts with: what it inherits of the guard's, and what
is set for its device. Nothing of the guard's own (``KERNELARC_*``) and no credential passes:
a candidate that finds a variable of the guard's knows it runs under the guard and where.
Used by the guard's workers (``runner.process``, ``runner.pool``) and ``kernelarc verify``'s
sandboxed child (``wholemodel.sandboxed``).
"""

from __future__ import annotations

import os

from ..paths import PROJECT_ROOT

# Variables a worker may inherit; everything else (KERNELARC_* above all) is dropped. A
# candidate that finds a variable of the guard's knows it runs under the guard and where (the
# spare workers' marker once told a ``reads_environment`` cheat, on an H100, session 38).
# Whole names, and prefixes that end in ``_``: names such as HOME, LANG and CC once served as
# prefixes, and ``HOMEBREW_GITHUB_API_TOKEN``, ``LANGCHAIN_API_KEY`` and ``CCI_TOKEN`` reached
# the sandbox with them (red team, session 43).
ENV_KEEP_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "USER",
        "LOGNAME",
        "SHELL",
        "LD_LIBRARY_PATH",
        "CC",
        "CXX",
        "CFLAGS",
        "CXXFLAGS",
        "XDG_CACHE_HOME",
        "PYTHONPATH",
        "VIRTUAL_ENV",
    }
)
ENV_KEEP_PREFIXES = (
    "LC_",
    "CUDA_",
    "NVIDIA_",
    "TRITON_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "PYTORCH_",
    "NVCC_",
    "OMP_",
    "MKL_",
    "NCCL_",
    "NVSHMEM_",
)
# Words of a credential's name: dropped even under a kept prefix (``NVIDIA_API_KEY``)
ENV_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "SESSION")


def _inherited(name: str) -> bool:
    """Whether a worker keeps the caller's variable ``name``."""
    if name.startswith("KERNELARC") or any(word in name.upper() for word in ENV_SECRET_WORDS):
        return False
    return name in ENV_KEEP_NAMES or name.startswith(ENV_KEEP_PREFIXES)


def worker_env(device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a worker for ``device``: what it inherits (``_inherited``), the
    project on its path, the settings its device needs, and ``extra`` (the GPU it is pinned to)."""
    env = {k: v for k, v in os.environ.items() if _inherited(k)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
        # One thread per CPU worker: on a busy machine torch's parallel regions wait at their
        # barriers for descheduled threads (a 65k-element sum took 11 ms at load 6 on 2 cores),
        # which made the loop's own cost, and so every CPU figure, swing by 10x.
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    else:  # an interpreter chosen for the caller's own CPU work must not reach GPU workers
        env.pop("TRITON_INTERPRET", None)
    env.update(extra or {})
    return env
