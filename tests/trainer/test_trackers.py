"""Trackers as a TRL user finds them (log.report_to): TRL's train/ and eval/ keys, WANDB_PROJECT
(the recipe's name where unset), report_to as a string or a list, and a tracker that is not
installed stopping the run with exit 2 before any model loads. The wandb run is a real one, in
offline mode, read back from the .wandb file it writes; the same run writes TensorBoard's files."""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
import time
import zlib

import pytest
from tiny_runs import FAST

from grpocli.parallel.trackers import prefixed, project_name
from grpocli.recipe import load_recipe


def wandb_records(path) -> list:
    """The records of an offline run's .wandb file (wandb's LevelDB-style log of protobuf Records:
    a 7-byte header, 32 KiB blocks, each chunk with a 7-byte header: crc32 of type and data, length,
    type). A chunk whose checksum does not match ends the read (wandb-core may still be writing)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, block, out, part = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # a block's padding
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        if len(chunk) < length or zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            break
        part += chunk
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = pb.Record()
            record.ParseFromString(part)
            out.append(record)
            part = b""
    return out


def finished_records(path, wait: float = 120.0) -> list:
    """The run's records once wandb-core has written its exit record: the service process writes
    the file and may still be flushing when wandb.finish() returns on a loaded machine."""
    deadline = time.monotonic() + wait
    while True:
        records = wandb_records(path)
        kinds = [r.WhichOneof("record_type") for r in records]
        if "exit" in kinds:
            return records
        assert time.monotonic() < deadline, f"no exit record in {path} after {wait:.0f} s: {kinds}"
        time.sleep(0.5)


@pytest.mark.slow
def test_tracker_runs_have_trls_keys_and_project(tmp_path, monkeypatch):
    """One 1-step run with an evaluation logs to TensorBoard (event files under the run) and to wandb
    (an offline run, read back), whichever of the two is installed."""
    chosen = [name for name in ("tensorboard", "wandb") if importlib.util.find_spec(name) is not None]
    if not chosen:
        pytest.skip("neither tensorboard nor wandb is installed (pip install 'grpocli[trackers]')")
    from grpocli.trainer.loop import train

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_PROJECT", "from-wandb-project")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    train(load_recipe("quickstart", [*FAST, f"train.output_dir={out}", f"log.report_to={json.dumps(chosen)}",
                                     "train.steps=1", "eval.every=1", "eval.num_prompts=2", "eval.n=2"]))
    if "tensorboard" in chosen:  # under the run, in a folder named for the recipe
        events = list((out / "quickstart").glob("events.out.tfevents.*"))
        assert events and events[0].stat().st_size > 0
    if "wandb" not in chosen:
        return
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = finished_records(run_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.project == "from-wandb-project"
    rows = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]
    keys = set().union(*rows) - {"_runtime", "_step", "_timestamp"}
    assert all(k.startswith(("train/", "eval/")) for k in keys), sorted(keys)
    assert {"train/reward", "train/rewards/length/mean", "train/loss", "train/kl", "train/clip_ratio/low_min",
            "train/clip_ratio/high_max", "train/completions/max_terminated_length", "train/step_time",
            "eval/reward"} <= keys, sorted(keys)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first = next(m for m in metrics if m["step"] == 1)
    assert rows[0]["_step"] == 1 and rows[0]["train/reward"] == pytest.approx(first["reward"])


def test_project_names_and_prefixes(monkeypatch):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("TRACKIO_PROJECT", raising=False)
    assert project_name("wandb", "quickstart") == "quickstart" == project_name("trackio", "quickstart")
    monkeypatch.setenv("WANDB_PROJECT", "mine")
    monkeypatch.setenv("TRACKIO_PROJECT", "theirs")
    assert (project_name("wandb", "r"), project_name("trackio", "r"), project_name("tensorboard", "r")) == \
        ("mine", "theirs", "r")
    assert prefixed({"step": 3, "reward": 0.5, "rewards/f/mean": 1, "eval/reward": 0.2, "note": "x"}) == \
        {"train/reward": 0.5, "train/rewards/f/mean": 1, "eval/reward": 0.2}


def test_report_to_takes_trls_forms():
    def report_to(value: str) -> list[str]:
        return load_recipe("quickstart", [f"log.report_to={value}"]).recipe.log.report_to

    assert report_to('"wandb"') == ["wandb"] and report_to('["wandb", "tensorboard"]') == ["wandb", "tensorboard"]
    assert report_to('"none"') == [] == report_to('[]')
    installed = [n for n in ("tensorboard", "wandb", "trackio") if importlib.util.find_spec(n) is not None]
    assert report_to('"all"') == installed


def test_a_tracker_not_installed_is_exit_2_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """`grpo train` itself (its main, in this process): exit 2 with the message, nothing written."""
    if importlib.util.find_spec("trackio") is not None:
        pytest.skip("trackio is installed here: no tracker to name that is not")
    from grpocli.cli.app import main

    out = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["grpo", "train", "quickstart", 'log.report_to="trackio"',
                                      f"train.output_dir={out}", "model.name_or_path=no/such-model-loaded"])
    with pytest.raises(SystemExit) as done:
        main()
    err = capsys.readouterr().err
    assert done.value.code == 2, err
    assert "log.report_to names trackio, which is not installed" in err and "pip install trackio" in err
    assert not out.exists()  # nothing written: the run stopped at its checks (the model named does not exist)
