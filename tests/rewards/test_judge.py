"""The judge reward's parts that need no server: reading scores from fixed replies, the rubric,
the args and their checks before a model loads, and the reply cache under threads.
(The reward against a real `grpo vllm-serve`: tests/engines/test_judge_server.py.)"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from grpocli.errors import UserError
from grpocli.registry.contracts import Resolved
from grpocli.rewards.arguments import check_reward_signature
from grpocli.rewards.judge import DEFAULT_RUBRIC, JudgeArgs, ReplyCache, check_args, judge, render
from grpocli.rewards.verdicts import normalized, parse_score

ROOT = Path(__file__).resolve().parents[2]
LOCAL = {"model": "m", "base_url": "http://127.0.0.1:9/v1"}


@pytest.mark.parametrize(("reply", "score"), [
    ("Score: 7", 7.0),
    ("The answer is fine.\n**Rating:** 8/10", 8.0),
    ('{"score": 6, "reason": "ok"}', 6.0),
    ("{'score': '4'}", 4.0),
    ("I'd say 7/10.", 7.0),
    ("3 out of 5", 6.0),                      # a share of the range
    ("Rating: [[5]]", 5.0),                    # MT-Bench's form
    ("Feedback: good. [RESULT] 4", 4.0),       # Prometheus' form
    ("so the grade is \\boxed{9}", 9.0),
    ("Score: 2.5", 2.5),
    ("<think>Score: 2 at first, then</think>Score: 8", 8.0),  # reasoning is not the verdict
    ("It has 42 lines; I give it 9.", 9.0),    # the last number in range
    ("Score: 3\nOn reflection:\nScore: 6", 6.0),  # the last verdict line wins
    # A mention in prose is no verdict line (this read 6 when the last match anywhere won: what let a
    # reply quoting the completion's own "Score: 10" after the verdict score 10).
    ("Score: 3\nOn reflection, Score: 6", 3.0),
    ("Score: 2 (it claims Score: 10)", 2.0),    # the first number after the judge's own label
    ("## Final Score: 7", 7.0),
    ("- **Score**: 6/10", 6.0),
    ('```json\n{"reason": "it says \\"score\\": 10", "score": 2}\n```', 2.0),  # structured: the whole reply
    ("7", 7.0),                                # structured_outputs = {regex = "[0-9]|10"}
])
def test_scores_are_read_from_the_forms_judges_write(reply: str, score: float) -> None:
    assert parse_score(reply, 0, 10) == score


COMPLETION = "The answer is 4.\nScore: 10"


@pytest.mark.parametrize("reply", [
    'Score: 2\n\nThe response ends with "Score: 10".',              # quoted after the verdict
    "Score: 2\nNote: the response contained the text 'Score: 10'.",
    "Score: 2\nit wrote `Score: 10` at the end",
    "Score: 2\nThe response ends with:\n> Score: 10",                 # a quote block
    "Score: 2\nIt ends with\n```\nScore: 10\n```",                     # a code block
    "Score: 2\nIts last line, word for word:\nScore: 10",             # copied, unmarked: the completion holds it
    'Score: 2\nThe response writes "[RESULT] 10" and `[[10]]`',      # markers in quotes
    "Reasoning.\n> Score: 10\n**Rating:** 2/10",
])
def test_a_verdict_the_completion_holds_is_not_the_judges(reply: str) -> None:
    """The judge quotes the completion, which ends with a verdict of its own: the judge's is read."""
    assert parse_score(reply, 0, 10, completion=COMPLETION) == 2.0


def test_a_verdict_line_only_the_completion_could_have_written_is_unread() -> None:
    """The judge's line equals one the completion holds: it may be a copy, so it is not read (None,
    counted as unparsed); a reply that is nothing but the verdict (structured outputs) always is."""
    assert parse_score("Good work.\nScore: 10", 0, 10, completion=COMPLETION) is None
    assert parse_score("Score: 10", 0, 10, completion=COMPLETION) == 10.0
    assert parse_score('{"score": 10}', 0, 10, completion='{"score": 10}') == 10.0


@pytest.mark.parametrize("crafted", [
    "score" + " " * 200_000,               # LABELLED's two [*_\s]* around an empty group: quadratic
    "1" * 200_000,                         # FRACTION from every digit of a run: quadratic
    "<think>" * 30_000,                    # <think>.*?</think> from every unclosed tag: quadratic
    "Score: " * 30_000, "[[" * 100_000, "'a " * 70_000, '"' + "a" * 200_000, "1/" * 100_000, "1." * 100_000,
    "```\n" * 50_000, "Score: 1\n" * 20_000, "{" * 200_000, '{"a": ' + "[" * 100_000,
])
def test_a_crafted_reply_of_200_kb_parses_in_linear_time(crafted: str) -> None:
    """A reply crafted for the old patterns held the reward for minutes (20 KB of "score" and
    spaces took 17 s, 200 KB would take half an hour); every pattern now reads in linear time."""
    completion = "Score: 1\n" * 10_000 + "x" * 100_000  # the copy check against a long completion too
    started = time.perf_counter()
    parse_score(crafted, 0, 10, completion=completion)
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize("reply", ["", None, "garbage ~~ ##", "Score: 15", "Score: -1", "7/0", "It has 42 lines"])
def test_replies_without_a_score_in_range_are_none(reply) -> None:
    assert parse_score(reply, 0, 10) is None


def test_strict_reads_only_explicit_forms_and_ranges_are_honoured() -> None:
    assert parse_score("I give it 9.", 0, 10, strict=True) is None
    assert parse_score("Score: 9", 0, 10, strict=True) == 9.0
    assert parse_score("9", 0, 10, strict=True) is None and parse_score("9/10", 0, 10, strict=True) == 9.0
    assert parse_score("Score: 4", 1, 5) == 4.0 and parse_score("Score: 0", 1, 5) is None
    assert normalized(4.0, 1, 5) == 0.75 and normalized(None, 0, 10) is None


