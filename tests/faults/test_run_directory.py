"""What a run directory keeps, whatever the run meets: a reward that changes the working directory,
a resume with a changed recipe, a directory holding metrics but no checkpoint, SIGTERM and SIGINT.

Each test runs the real `grpo train` in a subprocess on the tiny model and reads the run directory
it leaves.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import ROOT, run_grpo
from tiny_runs import FAST

ENV = {"OMP_NUM_THREADS": "1"}

MOVES = '''
import os

def moves_away(prompts, completions, **kwargs):
    os.chdir({elsewhere!r})  # as rewards that run code in a scratch directory often do
    return [float(len(c)) for c in completions]
'''


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_reward_that_changes_directory_does_not_move_the_run(tmp_path):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir(), elsewhere.mkdir()
    reward = tmp_path / "moving.py"
    reward.write_text(MOVES.format(elsewhere=str(elsewhere)))
    args = ["train", "quickstart", *FAST, f'rewards=[{{name="{reward}:moves_away"}}]', "train.save_steps=1",
            "train.output_dir=runs/moved"]
    done = run_grpo(*args, cwd=home, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run = home / "runs" / "moved"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1", "step-2"]
    assert (run / "config.resolved.toml").is_file() and (run / "rollouts" / "step-2.jsonl").is_file()
    assert _steps(run) == [1, 2]
    assert list(elsewhere.iterdir()) == []  # nothing written where the reward went
    first = (run / "metrics.jsonl").read_text()

    again = run_grpo(*args, "train.steps=3", cwd=home, env=ENV, timeout=300)  # the same command, one step more
    assert again.returncode == 0, again.stderr[-3000:]
    assert _steps(run) == [1, 2, 3]
    assert (run / "metrics.jsonl").read_text().startswith(first)  # resumed at step 2, not redone from 0
    assert list(elsewhere.iterdir()) == []


RUN = [*FAST, "train.steps=4", "train.save_steps=2"]  # as conftest.py trained it


def _digests(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_resume_that_changes_the_math_is_refused_then_kept_when_allowed(run_copy):
    before = _digests(run_copy)
    lr = "train.learning_rate=0.01"  # the quickstart trains at 0.001
    refused = run_grpo("train", "quickstart", *RUN, "train.steps=5", lr, "generation.num_generations=2",
                       f"train.output_dir={run_copy}", env=ENV, timeout=300)
    assert refused.returncode == 2, refused.stderr[-3000:]
    err = refused.stderr
    assert "Traceback" not in err
    assert "train.resume: the recipe changes how the run trains" in err
    assert "generation.num_generations 4 -> 2" in err and "train.learning_rate 0.001 -> 0.01" in err
    assert """train.allow_changes='["generation.num_generations", "train.learning_rate"]'""" in err
    assert "train.steps" not in err.split("valid:")[0]  # a key that may change is not named
    assert _digests(run_copy) == before  # nothing written

    allowed = run_grpo("train", "quickstart", *RUN, "train.steps=5", lr, '''train.allow_changes=["train"]''',
                       f"train.output_dir={run_copy}", env=ENV, timeout=300)
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    kept = run_copy / "history" / "config-until-step-4.toml"
    note = next(line for line in allowed.stderr.splitlines() if line.startswith("resuming with "))
    assert "train.learning_rate 0.001 -> 0.01" in note and "train.steps 4 -> 5" in note, note
    assert f"kept in {kept}" in allowed.stderr
    assert kept.read_bytes() == before["config.resolved.toml"]  # what steps 1-4 ran with
    assert "learning_rate = 0.01\n" in (run_copy / "config.resolved.toml").read_text()
    assert "learning_rate = 0.01\n" in (run_copy / "checkpoints/step-5/trainer/recipe.toml").read_text()
    assert "learning_rate = 0.001\n" in (run_copy / "checkpoints/step-4/trainer/recipe.toml").read_text()


@pytest.mark.slow
def test_metrics_without_a_checkpoint_are_kept_when_training_starts_again(run_copy):
    shutil.rmtree(run_copy / "checkpoints")  # a run that stopped before its first checkpoint
    before = _digests(run_copy)
    done = run_grpo("train", "quickstart", *FAST, f"train.output_dir={run_copy}", env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    attempt = run_copy / "history" / "attempt-1"
    assert (f"warning: {run_copy} holds metrics of 4 steps but no checkpoint to resume from" in done.stderr
            and f"kept in {attempt}" in done.stderr), done.stderr[-3000:]
    assert _digests(attempt) == before  # metrics, config and rollouts of the run before, byte for byte
    assert _steps(run_copy) == [1, 2]


def _start(log: Path, *args: str) -> subprocess.Popen:
    """`grpo ARGS` in the background, its output in `log` (a pipe nobody reads could fill up)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **ENV}
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "grpocli.cli.app", *args], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_until(check, proc: subprocess.Popen, log: Path, timeout: float = 240, poll: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"exited early ({proc.returncode}):\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out:\n{log.read_text()[-3000:]}"
        time.sleep(poll)


def _metric_steps(run: Path) -> list[int]:
    try:
        return _steps(run)
    except (OSError, ValueError, KeyError):  # not there yet, or a line being written
        return []


@pytest.mark.slow
def test_sigterm_during_a_checkpoint_write_removes_it_and_says_what_was_kept(tmp_path):
    run, log = tmp_path / "run", tmp_path / "log"
    proc = _start(log, "train", "quickstart", *FAST, "train.steps=100", "train.save_steps=1",
                  f"train.output_dir={run}")
    # the moment a checkpoint after step-1 is being written (or just was: either way nothing partial may stay)
    _wait_until(lambda: any(p.name.endswith(".tmp") for p in (run / "checkpoints").glob("step-*")) and
                (run / "checkpoints" / "step-1").is_dir(), proc, log, poll=0.002)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    out = log.read_text()
    assert "Traceback" not in out, out
    kept = re.search(r"stopped by SIGTERM: kept (\S+)/step-(\d+) \(the newest checkpoint\) and metrics.jsonl up to "
                     r"step (\d+); the same command resumes from step (\d+)", out)
    assert kept, out
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.endswith(".tmp")] == []
    newest = max(int(p.name.split("-")[1]) for p in (run / "checkpoints").iterdir())
    assert int(kept.group(2)) == int(kept.group(4)) == newest


