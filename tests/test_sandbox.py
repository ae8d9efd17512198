"""The OS sandbox around candidate workers (guard/sandbox/): what a sandboxed process can
read, write, see and reach, that a kill leaves nothing behind, and that an honest candidate
still builds and runs inside it. Real bwrap processes on the CPU.

Where bwrap cannot run here, the tests that need it are skipped, except under CI, where
the sandbox must work and they fail instead."""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from guard import sandbox
from guard.builders.cuda_cpp import EXT_PREFIX, extension_digest, publish_build
from guard.paths import GUARD_PACKAGE, PROJECT_ROOT
from guard.sandbox import cgroups
from guard.sandbox import isolation as isolation_mod
from guard.sandbox.policy import TMPFS_BYTES, SandboxPolicy, gpu_device_nodes

from helpers import (
    SYSCALLS,
    WRITABLE_SCAN,
    fake_workspace,
    honest_source,
    host_pids_with,
    orphan_source,
    prepare_candidate,
    rms_definition_and_workload,
)

pytestmark = pytest.mark.timeout(60)


def run_sandboxed(workdir: Path, code: str, **policy_args) -> dict:
    """Run ``code`` (after ``ATTEMPT``) with this interpreter in a sandbox around ``workdir``;
    it prints one JSON line, returned as a dict."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.defpath, "PYTHONDONTWRITEBYTECODE": "1"}
    policy = SandboxPolicy.for_worker(workdir, "cpu", env=env, **policy_args)
    code = textwrap.dedent(ATTEMPT) + textwrap.dedent(code)
    cmd = sandbox.wrap(policy, [sys.executable, "-c", code], env)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


ATTEMPT = """
    import json, os, sys
    def attempt(fn, *args):
        try:
            r = fn(*args)
            return r if isinstance(r, (list, str)) else "ok"
        except OSError as e:
            return "denied: " + type(e).__name__
    """


def test_a_sandboxs_tmp_and_shm_are_bounded(tmp_path, needs_bwrap):
    """They are RAM: a GPU worker, whose memory no cgroup caps, could fill the host's with them
    (red team, session 43). Each holds ``tmp_bytes`` (4 GiB by default), then ENOSPC."""
    workdir = tmp_path / "w"
    workdir.mkdir()
    env = {"PATH": os.defpath, "PYTHONDONTWRITEBYTECODE": "1"}
    code = textwrap.dedent(ATTEMPT) + textwrap.dedent(
        """
        def fill(path):
            with open(path, "wb") as f:
                for _ in range(16):
                    f.write(b"x" * (1 << 20))
        print(json.dumps({"tmp": attempt(fill, "/tmp/f"), "shm": attempt(fill, "/dev/shm/f")}))
        """
    )
    policy = SandboxPolicy.for_worker(workdir, "cpu", env=env)
    cmd = sandbox.wrap(policy, [sys.executable, "-c", code], env, tmp_bytes=8 << 20)
    got = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.splitlines()[-1])
    assert got == {"tmp": "denied: OSError", "shm": "denied: OSError"}, got
    assert f"--size {TMPFS_BYTES} --tmpfs /tmp" in " ".join(sandbox.wrap(policy, ["true"], env))


def test_a_bwrap_that_cannot_size_a_tmpfs_gets_no_size_option(tmp_path, monkeypatch):
    """``--size`` came in bwrap 0.7.0 and a set-user-ID bwrap refuses it: with a distribution's
    older one every sandbox failed to start, and the guard ran candidates without one. This
    checks the command line only (no older bwrap runs here)."""
    from guard.sandbox import bwrap

    monkeypatch.setattr(bwrap, "sizes_tmpfs", lambda binary: False)
    policy = SandboxPolicy.for_worker(tmp_path, "cpu", env={"PATH": os.defpath})
    cmd = sandbox.wrap(policy, ["true"], {"PATH": os.defpath}, binary=Path("/bin/true"), workdir_tmpfs_bytes=1 << 20)
    assert "--size" not in cmd and cmd.count("--tmpfs") >= 3


# -- reading ----------------------------------------------------------------------------------
def test_the_hosts_cgroups_and_other_kernel_state_are_out_of_sight(tmp_path, needs_bwrap):
    """sysfs shows the hardware (PCI, CPU topology) but not the host's running state: the
    cgroups' counters carried a message from one candidate to the next (red team, session 33)."""
    got = run_sandboxed(
        tmp_path / "scratch",
        """
    def walk(top):
        found = []
        for root, dirs, files in os.walk(top):
            found += files
        return found
    print(json.dumps({
        "fs": attempt(walk, "/sys/fs"),
        "cgroup": attempt(os.listdir, "/sys/fs/cgroup"),
        "cpus": attempt(os.listdir, "/sys/devices/system/cpu"),
    }))
    """,
    )
    assert got["fs"] == [], got  # not a file below /sys/fs: every cgroup hierarchy hidden
    assert got["cgroup"] == [] or got["cgroup"].startswith("denied"), got
    assert isinstance(got["cpus"], list) and any(c.startswith("cpu") for c in got["cpus"]), got


def test_workspace_and_secret_are_out_of_sight(tmp_path, needs_bwrap):
    # the workspace lies inside a folder the sandbox shows read-only, as ./.kernelarc lies
    # inside the project: it must be masked, not merely left unbound
    shown = tmp_path / "shown"
    shown.mkdir()
    (shown / "visible.txt").write_text("fine")
    ws = fake_workspace(shown)
    lone_secret = tmp_path / "secret.key"  # outside every bound path
    lone_secret.write_text("cd" * 32)
    got = run_sandboxed(
        tmp_path / "scratch",
        f"""
    print(json.dumps({{
        "visible": attempt(lambda: open({str(shown / "visible.txt")!r}).read()),
        "shown": attempt(os.listdir, {str(shown)!r}),
        "ws": attempt(os.listdir, {str(ws)!r}),
        "secret": attempt(lambda: open({str(ws / "secret.key")!r}).read()),
        "db": attempt(lambda: open({str(ws / "workspace.db")!r}).read()),
        "lone": attempt(lambda: open({str(lone_secret)!r}).read()),
        "tmp": attempt(os.listdir, {str(tmp_path)!r}),
    }}))
    """,
        protect=[ws],
        readonly=[shown],
    )
    assert got["visible"] == "fine"  # the bind works, so what follows is the mask's doing
    assert "ab" * 32 not in json.dumps(got) and "cd" * 32 not in json.dumps(got)
    assert got["secret"].startswith("denied") and got["db"].startswith("denied")
    assert got["ws"] == [] or got["ws"].startswith("denied")
    assert got["lone"].startswith("denied")
    assert "secret.key" not in got["tmp"]  # only the sandbox's own folders appear there


