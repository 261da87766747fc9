"""`grpo plan`'s training-phase and log-prob-pass peaks against the measured ones: grpo's real step
(two optimizer steps, forward + backward + AdamW, then the old policy's no-grad pass) on real
models, its tensor allocations tracked by torch's MemTracker (tests/planning/measured_step.py).
Every configuration within 15%; the table is printed (pytest -s shows it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from measured_step import measure, measure_on_two, save_small_model

HERE = Path(__file__).resolve().parent
#: Predicted within this share of the measured peak, both ways.
TOLERANCE = 0.15
TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=128"]
SHORT = ["data.max_prompt_length=16", "generation.max_completion_length=16"]
LONG = ["data.max_prompt_length=48", "generation.max_completion_length=64"]
CONFIGS = {
    "tiny, micro-batch 8, long (padded rows)": [*TINY, *LONG, "train.micro_batch_size=8"],
    "tiny, long, checkpointing": [*TINY, *LONG, "train.micro_batch_size=8", "model.gradient_checkpointing=true"],
    "small, micro-batch 2, short (shared prompts), beta 0.1": ["SMALL", *SHORT, "train.micro_batch_size=2",
                                                               "algorithm.beta=0.1"],
    "small, micro-batch 8, long": ["SMALL", *LONG, "train.micro_batch_size=8"],
    "small, micro-batch 8, long, bf16 autocast": ["SMALL", *LONG, "train.micro_batch_size=8",
                                                  "train.mixed_precision=bf16"],
    "small, long, LoRA": ["SMALL", *LONG, "train.micro_batch_size=8", "model.lora.enabled=true"],
    "small, long, checkpointing, beta 0.1": ["SMALL", *LONG, "train.micro_batch_size=8",
                                             "model.gradient_checkpointing=true", "algorithm.beta=0.1"],
}


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    return save_small_model(tmp_path_factory.mktemp("small") / "model")


def _overrides(config: list[str], small: Path) -> list[str]:
    return [f"model.name_or_path={small}" if o == "SMALL" else o for o in config]


def _check(name: str, predicted: int, measured: int) -> None:
    error = predicted / measured - 1
    print(f"{name:56s} predicted {predicted / 2**20:8.2f} MiB  measured {measured / 2**20:8.2f} MiB  {error:+.1%}")
    assert abs(error) <= TOLERANCE, f"{name}: predicted {predicted}, measured {measured} ({error:+.1%})"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_predicted_peaks_are_within_15_percent_of_the_measured_ones(name, small_model):
    line = measure(_overrides(CONFIGS[name], small_model))
    _check(name, line["predicted"], line["measured"])
    _check(f"{name}: log-prob pass", line["logprob_predicted"], line["logprob_measured"])


@pytest.mark.slow
def test_fsdp2_over_two_processes_within_15_percent(small_model, tmp_path):
    overrides = _overrides(["SMALL", *LONG, "train.micro_batch_size=8", "train.sharding=fsdp2",
                            "train.num_processes=2", "train.prompts_per_step=4", "algorithm.beta=0.1"], small_model)
    lines = measure_on_two(overrides, tmp_path, timeout=240)
    for line in lines:
        _check(f"small, FSDP2 x 2, beta 0.1 (rank {line['rank']})", line["predicted"], line["measured"])
        _check(f"small, FSDP2 x 2, beta 0.1 (rank {line['rank']}): log-prob pass", line["logprob_predicted"],
               line["logprob_measured"])
