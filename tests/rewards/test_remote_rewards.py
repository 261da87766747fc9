"""Rewards served over HTTP: `grpo reward-serve` subprocesses and [[rewards]] entries with url.

Real servers on 127.0.0.1 (port 0, the URL read from the line the server prints), a real tiny
training run through two of them with one SIGKILLed mid-run, and a stdlib HTTP server that answers
garbage.
"""

from __future__ import annotations

import http.server
import json
import socket
import textwrap
import threading
import time

import pytest
from cli_runner import run_grpo
from reward_server_process import RewardServer
from tiny_runs import FAST
from trickling_server import TricklingServer

from grpocli.errors import UserError
from grpocli.recipe.schema import RewardSpec
from grpocli.registry import load_plugins
from grpocli.rewards import resolve, score
from grpocli.rewards.scoring import trainer_state

KEY = "reward-key-123"
SERVED = '''
import json, os, signal

CALLS = {"n": 0}


def record(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, scale=1.0, **columns):
    """Scores each completion's length times scale; logs (log_extra "seen") every keyword it got."""
    seen = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids, "columns": columns,
            "scale": scale, "state_type": type(trainer_state).__module__ + "." + type(trainer_state).__name__,
            "state": {k: getattr(trainer_state, k) for k in ("global_step", "max_steps", "epoch",
                                                             "num_input_tokens_seen")}}
    log_extra("seen", [json.dumps(seen, sort_keys=True)] * len(completions))
    log_metric("record_calls", 1.0)
    return [scale * len(c[-1]["content"] if isinstance(c, list) else c) for c in completions]


def boom(completions, **kwargs):
    raise ValueError("boom on purpose")


def bad_values(completions):
    return ["x"] * len(completions)


def length_or_die(completions):
    """The length of each completion; SIGKILLs its own server at call number GRPO_TEST_DIE_AT."""
    CALLS["n"] += 1
    if os.environ.get("GRPO_TEST_DIE_AT") == str(CALLS["n"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return [float(len(c[-1]["content"] if isinstance(c, list) else c)) for c in completions]
'''


@pytest.fixture(scope="module")
def served_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("served")
    (folder / "srv_rewards.py").write_text(textwrap.dedent(SERVED))
    return folder


@pytest.fixture(scope="module")
def server(served_dir):
    """One `grpo reward-serve` with a built-in and module:function rewards, behind an API key; the
    operator fixes length's target and lets requests pick record's scale from a list."""
    srv = RewardServer("length", "srv_rewards:record", "srv_rewards:boom", "srv_rewards:bad_values",
                       cwd=served_dir, api_key=KEY,
                       args=("--args", 'length={"target": 3}', "--allow", 'srv_rewards:record={"scale": [1, 2.0]}'))
    yield srv
    srv.stop()


@pytest.fixture
def keyed(monkeypatch, served_dir):
    monkeypatch.setenv("GRPO_REWARD_API_KEY", KEY)
    monkeypatch.syspath_prepend(str(served_dir))  # the same module in-process, to compare


def remote(name: str, url, **kw) -> RewardSpec:
    return RewardSpec(name=name, url=url, retry_backoff=kw.pop("retry_backoff", 0.0), **kw)


BATCH = {
    "prompts": [[{"role": "user", "content": "2+2?"}]] * 2 + [[{"role": "user", "content": "3+4?"}]] * 2,
    "completions": ["4", "four", "7", "seven!"],
    "columns": {"answer": ["4", "4", "7", "7"], "level": [1, 1, 2, 2]},
    "completion_ids": [[52], [102, 111, 117], [55], [115, 33]],
}


def scored(specs: list[RewardSpec], batch: dict = BATCH):
    fns = resolve(specs, load_plugins().rewards)
    return score(fns, batch["prompts"], batch["completions"], batch["columns"], completion_ids=batch["completion_ids"],
                 state=trainer_state(global_step=3, max_steps=10, epoch=0.5, num_tokens=123))


# -- the keywords ------------------------------------------------------------------------------
def test_keywords_and_logs_arrive_as_in_process_for_a_module_function(server, keyed):
    # first over HTTP: the server's first request comes while it imports transformers for the TrainerState
    over_http = scored([remote("srv_rewards:record", server.url, args={"scale": 2.0})])
    local = scored([RewardSpec(name="srv_rewards:record", args={"scale": 2.0})])
    assert over_http.per_reward == local.per_reward == {"record": [2.0, 8.0, 2.0, 12.0]}
    assert over_http.logged.columns == local.logged.columns  # every keyword it saw, as JSON
    seen = json.loads(over_http.logged.columns["seen"][0])
    assert seen["completions"][1] == [{"role": "assistant", "content": "four"}]  # TRL's message lists
    assert seen["columns"] == BATCH["columns"] and seen["completion_ids"] == BATCH["completion_ids"]
    assert seen["state_type"] == "transformers.trainer_callback.TrainerState"
    assert seen["state"] == {"global_step": 3, "max_steps": 10, "epoch": 0.5, "num_input_tokens_seen": 123}
    assert over_http.logged.metrics == local.logged.metrics == {"record_calls": [1.0]}