def test_the_projects_checkout_shows_the_guard_package_alone(tmp_path, needs_bwrap):
    """The checkout the guard runs from holds what no candidate may read: a demo's workspace
    (not named ``.kernelarc``), ``.git``, a user's ``.env``. A sandboxed candidate read another
    workspace's secret and its agents' sources there (red team, session 39): now only the guard
    package is shown of it, even where the checkout or a folder above it is on ``PYTHONPATH``."""
    env = {"PATH": os.defpath, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), str(PROJECT_ROOT.parent)])}
    policy = SandboxPolicy.for_worker(tmp_path / "scratch", "cpu", env=env)
    assert GUARD_PACKAGE in policy.readonly
    assert not any(b == PROJECT_ROOT or b in PROJECT_ROOT.parents for b in policy.readonly), policy.readonly
    got = run_sandboxed(
        tmp_path / "scratch",
        f"""
    print(json.dumps({{
        "root": attempt(os.listdir, {str(PROJECT_ROOT)!r}),
        "git": attempt(os.listdir, {str(PROJECT_ROOT / ".git")!r}),
        "readme": attempt(lambda: open({str(PROJECT_ROOT / "README.md")!r}).read()),
        "guard": attempt(lambda: open({str(GUARD_PACKAGE / "__init__.py")!r}).read()),
    }}))
    """,
    )
    assert got["guard"] != "" and not got["guard"].startswith("denied")
    assert got["git"].startswith("denied") and got["readme"].startswith("denied")
    # the mount points alone: the guard package and the interpreter's venv, where it lies there
    assert set(got["root"]) <= {"guard", ".venv"}, got["root"]


UNDO_MOUNTS = """
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
    def call(fn, *args):
        if fn(*args) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    def undo(ws, shown):
        return {
            "umount_mask": attempt(call, libc.umount2, ws.encode(), 2),
            "remount_rw": attempt(call, libc.mount, None, shown.encode(), None, MS_REMOUNT | MS_BIND, None),
            "secret": attempt(lambda: open(ws + "/secret.key").read()),
            "write": attempt(lambda: open(shown + "/planted.txt", "w").write("x")),
        }
    def nested(ws, shown):
        # a user namespace of its own gives back every capability, over mounts the kernel locks
        uid, gid = os.getuid(), os.getgid()
        call(libc.unshare, 0x10000000 | 0x00020000)  # CLONE_NEWUSER | CLONE_NEWNS
        open("/proc/self/setgroups", "w").write("deny")
        open("/proc/self/uid_map", "w").write(f"{uid} {uid} 1")
        open("/proc/self/gid_map", "w").write(f"{gid} {gid} 1")
        return undo(ws, shown)
    caps = [ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("CapEff")][0]
    """


def test_a_sandboxed_process_cannot_undo_its_mounts(tmp_path, needs_bwrap):
    # Run by root (as CI is), bwrap used to leave the sandbox every capability: unmounting the
    # mask over the workspace showed the secret, and remounting a read-only bind writable let
    # it write the host's files. Tried as the sandbox is, then from a user namespace of its own.
    shown = tmp_path / "shown"
    shown.mkdir()
    ws = fake_workspace(shown)
    got = run_sandboxed(
        tmp_path / "scratch",
        UNDO_MOUNTS
        + f"""
    out = {{"caps": caps, "as_is": undo({str(ws)!r}, {str(shown)!r})}}
    out["nested"] = attempt(lambda: json.dumps(nested({str(ws)!r}, {str(shown)!r})))
    print(json.dumps(out))
    """,
        protect=[ws],
        readonly=[shown],
    )
    assert int(got["caps"], 16) == 0, got
    attempts = [got["as_is"]]
    if not got["nested"].startswith("denied"):  # no nested user namespace here: nothing to try
        attempts.append(json.loads(got["nested"]))
    for tried in attempts:
        assert all(v.startswith("denied") for v in tried.values()), got
    assert "ab" * 32 not in json.dumps(got)
    assert not (shown / "planted.txt").exists()
    assert (ws / "workspace.db").read_text() == "records"


def test_policy_masks_and_leaves_out_protected_paths(tmp_path):
    shown = tmp_path / "shown"
    ws = fake_workspace(shown)
    inner = ws / "lib"  # e.g. a PYTHONPATH entry inside the workspace: never bound
    inner.mkdir()
    policy = SandboxPolicy.for_worker(
        tmp_path / "scratch",
        "cpu",
        protect=[ws],
        readonly=[shown, inner],
        expose=[ws / "problems"],
        env={"PYTHONPATH": str(inner)},
    )
    assert shown in policy.readonly and ws in policy.masks
    assert not any(p == inner or inner in p.parents for p in policy.readonly)
    assert policy.exposed == (ws / "problems",)
    assert Path("/") not in policy.readonly and Path("/tmp") not in policy.readonly
    assert Path(os.path.expanduser("~")) not in policy.readonly
    assert GUARD_PACKAGE in policy.readonly  # of the checkout, the guard package alone
    assert Path("/opt") not in policy.readonly  # a user's data may lie there: only CUDA's folders
    assert not any(p == PROJECT_ROOT or p in PROJECT_ROOT.parents for p in policy.readonly)


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def _fake_gcc(prefix: Path) -> Path:
    """A gcc installed under ``prefix`` that answers the driver's questions as gcc does and
    runs its ``cc1`` otherwise; ``prefix`` also holds a folder a build never needs."""
    cc1 = _executable(prefix / "libexec" / "gcc" / "x86_64-linux" / "13" / "cc1", "#!/bin/sh\necho compiled\n")
    (prefix / "lib" / "gcc" / "x86_64-linux" / "13").mkdir(parents=True)
    (prefix / "include" / "c++" / "13").mkdir(parents=True)
    (prefix / "private").mkdir()
    (prefix / "private" / "heldout.jsonl").write_text("held out")
    return _executable(
        prefix / "bin" / "gcc",
        f"""#!/bin/sh
case "$1" in
  -print-search-dirs)
    echo "install: {prefix}/lib/gcc/x86_64-linux/13/"
    echo "programs: ={prefix}/libexec/gcc/x86_64-linux/13/:{prefix}/libexec/gcc/x86_64-linux/:{prefix}/nowhere/"
    echo "libraries: ={prefix}/lib/gcc/x86_64-linux/13/../../../:/usr/lib/" ;;
  -E)
    echo '#include <...> search starts here:' >&2
    echo ' {prefix}/include/c++/13' >&2
    echo 'End of search list.' >&2 ;;
  *) exec {cc1} ;;
esac
""",
    )


