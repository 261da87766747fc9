"""Failed writes, for real: a full disk (RLIMIT_FSIZE in the `grpo train` subprocess, SIGXFSZ
ignored so that write() fails with EFBIG as on a full disk) while a checkpoint or metrics.jsonl
is written, an output_dir that is a file or cannot be written, non-UTF-8 bytes in metrics.jsonl
and rollouts files, and running out of memory. Each is one message and exit 2 (no traceback);
nothing written before is lost, and the run resumes afterwards."""

from __future__ import annotations

import hashlib
import io
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_runner import ROOT, assert_clean_error, unwritable_place
from rich.console import Console
from tiny_runs import FAST

from grpocli.cli.failures import as_user_error
from grpocli.inspection.overview import show_run
from grpocli.recipe import load_recipe
from grpocli.rundir import RunDir
from grpocli.trainer.loop import train

RUN = [*FAST, "train.steps=4", "train.save_steps=2"]  # as conftest.py trained it
TORN = b'\xff\xfe\x00{"step": 5, "loss": 0.1'  # what a crash or a full disk leaves at the end






def _grpo_limited(max_file_bytes: int, *args: str) -> subprocess.CompletedProcess:
    """`grpo ARGS` where no file may grow past max_file_bytes (a disk that is full for it)."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() fails with EFBIG instead of a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    return subprocess.run([sys.executable, "-m", "grpocli.cli.app", *args], check=False, preexec_fn=limit,
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}




@pytest.mark.slow
def test_full_disk_while_checkpointing_keeps_what_was_written_then_resumes(run_copy, capfd):
    run = RunDir(run_copy)
    step4 = run.checkpoint(4)
    optimizer = (step4 / "trainer" / "optimizer.pt").stat().st_size
    others = max(p.stat().st_size for p in run_copy.rglob("*") if p.is_file() and p.name != "optimizer.pt")
    assert others < optimizer * 0.8  # the limit stops the optimizer file only
    before = {p.name: _digests(p) for _, p in run.list_checkpoints()}
    metrics_before = run.metrics.read_bytes()

    result = _grpo_limited(int(optimizer * 0.8), "train", "quickstart", *RUN, "train.steps=6",
                           f"train.output_dir={run_copy}")
    assert_clean_error(result, "train.output_dir: could not write the checkpoint of step 6 to "
                       f"{run.checkpoints / 'step-6.tmp'}", "a checkpoint needs about 0.", "(the size of step-4)",
                       "free there now", "earlier checkpoints and metrics.jsonl are as they were",
                       "run the same command again: it resumes from step-4")
    assert {p.name: _digests(p) for _, p in run.list_checkpoints()} == before  # step-2, step-4 untouched
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["step-2", "step-4"]  # no step-6(.tmp)
    assert run.metrics.read_bytes().startswith(metrics_before)
    assert [m["step"] for m in run.read_metrics()] == [1, 2, 3, 4, 5, 6]

    # the disk also tore the last metrics line; the rerun drops it and resumes from step-4
    with open(run.metrics, "ab") as f:
        f.write(TORN)
    before_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(load_recipe("quickstart", [*RUN, "train.steps=6", f"train.output_dir={run_copy}"]))
    finally:
        torch.set_num_threads(before_threads)
    err = capfd.readouterr().err
    assert f"warning: {run.metrics}: dropping a torn last line" in err
    assert [m["step"] for m in run.read_metrics()] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in run.list_checkpoints()] == [2, 4, 6]


@pytest.mark.slow
def test_full_disk_at_the_last_bytes_of_a_checkpoint_file(run_copy):
    """A limit a few bytes short of the optimizer file fails at its final flush, where torch's
    stream writer says only "basic_ios::clear: iostream error"."""
    run = RunDir(run_copy)
    optimizer = (run.checkpoint(4) / "trainer" / "optimizer.pt").stat().st_size
    result = _grpo_limited(optimizer - 100, "train", "quickstart", *RUN, "train.steps=6",
                           f"train.output_dir={run_copy}")
    assert_clean_error(result, "could not write the checkpoint of step 6", "basic_ios::clear",
                       "run the same command again: it resumes from step-4")
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["step-2", "step-4"]


def test_full_disk_while_exporting_leaves_nothing(run_copy, tmp_path):
    weights = (RunDir(run_copy).checkpoint(4) / "model.safetensors").stat().st_size
    out = tmp_path / "exported"
    result = _grpo_limited(weights // 2, "export", str(run_copy), str(out))
    assert_clean_error(result, f"grpo export RUN_OR_CHECKPOINT: could not write the model to {out}",
                       "the export needs about", "free there now", "nothing was written")
    assert not out.exists() and list(tmp_path.glob(".exported.tmp-*")) == []


@pytest.mark.slow
def test_full_disk_while_logging_metrics_names_the_file(tmp_path):
    out = tmp_path / "run"
    result = _grpo_limited(4500, "train", "quickstart", *FAST, "train.steps=8", "log.rollouts_every=0",
                           f"train.output_dir={out}")
    assert_clean_error(result, f"train.output_dir: cannot write {out / 'metrics.jsonl'}: the file grew past "
                       "the size allowed", "then run the same command again; training resumes from the newest")
    assert RunDir(out).read_metrics()  # the complete lines are there to read


def test_output_dir_that_is_a_file(grpo, tmp_path):
    taken = tmp_path / "run"
    taken.write_text("not a run\n")
    result = grpo("train", "quickstart", f"train.output_dir={taken}")
    assert_clean_error(result, "train.output_dir", str(taken))
    assert taken.read_text() == "not a run\n"




def test_output_dir_that_cannot_be_written(grpo, tmp_path):
    place = unwritable_place(tmp_path)
    try:
        result = grpo("train", "quickstart", f"train.output_dir={place / 'run'}")
    finally:
        if place != Path("/sys"):
            place.chmod(0o755)
    assert_clean_error(result, "train.output_dir", str(place / "run"))


@pytest.mark.slow
def test_inspect_reads_around_bad_bytes_and_names_the_lines(run_copy):
    run = RunDir(run_copy)
    lines = run.metrics.read_bytes().splitlines(keepends=True)
    run.metrics.write_bytes(lines[0] + b"\xc3\x28 not utf-8\n" + b"".join(lines[1:]) + TORN)
    rollout = run.rollout_file(2)
    rows = rollout.read_bytes().splitlines(keepends=True)
    rollout.write_bytes(rows[0] + b"\x80\x81\x82\n" + b"".join(rows[1:]))
    weights = run.checkpoint(4) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])

    out = io.StringIO()
    show_run(str(run_copy), write_png=False, console=Console(file=out, width=200))
    text = out.getvalue()
    assert "steps logged 4 of 4" in text
    assert "line 2 of metrics.jsonl cannot be read (not UTF-8 JSON); skipped" in text
    assert "last line of metrics.jsonl is incomplete (line 6: " in text
    assert "checkpoints: step-2, step-4 (damaged)" in text
    assert "checkpoint step-4: model.safetensors is damaged" in text

    out = io.StringIO()
    show_run(str(run_copy), rollouts_step=2, console=Console(file=out, width=200))
    text = out.getvalue()
    assert f"line 2 of {rollout} cannot be read (not UTF-8 JSON); skipped" in " ".join(text.split())
    assert f"rollouts of step 2: {len(rows)} completions" in text


@pytest.mark.slow
def test_out_of_memory_while_loading_the_model_names_the_knobs(tmp_path):
    """A real allocation failure: the process may map 3 GiB of data (RLIMIT_DATA), the model needs 6."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (3 * 2**30, 3 * 2**30))

    big = ["model.tiny.hidden_size=4096", "model.tiny.intermediate_size=16384", "model.tiny.num_heads=32",
           "model.tiny.num_layers=8"]
    result = subprocess.run([sys.executable, "-m", "grpocli.cli.app", "train", "quickstart", *big,
                             f"train.output_dir={tmp_path / 'run'}"], check=False, preexec_fn=limit,
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert_clean_error(result, "grpo train: out of memory", "train.micro_batch_size",
                       "generation.max_completion_length", "model.gradient_checkpointing=true")


def test_out_of_memory_names_the_knobs():
    for exc in (MemoryError(), torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")):
        error = as_user_error(exc, "train")
        assert error is not None, exc
        text = error.render()
        assert text.startswith("grpo train: out of memory")
        for knob in ("train.micro_batch_size", "generation.max_completion_length", "train.prompts_per_step",
                     "model.gradient_checkpointing=true"):
            assert knob in text
    assert "--max-tokens" in as_user_error(MemoryError(), "eval").render()
    assert as_user_error(RuntimeError("shape mismatch"), "train") is None  # a bug keeps its traceback
    assert as_user_error(FileNotFoundError(2, "No such file", "x"), "train") is None
