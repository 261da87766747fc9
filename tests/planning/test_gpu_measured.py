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


def test_train_refuses_a_recipe_that_cannot_fit_before_loading_the_model(tmp_path, grpo):
    """A 72B-shaped config with no weights beside it: the check stops the run (exit 2) before any
    load could notice that the weights are missing."""
    import json

    from test_plan import QWEN25

    from grpocli.models import build_char_tokenizer

    folder = tmp_path / "huge"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**QWEN25, "hidden_size": 8192, "intermediate_size": 29568,
                                                    "num_hidden_layers": 80, "num_attention_heads": 64,
                                                    "num_key_value_heads": 8, "tie_word_embeddings": False}))
    build_char_tokenizer().save_pretrained(folder)  # a tokenizer, so that the memory check is what stops it
    done = grpo("train", "quickstart", f"model.name_or_path={folder}", "train.steps=1",
                f"train.output_dir={tmp_path / 'run'}", "log.progress=none")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "train.memory_check: the recipe needs" in done.stderr and "Traceback" not in done.stderr