@pytest.mark.slow
def test_sigint_with_checkpoint_on_signal_finishes_the_step_and_resumes(tmp_path):
    run, log = tmp_path / "run", tmp_path / "log"
    args = ["train", "quickstart", *FAST, "train.checkpoint_on_signal=true", f"train.output_dir={run}"]
    proc = _start(log, *args, "train.steps=100")  # save_steps 0: no checkpoint before the end
    _wait_until(lambda: len(_metric_steps(run)) >= 1, proc, log)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 128 + signal.SIGINT
    out = log.read_text()
    assert "Traceback" not in out, out
    last = _steps(run)[-1]
    assert f"stopped by SIGINT: kept {run / 'checkpoints' / f'step-{last}'} (the newest checkpoint) and " \
           f"metrics.jsonl up to step {last}; the same command resumes from step {last}" in out, out
    before = (run / "metrics.jsonl").read_text()

    again = run_grpo(*args, f"train.steps={last + 1}", env=ENV, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (run / "metrics.jsonl").read_text().startswith(before) and _steps(run)[-1] == last + 1


@pytest.mark.slow
def test_sigterm_of_a_two_process_run_checkpoints_the_step_and_stops_every_process(tmp_path):
    run, log = tmp_path / "run", tmp_path / "log"
    proc = _start(log, "train", "quickstart", *FAST, "train.steps=100", "train.num_processes=2",
                  "train.checkpoint_on_signal=true", f"train.output_dir={run}")
    _wait_until(lambda: len(_metric_steps(run)) >= 1, proc, log)
    proc.send_signal(signal.SIGTERM)  # to `grpo train`: it passes it on to the launcher and the workers
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    out = log.read_text()
    assert "Traceback" not in out and out.count("stopped by SIGTERM") == 1, out
    last = _steps(run)[-1]
    assert f"kept {run / 'checkpoints' / f'step-{last}'} (the newest checkpoint)" in out, out
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [f"step-{last}"]
    deadline = time.monotonic() + 30
    while _processes_of(run) and time.monotonic() < deadline:  # the workers exit with their launcher
        time.sleep(0.2)
    assert _processes_of(run) == []


def _processes_of(run: Path) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(run).encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_export_eval_and_inspect_read_a_run_that_prunes_its_checkpoints_as_they_read(tmp_path):
    """A live run writes a checkpoint every step and keeps one (each is pruned about a second after
    it is written) while the commands that read a run read it: each ends well (exit 0), or says the
    checkpoint it read was removed meanwhile (exit 2): never a traceback."""
    run, log = tmp_path / "run", tmp_path / "log"
    proc = _start(log, "train", "quickstart", *FAST, "train.steps=1000000", "train.save_steps=1",
                  "train.save_total_limit=1", f"train.output_dir={run}")
    try:
        _wait_until(lambda: len(_metric_steps(run)) >= 2, proc, log)  # checkpoints step-1, step-2 written (one kept)
        readers = [["export", str(run), str(tmp_path / f"out{i}")] for i in range(3)]
        readers += [["inspect", str(run)], ["eval", "quickstart", *FAST[:4], "--checkpoint", str(run), "--n", "2",
                                           "--num-prompts", "2", "--max-tokens", "4", "--output-dir", str(tmp_path / "ev")]]
        for args in readers:
            done = run_grpo(*args, env=ENV, timeout=300)
            assert done.returncode in (0, 2) and "Traceback" not in done.stderr, (args, done.stderr[-3000:])
            if done.returncode == 2:
                assert "was removed while grpo" in done.stderr and "checkpoints of the run now" in done.stderr, \
                    done.stderr[-3000:]
        assert proc.poll() is None, log.read_text()[-3000:]  # the run went on meanwhile
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
