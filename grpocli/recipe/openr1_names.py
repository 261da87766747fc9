"""open-r1's GRPO fields and reward names (huggingface/open-r1, src/open_r1/configs.py and rewards.py), for
`grpo import trl` on an open-r1 recipe (recipes/*/grpo/config_*.yaml) or its grpo.py.

open-r1 adds fields to TRL's: GRPOScriptArguments (reward_funcs by name, the cosine_*, repetition_*,
code_* and overlong arguments of its rewards, dataset_prompt_column) and its GRPOConfig (system_prompt,
chat_template, hub and wandb settings). Each reward name maps to a grpo built-in or a TRL reward
function, with open-r1's arguments carried as the entry's args; the rest name open-r1's own function,
which works when open-r1 is installed (grpo calls TRL-style reward functions unchanged).
"""

from __future__ import annotations

from typing import Any

#: GRPOScriptArguments' defaults (open-r1 main, 2025): a script records only what differs from them.
OPENR1_DEFAULTS: dict[str, Any] = {
    "cosine_min_value_wrong": 0.0, "cosine_max_value_wrong": -0.5, "cosine_min_value_correct": 0.5,
    "cosine_max_value_correct": 1.0, "cosine_max_len": 1000, "repetition_n_grams": 3,
    "repetition_max_penalty": -1.0, "code_language": "python", "code_eval_test_batch_size": 1,
    "max_completion_len": 16384, "soft_punish_cache": 4096,
}
#: open-r1 fields -> (recipe key or None, note).
OPENR1_FIELDS: dict[str, tuple[str | None, str]] = {
    "dataset_prompt_column": ("data.prompt_column", "open-r1's prompt column"),
    "system_prompt": ("data.system_prompt", "open-r1 puts it before each prompt; so does grpo"),
    "max_prompt_length": ("data.max_prompt_length", "left-truncated, as TRL < 1.0 did"),
    "dataset_config": ("data.args.name", "the dataset's config, as load_dataset(name, config)"),
    "torch_dtype": ("model.dtype", "ModelConfig's older name of dtype"),
    "chat_template": (None, "a Jinja template string: save it in the tokenizer's folder "
                      "(tokenizer_config.json) and set model.tokenizer to it"),
    "dataset_mixture": (None, "a mixture of datasets: build it with `datasets` and save it as one file for "
                        "data.dataset"),
    "model_revision": (None, "grpo loads the revision the hub cache or a local folder holds: download the revision "
                       "(hf download NAME --revision R --local-dir DIR) and set model.name_or_path to DIR"),
    "benchmarks": (None, "open-r1's lighteval benchmarks: use eval.* and `grpo eval`"),
    "callbacks": (None, "open-r1's push-revision callbacks: after the run, grpo export and hf upload"),
    "hub_model_revision": (None, "after the run: hf upload HUB_ID DIR --revision R"),
    "overwrite_hub_revision": (None, "after the run: hf upload"),
    "push_to_hub_revision": (None, "after the run: hf upload HUB_ID DIR --revision R"),
    "wandb_log_unique_prompts": (None, "the rollouts are in the run directory's rollouts.jsonl"),
    "wandb_entity": (None, "set WANDB_ENTITY"),
    "wandb_project": (None, "set WANDB_PROJECT"),
    "wandb_run_group": (None, "set WANDB_RUN_GROUP"),
    "e2b_router_url": (None, "grpo runs code in its own sandbox (docs/code-sandbox.md)"),
    "morph_router_url": (None, "grpo runs code in its own sandbox (docs/code-sandbox.md)"),
    "code_provider": (None, "grpo runs code in its own sandbox (docs/code-sandbox.md)"),
    "ioi_provider": (None, "open-r1's IOI reward needs open-r1 and its provider"),
    "parallel_code_exec_per_proc": (None, "the code reward's [[rewards]] batch_size bounds it"),
    "code_eval_scoring_mode": (None, "grpo's code.tests scores the share of tests passed"),
    **{name: (None, "carried as the args of the reward that reads it") for name in OPENR1_DEFAULTS},
}

#: open-r1 reward name -> (grpo [[rewards]] name, {arg: open-r1 field}, what it is).
OPENR1_REWARDS: dict[str, tuple[str, dict[str, str], str]] = {
    "accuracy": ("math.accuracy", {}, "math-verify against the solution column, as open-r1's accuracy_reward"),
    "format": ("format.strict", {}, "<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>, as open-r1's format_reward"),
    "tag_count": ("format.tag_count", {}, "0.25 per tag found once, as open-r1's tag_count_reward"),
    "reasoning_steps": ("reasoning.steps", {}, "min(1, step markers / 3), as open-r1's reasoning_steps_reward"),
    "cosine": ("trl.rewards:get_cosine_scaled_reward",
               {"min_value_wrong": "cosine_min_value_wrong", "max_value_wrong": "cosine_max_value_wrong",
                "min_value_correct": "cosine_min_value_correct", "max_value_correct": "cosine_max_value_correct",
                "max_len": "cosine_max_len"}, "TRL's copy of open-r1's cosine-scaled reward"),
    "repetition_penalty": ("trl.rewards:get_repetition_penalty_reward",
                           {"ngram_size": "repetition_n_grams", "max_penalty": "repetition_max_penalty"},
                           "TRL's copy of open-r1's n-gram repetition penalty"),
    "soft_overlong_punishment": ("trl.rewards:get_soft_overlong_punishment",
                                 {"max_completion_len": "max_completion_len", "soft_punish_cache": "soft_punish_cache"},
                                 "DAPO's overlong punishment, TRL's function"),
    "code": ("code.tests", {}, "the completion's code run against the verification_info tests in grpo's sandbox"),
    "length": ("open_r1.rewards:len_reward", {}, "open-r1's Kimi 1.5 length reward (needs open-r1 installed)"),
    "binary_code": ("open_r1.rewards:binary_code_reward", {}, "open-r1's function (needs open-r1 and its provider)"),
    "ioi_code": ("open_r1.rewards:ioi_code_reward", {}, "open-r1's function (needs open-r1 and its provider)"),
    "cf_code": ("open_r1.rewards:cf_code_reward", {}, "open-r1's function (needs open-r1 and its provider)"),
    "code_format": ("open_r1.rewards:get_code_format_reward", {"language": "code_language"},
                    "open-r1's factory (needs open-r1 installed)"),
}


def openr1_reward(name: str, fields: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The [[rewards]] entry (name, args) for open-r1's reward ``name``, and a note on what it is."""
    target, args, what = OPENR1_REWARDS[name]
    values = {arg: fields.get(field, OPENR1_DEFAULTS.get(field)) for arg, field in args.items()}
    return {"name": target, **({"args": values} if values else {})}, what


__all__ = ["OPENR1_DEFAULTS", "OPENR1_FIELDS", "OPENR1_REWARDS", "openr1_reward"]
