"""Hostile requests to a real `grpo reward-serve` (issue 31, item 4): a request never chooses how its
reward runs (the interpreter, the isolation, the limits, the judge's endpoint or its key's variable),
and a request without the API key is refused before its body is read.

Real servers on 127.0.0.1 (subprocesses, port 0), real HTTP; the judge's endpoints are stdlib HTTP
servers that record what reaches them.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from big_body import memory_mb, send
from cli_runner import run_grpo
from reward_server_process import RewardServer

from grpocli.errors import UserError
from grpocli.recipe.schema import RewardSpec
from grpocli.registry import load_plugins
from grpocli.rewards import resolve, score

KEY = "operator-key-31"
PASSING = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = ["assert add(1, 2) == 3"]


def post(url: str, body: dict, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url + "/score", data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def batch(reward: str, args: dict, columns: dict | None = None, n: int = 1) -> dict:
    return {"protocol": 1, "reward": reward, "args": args, "prompts": ["p"] * n, "completions": [PASSING] * n,
            "columns": columns if columns is not None else {"tests": [TESTS] * n}}


@pytest.fixture
def script(tmp_path):
    """An executable 'interpreter' of a caller's that, if it ever ran, would leave a marker file."""
    marker = tmp_path / "ran-as-the-server"
    path = tmp_path / "evil.sh"
    path.write_text(f"#!/bin/sh\ntouch {marker}\nexec python3 \"$@\"\n")
    path.chmod(0o755)
    return path, marker


# -- code.tests ------------------------------------------------------------------------------------
def test_a_keyless_code_tests_server_never_runs_the_interpreter_isolation_or_limits_a_request_names(tmp_path, script):
    path, marker = script
    srv = RewardServer("code.tests", cwd=tmp_path)  # the defaults: loopback, no key
    try:
        assert "no --api-key: any user of this machine can call the rewards" in "".join(srv.output)
        for args, key in [({"isolation": "process", "python": str(path)}, "isolation"),
                          ({"python": str(path)}, "python"),
                          ({"memory_mb": 1 << 20, "max_processes": 4096, "workers": 256, "case_timeout": 600},
                           "memory_mb"),
                          ({"mode": "fraction"}, "mode")]:  # even the default, unless the operator fixed it
            status, answer = post(srv.url, batch("code.tests", args))
            assert status == 403, (args, answer)
            assert answer["detail"].startswith(f"args.{key} is not the request's to set"), answer
        status, answer = post(srv.url, batch("code.tests", {}, {"tests": [TESTS], "python": [str(path)]}))
        assert status == 422 and "columns.python" in answer["detail"], answer
        assert post(srv.url, batch("code.tests", {}))[1]["scores"] == [1.0]  # the server's own args
        assert not marker.exists()
    finally:
        srv.stop()


def test_an_operator_fixes_code_tests_args_and_lets_requests_pick_from_a_list(tmp_path, script, monkeypatch):
    path, marker = script
    (tmp_path / "code.toml").write_text('isolation = "process"\nworkers = 1\n')
    srv = RewardServer("code.tests", cwd=tmp_path, api_key=KEY,
                       args=("--args", f"code.tests=@{tmp_path / 'code.toml'}",
                             "--allow", 'code.tests={"memory_mb": [256, 512]}'))
    monkeypatch.setenv("GRPO_REWARD_API_KEY", KEY)

    def scored(args: dict) -> list:
        spec = RewardSpec(name="code.tests", url=srv.url, args=args, retry_backoff=0.0)
        fns = resolve([spec], load_plugins().rewards)
        return score(fns, ["p"], [PASSING], {"tests": [TESTS]}).per_reward["code.tests"]

    try:
        info = json.loads(urllib.request.urlopen(urllib.request.Request(
            srv.url + "/info", headers={"X-API-Key": KEY}), timeout=30).read())
        assert info["args"]["code.tests"] == {"args": {"isolation": "process", "workers": 1},
                                              "allow": {"memory_mb": [256, 512]}}
        assert scored({}) == scored({"isolation": "process"}) == scored({"memory_mb": 512}) == [1.0]
        for args, said in [({"memory_mb": 4096}, 'args.memory_mb = 4096 is not one this server allows for '
                                                 'code.tests: 256, 512'),
                           ({"isolation": "bwrap"}, 'args.isolation = "bwrap" differs from "process", the value this '
                                                    'server fixed'),
                           ({"python": str(path)}, "args.python is not the request's to set")]:
            with pytest.raises(UserError) as err:
                scored(args)
            assert err.value.where == "rewards[0].args", err.value.render()
            assert f"refused the args of 'code.tests' (HTTP 403): {said}" in err.value.what, err.value.what
        assert not marker.exists()
    finally:
        srv.stop()


