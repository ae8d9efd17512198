"""What the compilers on a worker's ``PATH`` need to see in the sandbox, asked of the
compilers themselves.

A build calls its compilers by name (Triton's launcher: the C compiler; CUDA C++: nvcc and
its host compiler; PyTorch's extensions: c++, ninja, the linker), and each runs in turn what
its install holds (gcc's ``cc1`` and ``collect2``, its C++ headers, nvcc's ``cicc``). Where the
install lies outside the system trees (the GPU machine's gcc in /opt/gcc) those folders must
be bound, or every compiled candidate fails to build (session 40).

Deriving them from where the binary lies (the folder above its ``bin``) showed far too much:
a project's own ``bin`` on ``PATH`` (direnv's ``PATH_add bin``) bound the whole project, with
other workspaces and an imported problem's held-out workloads in it, and a home reached
through a link bound that home (red team, session 41). So only each compiler's own folder is
bound, and the folders the compiler itself says it searches:

- gcc and clang: ``-print-search-dirs`` (its install, programs and libraries folders) and the
  include search list that ``-E -v`` prints;
- nvcc: the settings ``--dryrun`` prints (its ``bin``, ``cicc``'s folder, libdevice, the
  include and library folders).

Each answer is kept per binary and modification time, so a worker's start runs no compiler
after the first. A compiler that cannot be asked is bound by its own folder alone, logged.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping

log = logging.getLogger(__name__)

# Compilers a build calls by name; the variables that name the ones it calls first.
TOOLCHAIN = ("cc", "c++", "gcc", "g++", "clang", "clang++", "nvcc", "ld", "as", "ninja")
COMPILER_VARIABLES = ("CC", "CXX", "CUDAHOSTCXX")
# Names that answer gcc's driver options (``-print-search-dirs``, ``-E -v``).
GCC_LIKE = re.compile(r"^(?:.*-)?(?:cc|c\+\+|gcc|g\+\+|clang|clang\+\+)(?:-[\d.]+)?$")
C_PLUS_PLUS = re.compile(r"\+\+")
ASK_TIMEOUT_S = 20.0
# The environment a compiler is asked in: what changes where it searches, nothing else.
ASKING_ENV = ("PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH", "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH",
              "CPLUS_INCLUDE_PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "NVCC_PREPEND_FLAGS",
              "NVCC_APPEND_FLAGS")  # fmt: skip


def toolchain_paths(env: Mapping[str, str]) -> list[str]:
    """The folders to bind read-only for the compilers found on ``env``'s ``PATH`` (and named
    by ``CC``, ``CXX``, ``CUDAHOSTCXX``): each one's own folder (the name found and the binary
    it leads to), and the folders it says it searches. Existing absolute folders only, ``/``
    never: an empty or relative ``PATH`` entry (``export PATH=$EXTRA:$PATH`` with ``EXTRA``
    unset) named the guard's current folder, and a ``ninja`` there bound it (red team,
    session 41); gcc answers ``.`` for an empty ``CPATH`` entry."""
    search = os.pathsep.join(p for p in env.get("PATH", os.defpath).split(os.pathsep) if os.path.isabs(p))
    names = [*TOOLCHAIN, *(env[k] for k in COMPILER_VARIABLES if env.get(k))]
    asking = tuple(sorted((k, env[k]) for k in ASKING_ENV if k in env))
    out: list[str] = []
    for name in dict.fromkeys(names):
        found = shutil.which(name, path=search)
        if found is None:
            continue
        real = os.path.realpath(found)
        out += [os.path.dirname(os.path.abspath(found)), os.path.dirname(real)]
        try:
            mtime = os.stat(real).st_mtime_ns
        except OSError:
            continue
        out += _searched(os.path.abspath(found), os.path.basename(name), mtime, asking)
    absolute = (os.path.normpath(p) for p in out if os.path.isabs(p))
    return [p for p in dict.fromkeys(absolute) if p != "/" and os.path.isdir(p)]


@functools.lru_cache(maxsize=64)
def _searched(exe: str, name: str, mtime_ns: int, asking: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """The folders the compiler at ``exe`` says it searches (``mtime_ns`` and ``asking`` key
    the cache: a reinstalled compiler, or another environment, is asked again)."""
    env = dict(asking)
    if name == "nvcc" or os.path.basename(os.path.realpath(exe)) == "nvcc":
        return tuple(_nvcc_folders(exe, env))
    if GCC_LIKE.match(name) or GCC_LIKE.match(os.path.basename(os.path.realpath(exe))):
        language = "c++" if C_PLUS_PLUS.search(name) else "c"
        return tuple(_gcc_folders(exe, env, language))
    return ()


def _ask(argv: list[str], env: dict[str, str]) -> str | None:
    """What the compiler printed (stdout and stderr), or None where it could not be asked."""
    try:
        done = subprocess.run(
            argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=ASK_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("sandbox: could not ask %s where it searches (%s); only its own folder is shown", argv[0], exc)
        return None
    return done.stdout + done.stderr


def _gcc_folders(exe: str, env: dict[str, str], language: str) -> list[str]:
    """gcc's (or clang's) install, programs and libraries folders, and its include search list."""
    out: list[str] = []
    dirs = _ask([exe, "-print-search-dirs"], env)
    for line in (dirs or "").splitlines():
        key, sep, value = line.partition(": ")
        if sep and key in ("install", "programs", "libraries"):
            out += [p for p in value.strip().lstrip("=").split(os.pathsep) if p]
    listing = _ask([exe, "-E", "-v", "-x", language, os.devnull], env)
    out += include_list(listing or "")
    return out


def include_list(text: str) -> list[str]:
    """The folders of the include search lists in what ``-E -v`` printed."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("#include ") and "search starts here" in line:
            inside = True
        elif line.startswith("End of search list"):
            inside = False
        elif inside and line.startswith(" "):
            out.append(line.strip().removesuffix(" (framework directory)"))
    return out


