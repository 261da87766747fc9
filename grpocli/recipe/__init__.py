"""Recipes: the schema, the loader with sources, and the built-in catalog.

    schema.py             the Recipe: every option of a run, declared once (type, bounds, description)
    section.py            the base of every section: unknown keys refused, assignments validated
    train_section.py      [train]: optimization and run control
    guard_section.py      [train.guard]: what a run does when a step goes wrong
    distill_section.py    [distill]: on-policy distillation from a teacher
    algorithm_section.py  [algorithm]: advantages, the loss and its conventions, KL
    vllm_section.py       [vllm]: the engine or server(s) that generate, importance sampling
    eval_section.py       [eval]: how `grpo eval` and periodic evaluation sample and judge
    data_sources.py       [[data.sources]]: a weighted mixture of datasets, each with its rewards
    tools_section.py      [[tools]] and [multi_turn]
    bounds.py             limits several keys share
    backend_choice.py     what generation.backend = "auto" becomes
    duration.py           train.num_train_epochs and train.warmup_ratio, as TRL says them
    fields.py             every key of the schema: documentation rows, the dotted key list
    loader.py             defaults < file < GRPO_SECTION__KEY < `section.key=value`, with each value's source
    catalog.py            the built-in recipes (recipes/ in the checkout, grpocli/recipes in the wheel)
    resume.py             what may change when a run resumes, and what may not
    trl_names.py          TRL 1.16's GRPOConfig fields and the recipe key of each
    trl_types.py          the type of each TRL field's value, checked (and read as `trl grpo --config` does)
    trl_config_file.py    a TRL GRPOConfig read from YAML or JSON (bounded), its values typed
    trl_import.py         `grpo import trl`: a GRPOConfig -> a recipe that trains as TRL would
    reward_import.py      its [[rewards]] from reward_funcs names (TRL's, open-r1's, module paths) and weights
    trl_distill.py        TRL's distillation configs (DistillationConfig, GKD, IW-OPD, server): their fields -> [distill]
    openr1_names.py       open-r1's fields and reward names, and what each becomes
    trl_script.py         a TRL training script read as fields (what it built when it ran)
    trl_script_run.py     the child process that runs the script with stand-ins and no network
    foreign.py            a TRL config given to `grpo train`: named, with the import command
    override_hints.py     TRL's command-line shapes (--learning_rate 1e-6) answered with the key meant

Below every package but grpocli.algorithms (its variant tables name the accepted losses and
estimators) and grpocli.errors; imports no torch, so `grpo --help` and `grpo inspect` stay light.
"""

from grpocli.recipe.loader import (
    Resolved,
    flatten,
    load_recipe,
    parse_overrides,
    sources_json,
    to_toml,
)
from grpocli.recipe.schema import Recipe

__all__ = ["Recipe", "Resolved", "flatten", "load_recipe", "parse_overrides", "sources_json", "to_toml"]