# -- judge -----------------------------------------------------------------------------------------
class Endpoint:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 that answers "Score: 7" and records each
    request's Authorization header."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        seen = self.seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                seen.append(self.headers.get("Authorization", ""))
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                                   "choices": [{"index": 0, "finish_reason": "stop",
                                                "message": {"role": "assistant", "content": "Score: 7"}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


def test_judge_sends_the_servers_key_only_to_the_operators_endpoint(tmp_path):
    operator, caller = Endpoint(), Endpoint()
    fixed = {"model": "m", "base_url": operator.url, "api_key_env": "JUDGE_KEY", "max_retries": 0}
    srv = None
    try:
        srv = RewardServer("judge", cwd=tmp_path, args=("--args", f"judge={json.dumps(fixed)}"),
                           env={"JUDGE_KEY": "judge-key", "HF_TOKEN": "hf-secret"})
        for args in ({"model": "m", "base_url": caller.url, "api_key_env": "HF_TOKEN"}, {"api_key_env": "HF_TOKEN"},
                     {"base_url": caller.url}):
            status, answer = post(srv.url, batch("judge", args, {}))
            assert status == 403 and "differs from" in answer["detail"], (args, answer)
        status, answer = post(srv.url, batch("judge", {}, {"api_key_env": ["HF_TOKEN"]}))
        assert status == 422 and "columns.api_key_env" in answer["detail"], answer
        status, answer = post(srv.url, batch("judge", {"model": "m"}, {}))
        assert status == 200 and answer["scores"] == [pytest.approx(0.7)], answer
        assert caller.seen == [] and operator.seen == ["Bearer judge-key"]
    finally:
        if srv is not None:
            srv.stop()
        operator.close()
        caller.close()


# -- the command line ------------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "said"), [
    (["length", "--args", "nope={}"], "--args 'nope={}' names no reward this server serves"),
    (["length", "--args", "length=[1]"], "list given; args are a JSON object"),
    (["length", "--args", "length={bad"], "is not JSON"),
    (["length", "--args", "length=@missing.toml"], "cannot read missing.toml"),
    (["length", "--args", 'length={"targte": 3}'], "takes no argument 'targte'"),
    (["length", "--args", 'length={"target": 3}', "--args", 'length={"target": 4}'], "--args is given twice"),
    (["code.tests", "--args", 'code.tests={"memory_mb": 1}'], "code.tests arg memory_mb"),
    (["code.tests", "--allow", 'code.tests={"python": ["/usr/bin/python3"]}'], "python is the operator's alone"),
    (["judge", "--args", 'judge={"model": "m", "base_url": "http://127.0.0.1:9/v1"}',
      "--allow", 'judge={"api_key_env": ["HF_TOKEN"]}'], "api_key_env is the operator's alone"),
    (["length", "--allow", 'length={"target": 3}'], "is not a list of values"),
], ids=["unserved", "not-an-object", "not-json", "no-file", "misspelt", "twice", "out-of-bounds", "allow-python",
        "allow-key-env", "allow-not-a-list"])
def test_bad_args_options_exit_2_naming_them(tmp_path, argv, said):
    out = run_grpo("reward-serve", *argv, "--port", "0", cwd=tmp_path, timeout=120)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and said in out.stderr, out.stderr


# -- the key before the body -----------------------------------------------------------------------
SERVED = '''
def n(completions):
    return [float(len(c)) for c in completions]
'''


def test_a_big_body_without_the_key_is_refused_before_it_is_read_and_a_big_one_with_it_is_a_413(tmp_path, monkeypatch):
    (tmp_path / "srv_mod.py").write_text(SERVED)
    srv = RewardServer("srv_mod:n", cwd=tmp_path, api_key=KEY, args=("--max-body-mb", "1"))
    try:
        time.sleep(1.0)  # settled after its first answer
        before = memory_mb(srv.proc.pid)
        for headers in ({}, {"X-API-Key": "wrong"}):
            status, answer, took = send(srv.url, "/score", 100 * 2**20, headers=headers)
            assert status == 401 and "API key" in answer["detail"], answer
            assert took < 100 * 2**20
        after = memory_mb(srv.proc.pid)
        assert after["hwm"] - before["hwm"] < 16, (before, after)  # main's code: +600 MB before its 401
        for chunked in (False, True):  # with the key: past --max-body-mb, a 413 naming the bound
            status, answer, _ = send(srv.url, "/score", 2 * 2**20, headers={"X-API-Key": KEY}, chunked=chunked)
            assert status == 413 and "larger than /score takes (1 MiB)" in answer["detail"], (chunked, answer)
        monkeypatch.setenv("GRPO_REWARD_API_KEY", KEY)
        fns = resolve([RewardSpec(name="srv_mod:n", url=srv.url, retry_backoff=0.0)], load_plugins().rewards)
        assert score(fns, ["p"], ["abc"], {}).per_reward["n"] == [3.0]
        with pytest.raises(UserError, match=r"refused the request \(HTTP 413\): the request body is larger"):
            score(fns, ["p"], ["x" * 2**21], {})
    finally:
        srv.stop()
