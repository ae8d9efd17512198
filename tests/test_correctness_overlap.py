"""The correctness gate lets the two workers overlap (``correctness_gate.check``): the
candidate's worker runs the next group of rounds while the trusted worker compares the last.
The verdict must not change: every round compared in order, the first failure decides, and a
group started before an earlier one failed is waited for, so the worker stays in step."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from guard.cascade import correctness_gate
from guard.cascade.context import EvalContext
from guard.cascade.reasons import Rejection
from guard.config import GuardConfig
from guard.problems.derive import WorkloadSet
from guard.problems.schema import Definition, Workload

COPY = Definition.model_validate(
    {
        "name": "copy",
        "op_type": "copy",
        "reference": "def run(x):\n    return x.clone()\n",
        "axes": {"n": {"type": "var"}},
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
    }
)


def workload(uuid: str, n: int) -> Workload:
    return Workload.model_validate({"uuid": uuid, "axes": {"n": n}, "inputs": {"x": {"type": "random"}}})


class Worker:
    """A worker that answers at once and writes what it is asked into a shared log. A request
    is only taken when the previous one was answered (one outstanding, as a real worker)."""

    def __init__(self, role: str, log: list[tuple[str, ...]], outdir: Path, fail_tag: str | None = None):
        self.role, self.log, self.outdir, self.fail_tag = role, log, outdir, fail_tag
        self.pending: dict | None = None

    def send(self, message: dict) -> None:
        assert self.pending is None, f"{message['op']} sent while {self.pending['op']} is unanswered"
        self.pending = message
        tags = [r["tag"] for r in message.get("rounds", [])] or [message.get("tag", "")]
        self.log.append((self.role, "sent", message["op"], *tags))

    def remove_output(self, name: str) -> None:
        (self.outdir / name).unlink(missing_ok=True)

    def receive(self, timeout: float) -> dict:
        msg, self.pending = self.pending, None
        assert msg is not None
        self.log.append((self.role, "answered", msg["op"]))
        if msg["op"] == "reference":
            return {"ok": True, "rounds": [{"tag": r["tag"], "ok": True, "finite": True} for r in msg["rounds"]]}
        if msg["op"] == "check":
            rounds = [
                {
                    "tag": r["tag"],
                    "outputs": [{"file": str(self.outdir / f"{r['tag']}_0.bin"), "shape": [1], "dtype": "float32"}],
                }
                for r in msg["rounds"]
            ]
            return {"ok": True, "rounds": rounds}
        if msg["op"] == "compare":
            passed = msg["tag"] != self.fail_tag
            return {
                "ok": True,
                "passed": passed,
                "status": "PASSED" if passed else "INCORRECT_NUMERICAL",
                "message": "x",
            }
        return {"ok": True}


def context(tmp_path: Path, fail_tag: str | None = None, **cfg) -> tuple[EvalContext, list[tuple[str, ...]]]:
    log: list[tuple[str, ...]] = []
    config = GuardConfig(adversarial_rounds=False, correctness_rounds=2, heldout_rounds=1, **cfg)
    ref = SimpleNamespace(
        cfg=config,
        device=SimpleNamespace(kind="cpu"),
        seed=lambda *parts: abs(hash(parts)) % 1000,
        hold=lambda exclusive, progress: contextlib.nullcontext(0.0),
    )
    cand = Worker("candidate", log, tmp_path)
    cand.outdir = tmp_path  # where the guard names the candidate's output files
    ctx = EvalContext(
        cid="c",
        problem=SimpleNamespace(definition=COPY),  # type: ignore[arg-type]
        wset=WorkloadSet(visible=[workload("a", 16), workload("b", 16)], heldout=[workload("h", 17)]),
        eval_seed=1,
        cand=cand,  # type: ignore[arg-type]
        trusted=Worker("trusted", log, tmp_path, fail_tag),  # type: ignore[arg-type]
        key="k",
        progress=lambda *a: None,
        ref=ref,  # type: ignore[arg-type]
    )
    return ctx, log


def order(log: list[tuple[str, ...]]) -> list[str]:
    """The log as 'who:what' steps, answers left out."""
    return [f"{e[0][0]}:{e[2]}" + (f":{e[3]}" if len(e) > 3 else "") for e in log if e[1] == "sent"]


def check_both(ctx):
    """The visible part, then the held-out one, as ``Guard.evaluate`` runs them (with the
    benchmark between them)."""
    return correctness_gate.merged(correctness_gate.check(ctx, "visible"), correctness_gate.check(ctx, "heldout"))


def test_the_next_group_runs_while_the_last_is_compared(tmp_path):
    ctx, log = context(tmp_path)
    checked = check_both(ctx)
    assert checked.rounds == 5  # 2 + 2 visible, 1 held-out
    assert checked.visible_workloads == 2 and checked.heldout_workloads == 1
    assert order(log) == [
        "t:reference:w0r0",
        "c:check:w0r0",
        "t:reference:w1r0",  # while the candidate runs workload a
        "c:check:w1r0",  # started before a's rounds are compared
        "t:compare:w0r0",
        "t:compare:w0r1",
        "t:compare:w1r0",
        "t:compare:w1r1",
        # the held-out part, later (its tags go on from the visible ones')
        "t:reference:w2r0",
        "c:check:w2r0",
        "t:compare:w2r0",
    ]


def test_groups_larger_than_the_overlap_limit_take_turns(tmp_path):
    ctx, log = context(tmp_path, overlap_rounds_bytes=0)
    assert check_both(ctx).rounds == 5
    steps = order(log)
    assert steps[:5] == ["t:reference:w0r0", "c:check:w0r0", "t:compare:w0r0", "t:compare:w0r1", "t:reference:w1r0"]


def test_the_first_failure_decides_and_the_started_group_is_drained(tmp_path):
    ctx, log = context(tmp_path, fail_tag="w0r1")
    with pytest.raises(Rejection) as caught:
        correctness_gate.check(ctx, "visible")
    assert caught.value.status == "INCORRECT_NUMERICAL" and caught.value.workload == "a"
    steps = order(log)
    assert "t:compare:w1r0" not in steps  # nothing of b is judged
    # b's rounds were running when a failed: their answer was taken, so the worker is in step
    assert "c:check:w1r0" in steps and log.count(("candidate", "answered", "check")) == 2
    assert ctx.cand.pending is None  # type: ignore[attr-defined]


def test_determinism_is_asked_of_the_first_group_of_each_visible_workload_only(tmp_path):
    ctx, log = context(tmp_path, held_rounds_bytes=64)  # one round per group: 64 bytes, 16 floats
    sent: list[dict] = []
    send = ctx.cand.send

    def keep(message: dict) -> None:
        sent.append(message)
        send(message)

    ctx.cand.send = keep  # type: ignore[method-assign]
    check_both(ctx)
    flags = [(m["rounds"][0]["tag"], m["repeat"] is not None) for m in sent]
    assert flags == [("w0r0", True), ("w0r1", False), ("w1r0", True), ("w1r1", False), ("w2r0", False)]
    # a definition's default: bitwise repeats
    assert all(m["repeat"] == {"within": None} for m in sent if m["repeat"] is not None)


def test_a_problem_whose_repeats_may_differ_sends_its_tolerances(tmp_path):
    """``kernelarc.deterministic`` false (KernelBench imports: the reference itself may use
    cuDNN's atomics): the worker is told each output's tolerance for the repeated call."""
    ctx, _ = context(tmp_path)
    loose = COPY.model_copy(update={"kernelarc": COPY.kernelarc.model_copy(update={"deterministic": False})})
    ctx.problem = SimpleNamespace(definition=loose)  # type: ignore[assignment]
    sent: list[dict] = []
    for worker in (ctx.cand, ctx.trusted):
        worker.send = (lambda send: lambda message: (sent.append(message), send(message)))(worker.send)  # type: ignore[method-assign]
    correctness_gate.check(ctx, "visible")
    within = [m["repeat"]["within"] for m in sent if m["op"] == "check" and m["repeat"]]
    compared = [m["tolerances"] for m in sent if m["op"] == "compare"]
    assert len(within) == 2 and compared  # the first group of each visible workload
    # the tolerance the comparison with the reference uses
    assert all(w == compared[0] and w[0]["atol"] > 0 for w in within), (within, compared)
    # and one call's size as the definition gives it, which sizes the worker's copies
    from guard.cascade import memory_plan
    from guard.problems.schema import Workload

    for msg in (m for m in sent if m["op"] == "check"):
        want = sum(memory_plan.tensor_bytes(loose, Workload.model_validate(msg["workload"])))
        assert msg["call_bytes"] == want > 0


def test_a_worker_that_ends_between_held_out_groups_shows_nothing_it_said(tmp_path):
    """A candidate that printed a held-out shape and had its process end after its reply (a
    timer's signal) died on the guard's next send, outside any reply: its log tail came back
    in the diagnostic (review, session 18). The held-out part reports any failure bare."""
    from guard.runner.process import WorkerDied

    ctx, _ = context(tmp_path)
    ctx.cand.send = lambda message: (_ for _ in ()).throw(  # type: ignore[method-assign]
        WorkerDied("candidate worker exited with status 142 during 'check'", 142, "held-out shape: (17,)")
    )
    with pytest.raises(Rejection) as caught:
        correctness_gate.check(ctx, "heldout")
    rej = caught.value
    assert rej.status == "RUNTIME_ERROR" and "shape not shown" in rej.reason and rej.diagnostic is None
    assert "17" not in rej.reason
    with pytest.raises(WorkerDied):  # a visible workload's death keeps its text, for the cascade
        correctness_gate.check(ctx, "visible")
