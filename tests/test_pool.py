"""When the worker pool starts spare candidate workers: at warm-up, and, where the pool keeps
a spare (a server), on the CPU after an evaluation and on a GPU once its timing is over: never
while a candidate is timed."""

from __future__ import annotations

import pytest

from guard.runner.pool import WorkerPool


class FakeWorker:
    def __init__(self, role: str, spare: bool = False) -> None:
        self.role, self.spare = role, spare
        self.alive = True
        self.closed = False
        self.ready = False
        self.started_at = 0.0
        self.returncode: int | None = None

    def log_tail(self, lines: int = 30) -> str:
        return "worker log: out of memory"

    def wait_ready(self, timeout: float) -> dict:
        self.ready = True
        return {"ready": True}


@pytest.fixture
def started(monkeypatch):
    made: list[FakeWorker] = []

    def new(self, role, spare=False):
        made.append(FakeWorker(role, spare))
        return made[-1]

    monkeypatch.setattr(WorkerPool, "_new", new)
    monkeypatch.setattr(WorkerPool, "_discard", staticmethod(lambda worker: setattr(worker, "closed", True)))
    return made


@pytest.mark.parametrize("keep_spare", [True, False])
def test_a_spare_is_started_ahead_and_then_only_between_evaluations(tmp_path, started, keep_spare):
    pool = WorkerPool("cpu", tmp_path, prestart=True, keep_spare=keep_spare)
    pool.warm_up()
    assert [w.role for w in started] == ["trusted", "candidate"]
    spare = started[1]
    assert pool.take_candidate() is spare
    assert len(started) == 2  # nothing starts while the evaluation runs
    pool.replenish()
    assert len(started) == (3 if keep_spare else 2)
    assert pool.take_candidate() is (started[2] if keep_spare else started[-1])


def test_without_prestart_each_candidate_gets_a_worker_started_for_it(tmp_path, started):
    pool = WorkerPool("cpu", tmp_path, prestart=False)
    first = pool.take_candidate()
    pool.replenish()
    assert started == [first] and pool.take_candidate() is not first and len(started) == 2


def test_a_dead_spare_is_discarded_replaced_and_said(tmp_path, started, caplog):
    pool = WorkerPool("cpu", tmp_path, prestart=True)
    pool.warm_up()
    started[1].alive, started[1].returncode = False, -9
    worker = pool.take_candidate()
    assert started[1].closed and worker is started[2]
    # the verdict then waits for a whole start: the log says which spare ended, and how
    assert "had ended (killed by signal SIGKILL): worker log: out of memory" in caplog.text


def test_on_a_gpu_no_spare_starts_until_the_timing_is_over(tmp_path, started):
    """A spare's start beside the benchmark floored honest figures (session 47): taking a worker
    starts none; ``start_beside``, once the verdict's timing is over, starts the missing ones."""
    pool = WorkerPool("cuda", tmp_path, prestart=True, spares=3)
    pool.warm_up()
    assert [w.role for w in started] == ["trusted", "candidate", "candidate", "candidate"]
    assert pool.take_candidate() is started[1]  # the oldest spare: the likeliest to be ready
    for w in started[2:4]:
        w.ready = True  # the warm-up's spares have started
    assert len(started) == 4 and pool.quiet_spare() is None  # nothing starting beside the timing
    pool.start_beside()  # the timing is over
    assert len(started) == 5 and started[4].spare and not started[4].ready
    pool.quiet_spare()  # what a figure measured again waits for: every start under way is over
    assert started[4].ready
    pool.replenish()  # after the evaluation: the pool is full
    assert len(started) == 5 and pool.take_candidate() is started[2]
    # a caller that times nothing asks for the start at once
    pool.take_candidate()
    pool.start_beside()
    assert len(started) == 7
    one_shot = WorkerPool("cuda", tmp_path, prestart=True, keep_spare=False)
    one_shot.warm_up()
    before = len(started)
    one_shot.take_candidate()
    one_shot.start_beside()
    assert len(started) == before  # a one-shot command starts no worker that nobody would use
    assert one_shot.quiet_spare() is None


def test_with_three_spares_the_verdict_after_a_pairing_finds_one_ready(tmp_path, started):
    """A pairing takes a spare for the incumbent, and no spare starts before the timing is
    over; with one spare the next verdict waited for a start (8.3 s on an H100, session 44)."""
    pool = WorkerPool("cuda", tmp_path, prestart=True, spares=3)
    pool.warm_up()
    first, second, third = started[1:4]
    assert pool.take_candidate() is first
    assert pool.take_candidate() is second and len(started) == 4  # the incumbent's: nothing starts
    pool.start_beside()  # the pairing's timing is over
    assert len(started) == 6 and all(w.spare for w in started[4:])
    pool.replenish()  # the paired verdict is over: nothing more to start
    assert len(started) == 6
    assert pool.take_candidate() is third  # ready: started before this verdict
    with pytest.raises(ValueError):
        WorkerPool("cuda", tmp_path, spares=0)