def test_a_builtin_scores_the_same_and_two_urls_split_the_batch(server, keyed):
    args = {"target": 3}
    assert (scored([remote("length", server.url, args=args)]).per_reward
            == scored([RewardSpec(name="length", args=args)]).per_reward)
    port = server.url.rsplit(":", 1)[1]  # two URLs of one server: two requests, one per half
    halves = scored([remote("srv_rewards:record", [server.url, f"http://localhost:{port}"])])
    assert halves.per_reward["record"] == [1.0, 4.0, 1.0, 6.0]
    parts = [json.loads(s) for s in dict.fromkeys(halves.logged.columns["seen"])]
    assert [p["completion_ids"] for p in parts] == [BATCH["completion_ids"][:2], BATCH["completion_ids"][2:]]
    assert halves.logged.metrics == {"record_calls": [1.0, 1.0]}


# -- failures ----------------------------------------------------------------------------------
def test_a_wrong_or_missing_api_key_is_a_clear_error(server, keyed, monkeypatch):
    monkeypatch.setenv("GRPO_REWARD_API_KEY", "not-the-key")
    with pytest.raises(UserError, match=f"reward server {server.url} refused the API key .HTTP 401") as info:
        scored([remote("length", server.url, on_error="none")])  # no retry, and not silenced
    assert "GRPO_REWARD_API_KEY" in info.value.render()
    monkeypatch.delenv("GRPO_REWARD_API_KEY")
    with pytest.raises(UserError, match="HTTP 401"):
        scored([remote("length", server.url)])
    monkeypatch.setenv("MY_KEY_VAR", KEY)
    assert scored([remote("length", server.url, api_key_env="MY_KEY_VAR")]).errors == {}


def test_a_reward_that_raises_on_its_server_follows_on_error(server, keyed):
    with pytest.raises(UserError) as info:
        scored([remote("srv_rewards:boom", server.url, on_error="raise")])
    text = info.value.render()
    assert f"failed on its server {server.url}: raised ValueError: boom on purpose at" in text
    assert "srv_rewards.py:" in text and "rewards[0] (boom)" in text
    quiet = scored([remote("srv_rewards:boom", server.url, on_error="none")])
    assert quiet.per_reward["boom"] == [None] * 4 and quiet.errors == {"boom": 4}
    masked = scored([remote("srv_rewards:boom", server.url)])  # the default: each row asked alone, all fail
    assert masked.masked == {"boom": [True] * 4} and masked.errors == {}
    with pytest.raises(UserError, match=r"reward 'srv_rewards:bad_values' returned 'x' \(str\) at row 0"):
        scored([remote("srv_rewards:bad_values", server.url, on_error="none")])  # a bug: never silenced
    with pytest.raises(UserError, match="does not serve 'srv_rewards:nope'.*served: length, srv_rewards:record"):
        scored([remote("srv_rewards:nope", server.url)])
    with pytest.raises(UserError, match="takes no argument 'scael'.*did you mean"):
        scored([remote("srv_rewards:record", server.url, args={"scael": 2})])


def test_no_server_answering_follows_on_error_after_its_retries(keyed, capsys):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    quiet = scored([remote("length", url, on_error="none", retries=1)])
    assert quiet.per_reward["length"] == [None] * 4 and quiet.errors == {"length": 4}
    assert f"warning: reward server {url} failed for 'length'" in capsys.readouterr().err
    with pytest.raises(UserError, match=f"could not be scored by its reward server.s. after 3 tries .{url}: "):
        scored([remote("length", url, on_error="raise")])
    masked = scored([remote("length", url, retries=0)])  # the default: the servers' failure masks the batch
    assert masked.masked == {"length": [True] * 4} and masked.per_reward["length"] == [None] * 4
    assert "all 4 rows masked (no row can be scored alone)" in capsys.readouterr().err


def test_the_timeout_bounds_the_whole_answer_of_a_server_that_trickles(keyed, capsys):
    """A byte every 0.1 s: each read is quick, the answer never ends; the timeout ends the call."""
    slow = TricklingServer("body", every=0.1)
    try:
        t0 = time.monotonic()
        quiet = scored([remote("length", slow.url, on_error="none", retries=1, timeout=1)])
        took = time.monotonic() - t0
    finally:
        slow.close()
    assert quiet.per_reward["length"] == [None] * 4 and quiet.errors == {"length": 4}
    assert slow.requests == 2 and took < 4.5, (slow.requests, took)  # two tries of at most 1 s each
    assert f"warning: reward server {slow.url} failed for 'length' (no answer within 1 s)" in capsys.readouterr().err