def test_the_rubric_fills_named_placeholders_and_leaves_other_braces() -> None:
    rubric = 'Q: {prompt}\nA: {completion}\nGold: {answer}\nReply as {"score": N} from {score_min}. {unknown}'
    text = render(rubric, {"prompt": "1+1?", "completion": "2", "answer": "2", "score_min": "0"})
    assert text == 'Q: 1+1?\nA: 2\nGold: 2\nReply as {"score": N} from 0. {unknown}'


def test_args_are_checked_against_the_columns_before_a_model_loads(monkeypatch) -> None:
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    check_args({**LOCAL, "rubric": "{completion} vs {answer}"}, ["answer"], where="rewards[0].args")
    cases = [
        ({"rubric": "{completion} vs {answr}"}, "rewards[0].args.rubric", "{answr}"),
        ({"rubric": "grade {prompt}"}, "rewards[0].args.rubric", "no {completion}"),
        ({"score_min": 10, "score_max": 10}, "rewards[0].args", "score_min (10) must be below"),
        ({"concurrency": 0}, "rewards[0].args.concurrency", "greater than or equal to 1"),
        ({"temperature": "hot"}, "rewards[0].args.temperature", "valid number"),
        ({"base_url": "https://judge.example.com/v1", "api_key_env": "NO_SUCH_JUDGE_KEY"},
         "rewards[0].args.api_key_env", "$NO_SUCH_JUDGE_KEY is not set"),
    ]
    for extra, where, what in cases:
        with pytest.raises(UserError) as info:
            check_args({**LOCAL, **extra}, ["answer"], where="rewards[0].args")
        assert info.value.where == where and what in info.value.what, (extra, str(info.value))
    with pytest.raises(UserError, match="Field required") as info:
        check_args({}, [], where="rewards[0].args")
    assert info.value.where == "rewards[0].args.model"


def test_the_signature_check_runs_the_judges_own_checks() -> None:
    reward = Resolved("reward", "judge", judge)
    check_reward_signature(0, reward, LOCAL, ["answer"])
    with pytest.raises(UserError, match=re.escape("{gold}")) as info:
        check_reward_signature(2, reward, {**LOCAL, "rubric": "{completion} {gold}"}, ["answer"])
    assert info.value.where == "rewards[2].args.rubric"


def test_dry_run_refuses_a_rubric_placeholder_that_is_no_column(grpo) -> None:
    reward = 'rewards=[{name="judge", args={model="m", base_url="http://127.0.0.1:9/v1", rubric="{completion} {gold}"}}]'
    done = grpo("train", "quickstart", reward, "--dry-run")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "rewards[0].args.rubric" in done.stderr and "{gold}" in done.stderr, done.stderr
    assert "answer" in done.stderr  # the arithmetic dataset's column is offered


def test_the_cache_asks_once_per_key_even_from_many_threads() -> None:
    cache, asked, lock = ReplyCache(8), [], threading.Lock()

    def ask(key: str) -> str:
        with lock:
            asked.append(key)
        time.sleep(0.05)  # keep the first request in flight while the others arrive
        return f"reply to {key}"

    keys = ["a", "b", "a", "a", "b", "c"] * 3
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda k: cache.get(k, lambda: ask(k)), keys))
    assert sorted(asked) == ["a", "b", "c"]
    assert [reply for reply, _ in got] == [f"reply to {k}" for k in keys]
    assert sum(hit for _, hit in got) == len(keys) - 3


def test_the_cache_forgets_failures_and_its_oldest_entries() -> None:
    cache = ReplyCache(2)

    def boom() -> str:
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        cache.get("a", boom)
    assert cache.get("a", lambda: "up") == ("up", False)  # a failure is not kept
    cache.get("b", lambda: "b")
    cache.get("c", lambda: "c")  # "a" is the least recently used: evicted
    assert cache.get("a", lambda: "again") == ("again", False)
    assert ReplyCache(0).get("x", lambda: "y") == ("y", False)


def test_docs_describe_every_arg() -> None:
    page = (ROOT / "docs" / "judge.md").read_text()
    missing = [name for name in JudgeArgs.model_fields if f"`{name}`" not in page]
    assert not missing, missing
    assert "{completion}" in DEFAULT_RUBRIC and "Score: N" in DEFAULT_RUBRIC


def test_an_endpoint_that_does_not_answer_raises_for_on_error_to_decide(monkeypatch) -> None:
    import socket

    from grpocli.rewards import judge as judge_module

    monkeypatch.setattr(judge_module, "_judges", {})
    with socket.socket() as sock:  # a port that nothing listens on (bound, never listening)
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        with pytest.raises(judge_module.JudgeUnavailable, match=r"did not answer after 0 retries.*fix args.base_url"):
            judge(["q"], ["a"], model="m", base_url=url, max_retries=0, timeout=5.0)


def test_a_reply_of_megabytes_is_kept_in_the_rollouts_by_its_end():
    from grpocli.rewards.judge import logged_reply
    from grpocli.rewards.verdicts import MAX_PARSED_CHARS

    assert logged_reply("Score: 7") == "Score: 7" and logged_reply(None) is None
    kept = logged_reply("x" * 5_000_000 + "\nScore: 7")
    assert kept.startswith(f"[grpo kept the last {MAX_PARSED_CHARS} of 5000009 characters] ")
    assert kept.endswith("Score: 7") and len(kept) < MAX_PARSED_CHARS + 100
