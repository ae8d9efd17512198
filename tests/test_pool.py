"""When the worker pool starts spare candidate workers: at warm-up, and, where the pool keeps
a spare (a server), on the CPU after an evaluation (never in the middle of one) and on a GPU
as soon as the last spare is taken."""

from __future__ import annotations

import pytest

from guard.runner.pool import WorkerPool


class FakeWorker:
    def __init__(self, role: str, spare: bool = False) -> None:
        self.role, self.spare = role, spare
        self.alive = True
        self.closed = False
        self.ready = True
        self.outstanding: str | None = None
        self.sent: list[dict] = []

    def ready_now(self) -> bool:
        return self.ready

    def send(self, message: dict) -> None:
        assert self.outstanding is None
        self.sent.append(message)
        self.outstanding = message["op"]

    def receive(self, timeout: float) -> dict:
        self.outstanding = None
        return {"ok": True, "seconds": 0.3}


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


def test_a_dead_spare_is_discarded_and_replaced(tmp_path, started):
    pool = WorkerPool("cpu", tmp_path, prestart=True)
    pool.warm_up()
    started[1].alive = False
    worker = pool.take_candidate()
    assert started[1].closed and worker is started[2]


def test_on_a_gpu_the_next_spare_starts_as_soon_as_one_is_taken(tmp_path, started):
    pool = WorkerPool("cuda", tmp_path, prestart=True)
    pool.warm_up()
    assert pool.take_candidate() is started[1]
    spare = started[2]
    assert len(started) == 3 and spare.spare  # ready when the next candidate comes at once
    assert spare.sent == []  # it sets the device up only once nothing is timed
    pool.replenish()  # the evaluation is over: there is a spare already, and it settles now
    assert len(started) == 3 and spare.sent == [{"op": "settle"}] and spare.outstanding == "settle"
    assert pool.take_candidate() is spare and spare.outstanding is None  # its answer read first
    late = started[3]
    late.ready = False
    pool.replenish()  # not ready yet: it settles on its first request instead
    assert late.sent == [] and pool.take_candidate() is late
    one_shot = WorkerPool("cuda", tmp_path, prestart=True, keep_spare=False)
    one_shot.warm_up()
    before = len(started)
    one_shot.take_candidate()
    assert len(started) == before  # a one-shot command starts no worker that nobody would use


def test_only_spares_are_told_they_start_ahead_of_their_candidate(tmp_path, monkeypatch):
    from guard.runner import pool as pool_mod
    from guard.runner import spare_setup

    envs: list[dict] = []

    class Recorded:
        def __init__(self, role, device, workdir, memory_limit_gb, env, **kw):
            envs.append(dict(env))

        def start(self):
            return self

    monkeypatch.setattr(pool_mod, "WorkerProcess", Recorded)
    pool = WorkerPool("cuda", tmp_path, prestart=False, env={"CUDA_VISIBLE_DEVICES": "1"})
    pool._new("candidate")
    pool._new("candidate", spare=True)
    assert [spare_setup.ENV in e for e in envs] == [False, True]
    assert all(e["CUDA_VISIBLE_DEVICES"] == "1" for e in envs) and spare_setup.ENV not in pool.env


def test_a_spare_worker_settles_when_asked_and_goes_on_answering(tmp_path):
    from guard.runner import messages as m
    from guard.runner import spare_setup
    from guard.runner.process import WorkerProcess

    worker = WorkerProcess("candidate", "cpu", tmp_path / "w", env_extra={spare_setup.ENV: "1"}).start()
    try:
        assert worker.wait_ready(120)["ready"] and worker.ready_now()
        settled = m.parse_reply(worker.request(m.Settle().model_dump(), 60), m.SettleReply)
        assert settled.ok and settled.seconds == 0.0  # the CPU has no device to set up
        memory = m.parse_reply(worker.request(m.Memory().model_dump(), 30), m.MemoryReply)
        assert memory.ok and memory.peak_bytes > 0
    finally:
        worker.close()
