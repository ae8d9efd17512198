"""What an agent can do through the tools before and around its candidate's sandbox (red team,
session 42): the source paths the guard's own process writes, the size of a solution, its
share of the queue, and what the report exports as the run's best."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from guard.candidates.load import from_solution_json, from_source
from guard.candidates.solution import Solution
from launcher.report import _export, _run_best

from helpers import RMS, add_judged_candidate, fast_config, fast_workspace, honest_source

HONEST = honest_source()
ZEROS = "import torch\n\ndef run(hidden_states, weight):\n    return torch.zeros_like(hidden_states)\n"


def solution(*sources: tuple[str, str], entry: str = "kernel.py::run") -> dict:
    return {
        "name": "x",
        "spec": {"languages": ["pytorch"], "entry_point": entry, "destination_passing_style": False},
        "sources": [{"path": p, "content": c} for p, c in sources],
    }


@pytest.mark.parametrize(
    "path",
    [
        "notes/.git/config",  # a repository inside the archive, whose config runs commands for git users there
        ".git/HEAD",
        ".gitattributes",
        "./kernel.py",  # one file under two names: the order of the entries decided what ran
        "a//kernel.py",
        "kernel.py/",
        "../kernel.py",
        "/etc/kernel.py",
        "a\\kernel.py",
        "line\nbreak.py",
        "/".join(["d"] * 9) + "/k.py",
    ],
)
def test_source_paths_are_plain_relative_names(path):
    """Every source path is in normal form and names nothing hidden: the guard's unsandboxed
    process writes accepted sources into the workspace's git archive (a red team's
    ``notes/.git/config`` with ``core.fsmonitor`` ran a command at the next ``git status``
    there), and two names of one file let the order of the entries decide what ran, while the
    source hash, which sorts them, called the two orders one candidate."""
    with pytest.raises(ValidationError, match="invalid source path"):
        Solution.model_validate(solution(("kernel.py", HONEST), (path, "x")))
    with pytest.raises(ValueError, match="invalid source path"):
        from_solution_json(json.dumps(solution(("kernel.py", HONEST), (path, "x"))))


def test_plain_nested_paths_and_hidden_file_names_from_a_command_line_still_work():
    sol = Solution.model_validate(solution(("kernel.py", HONEST), ("lib/util-2.py", "X = 1\n"), ("README", "")))
    assert [s.path for s in sol.sources] == ["kernel.py", "lib/util-2.py", "README"]
    assert from_source(HONEST, "pytorch", ".hidden.py").sources[0].path == "kernel.py"


@pytest.fixture
def queue_only(tmp_path):
    """A service that only queues (another process would judge): no worker starts."""
    from guard.workspace import Workspace
    from kernelarc_mcp.service import Service

    ws = fast_workspace(tmp_path / "ws")
    svc = Service(Workspace.open(ws), fast_config(), device="cpu", prestart=False, evaluator=False)
    yield svc
    svc.close()


def test_a_solution_beyond_its_size_is_refused_before_anything_is_stored(queue_only):
    """A solution.json's fields beside its sources were unbounded and stored with every verdict
    (a red team's 60 MB of padding was ACCEPTed, 362 MiB on disk)."""
    from kernelarc_mcp.service import SOLUTION_METADATA_BYTES, ServiceError

    big = solution(("kernel.py", HONEST))
    big["padding"] = "x" * (queue_only.guard.cfg.max_source_bytes + SOLUTION_METADATA_BYTES)
    with pytest.raises(ServiceError, match="larger than .* bytes as JSON"):
        queue_only.submit("mallory", RMS, solution=big)
    assert queue_only.jobs.pending() == 0
    fine = solution(("kernel.py", HONEST))
    fine["description"] = "a few words"
    assert queue_only.submit("mallory", RMS, solution=fine).startswith("j-")


def test_one_agent_cannot_fill_the_queue_ahead_of_the_others(queue_only):
    """Jobs were claimed oldest first with no bound per agent: 200 of one agent's put every
    other agent 200 evaluations back. Now an agent may have ``max_queued_per_agent`` waiting
    or being judged; another agent's submission still goes in."""
    from kernelarc_mcp.service import ServiceError

    limit = queue_only.guard.cfg.max_queued_per_agent
    for i in range(limit):
        queue_only.submit("mallory", RMS, source=HONEST + f"\n# {i}\n")
    with pytest.raises(ServiceError, match="max_queued_per_agent"):
        queue_only.submit("mallory", RMS, source=HONEST + "\n# one more\n")
    job = queue_only.submit("bob", RMS, source=HONEST)
    assert queue_only.jobs.get(job).position == limit


def test_one_agent_cannot_fill_the_workspace_with_submissions(tmp_path):
    """Every submission is stored with its verdict, and nothing bounded how many: 400 screen
    rejections of 250 KB made a 207 MB database (red team, session 42). Now an agent's stored
    bytes are bounded; its limit is counted in bytes, and another agent still submits."""
    from guard.workspace import Workspace
    from kernelarc_mcp.service import Service, ServiceError

    limit = 40_000
    svc = Service(
        Workspace.open(fast_workspace(tmp_path / "ws")),
        fast_config(max_stored_bytes_per_agent=limit, max_queued_per_agent=100),
        device="cpu",
        prestart=False,
        evaluator=False,
    )
    try:
        padded = HONEST + "# " + "\u00e9" * 3000 + "\n"  # 2 bytes a character: counted as bytes
        sent = 0
        with pytest.raises(ServiceError, match="max_stored_bytes_per_agent"):
            for i in range(100):
                svc.submit("mallory", RMS, source=padded + f"# {i}\n", notes="n" * 100)
                sent += 1
        assert 4 <= sent <= limit // 6000  # each is over 6000 bytes
        (stored,) = (
            svc.jobs.db.reader()
            .execute(
                "SELECT SUM(LENGTH(CAST(solution_json AS BLOB)) + LENGTH(notes)) FROM jobs WHERE agent = 'mallory'"
            )
            .fetchone()
        )
        assert stored <= limit
        assert svc.submit("bob", RMS, source=HONEST).startswith("j-")
    finally:
        svc.close()


def test_a_workspace_from_before_the_limit_counts_its_stored_jobs(tmp_path):
    """A jobs table without the byte count gets one, filled from what each job stored."""
    import sqlite3

    from guard.workspace import Workspace
    from kernelarc_mcp.service import Service, ServiceError

    ws = Workspace.open(fast_workspace(tmp_path / "ws"))
    with sqlite3.connect(ws.db_path) as c:
        c.execute(
            "CREATE TABLE jobs (id TEXT PRIMARY KEY, agent TEXT NOT NULL, problem TEXT NOT NULL, solution_json TEXT"
            " NOT NULL, notes TEXT, parent TEXT, state TEXT NOT NULL, candidate_id TEXT, error TEXT, created_at REAL"
            " NOT NULL, started_at REAL, finished_at REAL)"
        )
        c.execute(
            "INSERT INTO jobs (id, agent, problem, solution_json, state, created_at) VALUES (?,?,?,?,?,?)",
            ("j-old", "mallory", RMS, "x" * 30_000, "done", 1.0),
        )
    svc = Service(ws, fast_config(max_stored_bytes_per_agent=30_100), device="cpu", prestart=False, evaluator=False)
    try:
        with pytest.raises(ServiceError, match="take 30000 bytes"):
            svc.submit("mallory", RMS, source=HONEST)
    finally:
        svc.close()


def test_another_agents_job_is_refused_at_once(queue_only):
    """``get_result`` on another agent's job waited for that job to end before refusing: how
    long it took told when the job ended."""
    import time

    from kernelarc_mcp.service import ServiceError

    job = queue_only.submit("bob", RMS, source=HONEST)
    t0 = time.monotonic()
    with pytest.raises(ServiceError, match="belongs to another agent"):
        queue_only.result("mallory", job, wait_s=5)
    assert time.monotonic() - t0 < 2.5  # not the 5 s a wait for the (never judged) job would take


def _cand(cid: str, agent: str, score: float, global_best: int = 0, decision: str = "ACCEPT", sol=None) -> dict:
    return {
        "id": cid,
        "agent": agent,
        "problem": RMS,
        "decision": decision,
        "score": score,
        "speedup_eager": score,
        "global_best": global_best,
        "solution_json": json.dumps(sol or solution(("kernel.py", HONEST))),
    }


def test_the_run_best_is_the_guards_global_best_not_the_highest_stored_score():
    """A candidate with a higher stored score that the guard's side-by-side re-measurement
    refused the title is not the run's best; where no candidate of the run took the title, the
    best of the agents' own bests (each one's latest ACCEPT) is."""
    lucky = _cand("c-lucky", "mallory", 9.0)  # ACCEPT over its own best, refused the global title
    holder = _cand("c-holder", "bob", 2.0, global_best=1)
    assert _run_best([holder, lucky])["id"] == "c-holder"
    revoked = _cand("c-gone", "eve", 5.0, global_best=0, decision="REJECT")
    assert _run_best([holder, lucky, revoked])["id"] == "c-holder"
    older = _cand("c-old", "mallory", 9.5)
    assert _run_best([older, lucky])["id"] == "c-lucky"  # mallory's best is its latest ACCEPT


def test_the_exported_best_is_the_solution_that_was_measured(tmp_path):
    """Sources were exported by their last name beside ``solution.json``: a source
    ``meta/solution.json`` replaced the exported solution and ``old/kernel.py`` the kernel that
    ran, both with a kernel of zeros (red team, session 42)."""
    sol = solution(("kernel.py", HONEST), ("old/kernel.py", ZEROS), ("meta/solution.json", json.dumps({"x": 1})))
    _export(_cand("c-1", "bob", 2.0, 1, sol=sol), tmp_path / "best")
    exported = json.loads((tmp_path / "best" / "solution.json").read_text())
    assert [s["path"] for s in exported["sources"]] == ["kernel.py", "old/kernel.py", "meta/solution.json"]
    assert (tmp_path / "best" / "sources" / "kernel.py").read_text() == HONEST
    assert (tmp_path / "best" / "sources" / "old" / "kernel.py").read_text() == ZEROS
    assert exported["author"] == "bob" and exported["definition"] == RMS


# -- the second round (red team, session 42) -------------------------------------------------


def test_a_caught_kernel_stays_caught_in_its_copies(tmp_path):
    """An ACCEPT revoked when timed again (REWARD_HACK) kept its verdict in the stored JSON:
    the same bytes submitted after were judged from it as a duplicate, ACCEPT, and took the
    global title back without a measurement; a copy judged before kept its ACCEPT. The
    revocation now covers every row of that source, and a duplicate is judged from the row."""
    from helpers import make_guard

    ws = fast_workspace(tmp_path / "ws")
    with make_guard(ws, correctness_rounds=1) as g:
        first = g.evaluate(from_source(HONEST, "pytorch"), RMS, agent="mallory")
        assert first.decision == "ACCEPT" and first.is_global_best
        copy = g.evaluate(from_source(HONEST, "pytorch"), RMS, agent="sybil")
        assert copy.duplicate_of == first.candidate_id and copy.decision == "ACCEPT"
        revoked = g.db.revoke(first.candidate_id, "REWARD_HACK", "caught when timed again")
        assert revoked == sorted([first.candidate_id, copy.candidate_id])
        for cid in revoked:
            row = g.db.candidate(cid)
            stored = json.loads(row["verdict_json"])
            assert (row["decision"], row["status"], row["global_best"]) == ("REJECT", "REWARD_HACK", 0)
            assert (stored["decision"], stored["status"], stored["is_global_best"]) == ("REJECT", "REWARD_HACK", False)
        again = g.evaluate(from_source(HONEST, "pytorch"), RMS, agent="mallory")
        assert (again.decision, again.status, again.is_global_best) == ("REJECT", "REWARD_HACK", False)
        assert "caught when timed again" in again.reason


def test_no_two_different_solutions_share_a_hash_or_a_build_key():
    """Parts joined by NUL alone let a file's content hold the next file's name: two solutions,
    one shadowing a standard module and one not, had one source hash (the second inherited the
    first's PASSED as a duplicate), and two C++ solutions one build key."""
    from guard.builders.cuda_cpp import extension_digest

    kernel = "import colorsys\n" + HONEST
    one = Solution.model_validate(solution(("a.txt", "q\0colorsys.py\0ONE_THIRD = 0.0"), ("kernel.py", kernel)))
    two = Solution.model_validate(solution(("a.txt", "q"), ("colorsys.py", "ONE_THIRD = 0.0"), ("kernel.py", kernel)))
    assert one.source_hash() != two.source_hash()
    body = "torch::Tensor run(torch::Tensor x) { return x; }\n"

    def cpp(*files: tuple[str, str]) -> dict:
        return {"spec": {"entry_point": "a.cpp::run"}, "sources": [{"path": p, "content": c} for p, c in files]}

    assert extension_digest(cpp(("a.cpp", body), ("b.cpp", "int y;"))) != extension_digest(
        cpp(("a.cpp", body + "b.cpp\0int y;"))
    )


def test_the_host_function_is_found_in_linear_time():
    """The binding's signature search ran a regular expression over the whole source in the
    guard's own process, in quadratic time, holding its other threads: 128 KB of ``a b(``
    lines took 30 s. A bound twenty times what the scan takes, not a speed target: the old
    search took minutes on this input."""
    import time

    from guard.builders.cuda_cpp import _signature

    cases = {
        "#include <torch/extension.h>\n\ntorch::Tensor run(torch::Tensor x, double eps) {\n}\n": (
            "torch::Tensor",
            "torch::Tensor x, double eps",
        ),
        "// doc\nstatic inline torch::Tensor\nrun(const torch::Tensor& x,\n    int n = f(2)) {\n}\n": (
            "static inline torch::Tensor",
            "const torch::Tensor& x,\n    int n = f(2)",
        ),
        "std::tuple<torch::Tensor, std::vector<int>> run(torch::Tensor a) { }": (
            "std::tuple<torch::Tensor, std::vector<int>>",
            "torch::Tensor a",
        ),
        "__global__ void run(float* x) {}\nvoid g() { run(x); }\ntorch::Tensor run(int y);\nint run(int y) {}": (
            "int",
            "int y",
        ),
        "__global__ void run(float* x) {}\n": None,
        # a ; { } ( in a comment or a literal is not code (the first linear scan cut there)
        "// Host entry point; binds to Python\ntorch::Tensor run(torch::Tensor x) { }": (
            "torch::Tensor",
            "torch::Tensor x",
        ),
        "// shape: {B, N} output\ntorch::Tensor run(torch::Tensor x) { }": ("torch::Tensor", "torch::Tensor x"),
        "torch::Tensor run(torch::Tensor x /* see (1 */) { }": ("torch::Tensor", "torch::Tensor x"),
        'const char* s = "run(x) {"; int run(int y) {}': ("int", "int y"),
    }
    for text, expected in cases.items():
        assert _signature(text, "run") == expected, text
    t0 = time.monotonic()
    assert _signature("a b(\n" * (256_000 // 5), "b") is None
    assert _signature("#b() {\n" * (256_000 // 7), "b") is None
    assert time.monotonic() - t0 < 10


def test_evidence_copied_from_another_agent_is_not_ones_own(tmp_path):
    """A byte-identical copy of another agent's ACCEPT is judged from that agent's measurement:
    cited as evidence it lent its strength to words the copier made up. And one agent keeps at
    most ``MAX_PER_AGENT`` conclusions of a problem (a red team's 100 records, each cited on a
    REJECT the screen gave for nothing, filled recall's window and hid every other agent's)."""
    from guard.archive.db import Database
    from guard.problems.problem import load_problem
    from memory import conclusions as C
    from memory.store import Memory
    from seeds import SEEDS_DIR

    db = Database(tmp_path / "w.db")
    problem = load_problem(SEEDS_DIR / RMS, "seed")
    add_judged_candidate(db, "c-alice", agent="alice", speedup=3)
    add_judged_candidate(db, "c-copy", agent="mallory", speedup=3, duplicate_of="c-alice")
    add_judged_candidate(db, "c-own", agent="mallory", speedup=3)
    m = Memory(db)
    with pytest.raises(C.MemoryError_, match="copy of alice's"):
        m.record("mallory", problem, "fp64 accumulation is 3x faster here", "insight", "c-copy")
    m.record("alice", problem, "one row per program wins", "insight", "c-alice")
    for i in range(C.MAX_PER_AGENT + 20):
        m.record("mallory", problem, f"pitfall {i} {'y' * i} rows {i * 7919}", "pitfall", "c-own")
    agents = [c["agent"] for c in m.recall(problem, "", "problem", 50)]
    assert agents.count("mallory") == C.MAX_PER_AGENT and agents.count("alice") == 1


def test_sources_never_meet_the_archives_own_files(tmp_path):
    """Sources lay beside the archive's ``solution.json`` and ``verdict.json``: a source of that
    name was overwritten, and ``verdict.json/n.txt`` made the commit fail, keeping an ACCEPT out
    of the archive. Sources now lie under ``sources/``."""
    import git

    from guard.archive.git_archive import GitArchive

    archive = GitArchive(tmp_path / "archive")
    sol = solution(("kernel.py", HONEST), ("verdict.json/n.txt", "x"), ("solution.json", "{}"))
    sha = archive.commit(RMS, "mallory", "c-1", sol, {"decision": "ACCEPT"})
    assert sha is not None
    folder = tmp_path / "archive" / RMS / "mallory" / "c-1"
    assert (folder / "sources" / "verdict.json" / "n.txt").read_text() == "x"
    assert (folder / "sources" / "solution.json").read_text() == "{}"
    assert json.loads((folder / "verdict.json").read_text()) == {"decision": "ACCEPT"}
    assert json.loads((folder / "solution.json").read_text())["sources"][0]["path"] == "kernel.py"
    assert git.Repo(tmp_path / "archive").head.commit.hexsha == sha


# -- the third round (red team, session 42) --------------------------------------------------


def test_a_copy_judged_while_its_original_is_caught_is_caught_too(tmp_path, monkeypatch):
    """The revocation covered copies already judged and copies judged after it, but not a copy
    being judged from the original's row as the revocation landed (two devices' jobs, or two
    servers on one workspace): it kept ACCEPT and the global title."""
    from helpers import make_guard

    ws = fast_workspace(tmp_path / "ws")
    with make_guard(ws, correctness_rounds=1) as g:
        first = g.evaluate(from_source(HONEST, "pytorch"), RMS, agent="mallory")
        assert first.decision == "ACCEPT"
        read = g.db.find_evaluated

        def revoked_just_after_the_read(*args):
            row = read(*args)
            g.db.revoke(row["id"], "REWARD_HACK", "caught when timed again")
            return row

        monkeypatch.setattr(g.db, "find_evaluated", revoked_just_after_the_read)
        copy = g.evaluate(from_source(HONEST, "pytorch"), RMS, agent="sybil")
        assert copy.duplicate_of == first.candidate_id
        assert (copy.decision, copy.status, copy.is_global_best) == ("REJECT", "REWARD_HACK", False)
        row = g.db.candidate(copy.candidate_id)
        assert (row["decision"], row["global_best"]) == ("REJECT", 0)


def test_c_text_is_scanned_in_linear_time():
    """``/\\*.*?\\*/`` over an unclosed comment is quadratic: the screen's and the repetition
    check's regular expressions took 135 s over 256 KB of ``/*a`` in the guard's own process,
    for any non-Python source, a ``notes.txt`` beside a Python kernel too. A bound far above
    what the scan takes, not a speed target."""
    import time

    from guard.candidates.c_text import blanked, without_comments
    from guard.repetition import normalized_hash
    from guard.screen import cpp_rules

    # a character literal is a literal, and a quote that does not close is code: a call after
    # '"' was hidden from the screen by the first linear scan
    assert [f.rule for f in cpp_rules.check("k.cu", "const char c = '\"'; system(cmd);")] == ["process"]
    assert blanked('x = "open; y(); // z\nw; // c') == 'x = "open; y(); // z\nw;     '  # the rest of its line is code
    src = 'int a; // c1\n/* b\n c */ char* s = "x//y\\"z"; /* open'
    assert blanked(src) == 'int a;      \n    \n      char* s = "       ";        '
    assert without_comments(src) == 'int a; \n char* s = "x//y\\"z"; '
    t0 = time.monotonic()
    for pattern in ("/*a", '"a', "//\n"):
        text = pattern * (256_000 // len(pattern))
        cpp_rules.check("k.cu", text)
        normalized_hash(Solution.model_validate(solution(("kernel.py", HONEST), ("notes.txt", text))))
    assert time.monotonic() - t0 < 20
    deep = "x = " + "-" * 200_000 + "1\n"  # too deep for the parser: compared as text, no error
    assert normalized_hash(Solution.model_validate(solution(("kernel.py", deep))))


def test_merged_tags_stay_within_a_records_limit(tmp_path):
    """Near-duplicates merged their tags without bound: 400 records of the same words with 10
    new tags each made one conclusion of 3,614 tags, 158 KB in every agent's recall."""
    from guard.archive.db import Database
    from guard.problems.problem import load_problem
    from memory import conclusions as C
    from memory.store import Memory
    from seeds import SEEDS_DIR

    db = Database(tmp_path / "w.db")
    problem = load_problem(SEEDS_DIR / RMS, "seed")
    add_judged_candidate(db, "c-1", agent="mallory", decision="REJECT", status="REWARD_HACK", speedup=None)
    m = Memory(db)
    for i in range(30):
        out = m.record(
            "mallory", problem, "tile sizes matter a lot", "pitfall", "c-1", [f"t{i}-{k}" for k in range(10)]
        )
    assert out["merged"] and len(out["tags"]) == C.MAX_TAGS


def test_a_python_source_is_screened_as_python_reads_it():
    """The worker writes a source as UTF-8 and Python imports it by its coding declaration:
    under ``coding: utf-7`` what the screen read as a comment ran (an ``import os`` and a frame
    walk, ACCEPTed as the global best; red team, session 42). Only UTF-8 is taken."""
    from guard.screen import screen_solution

    hidden = "# -*- coding: utf-7 -*-\n" + HONEST
    res = screen_solution(Solution.model_validate(solution(("kernel.py", hidden))), 256_000, 16)
    assert res.status == "REWARD_HACK" and res.findings[0].rule == "encoding", res
    plain = "# -*- coding: utf-8 -*-\n" + HONEST
    assert screen_solution(Solution.model_validate(solution(("kernel.py", plain))), 256_000, 16).status == "PASSED"