class Garbage(http.server.BaseHTTPRequestHandler):
    """Answers every POST with the server's ``answer`` bytes (status 200)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = self.server.answer  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def garbage():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize(("answer", "needles"), [
    (b"<html>hello</html>", ["something that is not JSON", "the body of the answer"]),
    (b'[1, 2]', ["a JSON list, not an object"]),
    (b'{"score": [1, 2, 3, 4]}', ["no list of scores", '"scores" of the answer']),
    (b'{"scores": [1, 2]}', ["2 scores for 4 completions", '"scores" of the answer']),
    (b'{"scores": [1, 2, "3", 4]}', ["scores[2] = '3' (str), not a number", '"scores"[2] of the answer']),
    (b'{"scores": [1, 2, 3, 4], "log_metric": {"m": ["x"]}}', ['"log_metric"."m" of the answer']),
], ids=["html", "list", "no-scores", "short", "string-score", "bad-metric"])
def test_a_server_that_answers_garbage_is_named_with_the_field(garbage, keyed, answer, needles):
    garbage.answer = answer
    url = f"http://127.0.0.1:{garbage.server_address[1]}"
    with pytest.raises(UserError) as info:
        scored([remote("length", url, on_error="none")])
    text = info.value.render()
    assert f"reward server {url} answered" in text
    for needle in needles:
        assert needle in text, text


def test_recipe_mistakes_are_named_before_anything_runs(keyed, monkeypatch):
    registry = load_plugins().rewards
    cases = [
        (RewardSpec(name="length", retries=3), "rewards[0].retries", "has no url"),
        (RewardSpec(name="length", url="127.0.0.1:8100"), "rewards[0].url", "is not an http(s) URL"),
        (RewardSpec(name="length", url=[]), "rewards[0].url", "empty list"),
        (RewardSpec(name="length", url=["http://a:1", "http://a:1"]), "rewards[0].url", "lists a server twice"),
        (RewardSpec(name="length", url="http://a:1", batch_size=2), "rewards[0].batch_size", "served"),
        (RewardSpec(name="length", url="http://a:1", api_key_env="NO_SUCH_VAR_XYZ"), "rewards[0].api_key_env",
         "NO_SUCH_VAR_XYZ, which is not set"),
    ]
    for spec, where, what in cases:
        with pytest.raises(UserError) as info:
            resolve([spec], registry)
        assert info.value.where == where and what in info.value.what, info.value.render()
    fns = resolve([RewardSpec(name="my_mod:my_reward", url="http://a:1", args={"anything": 1})], registry)
    assert fns[0].name == "my_reward" and fns[0].args == {}  # the server checks and passes its args


def test_reward_serve_refuses_an_unknown_reward_and_warns_off_loopback(tmp_path):
    out = run_grpo("reward-serve", "no.such_reward", "--host", "0.0.0.0", "--port", "0", cwd=tmp_path, timeout=120)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    assert "listens on 0.0.0.0, reachable from other machines and without --api-key" in out.stderr
    assert "unknown reward 'no.such_reward'" in out.stderr


# -- training ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_training_goes_on_through_the_other_server_when_one_is_killed(served_dir, keyed, tmp_path, capsys):
    from grpocli.recipe import load_recipe
    from grpocli.trainer.loop import train

    dies = RewardServer("srv_rewards:length_or_die", cwd=served_dir, api_key=KEY, env={"GRPO_TEST_DIE_AT": "2"})
    lives = RewardServer("srv_rewards:length_or_die", cwd=served_dir, api_key=KEY)
    try:
        out = tmp_path / "run"
        entry = (f'rewards=[{{name="srv_rewards:length_or_die", url=["{dies.url}", "{lives.url}"], '
                 'retry_backoff=0.05}]')
        train(load_recipe("quickstart", [*FAST, "train.steps=3", "train.torch_threads=1",
                                         f"train.output_dir={out}", entry]))
        assert dies.proc.wait(timeout=10) == -9  # SIGKILLed in its second request (step 2)
    finally:
        dies.stop()
        lives.stop()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["rewards/length_or_die/mean"] > 0 and "rewards/length_or_die/num_errors" not in m for m in metrics)
    assert f"warning: reward server {dies.url} failed for 'srv_rewards:length_or_die'" in capsys.readouterr().err


@pytest.mark.slow
def test_training_against_a_garbage_server_exits_2_naming_it(garbage, tmp_path):
    garbage.answer = b'{"scores": "all good"}'
    url = f"http://127.0.0.1:{garbage.server_address[1]}"
    out = run_grpo("train", "quickstart", *FAST, "train.steps=1", "train.torch_threads=1",
                   f"train.output_dir={tmp_path / 'run'}", f'rewards=[{{name="length", url="{url}"}}]', timeout=240)
    assert out.returncode == 2, (out.stdout[-2000:], out.stderr[-4000:])
    assert "Traceback" not in out.stderr
    assert f"reward server {url} answered scores = 'all good'" in out.stderr
    assert '"scores" of the answer of' in out.stderr
