"""The loop tells an observer of each optimizer step (grpocli.trainer.observer) without changing what
it trains or writes; `steps_only` runs the steps without evaluation or checkpoints (`grpo bench`)."""

from __future__ import annotations

import json

import pytest
from tiny_runs import FAST

from grpocli.recipe import load_recipe
from grpocli.trainer.loop import Loop
from grpocli.trainer.observer import StepRecord
from grpocli.trainer.session import Session

#: 2 optimizer batches a generation, 2 passes over them (old log-probs), a reference (KL): 4 steps a
#: cycle, cut to 5 steps (a second cycle of 1); an evaluation and a checkpoint every 2 steps.
CYCLES = [*FAST, "train.steps=5", "train.steps_per_generation=2", "algorithm.num_iterations=2",
          "algorithm.beta=0.04", "eval.every=2", "eval.num_prompts=4", "train.save_steps=2"]


class Records:
    def __init__(self) -> None:
        self.records: list[StepRecord] = []

    def on_step(self, record: StepRecord) -> None:
        self.records.append(record)


def _run(tmp_path, name: str, *, observer: Records | None = None, steps_only: bool = False) -> list[dict]:
    run = tmp_path / name
    s = Session.open(load_recipe("quickstart", [*CYCLES, f"train.output_dir={run}"]))
    loop = Loop(s, observer=observer, steps_only=steps_only)
    try:
        loop.run()
    finally:
        loop.close()
        s.close()
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _untimed(lines: list[dict]) -> list[dict]:
    return [{k: v for k, v in line.items() if not k.startswith("time/") and not k.endswith("/seconds")
             and k not in ("step_time", "tokens_per_second")}
            for line in lines]


def test_an_observer_gets_each_steps_record_and_changes_nothing(tmp_path):
    watched = Records()
    lines = _run(tmp_path, "watched", observer=watched)
    assert _untimed(lines) == _untimed(_run(tmp_path, "alone"))  # metrics, eval lines included, as without one
    steps = [line for line in lines if "loss" in line]
    records = watched.records
    assert [r.step for r in records] == [line["step"] for line in steps] == [1, 2, 3, 4, 5]
    assert [r.cycle_steps for r in records] == [4, 4, 4, 4, 1]
    for r, line in zip(records, steps):
        assert r.seconds == {k: v for k, v in line.items() if k.startswith("time/") and k in r.seconds}
        assert set(r.seconds) == {"time/generation", "time/rewards", "time/logprobs", "time/weight_sync",
                                  "time/training"}
        assert r.wall >= r.other >= 0 and r.skipped == bool(line["skipped_update"])
        assert r.completion_tokens == pytest.approx(line["tokens_per_second"] * line["step_time"])
        generated = r.generated.completions  # 8 prompts x 4 completions (2 batches of 4), the model's tokens
        assert len(r.generated.prompts) == 8 and len(generated) == 32 and r.generated.keep is None
        assert r.completion_tokens * r.cycle_steps == pytest.approx(sum(generated))  # one process: the cycle's
        assert len(r.frozen) == 2 and all(f.passes == 2 for f in r.frozen)  # old policy and reference
        assert r.trained in [f.lengths for f in r.frozen] and len(r.trained.completions) == 16
    # steps 1 and 3 train the cycle's first optimizer batch, 2 and 4 its second (num_iterations = 2)
    assert records[0].trained == records[2].trained != records[1].trained == records[3].trained
    assert records[0].generated == records[3].generated != records[4].generated


def test_steps_only_runs_no_evaluation_and_writes_no_checkpoint(tmp_path):
    lines = _run(tmp_path, "steps", steps_only=True)
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5] and all("loss" in line for line in lines)
    assert not (tmp_path / "steps" / "checkpoints").exists() and not (tmp_path / "steps" / "eval").exists()
