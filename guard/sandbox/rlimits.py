"""Per-process limits a sandbox's processes get on top of its cgroups, for kernel tables that
no cgroup or namespace of the sandbox bounds.

The open-file table is the host's, shared by every process, and only CAP_SYS_ADMIN in the
host's namespace passes its end. With the 20,000 open files a process inherited here, 20
children of a candidate opened 200,000 eventfds in 1.2 s, and about 130 would have filled this
CPU machine's table: every other sandbox on the host (another guard's candidates, the
confined agents) would have failed its next open (red team, session 44). Each process of a
candidate's now holds at most ``CANDIDATE_OPEN_FILES`` open descriptors.

That closes the descriptors' route only. A file mapped and then closed stays in the table
without a descriptor: one process held 5,000 that way with 7 descriptors open
(``benchmarks/file_table_probe.py``), and a process may hold 65,530 mappings, so about 40
processes of a sandbox could still fill this machine's table, and no cgroup bounds them: the
guard's pools watch the table instead (``guard.runner.host_files``).
"""

from __future__ import annotations

import resource

# the default soft limit of most Linux systems, where torch, Triton and CUDA run as they are
CANDIDATE_OPEN_FILES = 1024


def limit_open_files(most: int = CANDIDATE_OPEN_FILES) -> None:
    """This process's and its children's open files, soft and hard: raising the hard limit
    again needs CAP_SYS_RESOURCE, which no sandbox has."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = most if hard == resource.RLIM_INFINITY else min(most, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (cap, cap))
