"""A candidate's worker holds nothing of the guard's in its environment, spare or not.

The pool starts a spare candidate worker ahead of the next candidate, and told it so with a
variable of the guard's own (``KERNELARC_WORKER_SPARE``): the cheat ``reads_environment``,
which computes honestly only where it finds a variable named like the guard's, found it in
every candidate that got a spare worker, and was PASSED on an H100 (session 38). What the
guard tells a worker about itself now goes in its arguments (``WorkerProcess._args``); the
environment keeps only the allowed prefixes (``worker_env``). Whether a worker is a spare
shows in its arguments (/proc/self/cmdline) where it is not forked from a zygote: it says
when the worker started, not what a call is for.
"""

from __future__ import annotations

import re

from guard.candidates.load import from_source
from guard.runner import request_profile
from guard.runner.worker_environment import worker_env

from helpers import RMS, make_guard, unique

# The candidate reports what it sees through the one channel a rejected verdict keeps: its error.
PROBE = """
import os

def run(hidden_states, weight):
    names = sorted(k for k in os.environ if "KERNELARC" in k.upper())
    with open("/proc/self/environ", "rb") as f:
        block = [n.decode() for n in (v.split(b"=")[0] for v in f.read().split(b"\\0")) if b"KERNELARC" in n.upper()]
    raise RuntimeError(f"SEEN names={names} block={block}")
"""


def test_no_variable_of_the_guards_reaches_a_worker(monkeypatch):
    monkeypatch.setenv("KERNELARC_WORKSPACE", "/somewhere")
    monkeypatch.setenv(request_profile.ENV, "/tmp/profiles")
    for device in ("cpu", "cuda"):
        env = worker_env(device)
        assert not [k for k in env if "KERNELARC" in k.upper()], env


def test_the_users_credentials_do_not_reach_a_worker(monkeypatch):
    """Kept names once served as prefixes: HOME kept ``HOMEBREW_GITHUB_API_TOKEN``, LANG kept
    ``LANGCHAIN_API_KEY``, CC kept ``CCI_TOKEN``, and the ``NVIDIA_`` prefix ``NVIDIA_API_KEY``
    (red team, session 43). What a build and the GPU need still goes through."""
    leaks = {
        "HOMEBREW_GITHUB_API_TOKEN": "ghp_x",
        "LANGCHAIN_API_KEY": "lc_x",
        "LANGSMITH_API_KEY": "ls_x",
        "CCI_TOKEN": "cci_x",
        "NVIDIA_API_KEY": "nv_x",
        "CUDA_AUTH_SECRET": "c_x",
        "PATHOLOGICAL": "p_x",
    }
    kept = {
        "HOME": "/home/u",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "CC": "gcc",
        "CXXFLAGS": "-O2",
        "CUDA_HOME": "/usr/local/cuda",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "TORCH_CUDA_ARCH_LIST": "9.0",
    }
    for name, value in {**leaks, **kept}.items():
        monkeypatch.setenv(name, value)
    for device in ("cpu", "cuda"):
        env = worker_env(device)
        assert not set(leaks) & set(env), sorted(set(leaks) & set(env))
        assert {k: env[k] for k in kept} == kept


def test_spare_and_fresh_candidate_workers_see_nothing_of_the_guard(tmp_path, monkeypatch):
    from guard.runner import pool as pool_mod

    started: list[tuple[str, bool]] = []
    new = pool_mod.WorkerPool._new

    def recorded(self, role, spare=False):
        started.append((role, spare))
        return new(self, role, spare)

    monkeypatch.setattr(pool_mod.WorkerPool, "_new", recorded)
    g = make_guard(tmp_path / "ws", prestart=True, static_screen=False)  # spares, as a server keeps
    try:
        seen = []
        # the first candidate's worker is started for it or prestarted; each later one is the
        # spare the pool started while the one before was judged
        for i in range(3):
            v = g.evaluate(from_source(unique(PROBE), "pytorch", "kernel.py"), RMS, agent=f"probe{i}")
            m = re.search(r"SEEN names=(\[.*?\]) block=(\[.*?\])", v.reason or "")
            assert m, (v.status, v.reason)
            seen.append(m.groups())
        assert seen == [("[]", "[]")] * 3, seen
        assert ("candidate", True) in started, started  # a spare served one of the probes
    finally:
        g.close()