# nvcc's settings (``#$ NAME=value`` lines of ``--dryrun``) that name folders it uses.
NVCC_FOLDER_SETTINGS = ("_HERE_", "_THERE_", "CICC_PATH", "NVVMIR_LIBRARY_DIR")
NVCC_FLAG_SETTINGS = ("INCLUDES", "SYSTEM_INCLUDES", "LIBRARIES")


def _nvcc_folders(exe: str, env: dict[str, str]) -> list[str]:
    text = _ask([exe, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull], env)
    return nvcc_folders(text or "")


def nvcc_folders(text: str) -> list[str]:
    """The folders named by nvcc's ``--dryrun`` settings: its own, ``cicc``'s and libdevice's,
    the include (``-I``, ``-isystem``) and library (``-L``) folders, and ``nvvm`` (cicc's
    libraries)."""
    out: list[str] = []
    for line in text.splitlines():
        if not line.startswith("#$ ") or "=" not in line:
            continue
        key, _, value = line[3:].partition("=")
        key = key.strip()
        if key in NVCC_FOLDER_SETTINGS:
            out.append(value.strip())
            if key == "CICC_PATH":
                out.append(os.path.dirname(os.path.normpath(value.strip())))  # nvvm: cicc's lib64 beside it
        elif key in NVCC_FLAG_SETTINGS:
            try:
                words = shlex.split(value)
            except ValueError:
                continue
            out += _flag_folders(words)
    return out


def _flag_folders(words: list[str]) -> list[str]:
    out: list[str] = []
    take_next = False
    for word in words:
        if take_next:
            out.append(word)
            take_next = False
        elif word in ("-I", "-L", "-isystem"):
            take_next = True
        elif word.startswith(("-I", "-L")) and len(word) > 2:
            out.append(word[2:])
        elif word.startswith("-isystem") and len(word) > len("-isystem"):
            out.append(word[len("-isystem") :])
    return out
