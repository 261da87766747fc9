"""On one CUDA GPU (marker `gpu`; skipped elsewhere, with the reason): `grpo plan`'s training-phase
peak against torch.cuda.max_memory_allocated over two optimizer steps of grpo's real step, for the
shapes test_measured.py checks on the CPU and the same in bf16 mixed precision."""

from __future__ import annotations

import pytest
from measured_step import measure, save_small_model
from test_measured import CONFIGS, TOLERANCE, _overrides

pytestmark = pytest.mark.gpu

GPU_CONFIGS = {**CONFIGS, **{f"{name}, bf16 autocast": [*o, "train.mixed_precision=bf16"]
                             for name, o in CONFIGS.items() if "bf16" not in name}}


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    return save_small_model(tmp_path_factory.mktemp("small") / "model")


@pytest.mark.parametrize("name", list(GPU_CONFIGS))
def test_predicted_training_peak_within_15_percent_of_max_memory_allocated(name, small_model):
    line = measure(_overrides(GPU_CONFIGS[name], small_model))
    assert line["device"] == "cuda"
    error = line["predicted"] / line["measured"] - 1
    print(f"{name:56s} predicted {line['predicted'] / 2**20:8.2f} MiB  measured {line['measured'] / 2**20:8.2f} MiB  "
          f"{error:+.1%}")
    assert abs(error) <= TOLERANCE, line