def test_the_compilers_on_the_path_are_shown_where_they_say_they_search(tmp_path, monkeypatch, needs_bwrap):
    """The GPU machine's gcc lies in /opt/gcc, which the sandbox stopped binding with the rest
    of /opt in session 39: every Triton and CUDA C++ build there failed ("No such file or
    directory: '/opt/gcc/bin/gcc'"; session 40, an H100). Binding the folder above a
    compiler's ``bin`` then showed too much: a project's own ``bin`` on PATH showed the
    project, its workspaces and held-out workloads with it (red team, session 41). A compiler
    is shown by its own folder and the folders it says it searches, and a build runs it."""
    prefix = tmp_path / "opt" / "gcc"
    gcc = _fake_gcc(prefix)
    project = tmp_path / "project"  # direnv's PATH_add bin: a wrapper in the project's bin
    _executable(project / "bin" / "cc", f'#!/bin/sh\nexec {gcc} "$@"\n')
    other_ws = fake_workspace(project / "gpu1")
    home = tmp_path / "home"
    home_bin, user_bin = home / "bin", home / ".local" / "bin"  # nvcc in ~/bin, ninja in ~/.local/bin
    _executable(home_bin / "nvcc", "#!/bin/sh\n")
    _executable(user_bin / "ninja", "#!/bin/sh\n")
    (home / ".local" / "share").mkdir()
    monkeypatch.setenv("HOME", str(home))
    path = [str(project / "bin"), str(prefix / "bin"), str(home_bin), str(user_bin), os.defpath]
    env = {"PATH": os.pathsep.join(path), "CC": "gcc"}
    policy = SandboxPolicy.for_worker(tmp_path / "scratch", "cpu", env=env)
    shown = policy.readonly

    def visible(p: Path) -> bool:
        return any(p == b or b in p.parents for b in shown)

    for needed in ("bin", "libexec/gcc/x86_64-linux/13", "lib/gcc/x86_64-linux/13", "include/c++/13"):
        assert visible(prefix / needed), (needed, shown)
    assert not visible(prefix) and not visible(prefix / "private"), shown
    assert visible(project / "bin") and not visible(project) and not visible(other_ws), shown
    # in the home folder, the bin folders alone: not the home folder, not ~/.local/share
    assert visible(home_bin) and visible(user_bin), shown
    assert not visible(home) and not visible(home / ".local" / "share"), shown
    (tmp_path / "scratch").mkdir()
    for compiler in (gcc, project / "bin" / "cc"):
        proc = subprocess.run(
            sandbox.wrap(policy, [str(compiler)], env),
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr


def test_the_guards_script_folder_and_relative_path_entries_are_not_shown(tmp_path, monkeypatch):
    """A guard started as ``python /srv/proj/serve.py`` from another folder has the script's
    folder first on ``sys.path``, and it was bound whole: a red team's candidate read another
    workspace's secret and a problem's held-out workloads there (session 41). An empty
    ``PATH`` entry (``export PATH=$EXTRA:$PATH``, ``EXTRA`` unset) names the current folder,
    and a ``ninja`` there bound it; a relative ``PYTHONPATH`` entry did the same."""
    project = tmp_path / "proj"
    script = project / "serve.py"
    script.parent.mkdir()
    script.write_text("")
    fake_workspace(project / "gpu1")
    here = tmp_path / "here"
    _executable(here / "ninja", "#!/bin/sh\n")
    (here / "lib").mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setattr(sys, "argv", [str(script)])
    monkeypatch.setattr(sys, "path", [str(project), *sys.path])
    env = {"PATH": os.pathsep + os.defpath, "PYTHONPATH": "lib"}
    policy = SandboxPolicy.for_worker(tmp_path / "scratch", "cpu", env=env)
    shown = policy.readonly
    for hidden in (project, here, here / "lib"):
        assert not any(hidden == b or b in hidden.parents for b in shown), (hidden, shown)


def test_nvcc_and_gcc_answers_are_read_as_folders():
    """The folders in what ``nvcc --dryrun`` and ``gcc -E -v`` print (as nvcc 13.0 and gcc 12
    print them)."""
    from guard.sandbox.toolchain import include_list, nvcc_folders

    dryrun = (
        "#$ _HERE_=/cuda/bin\n#$ CICC_PATH=/cuda/bin/../nvvm/bin\n#$ NVVMIR_LIBRARY_DIR=/cuda/bin/../nvvm/libdevice\n"
        '#$ INCLUDES="-I/cuda/bin/../targets/x86_64-linux/include"  \n'
        '#$ SYSTEM_INCLUDES="-isystem" "/cuda/bin/../targets/x86_64-linux/include/cccl"  \n'
        '#$ LIBRARIES=  "-L/cuda/bin/../targets/x86_64-linux/lib/stubs" "-L/cuda/bin/../targets/x86_64-linux/lib"\n'
        "#$ PATH=/home/u:/usr/bin\n#$ gcc -E -x c++ -I/home/u/x /dev/null\n"
    )
    got = {os.path.normpath(p) for p in nvcc_folders(dryrun)}
    assert got == {
        "/cuda/bin",
        "/cuda/nvvm/bin",
        "/cuda/nvvm",
        "/cuda/nvvm/libdevice",
        "/cuda/targets/x86_64-linux/include",
        "/cuda/targets/x86_64-linux/include/cccl",
        "/cuda/targets/x86_64-linux/lib/stubs",
        "/cuda/targets/x86_64-linux/lib",
    }
    listing = (
        '#include "..." search starts here:\n#include <...> search starts here:\n /usr/include/c++/12\n'
        ' /usr/lib/gcc/x86_64-linux-gnu/12/include\nEnd of search list.\n # 0 "<stdin>"\n'
    )
    assert include_list(listing) == ["/usr/include/c++/12", "/usr/lib/gcc/x86_64-linux-gnu/12/include"]


def test_a_folder_reached_through_a_link_keeps_its_workspace_hidden(tmp_path, needs_bwrap):
    """A project on PYTHONPATH through a link (``/srv/proj`` -> ``/data/proj``) was bound at
    both paths, and the workspace inside it masked at the real one alone: its secret and
    database were read through the link's path (red team, session 41). Each folder is bound
    where it lies, the link made again, and the mask holds on both paths."""
    real = tmp_path / "data" / "proj"
    (real / "lib").mkdir(parents=True)
    (real / "lib" / "visible.txt").write_text("fine")
    ws = fake_workspace(real)
    alias = tmp_path / "srv_proj"
    alias.symlink_to(real)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {"PATH": os.defpath, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(alias / "lib")}
    policy = SandboxPolicy.for_worker(scratch, "cpu", env=env, readonly=[alias], protect=[ws])
    assert alias not in policy.readonly and real in policy.readonly, policy.readonly
    code = textwrap.dedent(ATTEMPT) + textwrap.dedent(
        f"""
        print(json.dumps({{
            "visible": attempt(lambda: open({str(alias / "lib" / "visible.txt")!r}).read()),
            "secret": [attempt(lambda p=p: open(p).read()) for p in ({str(alias / "ws" / "secret.key")!r},
                                                                     {str(ws / "secret.key")!r})],
            "db": [attempt(lambda p=p: open(p, "rb").read().decode("latin-1"))
                   for p in ({str(alias / "ws" / "workspace.db")!r}, {str(ws / "workspace.db")!r})],
        }}))
        """
    )
    proc = subprocess.run(
        sandbox.wrap(policy, [sys.executable, "-c", code], env),
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["visible"] == "fine", got  # the link works, so what follows is the mask's doing
    assert all(x.startswith("denied") for x in got["secret"] + got["db"]), got


def test_only_the_judged_gpu_node_is_bound():
    nodes = ["/dev/nvidia-caps", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidia1"]
    nodes += ["/dev/nvidia10", "/dev/nvidiactl"]
    picked = [str(p) for p in gpu_device_nodes(nodes, 1)]
    assert picked == ["/dev/nvidia-caps", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1", "/dev/nvidiactl"]
    assert [str(p) for p in gpu_device_nodes(nodes, None)] == nodes  # not known: every node, and said so
    assert "/dev/nvidia1" not in [str(p) for p in gpu_device_nodes(nodes, 10)]


def test_exposed_problem_folder_inside_a_masked_workspace(tmp_path, needs_bwrap):
    shown = tmp_path / "shown"
    ws = fake_workspace(shown)
    got = run_sandboxed(
        tmp_path / "scratch",
        f"""
    print(json.dumps({{
        "problem": attempt(lambda: open({str(ws / "problems" / "p" / "definition.json")!r}).read()),
        "secret": attempt(lambda: open({str(ws / "secret.key")!r}).read()),
    }}))
    """,
        protect=[ws],
        readonly=[shown],
        expose=[ws / "problems"],
    )
    assert got["problem"] == "{}" and got["secret"].startswith("denied")


# -- writing ----------------------------------------------------------------------------------
def test_writes_only_in_its_own_folder(tmp_path, needs_bwrap):
    tag = f"kernelarc-sandbox-test-{uuid.uuid4().hex[:8]}"
    cache = tmp_path / "cache"
    cache.mkdir()
    targets = {
        "project": PROJECT_ROOT / tag,
        "home": Path(os.path.expanduser("~")) / tag,
        "host_tmp": Path("/tmp") / tag,
        "cache": cache / tag,
    }
    scratch = tmp_path / "scratch"
    code = f"""
    targets = {{k: v for k, v in {json.dumps({k: str(v) for k, v in targets.items()})}.items()}}
    out = {{k: attempt(lambda p=p: open(p, "w").write("x")) for k, p in targets.items()}}
    out["own"] = attempt(lambda: open("own.txt", "w").write("mine"))
    print(json.dumps(out))
    """
    try:
        got = run_sandboxed(scratch, code, readonly=[cache])
        # the sandbox's /tmp is its own tmpfs: writable, and gone; so is a checkout there (a
        # fresh clone in /tmp), of which only the guard package is bound
        private = {"host_tmp"} | ({"project"} if Path("/tmp") in PROJECT_ROOT.parents else set())
        for name, path in targets.items():
            assert not path.exists(), f"the sandbox wrote {path}"
            if name not in private:
                assert got[name].startswith("denied"), (name, got[name])
        assert got["own"] == "ok" and (scratch / "own.txt").read_text() == "mine"
    finally:
        for path in targets.values():
            path.unlink(missing_ok=True)


def test_nothing_writable_but_its_own_folders(tmp_path, needs_bwrap):
    # Run by root, the sandbox is the host's uid 0, whose sysctl writes the kernel allows with
    # no capability: kernel.core_pattern set to a script in the worker's folder ran it as the
    # host's root (red team, session 32). Each sysctl is written its own value back.
    got = run_sandboxed(
        tmp_path / "scratch",
        WRITABLE_SCAN
        + textwrap.dedent(f"""
    def same(name):
        path = "/proc/sys/" + name
        value = open(path).read()
        with open(path, "w") as f:
            f.write(value)
    print(json.dumps({{
        "writable": writable_outside([{str(tmp_path / "scratch")!r}, "/tmp", "/dev/shm"]),
        "sysctl": [attempt(same, n) for n in ("kernel/core_pattern", "kernel/randomize_va_space")],
    }}))
    """),
    )
    assert got["writable"] == [], got
    assert all(r.startswith("denied") for r in got["sysctl"]), got


# -- processes and network --------------------------------------------------------------------------
def test_proc_shows_only_the_sandbox(tmp_path, needs_bwrap):
    me = os.getpid()
    got = run_sandboxed(
        tmp_path / "scratch",
        f"""
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    print(json.dumps({{
        "pids": pids,
        "host_environ": attempt(lambda: open("/proc/{me}/environ").read()),
        "init": open("/proc/1/cmdline", "rb").read().split(b"\\0")[0].decode(),
        "me": os.getpid(),
    }}))
    """,
    )
    assert got["host_environ"].startswith("denied")
    assert me not in got["pids"]  # the sandbox's pids are 1 (its init), 2, ...
    assert len(got["pids"]) <= 4 and got["me"] in got["pids"]
    assert got["init"].endswith("bwrap")  # PID 1 is the sandbox's own init


def test_a_sandbox_is_the_oom_killers_first_choice_only_where_that_holds(tmp_path, needs_bwrap):
    """Where the guard holds CAP_SYS_RESOURCE, every process of a sandbox starts at the highest
    OOM score and cannot lower it: a candidate that fills the host's memory is killed before
    the guard. Without it (this machine's root, CI's) a candidate could lower its own score
    while the other sandboxes kept 1000, making them the OOM killer's first choice instead of
    the hog (review, session 44): the sandboxes keep their parent's score there."""
    from guard.sandbox import oom

    got = run_sandboxed(
        tmp_path / "scratch",
        """
    def lower():
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("0")
    def child_score():
        r, w = os.pipe()
        if os.fork() == 0:
            os.write(w, open("/proc/self/oom_score_adj").read().encode())
            os._exit(0)
        os.wait()
        return os.read(r, 100).decode().strip()
    print(json.dumps({
        "score": open("/proc/self/oom_score_adj").read().strip(),
        "child": child_score(),
        "lower": attempt(lower),
        "after": open("/proc/self/oom_score_adj").read().strip(),
    }))
    """,
    )
    mine = Path("/proc/self/oom_score_adj").read_text().strip()
    if oom.has_capability(oom.CAP_SYS_RESOURCE):
        assert oom.applies()
        assert got["score"] == got["child"] == "1000"
        assert got["lower"].startswith("denied") and got["after"] == "1000", got
    else:
        assert not oom.applies()
        assert got["score"] == got["child"] == mine, got


def test_the_oom_score_is_set_only_with_the_capability_and_a_shell(tmp_path, monkeypatch):
    from guard.sandbox import oom

    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t000001fffeffffff\n")  # a container's root: no bit 24
    assert not oom.has_capability(oom.CAP_SYS_RESOURCE, status)
    status.write_text("Name:\tx\nCapEff:\t000001ffffffffff\n")
    assert oom.has_capability(oom.CAP_SYS_RESOURCE, status)
    monkeypatch.setattr(oom, "applies", lambda: False)
    assert oom.killed_first(["bwrap", "--", "x"]) == ["bwrap", "--", "x"]
    monkeypatch.setattr(oom, "applies", lambda: True)
    cmd = oom.killed_first(["bwrap", "--", "x y"])
    assert cmd[:2] == [oom.SHELL, "-c"] and cmd[-3:] == ["bwrap", "--", "x y"]
    # the shell sets the score, says nothing where it cannot, and passes the command on whole
    probe = subprocess.run(
        [*cmd[:4], sys.executable, "-c", "import sys; print(sys.argv[1:])", "a b", "$(x);"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert probe.returncode == 0 and probe.stdout.strip() == "['a b', '$(x);']" and probe.stderr == "", probe


def test_no_network(tmp_path, needs_bwrap):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        got = run_sandboxed(
            tmp_path / "scratch",
            f"""
        import socket
        def connect():
            with socket.create_connection(("127.0.0.1", {port}), timeout=2):
                return "connected"
        def udp():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(b"x", ("8.8.8.8", 53))
        print(json.dumps({{"tcp": attempt(connect), "udp": attempt(udp)}}))
        """,
        )
        assert got["tcp"].startswith("denied") and got["udp"].startswith("denied")
        with pytest.raises(socket.timeout):
            listener.accept()


# -- real workers -------------------------------------------------------------------------------
def test_kill_leaves_no_grandchild(tmp_path, needs_bwrap):
    from guard.runner.process import WorkerProcess

    marker = f"{time.time_ns() % 10**9}.5"  # sleep's argument: unique on this machine
    source = orphan_source(marker)
    worker = WorkerProcess("candidate", "cpu", tmp_path / "cand").start()
    try:
        assert worker.isolation == "bubblewrap"
        prepare_candidate(worker, source, tmp_path / "cache")
        deadline = time.monotonic() + 10
        while not host_pids_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_pids_with(marker), "the candidate's grandchild did not start"
    finally:
        worker.kill()
    assert host_pids_with(marker) == []


# Right on its first call on a round's inputs, a little off on the second: the determinism
# check, which keeps the first call's outputs as a copy while the second runs, must see it.
DRIFTING = """
import torch
_calls = [0]

def run(hidden_states, weight):
    _calls[0] += 1
    x = hidden_states.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()
    return (y + (_calls[0] - 1) * 1e-3).to(hidden_states.dtype)
"""


@pytest.mark.parametrize("kind", ["honest", "drifting", "drifting within tolerance"])
def test_candidate_builds_and_runs_in_the_sandbox(tmp_path, needs_bwrap, kind):
    from guard.runner.pool import WorkerPool

    ws = fake_workspace(tmp_path)
    pool = WorkerPool("cpu", tmp_path / "workers", prestart=False, protect=[ws])
    worker = pool.take_candidate()
    try:
        assert worker.isolation == "bubblewrap" and pool.isolation.available
        assert worker.outdir == worker.workdir / "out" and worker.outdir.is_dir()
        reply = prepare_candidate(worker, honest_source() if kind == "honest" else DRIFTING, tmp_path / "cache")
        assert reply.get("ok"), reply
        _, d, w = rms_definition_and_workload()
        reply = worker.request(
            {
                "op": "check",
                "workload": w.model_dump(mode="json"),
                "axes": d.resolve_axes(w.axes),
                "rounds": [{"seed": 7, "kind": "normal", "tag": "r0"}],
                # the first round twice; for a problem whose repeats may differ (a KernelBench
                # import), within a tolerance: 1e-3 is within 1e-2
                "repeat": {"within": [{"atol": 1e-2, "rtol": 1e-2}] if kind == "drifting within tolerance" else None},
                "outdir": str(worker.outdir),
            },
            60,
        )
        if kind == "drifting":
            assert not reply.get("ok") and reply.get("status") == "INCORRECT_NUMERICAL", reply
            assert "differs between two calls on the same inputs" in reply.get("message", ""), reply
            return
        assert reply.get("ok"), reply
        files = [o["file"] for r in reply["rounds"] for o in r["outputs"]]
        assert files and all(Path(f).parent == worker.outdir and Path(f).stat().st_size for f in files)
    finally:
        pool.discard(worker)
        pool.close()


def test_the_guard_deletes_output_files_only_in_the_workers_own_folder(tmp_path):
    """The ``out`` folder is the candidate's to write. Replaced by a link to another folder
    (another candidate's, whose round files have the same names), the guard's deletion of
    a compared round's file went through the link (red team, session 27); it no longer does."""
    from guard.runner.process import WorkerProcess

    worker = WorkerProcess("candidate", "cpu", tmp_path / "w", isolation=sandbox.Isolation("none", reason="test"))
    (worker.outdir / "w0r0_0.bin").write_bytes(b"x")
    worker.remove_output("w0r0_0.bin")
    assert not (worker.outdir / "w0r0_0.bin").exists()
    worker.remove_output("w0r0_0.bin")  # gone already: nothing to do

    victim = tmp_path / "other" / "out"
    victim.mkdir(parents=True)
    (victim / "w0r0_0.bin").write_bytes(b"someone else's round")
    worker.outdir.rmdir()
    worker.outdir.symlink_to(victim)
    worker.remove_output("w0r0_0.bin")
    assert (victim / "w0r0_0.bin").read_bytes() == b"someone else's round"
    with pytest.raises(ValueError):
        worker.remove_output("../other/out/w0r0_0.bin")


# -- switches ----------------------------------------------------------------------------------
def test_sandbox_off_gives_isolation_none(monkeypatch, tmp_path):
    from guard.runner.process import WorkerProcess

    monkeypatch.setenv("KERNELARC_SANDBOX", "off")
    iso = sandbox.probe()
    assert iso.mechanism == "none" and "KERNELARC_SANDBOX=off" in iso.reason
    assert sandbox.isolation_line() == f"isolation: none ({iso.reason})"
    assert WorkerProcess("candidate", "cpu", tmp_path / "w").isolation == "none"


def test_require_refuses_to_start_without_a_sandbox(monkeypatch, tmp_path):
    from guard.runner.pool import WorkerPool

    missing = sandbox.Isolation("none", reason="bwrap not found (test)")
    monkeypatch.setattr(isolation_mod, "_probe_bwrap", lambda: missing)
    monkeypatch.setenv("KERNELARC_SANDBOX", "require")
    with pytest.raises(sandbox.SandboxUnavailable, match="bwrap not found"):
        WorkerPool("cpu", tmp_path / "workers", prestart=False)
    monkeypatch.setenv("KERNELARC_SANDBOX", "")
    pool = WorkerPool("cpu", tmp_path / "workers", prestart=False)  # warns, starts
    assert pool.isolation == missing and pool.isolation.line() == "isolation: none (bwrap not found (test))"


def test_isolation_line_names_the_mechanism(needs_bwrap):
    line = f"isolation: bubblewrap {needs_bwrap.version}"
    if os.geteuid() == 0:  # said, never silent
        line += " (run by root: candidates are the host's uid 0)"
    capped = cgroups.probe()
    line += ", tasks capped" if capped.available else f", tasks not capped ({capped.reason})"
    assert sandbox.isolation_line() == line


# -- built extensions ------------------------------------------------------------------------------
def _cuda_solution(body: str) -> dict:
    return {
        "sources": [{"path": "kernel.cu", "content": body}],
        "spec": {"entry_point": "kernel.cu::run", "language": "cuda_cpp"},
    }


def test_publish_build_copies_only_the_worker_s_own_library(tmp_path):
    sol = _cuda_solution("torch::Tensor run(torch::Tensor x) { return x; }")
    digest = extension_digest(sol)
    assert digest == extension_digest(_cuda_solution("torch::Tensor run(torch::Tensor x) { return x; }"))
    assert digest != extension_digest(_cuda_solution("torch::Tensor run(torch::Tensor x) { return x * 2; }"))
    assert extension_digest(_cuda_solution("int nothing_to_bind;")) is None
    cache, worker = tmp_path / "cache", tmp_path / "worker"
    built = worker / "build" / digest / f"{EXT_PREFIX}{digest}.so"
    built.parent.mkdir(parents=True)

    assert not publish_build(worker, digest, cache)  # nothing built
    secret = tmp_path / "secret.key"
    secret.write_text("ab" * 32)
    built.symlink_to(secret)  # a worker pointing the guard at one of its files
    assert not publish_build(worker, digest, cache)
    built.unlink()
    os.link(secret, built)  # or hard-linking one
    assert not publish_build(worker, digest, cache)
    built.unlink()
    built.write_bytes(b"\x7fELF library")
    assert publish_build(worker, digest, cache)
    assert (cache / digest / built.name).read_bytes() == b"\x7fELF library"
    built.write_bytes(b"replaced later")  # the cached build is not replaced
    assert publish_build(worker, digest, cache)
    assert (cache / digest / built.name).read_bytes() == b"\x7fELF library"
    with pytest.raises(ValueError):
        publish_build(worker, "../../elsewhere", cache)


def test_a_worker_gets_its_own_sources_build_and_never_the_cache(tmp_path, needs_bwrap):
    """The shared cache holds every candidate's compiled library, of every workspace of the
    user: a sandboxed candidate could list them and load another's (red team, session 39). The
    guard hands a worker its own digest's build in a new folder of its own; the cache itself
    is not in the sandbox."""
    from guard.builders.cuda_cpp import hand_build
    from guard.paths import cache_dir

    sol = _cuda_solution("torch::Tensor run(torch::Tensor x) { return x; }")
    digest = extension_digest(sol)
    cache, worker = tmp_path / "cache", tmp_path / "worker"
    worker.mkdir()
    assert hand_build(cache, digest, worker) is None  # nothing built yet
    (cache / digest).mkdir(parents=True)
    (cache / digest / f"{EXT_PREFIX}{digest}.so").write_bytes(b"\x7fELF library")
    (cache / ("0" * 16)).mkdir()  # another source's build
    folder = hand_build(cache, digest, worker)
    assert folder is not None and folder.parent == worker
    assert [p.relative_to(folder) for p in folder.rglob("*") if p.is_file()] == [
        Path(digest) / f"{EXT_PREFIX}{digest}.so"
    ]
    assert (folder / digest / f"{EXT_PREFIX}{digest}.so").read_bytes() == b"\x7fELF library"
    with pytest.raises(ValueError):
        hand_build(cache, "../../elsewhere", worker)
    # and the user's shared cache is out of a candidate worker's sight
    from guard.runner.pool import WorkerPool

    shared = cache_dir() / "torch_extensions"
    shared.mkdir(parents=True, exist_ok=True)
    lists = f"import os\nos.listdir({str(shared)!r})\n\n\ndef run(hidden_states, weight):\n    return hidden_states\n"
    pool = WorkerPool("cpu", tmp_path / "workers", prestart=False)
    try:
        reply = prepare_candidate(pool.take_candidate(), lists, tmp_path / "none")
        assert not reply.get("ok") and "Error" in (reply.get("message") or ""), reply
    finally:
        pool.close()


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a compile of torch's headers: ~30 s on 2 idle cores, minutes loaded
def test_the_build_gate_hands_a_finished_build_to_the_next_worker(tmp_path, needs_bwrap):
    """Through the build gate: the first worker compiles and the guard publishes its build;
    the next worker of the same source loads it from the copy handed to its own folder,
    without compiling (no build of its own), though the cache is not in its sandbox."""
    from test_pipeline import CPP_RMSNORM

    from guard.candidates.load import from_source
    from guard.cascade.build_gate import build, extension_cache
    from guard.config import GuardConfig
    from guard.problems.store import ProblemStore
    from guard.runner.pool import WorkerPool

    from helpers import RMS, unique

    problem = ProblemStore(tmp_path / "no-workspace").get(RMS)
    source = unique(CPP_RMSNORM, "//")
    solution = from_source(source, "cuda_cpp", "kernel.cpp").model_dump(mode="json", exclude_none=True)
    digest = extension_digest(solution)
    cfg = GuardConfig(build_timeout_s=1100)
    pool = WorkerPool("cpu", tmp_path / "workers", prestart=False)
    try:
        first, second = pool.take_candidate(), pool.take_candidate()
        assert build(first, problem, solution, "cuda_cpp", cfg).ok
        assert (first.workdir / "build" / digest).is_dir()
        assert (extension_cache() / digest / f"{EXT_PREFIX}{digest}.so").is_file()
        assert build(second, problem, solution, "cuda_cpp", cfg).ok
        assert not (second.workdir / "build" / digest).exists()  # loaded, not compiled
        assert list(second.workdir.glob(f".built-*/{digest}/{EXT_PREFIX}{digest}.so"))
    finally:
        pool.close()


def test_a_worker_started_by_a_thread_that_ends_lives_on(tmp_path):
    """bwrap's --die-with-parent follows the thread that forked it: a spare started by a
    server's start-up thread was killed when that thread ended, in the middle of the verdict
    that had taken it. Workers are forked from one long-lived thread."""
    import threading
    import time

    from guard.runner.pool import WorkerPool

    pool = WorkerPool("cpu", tmp_path / "workers", prestart=False)
    taken = {}
    try:
        starter = threading.Thread(target=lambda: taken.update(worker=pool.take_candidate()))
        starter.start()
        starter.join()
        worker = taken["worker"]
        worker.wait_ready(120)
        time.sleep(0.5)  # the starter's end has been signalled by now
        assert worker.alive, worker.log_tail()
        assert worker.request({"op": "memory", "reset": False}, 60).get("ok")
        print("isolation:", worker.isolation)
    finally:
        if "worker" in taken:
            pool.discard(taken["worker"])
        pool.close()


def test_the_guard_reads_a_workers_files_only_as_plain_files(tmp_path):
    """What the guard reads in a worker's folder (a profile's report) is read as a plain file
    only: a link to a secret, a FIFO (an ``open`` that never returns) or a file too large is
    refused (red team, session 32)."""
    from guard.runner import worker_files

    folder = tmp_path / "w"
    folder.mkdir()
    (folder / "plain").write_bytes(b"report")
    assert worker_files.read_plain(folder, "plain", 100) == b"report"
    secret = tmp_path / "secret.key"
    secret.write_text("ab" * 32)
    (folder / "link").symlink_to(secret)
    os.mkfifo(folder / "fifo")
    (folder / "large").write_bytes(b"x" * 101)
    for name in ("link", "fifo", "large", "missing"):
        with pytest.raises(worker_files.NotAPlainFile):
            worker_files.read_plain(folder, name, 100)
    with pytest.raises(ValueError):
        worker_files.read_plain(folder, "../secret.key", 100)


def test_a_worker_in_its_own_sandbox_gets_the_seccomp_filter(tmp_path, needs_bwrap):
    """Keyrings are the uid's, not a namespace's, and a user namespace of the candidate's own
    gives capabilities back: both refused in a worker's own sandbox as in a cell
    (``guard.sandbox.seccomp``), while threads, forks and subprocesses still work. So is
    ``ptrace``: a sandboxed process stopped its sandbox's init with it, which then kept its
    caller waiting for good (red team, session 43)."""
    from guard.runner.process import WorkerProcess

    add_key, unshare, ptrace = SYSCALLS[platform.machine()]
    socket = {"x86_64": 41, "aarch64": 198}[platform.machine()]
    source = textwrap.dedent(f"""
        import ctypes, json, os, subprocess, threading
        libc = ctypes.CDLL(None, use_errno=True)
        SOCKET = {socket}
        def call(nr, *args):
            return "ok" if libc.syscall(nr, *args) >= 0 else "denied: " + os.strerror(ctypes.get_errno())
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
        seen = {{
            "add_key": call({add_key}, b"user", b"k", b"v", 1, ctypes.c_long(-3)),
            "own_userns": call({unshare}, 0x10000000),
            "ptrace_init": call({ptrace}, 16, 1, 0, 0),  # PTRACE_ATTACH to the sandbox's pid 1
            "vsock": call(SOCKET, 40, 1, 0),  # AF_VSOCK, SOCK_STREAM
            "io_uring": call(425, 8, ctypes.c_void_p(0)),
            "unix_socket": call(SOCKET, 1, 1, 0),  # AF_UNIX: still fine
            "subprocess": subprocess.run(["echo", "fine"], capture_output=True, text=True).stdout.strip(),
        }}
        open("probe.json", "w").write(json.dumps(seen))
        import torch
        def run(x, w):
            return x
    """)
    worker = WorkerProcess("candidate", "cpu", tmp_path / "cand").start()
    try:
        assert worker.isolation == "bubblewrap" and worker.cells is None
        assert prepare_candidate(worker, source, tmp_path / "cache").get("ok")
        seen = json.loads((worker.workdir / "probe.json").read_text())
    finally:
        worker.kill()
    assert seen["add_key"].startswith("denied") and seen["own_userns"].startswith("denied"), seen
    assert seen["ptrace_init"] == "denied: Operation not permitted", seen
    assert seen["vsock"] == seen["io_uring"] == "denied: Operation not permitted", seen
    assert seen["unix_socket"] == "ok", seen
    assert seen["subprocess"] == "fine", seen


def test_a_candidate_cannot_fill_the_hosts_file_table(tmp_path, needs_bwrap):
    """The kernel's open-file table is the host's: a candidate's processes hold at most
    ``CANDIDATE_OPEN_FILES`` descriptors each, which it cannot raise (red team, session 44: 20
    children opened 200,000 eventfds, and about 130 would have filled this machine's table,
    failing every other sandbox's next open). Files held by mappings are not bounded by this
    (``benchmarks/file_table_probe.py``; docs/guard.md, "The host's file table")."""
    from guard.runner.process import WorkerProcess
    from guard.sandbox.rlimits import CANDIDATE_OPEN_FILES

    source = textwrap.dedent("""
        import json, os, resource
        seen = {"limit": list(resource.getrlimit(resource.RLIMIT_NOFILE))}
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (1 << 20, 1 << 20))
            seen["raise"] = "ok"
        except (OSError, ValueError) as exc:
            seen["raise"] = "denied: " + type(exc).__name__
        held = []
        try:
            while len(held) < 100000:
                held.append(os.eventfd(0))
        except OSError as exc:
            seen["stopped"] = exc.strerror
        seen["opened"] = len(held)
        for fd in held:
            os.close(fd)
        r, w = os.pipe()
        if os.fork() == 0:  # a child inherits the limit
            import resource as res
            os.write(w, str(res.getrlimit(res.RLIMIT_NOFILE)[1]).encode())
            os._exit(0)
        os.wait()
        seen["child"] = int(os.read(r, 20))
        open("probe.json", "w").write(json.dumps(seen))
        import torch
        def run(x, w):
            return x
    """)
    worker = WorkerProcess("candidate", "cpu", tmp_path / "cand").start()
    try:
        assert prepare_candidate(worker, source, tmp_path / "cache").get("ok")
        seen = json.loads((worker.workdir / "probe.json").read_text())
    finally:
        worker.kill()
    assert seen["limit"][1] <= CANDIDATE_OPEN_FILES and seen["child"] <= CANDIDATE_OPEN_FILES, seen
    assert seen["raise"].startswith("denied"), seen
    assert seen["opened"] < CANDIDATE_OPEN_FILES and seen["stopped"] == "Too many open files", seen


NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to become nobody")
def test_the_sandbox_works_for_an_ordinary_user(needs_bwrap):
    """The sandbox (bwrap with the guard's command line) started by an ordinary user, here
    ``nobody``, where unprivileged user namespaces are on: it starts, shows what it binds,
    hides a masked workspace whose files the user could read, shows no other process, and
    lets the user write its own folder and nothing else. The system's own tools run inside
    (the guard's interpreter lies in a home that user may not enter)."""
    base = Path(tempfile.mkdtemp(prefix="kernelarc-nobody-", dir="/tmp"))
    try:
        shown = base / "shown"
        shown.mkdir()
        (shown / "visible.txt").write_text("fine")
        ws = fake_workspace(shown)
        scratch = base / "scratch"
        scratch.mkdir()
        for p in [base, *base.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)  # readable by anyone: only the sandbox hides
        os.chown(scratch, NOBODY, NOBODY)
        policy = SandboxPolicy(
            workdir=scratch,
            readonly=(Path("/usr"), Path("/etc"), shown),
            symlinks=tuple((os.readlink(p), Path(p)) for p in ("/bin", "/lib", "/lib64") if os.path.islink(p)),
            masks=(ws,),
        )
        script = (
            f"cat {shown / 'visible.txt'}; echo; "
            f"cat {ws / 'secret.key'} 2>/dev/null || echo secret-denied; "
            f"ls /proc | grep -c '^[0-9]'; "
            f"echo x > {scratch / 'mine'} && echo wrote-own; "
            f"echo x > {shown / 'theirs'} 2>/dev/null || echo shown-read-only; "
            "id -u"
        )
        cmd = sandbox.wrap(policy, ["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin"})
        setpriv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
        proc = subprocess.run(setpriv + cmd, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.split()
        assert lines[0] == "fine" and "ab" * 32 not in proc.stdout and "secret-denied" in lines, proc.stdout
        assert int(lines[lines.index("secret-denied") + 1]) <= 4, proc.stdout  # its init, sh, ls, grep
        assert "wrote-own" in lines and "shown-read-only" in lines and not (shown / "theirs").exists()
        assert lines[-1] == str(NOBODY), proc.stdout  # the host's unprivileged uid, not root
    finally:
        shutil.rmtree(base, ignore_errors=True)
