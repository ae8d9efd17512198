"""When the worker pool starts spare candidate workers: at warm-up, and after an evaluation
only where the pool keeps a spare (a server), never in the middle of one."""

from __future__ import annotations

import pytest

from guard.runner.pool import WorkerPool


class FakeWorker:
    def __init__(self, role: str) -> None:
        self.role = role
        self.alive = True
        self.closed = False


@pytest.fixture
def started(monkeypatch):
    made: list[FakeWorker] = []

    def new(self, role):
        made.append(FakeWorker(role))
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