def test_a_verdict_that_pairs_twice_leaves_the_next_one_a_ready_spare(tmp_path, started):
    """Review, session 45: pairings with the agent's best and the global best took both spares,
    and the next verdict waited for a start. The spares start once the pairings' timing is over,
    beside the held-out checks; on the CPU only after the evaluation."""
    pool = WorkerPool("cuda", tmp_path, prestart=True, spares=3)
    pool.warm_up()
    pool.take_candidate()  # the challenger's
    pool.take_candidate()  # the agent's best's
    pool.take_candidate()  # the global best's
    assert len(started) == 4
    pool.start_beside()
    assert len(started) == 7 and all(w.spare for w in started[4:])
    cpu = WorkerPool("cpu", tmp_path, prestart=True)
    cpu.warm_up()
    cpu.take_candidate()
    before = len(started)
    cpu.start_beside()
    assert len(started) == before


def test_a_closed_pool_starts_no_spare(tmp_path, started):
    pool = WorkerPool("cuda", tmp_path, prestart=True, spares=2)
    pool.warm_up()
    pool.close()
    before = len(started)
    pool.replenish()
    pool.warm_up()
    assert [w for w in started[before:] if w.role == "candidate"] == []
    assert started[before:] == []  # nor a trusted worker


def test_a_slow_spare_does_not_cut_the_next_ones_wait(tmp_path, started):
    """Review, session 45: the spares shared one wait, so a slow first start left the next a
    wait of 0 s, and a worker that does not answer in time is killed."""
    pool = WorkerPool("cuda", tmp_path, prestart=True, spares=2)
    pool.warm_up()
    waits = []
    for w in started[1:]:
        w.wait_ready = lambda timeout, w=w: (waits.append(timeout), setattr(w, "ready", True))
    pool.quiet_spare(timeout=30.0)
    assert waits == [30.0, 30.0]


def test_a_spare_that_fails_to_start_is_dropped_not_raised(tmp_path, started):
    from guard.runner.process import WorkerDied

    pool = WorkerPool("cuda", tmp_path, prestart=True)
    pool.warm_up()
    pool.take_candidate()
    pool.start_beside()
    broken = started[2]

    def died(timeout):
        raise WorkerDied("no torch", 1, "")

    broken.wait_ready = died
    pool.quiet_spare()
    assert broken.closed and pool.take_candidate() is started[3]


def test_only_spares_are_told_they_start_ahead_of_their_candidate(tmp_path, monkeypatch):
    """Told by an argument (``--spare``), never by a variable: a worker's environment holds
    nothing of the guard's (tests/test_worker_environment.py)."""
    from guard.runner import pool as pool_mod

    made: list[tuple[dict, bool]] = []

    class Recorded:
        def __init__(self, role, device, workdir, memory_limit_gb, env, **kw):
            made.append((dict(env), kw.get("spare", False)))

        def start(self):
            return self

    monkeypatch.setattr(pool_mod, "WorkerProcess", Recorded)
    pool = WorkerPool("cuda", tmp_path, prestart=False, env={"CUDA_VISIBLE_DEVICES": "1"})
    pool._new("candidate")
    pool._new("candidate", spare=True)
    assert [spare for _, spare in made] == [False, True]
    assert all(e == {"CUDA_VISIBLE_DEVICES": "1"} for e, _ in made)


def test_a_discarded_worker_is_killed_not_asked_to_exit(tmp_path, monkeypatch):
    """Unprofiled, a discarded worker is killed at once: asked to exit, it spent about 0.5 s
    in torch's teardown, which every verdict waited for."""
    import signal

    from guard.runner import request_profile

    monkeypatch.delenv(request_profile.ENV, raising=False)
    pool = WorkerPool("cpu", tmp_path / "workers", prestart=False)
    try:
        worker = pool.trusted()
        assert worker.request({"op": "memory", "reset": False}, 60).get("ok")
        asked: list[float] = []
        monkeypatch.setattr(worker, "close", lambda grace=2.0: asked.append(grace))
        pool.discard(worker)
        assert asked == [] and worker.proc is not None and worker.proc.poll() == -signal.SIGKILL
        assert not worker.workdir.exists()
    finally:
        pool.close()


