"""Processes and the run-directory lock, with real processes and real signals.

* SIGKILL of `grpo train ... train.num_processes=2` takes its launcher and both workers with it
  (grpocli.launch.processes), and leaves no stale lock: a resume right after it works.
* A user error that only the workers meet is printed once, exit 2, without a traceback.
* A second `grpo train` on a run directory in use stops at once (exit 2, naming the holder)
  and touches nothing; `grpo inspect` still reads the run (grpocli.launch.lock).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import ROOT, run_grpo
from tiny_runs import FAST

from grpocli.errors import UserError
from grpocli.launch.lock import holder, lock_path, run_lock
from grpocli.rundir import RunDir

ENV = {"OMP_NUM_THREADS": "1"}


def _start(log: Path, *args: str) -> subprocess.Popen:
    """`grpo ARGS` in the background, its output in `log` (a pipe nobody reads could fill up)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **ENV}
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "grpocli.cli.app", *args], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(check, timeout: float, what: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before {what}: {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {timeout} s")
        time.sleep(0.2)


def _processes_mentioning(text: str) -> list[int]:
    """Live (not zombie) processes whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text.encode() in cmdline and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def _steps(run: RunDir) -> list[int]:
    return [m["step"] for m in run.read_metrics()]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="scans /proc")
def test_sigkill_takes_launcher_and_workers_and_leaves_no_stale_lock(tmp_path):
    run = RunDir(tmp_path / "killed-run")
    log = tmp_path / "train.log"
    proc = _start(log, "train", "quickstart", *FAST, "train.steps=200", "train.save_steps=1",
                  "train.num_processes=2", f"train.output_dir={run.root}")
    try:
        _wait_for(lambda: run.latest_checkpoint() is not None, 150, "a checkpoint", proc, log)
        assert len(_processes_mentioning(str(run.root))) >= 4  # grpo train, its launcher, 2 workers
        assert holder(run)["pid"] == proc.pid  # the launching process holds the lock
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while (left := _processes_mentioning(str(run.root))) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left == [], f"survivors of SIGKILL: {left}"
    finally:
        for pid in _processes_mentioning(str(run.root)):  # only when the test failed
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
    step = run.latest_checkpoint()[0]
    resumed = run_grpo("train", "quickstart", *FAST, f"train.steps={step + 1}", f"train.output_dir={run.root}",
                       env=ENV, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _steps(run)[-1] == step + 1 and not lock_path(run).exists()


@pytest.mark.slow
def test_a_user_error_in_the_workers_is_printed_once_with_exit_2(tmp_path):
    plugin = tmp_path / "refusing_reward.py"
    plugin.write_text(
        "from grpocli.errors import UserError\n\n"
        "def refuse(prompts, completions, **kwargs):\n"
        "    raise UserError('the scoring service refused the batch', where='rewards[0] (refusing_reward)',\n"
        "                    hint='check the service, then run again')\n"
    )
    result = run_grpo("train", "quickstart", *FAST, "train.num_processes=2", f'rewards=[{{name="{plugin}:refuse"}}]',
                      f"train.output_dir={tmp_path / 'run'}", env=ENV, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.count("the scoring service refused the batch") == 1, result.stderr
    assert "next: check the service, then run again" in result.stderr
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr, result.stderr


@pytest.mark.slow
def test_a_second_run_on_a_directory_in_use_stops_and_touches_nothing(tmp_path):
    run = RunDir(tmp_path / "busy-run")
    slow = tmp_path / "slow_reward.py"  # 1 s a step at least: the run cannot finish between two polls
    slow.write_text("import time\n\ndef slow(prompts, completions, **kwargs):\n"
                    "    time.sleep(1.0)\n    return [float(len(c)) for c in completions]\n")
    args = ["train", "quickstart", *FAST, "train.steps=3", f"train.output_dir={run.root}",
            f'rewards=[{{name="{slow}:slow"}}]']
    log = tmp_path / "first.log"
    first = _start(log, *args)
    try:
        _wait_for(lambda: len(_steps(run)) >= 1, 150, "a metrics line", first, log)
        first.send_signal(signal.SIGSTOP)  # hold it mid-run (and holding the lock) while the others run
        before = {p: p.stat().st_mtime_ns for p in run.root.rglob("*")}
        started = time.monotonic()
        second = run_grpo(*args, env=ENV, timeout=120)
        took = time.monotonic() - started
        assert {p: p.stat().st_mtime_ns for p in run.root.rglob("*")} == before
        inspected = run_grpo("inspect", str(run.root), env=ENV, timeout=120)  # reads a run in use
    finally:
        first.send_signal(signal.SIGCONT)
    first.wait(timeout=300)
    assert second.returncode == 2, second.stderr[-3000:]
    assert f"the run directory {run.root} is in use by another grpo train (process {first.pid}" in second.stderr
    assert "train.output_dir=runs/new" in second.stderr and "Traceback" not in second.stderr
    assert took < 60  # it stops before loading a model (a whole run takes longer)
    assert inspected.returncode == 0, inspected.stderr[-3000:]
    assert first.returncode == 0, log.read_text()[-3000:]
    assert _steps(run) == [1, 2, 3] and not lock_path(run).exists()


def test_the_lock_names_its_holder_and_dies_with_it(tmp_path):
    run = RunDir(tmp_path / "run")
    code = ("import sys, time\nfrom grpocli.rundir import RunDir\nfrom grpocli.launch.lock import run_lock\n"
            f"with run_lock(RunDir({str(run.root)!r})):\n    print('held', flush=True)\n    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(UserError) as caught, run_lock(run):
            pass
        assert f"process {proc.pid}" in caught.value.what and "python -c" in caught.value.what
        assert caught.value.where == "train.output_dir" and f"kill {proc.pid}" in caught.value.hint
        assert json.loads(lock_path(run).read_text())["pid"] == proc.pid  # the holder's details kept
    finally:
        proc.kill()
        proc.wait()
    with run_lock(run):  # SIGKILL left the file but not the lock
        assert holder(run)["pid"] == os.getpid()
    assert run.root.is_dir() and not lock_path(run).exists()
    fresh = RunDir(tmp_path / "fresh")
    with run_lock(fresh):
        assert lock_path(fresh).exists()
    assert not fresh.root.exists()  # created here, nothing written: removed again


def test_deleting_the_lock_file_does_not_unlock_the_run(tmp_path):
    """The lock is on the directory: a second run on a live directory stops even when someone
    deleted <run>/.grpo.lock (before, it started and pruned the first run's checkpoint)."""
    run = RunDir(tmp_path / "run")
    code = ("import sys, time\nfrom grpocli.rundir import RunDir\nfrom grpocli.launch.lock import run_lock\n"
            f"with run_lock(RunDir({str(run.root)!r})):\n    print('held', flush=True)\n    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        lock_path(run).unlink()
        with pytest.raises(UserError, match="is in use by another grpo train"), run_lock(run):
            pass
        second = run_grpo("train", "quickstart", "train.steps=1", f"train.output_dir={run.root}", timeout=120)
        assert second.returncode == 2 and "in use by another grpo train" in second.stderr, second.stderr[-2000:]
        assert "Traceback" not in second.stderr and not (run.root / "metrics.jsonl").exists()
    finally:
        proc.kill()
        proc.wait()
