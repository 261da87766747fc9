"""How `grpo vllm-serve`'s engine host calls work off and stops (grpocli.server.host, inflight): a
stand-in engine whose ``llm.llm_engine.step`` is counted, no vLLM, no HTTP."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from grpocli.server.host import EngineHost
from grpocli.serving.access import ServerError


class LlmEngine:
    """vLLM's LLMEngine as the host sees it: step(), and the requests still inside it."""

    def __init__(self) -> None:
        self.steps, self.aborted = 0, []
        self.output_processor = type("Out", (), {"external_req_ids": {"req-1"}})()

    def step(self) -> list:
        self.steps += 1
        time.sleep(0.01)
        return []

    def abort_request(self, ids, internal=False) -> None:
        self.aborted.append(list(ids))


class Engine:
    model, max_model_len, world_size, dtype, spec, device = "/tiny", 64, 1, torch.float32, {}, None

    def __init__(self) -> None:
        self.llm = type("LLM", (), {})()
        self.llm.llm_engine = LlmEngine()
        self.closed = False

    def generate_forever(self) -> None:
        while True:  # as LLM.generate steps until its requests finish
            self.llm.llm_engine.step()

    def close(self) -> None:
        self.closed = True


def _idle(host: EngineHost, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while host.worker._busy is not None:
        assert time.monotonic() < deadline, "the engine thread is still inside the call"
        time.sleep(0.01)


def test_a_call_past_its_timeout_is_aborted_at_the_engines_next_step():
    engine = Engine()
    host = EngineHost(engine)
    try:
        with pytest.raises(ServerError, match="did not answer within 0.2 s"):
            host.run(engine.generate_forever, timeout=0.2)
        _idle(host)
        assert engine.llm.llm_engine.aborted == [["req-1"]]  # what it left inside vLLM: aborted
        assert host.health() is None
        steps = engine.llm.llm_engine.steps
        time.sleep(0.1)
        assert engine.llm.llm_engine.steps == steps  # nobody steps for the call any more
    finally:
        host.close()


def test_close_calls_off_the_running_call_and_shuts_the_engine_down():
    engine, answers = Engine(), []

    def wait() -> None:
        try:
            host.run(engine.generate_forever, timeout=60)
        except ServerError as exc:
            answers.append(exc)

    host = EngineHost(engine)
    waiting = threading.Thread(target=wait, daemon=True)
    waiting.start()
    while engine.llm.llm_engine.steps == 0:
        time.sleep(0.01)
    assert host.close(wait=5) is True
    assert engine.closed
    waiting.join(5)
    assert [(e.status, e.reason) for e in answers] == [(503, "the engine call was called off: the server is closing")]


def test_close_leaves_an_engine_stuck_inside_a_call_without_waiting_for_it():
    engine, release = Engine(), threading.Event()
    host = EngineHost(engine)
    started = threading.Event()

    def stuck() -> None:  # no step: nothing to call it off at
        started.set()
        release.wait(30)

    threading.Thread(target=lambda: host.run(stuck, timeout=60), daemon=True).start()
    assert started.wait(5)
    t0 = time.monotonic()
    try:
        assert host.close(wait=0.5) is False  # run_server then exits the process, saying so
        assert time.monotonic() - t0 < 2 and not engine.closed  # no shutdown beside a running call
    finally:
        release.set()