def test_a_verdict_starts_its_spares_only_once_its_timing_is_over(tmp_path, monkeypatch):
    """The guard takes its candidate's worker without starting a spare, and asks for the spares
    after the benchmark and the pairing, before the held-out checks (session 47: a start beside
    the benchmark floored honest figures). Seen from the gates' order on the CPU, where the
    pool itself starts nothing beside an evaluation."""
    from guard.candidates.load import from_source
    from guard.cascade import benchmark_gate, correctness_gate, pairing_gate

    from helpers import CHEATS, RMS, make_guard, unique

    guard = make_guard(tmp_path / "ws", static_screen=False)
    events: list[str] = []

    def traced(module, name, label):
        real = getattr(module, name)

        def wrapper(*a, **k):
            out = real(*a, **k)
            events.append(label(*a, **k) if callable(label) else label)
            return out

        monkeypatch.setattr(module, name, wrapper)

    traced(benchmark_gate, "benchmark", "benchmark done")
    traced(pairing_gate, "pairings", "pairing done")
    traced(correctness_gate, "check", lambda ctx, which, *a, **k: f"{which} checked")
    take = guard.pool.take_candidate
    monkeypatch.setattr(guard.pool, "take_candidate", lambda **k: events.append(f"taken {k}") or take(**k))
    monkeypatch.setattr(guard.pool, "start_beside", lambda: events.append("spares started"))
    try:
        v = guard.evaluate(from_source(unique((CHEATS / "honest_torch.py").read_text()), "pytorch"), RMS)
    finally:
        guard.close()
    assert v.status == "PASSED", v.reason
    assert events[0] == "taken {}", events  # the pool's default: no start
    order = [e for e in events if not e.startswith("taken")]
    assert order == ["visible checked", "benchmark done", "pairing done", "spares started", "heldout checked"]


def test_the_trusted_workers_idle_reference_is_taken_alone_on_the_device(tmp_path):
    """Review, session 47: the trusted worker's idle reference (a flush pass's time, which every
    later drain probe is held to) was taken when its timer was first made, beside a live
    candidate. It is taken once per trusted worker, under the exclusive slot, after any starting
    spare is through, before any candidate of the verdict is taken."""
    import contextlib
    from types import SimpleNamespace

    from guard.cascade.reference_side import ReferenceSide
    from guard.runner import messages as m

    order: list[str] = []

    @contextlib.contextmanager
    def hold(exclusive, progress):
        order.append(f"hold exclusive={exclusive}")
        yield 0.0
        order.append("let go")

    ref = ReferenceSide.__new__(ReferenceSide)
    ref._idle_referenced = __import__("weakref").WeakSet()
    ref.device = SimpleNamespace(kind="cuda")
    ref.pool = SimpleNamespace(quiet_spare=lambda: order.append("spares through") or None)
    ref.hold = hold
    ref.request = lambda trusted, msg, model: (
        order.append(type(msg).__name__) or m.DeviceIdleReply(ok=True, pass_ms=0.01, flush_ms=0.01)
    )
    first, second = FakeWorker("trusted"), FakeWorker("trusted")
    ref.ensure_idle_reference(first)
    ref.ensure_idle_reference(first)  # once per worker
    assert order == ["hold exclusive=True", "spares through", "DeviceIdle", "let go"]
    ref.ensure_idle_reference(second)  # a trusted worker started again: taken again
    assert order.count("DeviceIdle") == 2
    ref.device = SimpleNamespace(kind="cpu")
    ref.ensure_idle_reference(FakeWorker("trusted"))  # a CPU has no device to drain
    assert order.count("DeviceIdle") == 2


@pytest.mark.parametrize("wait", [False, True])
def test_a_verdict_waits_for_starting_spares_before_it_times_unless_told_not_to(tmp_path, monkeypatch, wait):
    """``wait_for_starts_before_timing``: the benchmark waits for starting spare workers before
    the first workload is timed (off by default since session 50; off, a figure a start floors
    or contradicts is only measured again after the wait). The wait comes first with no slot held,
    so that a hung start keeps no other guard's timing waiting, and again once the exclusive
    slot is taken, for a start begun meanwhile."""
    from guard.candidates.load import from_source
    from guard.cascade import benchmark_gate

    from helpers import CHEATS, RMS, make_guard, unique

    guard = make_guard(tmp_path / "ws", static_screen=False, wait_for_starts_before_timing=wait)
    events: list[str] = []
    real = benchmark_gate.benchmark
    monkeypatch.setattr(benchmark_gate, "benchmark", lambda ctx: events.append("benchmark") or real(ctx))
    monkeypatch.setattr(
        guard.pool, "quiet_spare", lambda: events.append(f"waited, holding {guard.reference.slot.held()}") or 1.5
    )
    try:
        v = guard.evaluate(from_source(unique((CHEATS / "honest_torch.py").read_text()), "pytorch"), RMS)
    finally:
        guard.close()
    assert v.status == "PASSED", v.reason
    # (a new problem's baselines wait for starts too, whatever the setting, where not cached)
    if wait:
        before = events[: events.index("benchmark")]
        assert before[-2:] == ["waited, holding None", "waited, holding exclusive"], events
        assert v.phases_s["spare_wait"] == 3.0
    else:
        assert "benchmark" in events and "spare_wait" not in v.phases_s
