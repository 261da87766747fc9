"""`grpo ref-serve` and algorithm.reference = "server": a real server process on 127.0.0.1, real HTTP,
the tiny model in float32, and real training runs compared with the in-process reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch
from big_body import memory_mb, send
from tiny_runs import FAST

from grpocli.errors import UserError
from grpocli.recipe import load_recipe
from grpocli.reference.client import KEY_ENV, ReferenceClient
from grpocli.reference.host import token_batches

KEY = "ref-test-key"
BUDGET = 64  # --max-batch-tokens: small, so that batching and splitting show


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _call(method: str, url: str, body: dict | None = None, key: str | None = KEY) -> tuple[int, object]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["X-API-Key"] = key
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers, method=method),
                                    timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _reference_model():
    """The in-process reference of the FAST recipe (tiny model, seed 0), and its tokenizer."""
    from grpocli.models import load_reference, load_tokenizer

    recipe = load_recipe("quickstart", list(FAST)).recipe
    return load_reference(recipe.model, recipe.train.seed), load_tokenizer(recipe.model)


class Url(str):
    """The server's URL, and its process id (``pid``)."""

    pid: int


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real `grpo ref-serve` on the reference model the FAST recipe builds in process."""
    from grpocli.models import save_model

    model, tokenizer = _reference_model()
    model_dir = save_model(model, tokenizer, tmp_path_factory.mktemp("ref-model"))
    port = _free_port()
    log = tmp_path_factory.mktemp("ref-log") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpocli.cli.app", "ref-serve", "--model", str(model_dir), "--port", str(port),
             "--dtype", "float32", "--api-key", KEY, "--max-batch-tokens", str(BUDGET)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = Url(f"http://127.0.0.1:{port}")
    url.pid = proc.pid
    try:
        deadline = time.monotonic() + 120
        while _poll(url) is None:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        yield url
    finally:
        if proc.poll() is None:
            _call("POST", url + "/close", {})
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _poll(url: str) -> int | None:
    try:
        return _call("GET", url + "/health")[0]
    except OSError:
        return None


def _naive_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """log softmax(logits / t) at each completion token: one plain forward pass of one sequence."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].double()
    return torch.log_softmax(logits / temperature, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def _groups(seed: int, n_groups: int = 3) -> list[tuple[list[int], list[list[int]]]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_groups):
        prompt = torch.randint(3, 40, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
        completions = [torch.randint(3, 40, (int(torch.randint(1, 8, (1,), generator=g)),), generator=g).tolist()
                       for _ in range(3)]
        out.append((prompt, completions))
    return out


@pytest.mark.slow
def test_logprobs_equal_the_in_process_pass_and_requests_are_batched(server):
    model, _ = _reference_model()
    client = ReferenceClient(server, timeout=60, api_key=KEY)
    client.wait_until_ready()
    groups = _groups(0, n_groups=6)  # more than BUDGET tokens: several forward passes
    before = client.call("GET", "/info")["batches"]
    answers = client.logprobs(groups, temperature=0.7)
    assert client.call("GET", "/info")["batches"] - before >= 2
    worst = max(float((torch.tensor(lp, dtype=torch.float64) - _naive_logprobs(model, p, c, 0.7)).abs().max())
                for (p, cs), per in zip(groups, answers) for c, lp in zip(cs, per))
    assert worst < 1e-5, worst
    # four requests waiting together (held behind an open weight update) share forward passes
    uid = client.call("POST", "/weights/begin", {"alpha": 0.5, "timeout": 60})["update_id"]
    requests = [[([k + 3] * 5, [[k + 4 + j] * 4 for j in range(3)])] for k in range(4)]  # 27 tokens each
    results: dict[int, list] = {}
    threads = [threading.Thread(target=lambda k=k: results.__setitem__(k, client.logprobs(requests[k], 1.0)))
               for k in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while client.call("GET", "/info")["waiting"] < 4:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    before = client.call("GET", "/info")["batches"]
    client.call("POST", "/weights/abort", {"update_id": uid})  # nothing mixed: the weights stay intact
    for t in threads:
        t.join(60)
    passes = client.call("GET", "/info")["batches"] - before
    assert passes == len(token_batches([9] * 12, BUDGET)) == 2, passes  # 4 requests, 2 forward passes
    for k, r in enumerate(requests):
        (p, cs), = r
        for c, lp in zip(cs, results[k][0]):
            assert torch.allclose(torch.tensor(lp, dtype=torch.float64), _naive_logprobs(model, p, c, 1.0), atol=1e-5)


@pytest.mark.slow
def test_api_key_required_on_every_endpoint(server):
    for method, path, body in (("GET", "/health", None), ("GET", "/info", None),
                               ("POST", "/logprobs", {"groups": [{"prompt_ids": [5], "completion_ids": [[6]]}]}),
                               ("POST", "/weights/begin", {"alpha": 1.0}), ("POST", "/close", {})):
        for key in (None, "wrong-key"):
            status, answer = _call(method, server + path, body, key=key)
            assert status == 401, (path, key, status, answer)
            assert "API key" in answer["detail"]
    assert _call("POST", server + "/logprobs", {"groups": [{"prompt_ids": [5], "completion_ids": [[6]]}]})[0] == 200
    status, answer = _call("POST", server + "/logprobs", {"groups": [{"prompt_ids": [5], "completion_ids": [[10**6]]}]})
    assert status == 400 and "outside the model's vocabulary" in answer["detail"]
    with pytest.raises(UserError, match="HTTP 401") as err:
        ReferenceClient(server, timeout=10).wait_until_ready()
    assert KEY_ENV in err.value.hint


def _train(out, *overrides: str):
    """A real 2-step run in this process; (the session, its metrics)."""
    from grpocli.trainer.loop import Loop
    from grpocli.trainer.session import Session

    s = Session.open(load_recipe("quickstart", [*FAST, f"train.output_dir={out}", "algorithm.beta=0.1", *overrides]))
    try:
        loop = Loop(s)
        loop.run()
        loop.close()
    finally:
        s.close()
    return s, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _assert_same_metrics(got: list[dict], want: list[dict]) -> None:
    assert [m["step"] for m in got] == [m["step"] for m in want] == [1, 2]
    for g, w in zip(got, want):
        for key in ("kl", "loss", "grad_norm", "reward", "entropy"):
            assert abs(g[key] - w[key]) <= 1e-5 * max(1.0, abs(w[key])), (g["step"], key, g[key], w[key])
    assert want[-1]["kl"] > 0  # the reference mattered


@pytest.mark.slow
def test_training_with_the_server_gives_the_local_metrics_and_holds_no_reference(tmp_path, server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    _, local = _train(tmp_path / "local")
    s, remote = _train(tmp_path / "server", "algorithm.reference=server", f"algorithm.reference_url={server}")
    assert isinstance(s.reference, ReferenceClient) and not isinstance(s.reference, torch.nn.Module)
    _assert_same_metrics(remote, local)


@pytest.mark.slow
def test_ref_sync_steps_mixes_the_policy_into_the_server(tmp_path, server, monkeypatch):
    """ref = 0.5 policy + 0.5 ref after each step: the server's log-probs follow the local mixed
    reference; the checkpoint holds the server's weights; sending them back restores the server."""
    monkeypatch.setenv(KEY_ENV, KEY)
    sync = ["algorithm.ref_sync_steps=1", "algorithm.ref_sync_alpha=0.5"]
    s_local, local = _train(tmp_path / "local", *sync)
    version = ReferenceClient(server, timeout=30, api_key=KEY).wait_until_ready()["weights_version"]
    _, remote = _train(tmp_path / "server", *sync, "algorithm.reference=server", f"algorithm.reference_url={server}")
    _assert_same_metrics(remote, local)
    client = ReferenceClient(server, timeout=60, api_key=KEY)
    assert client.wait_until_ready()["weights_version"] == version + 2  # one refresh per step
    groups = _groups(7)
    fresh, _ = _reference_model()
    for model, close in ((s_local.reference, True), (fresh, False)):
        answers = client.logprobs(groups, 1.0)
        worst = max(float((torch.tensor(lp, dtype=torch.float64) - _naive_logprobs(model, p, c, 1.0)).abs().max())
                    for (p, cs), per in zip(groups, answers) for c, lp in zip(cs, per))
        assert (worst < 1e-5) == close, worst  # the mixed reference's, no longer the initial one's
    from safetensors.torch import load_model

    saved, want = _reference_model()[0], _reference_model()[0]  # the checkpoints' moving references, loaded
    load_model(saved, tmp_path / "server/checkpoints/step-2/trainer/reference.safetensors")
    load_model(want, tmp_path / "local/checkpoints/step-2/trainer/reference.safetensors")
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(saved.state_dict().values(), want.state_dict().values()))
    assert not torch.equal(saved.lm_head.weight, fresh.lm_head.weight)
    client.load_state_dict(dict(fresh.state_dict()))  # as a resume does: alpha = 1
    answers = client.logprobs(groups, 1.0)
    assert all(torch.allclose(torch.tensor(lp, dtype=torch.float64), _naive_logprobs(fresh, p, c, 1.0), atol=1e-5)
               for (p, cs), per in zip(groups, answers) for c, lp in zip(cs, per))


@pytest.mark.slow
def test_timeouts_and_an_abandoned_update(server):
    """A request past the client's timeout is a UserError naming the key; an update that stops midway
    leaves the weights refused (409, with the reason) until a complete alpha = 1 update."""
    from grpocli.generation.weights import pack_bucket

    client = ReferenceClient(server, timeout=1.0, api_key=KEY)
    model, _ = _reference_model()
    uid = client.call("POST", "/weights/begin", {"alpha": 0.5, "timeout": 3.0}, timeout=30)["update_id"]
    name, tensor = next(iter(model.state_dict().items()))
    client.call("POST", f"/weights/bucket?update_id={uid}", pack_bucket([(name, tensor)]), timeout=30)
    with pytest.raises(UserError, match=r"did not answer POST /logprobs within 1 s") as err:
        client.logprobs(_groups(3), 1.0)  # waits behind the open update
    assert err.value.where == "algorithm.reference_timeout"
    deadline = time.monotonic() + 30
    while client.call("GET", "/info", timeout=30)["updating"]:  # it expires 3 s after its last call
        assert time.monotonic() < deadline
        time.sleep(0.2)
    with pytest.raises(UserError, match="HTTP 409: the reference weights are partly mixed") as err:
        client.logprobs(_groups(3), 1.0)
    assert "got no call for 3 s" in err.value.what
    client.timeout = 60
    client.load_state_dict(dict(model.state_dict()))
    groups = _groups(3)
    answers = client.logprobs(groups, 1.0)
    assert torch.allclose(torch.tensor(answers[0][0], dtype=torch.float64),
                          _naive_logprobs(model, groups[0][0], groups[0][1][0], 1.0), atol=1e-5)


@pytest.mark.slow
def test_a_request_that_waited_on_an_update_that_expired_half_sent_is_never_answered_from_mixed_weights(server):
    """Issue 31 item 8: a /logprobs held behind an open update is refused (409) once the update expires
    with half its tensors mixed in (main's code answered it from the half-mixed weights), and so is a
    download; a complete alpha = 1 update brings back the answers of before."""
    from grpocli.generation.weights import pack_bucket

    client = ReferenceClient(server, timeout=60, api_key=KEY)
    model, _ = _reference_model()
    groups = _groups(11)
    body = {"groups": [{"prompt_ids": p, "completion_ids": cs} for p, cs in groups], "temperature": 1.0}
    status, before = _call("POST", server + "/logprobs", body)
    assert status == 200, before
    uid = client.call("POST", "/weights/begin", {"alpha": 0.5, "timeout": 3.0})["update_id"]
    name, tensor = next(iter(model.state_dict().items()))  # half the update: one tensor, far from the server's
    client.call("POST", f"/weights/bucket?update_id={uid}", pack_bucket([(name, torch.randn_like(tensor) * 3)]))
    held: dict[str, tuple] = {}
    waiter = threading.Thread(target=lambda: held.__setitem__("answer", _call("POST", server + "/logprobs", body)))
    waiter.start()
    deadline = time.monotonic() + 30
    while client.call("GET", "/info")["waiting"] < 1:  # held behind the open update
        assert time.monotonic() < deadline
        time.sleep(0.05)
    waiter.join(60)  # the update expires 3 s after its last call; then the held request is answered
    status, answer = held["answer"]
    if status == 200:  # answered from the previous complete weights: allowed, and then exactly those
        assert answer["logprobs"] == before["logprobs"] and answer["weights_version"] == before["weights_version"]
    else:
        assert status == 409, answer
        assert "the reference weights are partly mixed" in answer["detail"] and "no call for 3 s" in answer["detail"]
    assert client.call("GET", "/info")["damaged"]
    status, answer = _call("GET", server + "/weights/bucket?index=0")
    assert status == 409 and "partly mixed" in answer["detail"], answer  # no checkpoint of them either
    with pytest.raises(UserError, match="HTTP 409: the reference weights are partly mixed"):
        client.state_dict()
    client.load_state_dict(dict(model.state_dict()))  # as a resume does: alpha = 1
    status, after = _call("POST", server + "/logprobs", body)
    assert status == 200 and after["weights_version"] == client.call("GET", "/info")["weights_version"]
    assert torch.allclose(torch.tensor([x for g in after["logprobs"] for c in g for x in c]),
                          torch.tensor([x for g in before["logprobs"] for c in g for x in c]), atol=1e-5)


@pytest.mark.slow
def test_a_big_body_without_the_key_is_refused_before_it_is_read(server):
    """Issue 31 item 4: the key from the headers (401) before a byte of the body is read, whatever the
    path; with the key, a JSON body past the bound is a 413 (a weight bucket has none)."""
    before = memory_mb(server.pid)
    for path in ("/logprobs", "/weights/bucket?update_id=x", "/nowhere"):
        status, answer, took = send(server, path, 100 * 2**20)
        assert status == 401 and "API key" in answer["detail"], (path, answer)
        assert took < 100 * 2**20
    after = memory_mb(server.pid)
    assert after["hwm"] - before["hwm"] < 16, (before, after)
    status, answer, _ = send(server, "/logprobs", 300 * 2**20, headers={"X-API-Key": KEY})
    assert status == 413 and "larger than /logprobs takes (256 MiB)" in answer["detail"], answer
    assert memory_mb(server.pid)["hwm"] - before["hwm"] < 16


def test_no_server_is_a_user_error_naming_the_url():
    section = load_recipe("quickstart", ["algorithm.reference=server", "algorithm.reference_url=http://127.0.0.1:9",
                                         "algorithm.reference_timeout=1"]).recipe.algorithm
    with pytest.raises(UserError, match="no grpo ref-serve answers at http://127.0.0.1:9") as err:
        ReferenceClient.connect(section)
    assert err.value.where == "algorithm.reference_url" and "grpo ref-serve --model" in err.value.hint


@pytest.mark.slow
def test_bad_model_exits_2_without_traceback(grpo, tmp_path):
    result = grpo("ref-serve", "--model", str(tmp_path / "missing"), "--port", str(_free_port()))
    assert result.returncode == 2, result.stderr
    assert "--model" in result.stderr and "Traceback" not in result.stderr


# -- a served distillation teacher (distill.teacher = the server's URL) -------------------------------------
@pytest.mark.slow
def test_a_served_teacher_gives_the_local_teachers_metrics(tmp_path, server, monkeypatch):
    """The server holds the student's starting weights; with 'reward_plus_kl' the student moves away from them
    at step 1 (rewards), so step 2 has a KL to the teacher, through the server as in process."""
    from grpocli.models import save_model

    monkeypatch.setenv(KEY_ENV, KEY)
    model, tokenizer = _reference_model()
    local_dir = save_model(model, tokenizer, tmp_path / "teacher")
    keys = ["distill.objective=reward_plus_kl", "distill.coef=0.5", "algorithm.beta=0"]
    _, local = _train(tmp_path / "local", *keys, f"distill.teacher={local_dir}")
    s, remote = _train(tmp_path / "served", *keys, f"distill.teacher={server}")
    assert isinstance(s.teacher, ReferenceClient) and s.teacher.where == "distill.teacher"
    assert local[0]["distill/reverse_kl"] == 0.0 and local[1]["distill/reverse_kl"] != 0.0
    for g, w in zip(remote, local):
        for key in ("distill/reverse_kl", "loss", "grad_norm", "reward"):
            assert abs(g[key] - w[key]) <= 1e-5 * max(1.0, abs(w[key])), (g["step"], key, g[key], w[key])


class ShortAnswers:
    """A real HTTP proxy on 127.0.0.1 in front of the server that drops the last log-prob of one completion
    (the second group's first) from every /logprobs answer."""

    def __init__(self, target: str) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Forward(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                self.forward(None)

            def do_POST(self) -> None:
                self.forward(self.rfile.read(int(self.headers.get("Content-Length", 0))))

            def forward(self, data) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length",
                                                                                     "connection")}
                req = urllib.request.Request(target + self.path, data=data, headers=headers, method=self.command)
                with urllib.request.urlopen(req, timeout=60) as resp:
                    status, body = resp.status, resp.read()
                if self.path == "/logprobs":
                    answer = json.loads(body)
                    answer["logprobs"][1][0] = answer["logprobs"][1][0][:-1]
                    body = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ShortAnswers:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


def test_a_teacher_server_answering_the_wrong_number_of_log_probs_names_the_row(tmp_path, server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    with ShortAnswers(server) as proxy, pytest.raises(UserError) as err:
        _train(tmp_path / "run", f"distill.teacher={proxy.url}", "train.steps=1")
    assert err.value.where == "distill.teacher", err.value
    assert "log-probs for a completion of" in err.value.what and "prompt 1, its completion 0" in err.value.what
