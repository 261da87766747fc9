"""The worker `grpo ref-serve` runs its model on (grpocli.reference.worker), on plain Python jobs: no model, no HTTP.

The hosts' own tests (tests/engines, tests/reference, tests/faults/test_server_faults.py) check the
same behaviour through the real servers; these pin the worker's contract by itself: one thread,
jobs in the order they came, every waiting job handed over at once, a deadline per job, health.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout

import pytest

from grpocli.reference.worker import Job, Worker
from grpocli.serving.access import ServerError

NAMES = {"subject": "the model", "worker": "the test worker", "restart": "grpo test-serve"}


class Recorder:
    """A schedule that runs each job's callable in order and records how jobs arrived."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.threads: set[str] = set()
        self.worker = Worker("grpo-test", self.schedule, **NAMES)

    def schedule(self, jobs: list[Job]) -> None:
        self.batches.append([job.kind for job in jobs])
        self.threads.add(threading.current_thread().name)
        for job in jobs:
            fn, limit = job.args
            self.worker.run(job, fn, label=job.kind, limit=limit)


@pytest.fixture
def rec():
    r = Recorder()
    yield r
    r.worker.close()


def test_jobs_run_in_order_on_the_worker_thread_with_their_answers(rec):
    out = []
    assert rec.worker.ask(Job("a", (lambda: out.append(1) or "one", 5.0)), 5.0) == "one"
    with pytest.raises(ValueError, match="bad input"):
        rec.worker.ask(Job("b", (lambda: (_ for _ in ()).throw(ValueError("bad input")), 5.0)), 5.0)
    assert rec.worker.ask(Job("c", (lambda: out.append(2) or "two", 5.0)), 5.0) == "two"
    assert out == [1, 2] and rec.threads == {"grpo-test"}
    assert rec.worker.health() is None  # a job's error is its answer, not the worker's end


def test_every_waiting_job_is_handed_over_at_once(rec):
    gate = threading.Event()
    first = rec.worker.submit(Job("first", (gate.wait, 5.0)))
    while not first.running():
        time.sleep(0.01)
    later = [rec.worker.submit(Job(f"job{k}", (lambda k=k: k, 5.0))) for k in range(3)]
    while rec.worker.waiting() < 3:
        time.sleep(0.01)
    gate.set()
    assert first.result(5) is True and [f.result(5) for f in later] == [0, 1, 2]
    assert rec.batches == [["first"], ["job0", "job1", "job2"]]


def test_a_job_past_its_deadline_makes_the_worker_stuck_until_it_ends(rec):
    with pytest.raises(FutureTimeout):
        rec.worker.ask(Job("sleep", (lambda: time.sleep(1.0), 0.1)), 0.1)
    time.sleep(0.2)
    problem = rec.worker.health()
    assert problem is not None and problem.startswith("the model is stuck: sleep has run ")
    assert problem.endswith(" s past its deadline; restart grpo test-serve")
    with pytest.raises(ServerError) as err:  # refused at once, not queued behind the stuck job
        rec.worker.ask(Job("next", (lambda: None, 5.0)), 5.0)
    assert err.value.status == 503 and err.value.reason == problem
    deadline = time.monotonic() + 5
    while rec.worker.health() is not None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert rec.worker.ask(Job("next", (lambda: "ok", 5.0)), 5.0) == "ok"


def test_a_job_without_a_deadline_never_counts_as_stuck(rec):
    future = rec.worker.submit(Job("long", (lambda: time.sleep(0.3) or "done", None)))
    time.sleep(0.1)
    assert rec.worker.health() is None
    assert future.result(5) == "done"


def test_a_dead_worker_refuses_with_its_reason(rec):
    rec.worker.dead = "the model failed; restart grpo test-serve"
    with pytest.raises(ServerError) as err:
        rec.worker.ask(Job("x", (lambda: None, 5.0)), 5.0)
    assert (err.value.status, err.value.reason) == (503, "the model failed; restart grpo test-serve")


def test_a_cancelled_job_is_skipped(rec):
    gate = threading.Event()
    rec.worker.submit(Job("first", (gate.wait, 5.0)))
    ran = []
    skipped = Job("skipped", (lambda: ran.append(1), 5.0))
    rec.worker.submit(skipped)
    assert skipped.future.cancel()
    gate.set()
    assert rec.worker.ask(Job("after", (lambda: "after", 5.0)), 5.0) == "after"
    assert ran == [] and skipped.future.cancelled()


def test_close_cancels_the_queued_jobs_and_stops_the_thread():
    rec = Recorder()
    gate = threading.Event()
    running = rec.worker.submit(Job("running", (gate.wait, 5.0)))
    while not running.running():
        time.sleep(0.01)
    queued = rec.worker.submit(Job("queued", (lambda: None, 5.0)))
    rec.worker.close()
    assert queued.cancelled()
    with pytest.raises(CancelledError):
        queued.result(0)
    gate.set()
    assert running.result(5) is True  # the running job ends on its own
    rec.worker.thread.join(5)
    assert rec.worker.health() == "the test worker thread has stopped; restart grpo test-serve"


def test_wait_lets_the_schedule_run_without_jobs():
    calls = []
    worker = Worker("grpo-test", lambda jobs: calls.append(list(jobs)), wait=lambda: 0.05, **NAMES)
    try:
        deadline = time.monotonic() + 5
        while len(calls) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert all(batch == [] for batch in calls)
    finally:
        worker.close()
