"""The run's git repository and one clone of it per agent (gitpython)."""

from __future__ import annotations

import json
from pathlib import Path

from guard.problems.problem import Problem

GUIDE = """\
# How to work in this run

You are one of several agents optimizing the same GPU kernel problem, `{problem}`, through
the KernelArc MCP server (its tools are available to you as `mcp__kernelarc__*`). The
server judges every kernel: you cannot change its verdicts, and it never trusts what a
kernel prints.

1. `get_problem` for the reference, shapes, tolerances, workloads and the candidate
   contract; the seed kernels are in `seeds/` here and in the answer.
2. `recall` before you start and after each setback: verified conclusions of all agents,
   methods ranked for your measured bottleneck, your own history.
3. Write your kernel in this folder (your own clone), then `submit_candidate` with its source and `notes`
   saying what you tried. If it answers with a `job_id`, call `get_result`.
4. Read the verdict (decision, reason, per-workload times, advice). `record` what you
   learned as an insight or pitfall, citing the `candidate_id` that shows it.
5. `peek_best` shows the leaders' code. Follow the advice: continue, redraft (change the
   design, not its parameters), stop (the swarm is done with you).

Commit your kernels here as you go; your branch is `agent/<your name>`.
"""


def brief(problem: Problem) -> str:
    d = problem.definition
    lines = [f"# {d.name}", "", (d.description or "").strip(), "", "## Inputs", ""]
    for name, spec in d.inputs.items():
        lines.append(f"- `{name}`: {spec.dtype} {spec.shape if spec.shape is not None else 'scalar'}")
    lines += ["", "## Outputs", ""]
    for name, spec in d.outputs.items():
        lines.append(f"- `{name}`: {spec.dtype} {spec.shape}")
    lines += ["", "## Reference", "", "```python", d.reference.rstrip(), "```", ""]
    lines += ["## Visible workloads (axes)", ""]
    lines += [f"- `{w.uuid}`: {json.dumps(w.axes)}" for w in problem.workloads]
    return "\n".join(lines) + "\n"


def create_repo(folder: Path, problem: Problem) -> None:
    import git

    folder.mkdir(parents=True, exist_ok=True)
    repo = git.Repo.init(folder, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "KernelArc launcher")
        cw.set_value("user", "email", "launcher@kernelarc.invalid")
    (folder / "BRIEF.md").write_text(brief(problem))
    (folder / "GUIDE.md").write_text(GUIDE.format(problem=problem.name))
    seeds = folder / "seeds"
    seeds.mkdir(exist_ok=True)
    for name, path in problem.seed_kernels().items():
        (seeds / name).write_text(path.read_text())
    repo.git.add(A=True)
    repo.index.commit(f"run brief for {problem.name}", skip_hooks=True)


def clone_for_agent(repo_folder: Path, worktree: Path, agent: str) -> None:
    """The agent's own clone of the run's repository, on its branch ``agent/<name>``: nothing
    of it is shared with another agent. Worktrees of one repository shared its configuration,
    and a red team's agent set ``core.fsmonitor`` there, which another agent's ``git status``
    then ran with that agent's token in reach. No hard links either: an object file the agent
    rewrote would have changed the others' too."""
    import git

    worktree.parent.mkdir(parents=True, exist_ok=True)
    clone = git.Repo(repo_folder).clone(str(worktree), no_hardlinks=True, branch="main")
    with clone.config_writer() as cw:
        cw.set_value("user", "name", agent)
        cw.set_value("user", "email", f"{agent}@kernelarc.invalid")
    clone.create_head(f"agent/{agent}").checkout()
