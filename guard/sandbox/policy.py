"""What a sandboxed candidate worker may see: the mounts, built from what exists on this
machine rather than from a fixed list (a developer's venv, a GPU VM's system Python with
packages on ``PYTHONPATH``, CUDA under ``/usr/local`` or ``/opt``).

Nothing here starts a process; ``guard.sandbox.bwrap`` turns a policy into a command line.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
import re
import site
import stat
import sys
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..paths import CHECKOUT, GUARD_PACKAGE, PROJECT_ROOT
from .toolchain import toolchain_paths

log = logging.getLogger(__name__)


# System trees a Python process, a compiler (CUDA C++ builds) and the CUDA driver need.
# /etc is there for ld.so.cache, passwd and the alternatives links; what in it is not
# world-readable (shadow, ssh host keys, ...) is masked, see ``_unreadable_in_etc``. /opt is
# not: what a user keeps there (datasets, a problem folder with its held-out workloads: red
# team, session 39) was shown whole; its CUDA folders and an interpreter installed there are
# bound as such (``CUDA_GLOBS``, ``_interpreter_paths``), and ``LD_LIBRARY_PATH``'s entries.
SYSTEM_PATHS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc")
# sysfs: the CUDA driver and PyTorch's cpuinfo read PCI, NUMA and CPU topology there.
SYSFS = "/sys"
# What of sysfs is the host's running state rather than its hardware: hidden. A candidate read
# the pids cgroup's high-water mark there (``pids.peak``, which only grows), set by an earlier
# candidate that had made as many threads as a held-out shape's size: a message from one
# candidate to the next that outlived the first one's cell (red team, session 33). The cgroups'
# counters of every group on the host (memory peaks, pids, other guards') were all readable.
SYSFS_HIDDEN = ("/sys/fs", "/sys/kernel/debug", "/sys/kernel/tracing", "/sys/kernel/security", "/sys/kernel/config")
# What a sandbox's own /tmp and /dev/shm may hold, each: they are RAM, and a GPU worker, whose
# memory no cgroup caps, could fill the host's with them (red team, session 43, found them
# bounded by nothing but the memory cgroup, which not every worker has). A build's temporary
# files are tens of MB.
TMPFS_BYTES = 4 << 30
GPU_DEVICE_GLOB = "/dev/nvidia*"  # nvidia0..N, nvidiactl, nvidia-uvm(-tools), nvidia-caps/
GPU_NODE = re.compile(r"/dev/nvidia(\d+)$")  # one GPU's node; the others are shared control nodes
CUDA_GLOBS = ("/usr/local/cuda*", "/usr/local/nvidia", "/opt/nvidia", "/opt/cuda*")
WORKSPACE_DIRNAME = ".kernelarc"
# Entries of a sandbox's /proc shown read-only. The sandbox's uid is the guard's, so run by
# root it is the host's uid 0, which the kernel lets write sysctls with no capability at all
# (kernel.core_pattern set to a script in the worker's folder ran it as the host's root: red
# team, session 32); the rest are host-wide knobs whose files root owns (``driver``: the NVIDIA
# driver's registry and suspend files, found writable on the H100). Those this kernel has.
PROC_READ_ONLY = tuple(
    name
    for name in ("sys", "sysrq-trigger", "irq", "bus", "mtrr", "pressure", "driver")
    if os.path.exists(f"/proc/{name}")
)  # guard.workspace.DEFAULT_WORKSPACE (no import: keep this light)


@dataclass(frozen=True)
class SandboxPolicy:
    """The mounts of one sandboxed worker. Paths are absolute and bound at the same path
    inside, so file names in messages mean the same thing on both sides."""

    workdir: Path  # the worker's own folder: the only host folder it may write
    readonly: tuple[Path, ...] = ()  # bound read-only, parents before children
    symlinks: tuple[tuple[str, Path], ...] = ()  # (target, link): top-level links such as /lib -> usr/lib
    masks: tuple[Path, ...] = ()  # protected paths that a read-only bind would show: hidden
    exposed: tuple[Path, ...] = ()  # read-only, bound after the masks (may lie inside one)
    devices: tuple[Path, ...] = ()  # device nodes bound as they are (GPU)
    hostname: str = "kernelarc-sandbox"
    notes: tuple[str, ...] = field(default=(), compare=False)  # what was left out, and why

    @classmethod
    def for_worker(
        cls,
        workdir: Path,
        device: str,
        protect: Iterable[Path] = (),
        readonly: Iterable[Path] = (),
        expose: Iterable[Path] = (),
        env: Mapping[str, str] | None = None,
        gpu_minor: int | None = None,
    ) -> "SandboxPolicy":
        """The policy of a candidate worker in ``workdir``.

        ``protect``: paths the worker must never see (the workspace, a secret), masked where
        a read-only bind would include them and never bound themselves. ``readonly``: more
        paths to show read-only (the built-extension cache). ``expose``: paths to show
        read-only even inside a protected path (e.g. the workspace's problem folders, which
        hold the safetensors inputs). ``env``: the worker's environment, whose
        ``PYTHONPATH`` and ``LD_LIBRARY_PATH`` entries are shown too. ``gpu_minor``: the
        minor number of the GPU the worker is judged on; only that GPU's node is bound (with
        the control nodes), so that a candidate cannot run work on another GPU of the machine.
        """
        workdir = Path(os.path.abspath(workdir))
        env = dict(os.environ if env is None else env)
        protected = _existing(list(protect) + default_protected())
        exposed = _existing(expose)
        notes: list[str] = []

        wanted = [
            *_interpreter_paths(),
            *(str(_guard_alone(Path(os.path.realpath(p)))) for p in _import_paths(env)),
            str(GUARD_PACKAGE),
            *SYSTEM_PATHS,
            SYSFS,
            *_cuda_paths(env),
            *_away_from_private(toolchain_paths(env)),
            *_env_paths(env, "LD_LIBRARY_PATH"),
            *(str(p) for p in readonly),
        ]
        # Every path is bound where it really lies, once, and each link met on the way to it
        # is made again as a link: a folder bound at a link's path and again at its target's
        # was two mounts of one folder, and a workspace inside it was masked at the real one
        # alone (red team, session 41: a project reached through a link showed its secret).
        binds: list[Path] = []
        links: list[tuple[str, Path]] = []
        for raw in wanted:
            path = Path(os.path.abspath(raw))
            if not path.exists():
                continue
            real, met = links_on_the_way(path)
            links += met
            if any(_within(real, q) for q in protected):
                notes.append(f"not shown, inside a protected path: {real}")
            else:
                binds.append(real)
        shown_exposed: list[Path] = []
        for raw_exposed in exposed:
            real, met = links_on_the_way(raw_exposed)
            links += met
            shown_exposed.append(real)
        readonly_binds = _outermost(binds)
        masks = [p for p in protected if any(_within(p, b) for b in readonly_binds)]
        # a link is made only where no bind shows it already, and never inside what is hidden
        links = [
            (target, at)
            for target, at in dict.fromkeys(links)
            if not any(_within(at, b) for b in (*readonly_binds, workdir))
            and not any(_within(at, q) for q in protected)
        ]
        if Path("/etc") in readonly_binds:
            masks.extend(_unreadable_in_etc())
        if Path(SYSFS) in readonly_binds:
            masks.extend(p for p in map(Path, SYSFS_HIDDEN) if p.is_dir())
        devices: list[Path] = []
        if device.startswith("cuda"):
            devices = gpu_device_nodes(sorted(glob.glob(GPU_DEVICE_GLOB)), gpu_minor)
            if gpu_minor is None:
                notes.append("every GPU's device node bound: which one is this worker's is not known")
        for note in notes:
            log.debug("sandbox: %s", note)
        return cls(
            workdir=workdir,
            readonly=tuple(readonly_binds),
            symlinks=tuple(sorted(links, key=lambda x: (len(x[1].parts), str(x[1])))),
            masks=tuple(dict.fromkeys(masks)),
            exposed=tuple(p for p in dict.fromkeys(shown_exposed) if p not in readonly_binds),
            devices=tuple(devices),
            notes=tuple(notes),
        )


def gpu_device_nodes(nodes: Sequence[str], minor: int | None) -> list[Path]:
    """Of the ``/dev/nvidia*`` nodes, the control nodes and the node of GPU ``minor`` (every
    GPU's when ``minor`` is None)."""
    out = []
    for node in nodes:
        m = GPU_NODE.match(node)
        if m is None or minor is None or int(m.group(1)) == minor:
            out.append(Path(node))
    return out


def default_protected() -> list[Path]:
    """Workspaces the guard may use besides the one it is given: ``$KERNELARC_WORKSPACE``
    and a ``.kernelarc`` in the current folder or the project (a demo's), so a stale one
    inside a bound folder is hidden too."""
    out = [Path.cwd() / WORKSPACE_DIRNAME, PROJECT_ROOT / WORKSPACE_DIRNAME]
    if os.environ.get("KERNELARC_WORKSPACE"):
        out.append(Path(os.environ["KERNELARC_WORKSPACE"]).expanduser())
    return out


def scratch_env(workdir: Path, env: Mapping[str, str]) -> dict[str, str]:
    """Variables that keep every cache a candidate's libraries write (Triton, inductor, the
    CUDA JIT cache, ``~/.cache``) inside its own folder: nothing is shared with the next
    candidate, and inside the sandbox nothing else is writable."""
    workdir = Path(workdir)
    out = {
        "HOME": str(workdir),
        "TMPDIR": "/tmp",
        "XDG_CACHE_HOME": str(workdir / ".cache"),
        "TRITON_HOME": str(workdir),
        "TRITON_CACHE_DIR": str(workdir / ".triton" / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(workdir / ".inductor"),
        "TORCH_EXTENSIONS_DIR": str(workdir / ".torch_extensions"),
        "CUDA_CACHE_PATH": str(workdir / ".nv" / "ComputeCache"),
    }
    # HOME moves, so packages installed with ``pip --user`` would vanish from sys.path: keep them.
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user_site and os.path.isdir(user_site) and user_site in sys.path:
        out["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), user_site) if p)
    return out


# -- helpers ---------------------------------------------------------------------------------
def _interpreter_paths() -> list[str]:
    """Where this interpreter and its installed packages live."""
    paths = [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
    ]
    paths += [sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    paths += site.getsitepackages()
    return [p for p in paths if p]


def _import_paths(env: Mapping[str, str]) -> list[str]:
    """The other folders this process imports from, and the worker's ``PYTHONPATH``. Left out:
    the current folder ('' in sys.path), the caller's, often the one holding the workspace;
    and the folder of the script this process was started as (``python /srv/proj/serve.py``
    puts ``/srv/proj`` first on ``sys.path``, and a red team's candidate read another
    workspace's secret and held-out workloads there: session 41). A worker imports neither."""
    left_out = {os.getcwd()}
    if sys.argv and sys.argv[0] and os.path.isfile(sys.argv[0]):
        left_out.add(os.path.dirname(os.path.realpath(sys.argv[0])))
        left_out.add(os.path.dirname(os.path.abspath(sys.argv[0])))
    interpreter = [Path(os.path.realpath(p)) for p in _interpreter_paths()]
    paths = [
        p
        for p in sys.path
        if p
        and (
            os.path.abspath(p) not in left_out
            or any(_within(Path(os.path.realpath(p)), q) for q in interpreter)  # a console script's bin
        )
    ]
    return paths + _env_paths(env, "PYTHONPATH")


def _guard_alone(path: Path) -> Path:
    """An import path in the project's checkout, or above it (the checkout itself on
    ``PYTHONPATH``, its ``tests`` under pytest), as the guard package alone: a worker imports
    nothing else of it, and a checkout holds what no candidate may read, such as the demo's
    workspace (whose secret and agents' sources a sandboxed candidate read: red team, session
    39), ``.git`` or a user's ``.env``. The interpreter's own folders (a venv in the checkout)
    are bound as they are."""
    if CHECKOUT is None or _within(path, GUARD_PACKAGE):
        return path
    return GUARD_PACKAGE if _within(CHECKOUT, path) or _within(path, CHECKOUT) else path


def _cuda_paths(env: Mapping[str, str]) -> list[str]:
    paths = [p for g in CUDA_GLOBS for p in glob.glob(g)]
    paths += [env[k] for k in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT") if env.get(k)]
    return paths


def _away_from_private(folders: list[str]) -> list[str]:
    """The toolchain's folders, less any that would show the home folder or the checkout
    whole (the folder itself or one above it): a compiler's search list holds what it was
    configured with, and nothing a build needs lies that high."""
    private = [Path(os.path.realpath(os.path.expanduser("~"))), *([CHECKOUT] if CHECKOUT is not None else [])]
    out = []
    for folder in folders:
        real = Path(os.path.realpath(folder))
        if any(_within(k, real) for k in private):
            log.debug("sandbox: toolchain folder %s not shown: it holds the home folder or the checkout", folder)
        else:
            out.append(folder)
    return out


def links_on_the_way(path: Path) -> tuple[Path, list[tuple[str, Path]]]:
    """Where ``path`` (absolute) really lies, and each link met on the way as (its target as
    written, where the link lies), where it lies being a real path itself; a link to a
    relative target is read from its own folder, as the kernel does."""
    met: list[tuple[str, Path]] = []
    here = Path("/")
    todo = list(path.parts[1:])
    while todo:
        part = todo.pop(0)
        if part == "..":
            here = here.parent
            continue
        step = here / part
        if not step.is_symlink():
            here = step
            continue
        if len(met) > 40:  # as ELOOP: resolve the rest as the kernel would
            return Path(os.path.realpath(step.joinpath(*todo))), met
        target = os.readlink(step)
        met.append((target, step))
        target_parts = list(Path(target).parts)
        if Path(target).is_absolute():
            here, target_parts = Path("/"), target_parts[1:]
        todo = target_parts + todo
    return here, met


def _env_paths(env: Mapping[str, str], name: str) -> list[str]:
    """A path list's absolute entries: an empty or relative one means a folder relative to
    wherever it is read, the guard's current folder here and the worker's inside."""
    return [p for p in env.get(name, "").split(os.pathsep) if os.path.isabs(p)]


def _existing(paths: Iterable[Path]) -> list[Path]:
    out = []
    for p in paths:
        p = Path(os.path.abspath(os.path.expanduser(p)))
        if os.path.lexists(p):
            out.append(p)
            if p.resolve() != p:
                out.append(p.resolve())  # reached through a link, it is the same folder
    return list(dict.fromkeys(out))


def _within(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def _outermost(paths: Sequence[Path]) -> list[Path]:
    """Drop paths already inside another bound path; parents come first."""
    out: list[Path] = []
    for p in sorted(set(paths), key=lambda x: (len(x.parts), str(x))):
        if not any(_within(p, q) for q in out):
            out.append(p)
    return sorted(out, key=lambda x: (len(x.parts), str(x)))


@functools.lru_cache(maxsize=1)
def _unreadable_in_etc() -> tuple[Path, ...]:
    """Entries of /etc that others may not read (shadow, ssh host keys, ssl/private, sudoers):
    hidden, since the sandbox runs as the guard's user, possibly root."""
    hidden: list[Path] = []
    for root, dirs, files in os.walk("/etc", followlinks=False):
        for name in list(dirs):
            p = os.path.join(root, name)
            st = os.lstat(p)
            if not stat.S_ISLNK(st.st_mode) and (st.st_mode & 0o005) != 0o005:
                hidden.append(Path(p))
                dirs.remove(name)  # the mask hides everything below it
        for name in files:
            p = os.path.join(root, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and not st.st_mode & 0o004:
                hidden.append(Path(p))
    return tuple(hidden)
