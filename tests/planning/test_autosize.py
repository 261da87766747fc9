"""The "auto" sizes (grpocli.planning.autosize): what `grpo train` chooses before the model loads and `grpo plan`
plans with, from the plan's own figures at each memory size."""

from __future__ import annotations

import pytest

from grpocli.planning import make_plan, shape_of
from grpocli.planning.autosize import auto_sizes
from grpocli.planning.recipe_settings import largest_micro_batch
from grpocli.planning.recipe_settings import with_changes as _with
from grpocli.recipe import load_recipe

MIB = 2**20
AUTO = ["train.micro_batch_size=auto", "model.gradient_checkpointing=auto", "train.max_tokens_per_micro_batch=auto",
        "generation.max_completion_length=512"]


@pytest.fixture(scope="module")
def recipe():
    r = load_recipe("quickstart", AUTO).recipe
    return r, shape_of(r.model)


def largest(r, shape, memory, checkpointing):
    return largest_micro_batch(_with(r, {"model.gradient_checkpointing": checkpointing, "train.micro_batch_size": 1,
                                         "train.max_tokens_per_micro_batch": None}), shape, 1, memory, None)


@pytest.mark.parametrize("memory", [1024 * MIB, 60 * MIB])
def test_checkpointing_only_where_four_do_not_fit_without_it(recipe, memory):
    r, shape = recipe
    chosen = auto_sizes(r, shape, 1, memory)
    off, on = largest(r, shape, memory, False), largest(r, shape, memory, True)
    assert chosen["model.gradient_checkpointing"] == (off < 4)
    size = on if chosen["model.gradient_checkpointing"] else off
    assert chosen["train.micro_batch_size"] == size >= 1
    assert chosen["train.max_tokens_per_micro_batch"] == size * (r.data.max_prompt_length + 512)


def test_the_plan_of_an_auto_recipe_is_the_plan_of_what_train_would_choose(recipe):
    r, shape = recipe
    chosen = auto_sizes(r, shape, 1, 60 * MIB)
    assert chosen["model.gradient_checkpointing"] is True  # 3 without it, 4 with it (test above)
    planned = make_plan(r, shape, gpus=1, gpu_memory=60 * MIB)
    assert planned.settings.gradient_checkpointing and planned.settings.train.rows == 4
    fixed = make_plan(_with(r, chosen), shape, gpus=1, gpu_memory=60 * MIB)
    assert [p.total for p in planned.phases] == [p.total for p in fixed.phases]
    assert max(p.total for p in planned.phases[1:]) <= 60 * MIB  # the log-prob and training phases fit


def test_a_colocated_engine_gets_what_the_trainer_leaves(tmp_path):
    import json

    from test_plan import QWEN25_05B

    from grpocli.planning.memory import phases
    from grpocli.planning.recipe_settings import settings_of

    (tmp_path / "config.json").write_text(json.dumps(QWEN25_05B))
    r = load_recipe("quickstart", ["generation.backend=vllm", "vllm.gpu_memory_utilization=auto",
                                   "train.micro_batch_size=auto", "data.max_prompt_length=256",
                                   "generation.max_completion_length=1024", "model.dtype=bfloat16"]).recipe
    shape, memory = shape_of(r.model, str(tmp_path)), 80 * 2**30
    chosen = auto_sizes(r, shape, 1, memory)
    share = chosen["vllm.gpu_memory_utilization"]

    def peak(s):
        sized = _with(r, {**chosen, "vllm.gpu_memory_utilization": s})
        return max(p.total for p in phases(shape, settings_of(sized, shape, gpus=1, gpu_memory=memory)))

    assert 0.01 <= share < 0.95 and chosen["train.micro_batch_size"] >= 1
    assert peak(share) <= memory < peak(round(share + 0.01, 2))  # the largest share that fits
    assert make_plan(r, shape, gpus=1, gpu_memory=memory).fits
