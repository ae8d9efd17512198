"""A worker's process tree as /proc shows it: its processes, their stat fields, their threads'
run times. Read by the freeze (``freeze``), the CPU-time charge (``tree_cpu``) and the reads of
held outputs (``peek``), none of which owns it."""

from __future__ import annotations

from pathlib import Path


def stat_fields(pid: int, tid: str | None = None) -> list[str] | None:
    """The fields of /proc/PID/stat (or of one thread's, /proc/PID/task/TID/stat) after the
    command name (state first), or None when gone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        stat = Path(path).read_text()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: fields follow the last ')'
    return stat[stat.rfind(")") + 2 :].split()


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, from the parent links of every process in /proc
    (for kernels without /proc/PID/task/TID/children)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name))
        if fields and len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it: from each thread's list of children (a walk of the
    tree alone, fast enough to keep up with processes that fork and exit), or from every
    process's parent link where the kernel lacks those lists."""
    if not Path(f"/proc/{pid}/task").exists():
        return [pid] if stat_fields(pid) is not None else []
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                text = (task / "children").read_text()
            except FileNotFoundError:
                if p == pid and task.name == str(pid):  # no children lists in this kernel
                    return descendants(pid)
                continue
            except OSError:
                continue
            todo.extend(int(c) for c in text.split())
    return out


def run_ns(pid: int) -> dict[int, int] | None:
    """Nanoseconds each thread of the process has run, by thread id (the scheduler's own count,
    which grows by any wake-up, however short), or None where the kernel does not keep it.
    Per thread, not summed: a thread that exits takes its count with it, so a process that
    swaps an old thread for a new one while it should be stopped can leave a smaller sum."""
    out: dict[int, int] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return out or None
