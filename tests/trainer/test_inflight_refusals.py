"""generation.pipeline = "inflight" refuses, before any model or engine loads (exit 2, what, where,
what works), what it cannot do: a backend that cannot generate while the trainer trains, a
max_staleness smaller than one cycle (the message names the value that works), and the options that
need the last rewards before the next prompts or that it does not cover yet."""

from __future__ import annotations

import pytest

from grpocli.errors import UserError
from grpocli.multiturn.toolbox import check_combinations
from grpocli.recipe import load_recipe
from grpocli.trainer.preflight import _check_combinations

FAST = ("model.tiny.hidden_size=16", "model.tiny.num_layers=1", "generation.max_completion_length=4")


def test_a_backend_that_cannot_is_refused_before_the_model_loads(grpo, tmp_path):
    out = grpo("train", "quickstart", *FAST, "generation.backend=hf", "generation.pipeline=inflight",
               f"train.output_dir={tmp_path / 'run'}")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "generation.backend = 'hf' generates with the training model itself" in out.stderr
    assert "'vllm' or 'vllm-server' with pipeline 'inflight'" in out.stderr and 'generation.pipeline = "sync"' in out.stderr
    assert not (tmp_path / "run" / "config.resolved.toml").exists()


@pytest.mark.parametrize(("keys", "says"), [
    (["generation.backend=paged"], "generation.backend = 'paged'"),
    (["train.steps_per_generation=2", "algorithm.num_iterations=2", "generation.max_staleness=3"],
     "smaller than in-flight generation needs"),
    (["generation.async_steps=1"], "generation.async_steps = 1"),
    (["algorithm.fill_batch=true"], "algorithm.fill_batch or train.curriculum"),
    (["vllm.importance_sampling_correction=false"], "vllm.importance_sampling_correction = false"),
    (["train.num_processes=2"], "train.num_processes = 2"),
    (['tools=[{name="calculator"}]'], "generation.pipeline is not supported with [[tools]]"),
])
def test_what_inflight_cannot_do_is_refused_with_what_works(keys, says):
    base = ["generation.backend=vllm", "generation.pipeline=inflight"]
    recipe = load_recipe("quickstart", [*base, *keys]).recipe
    with pytest.raises(UserError) as caught:
        _check_combinations(recipe)
        check_combinations(recipe)  # multi-turn's own (grpocli.multiturn.toolbox, as preflight calls it)
    message = str(caught.value) + " " + str(getattr(caught.value, "valid", "")) + str(getattr(caught.value, "hint", ""))
    assert says in message, message
    if "max_staleness" in " ".join(keys):
        assert "at least 4 here" in message and "generation.max_staleness=4" in message


def test_max_staleness_without_inflight_is_refused_and_the_least_value_is_the_default():
    with pytest.raises(UserError, match="bounds in-flight generation"):
        _check_combinations(load_recipe("quickstart", ["generation.max_staleness=2"]).recipe)
    _check_combinations(load_recipe("quickstart", ["generation.backend=vllm", "generation.pipeline=inflight",
                                                   "train.steps_per_generation=2"]).recipe)  # None: one cycle
