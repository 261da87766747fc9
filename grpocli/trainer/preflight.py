"""Checks that need no model: every name in the recipe resolves to a registered plugin entry,
the training split loads, every callable the recipe uses (rewards, dataset loader,
curriculum, tools, environment) fits its contract in grpocli.registry.hookspecs, so that grpo
can call it with what it will pass (grpocli.registry.contracts), and the longest sequence fits
the model's positions (read from its config, no weights loaded)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from grpocli.algorithms.variants import (
    ADVANTAGES,
    IMPORTANCE_SAMPLING_MODES,
    KL_ESTIMATORS,
    LOSSES,
    names,
)
from grpocli.errors import UserError
from grpocli.generation.base import paged_on_sharded_policy
from grpocli.generation.positions import check_positions
from grpocli.recipe import Recipe

if TYPE_CHECKING:
    from grpocli.multiturn.toolbox import Toolbox
    from grpocli.registry import Entry, Plugins
    from grpocli.rewards import RewardFn


#: Backends that generate with the training model itself: no engine of their own, no engine log-probs.
ON_THE_POLICY = ("hf", "paged")


@dataclass
class Checked:
    plugins: Plugins
    reward_fns: list[RewardFn]
    curriculum: Callable[..., Any] | None
    dataset: Any = None  # the training split (datasets.Dataset)
    toolbox: Toolbox | None = None  # a multi-turn recipe's tools and environment, else None
    sources: list[Any] = field(default_factory=list)  # [[data.sources]]: each one's training split, in order


def preflight(recipe: Recipe) -> Checked:
    """Resolve every name and check every callable against its contract; UserError (with
    did-you-mean, or naming the plugin, function and parameter that does not fit) otherwise."""
    from grpocli.data.source import load_dataset_for
    from grpocli.data.source import resolve as resolve_dataset
    from grpocli.models import check_model
    from grpocli.multiturn.toolbox import check_environment, open_toolbox
    from grpocli.registry import load_plugins
    from grpocli.rewards import resolve as resolve_rewards

    _check_combinations(recipe)
    check_model(recipe.model)  # a GGUF file, folder or packaged model that cannot load, named now
    check_positions(recipe)  # prompt + completion longer than the model's positions, from its config alone
    plugins = load_plugins()
    reward_fns = resolve_rewards(recipe.rewards, plugins.rewards)  # names, and [[rewards]] args they take
    if not recipe.data.sources:
        resolve_dataset(recipe.data, plugins.datasets)
    curriculum = _curriculum(recipe, plugins)  # hookspecs.Curriculum
    toolbox = open_toolbox(recipe, plugins)  # hookspecs.Tool and EnvironmentFactory; schemas built
    if recipe.data.sources:  # [[data.sources]]: each checked and loaded, named (grpocli.trainer.source_checks)
        return _mixture(recipe, plugins, reward_fns, curriculum, toolbox)
    # hookspecs.DatasetLoader, checked before the loader is called:
    dataset = load_dataset_for(recipe.data, plugins.datasets, recipe.data.split, recipe.train.seed)
    _check_eval_split(recipe, plugins)
    _check_batch_fits(recipe, len(dataset))  # a warning
    row_columns = sorted(set(dataset.column_names) | {"prompt"})  # a row as the trainer hands it on
    if toolbox is not None:
        check_environment(toolbox, row_columns)  # hookspecs.Environment: reset(**row), get_reward()
    env_column = ["environments"] if recipe.multi_turn.environment else []  # TRL's keyword, per rollout
    _check_reward_signatures(reward_fns, recipe, plugins, list(dataset.column_names) + env_column)
    return Checked(plugins=plugins, reward_fns=reward_fns, curriculum=curriculum, dataset=dataset, toolbox=toolbox)


def _mixture(recipe: Recipe, plugins: Plugins, reward_fns: list[RewardFn], curriculum: Callable[..., Any] | None,
             toolbox: Toolbox | None) -> Checked:
    """Checked for a recipe with [[data.sources]]: ``sources`` each one's training split, ``dataset`` all their
    rows one after another (what train.num_train_epochs counts)."""
    from grpocli.data.mixture import MixedRows
    from grpocli.trainer.source_checks import check_sources

    sources = check_sources(recipe, plugins, reward_fns, toolbox)
    dataset = MixedRows([(s.label, rows) for s, rows in zip(recipe.data.sources, sources, strict=True)])
    _check_batch_fits(recipe, len(dataset))  # a warning
    if set(recipe.data.model_fields_set) & {"dataset", "args"} and (recipe.data.dataset != "arithmetic"
                                                                     or recipe.data.args):
        print("note: data.dataset and data.args are not read: [[data.sources]] names the datasets",
              file=sys.stderr, flush=True)
    return Checked(plugins=plugins, reward_fns=reward_fns, curriculum=curriculum, dataset=dataset,
                   toolbox=toolbox, sources=sources)


def _check_eval_split(recipe: Recipe, plugins: Plugins) -> None:
    """With eval.every, the held-out split of a local dataset loads now: a missing or broken
    test file would otherwise stop the run at its first evaluation, after the model loaded."""
    from grpocli.data.source import load_dataset_for, resolve

    split = recipe.eval.split_for(recipe.data.eval_split)
    if not recipe.eval.every or split == recipe.data.split:
        return
    if resolve(recipe.data, plugins.datasets)[0].name == "local":
        load_dataset_for(recipe.data, plugins.datasets, split, recipe.train.seed)


def _check_batch_fits(recipe: Recipe, rows: int) -> None:
    """Warn where a generation batch asks more prompts than the split has rows: each row then comes
    several times in one batch, which is allowed (a tiny file to try a recipe on) but rarely meant.
    Its size in memory is bounded by the schema (train.prompts_per_step, MAX_COMPLETIONS_PER_BATCH)."""
    t = recipe.train
    wanted = t.prompts_per_step * t.steps_per_generation
    if wanted <= rows:
        return
    what = (f"train.prompts_per_step = {wanted}" if t.steps_per_generation == 1 else
            f"train.prompts_per_step x train.steps_per_generation = {t.prompts_per_step} x {t.steps_per_generation} "
            f"= {wanted}")
    has = ("the [[data.sources]] have" if recipe.data.sources else
           f"split {recipe.data.split!r} of data.dataset has")
    print(f"warning: {what} prompts per generation batch, but {has} "
          f"{rows} rows, so each row comes {wanted / rows:.1f} times in one batch; lower train.prompts_per_step or "
          "give the dataset more rows (data.args.num_samples for a generated one)", file=sys.stderr, flush=True)


def _curriculum(recipe: Recipe, plugins: Plugins) -> Callable[..., Any] | None:
    """The curriculum function, its args checked; None without train.curriculum."""
    t = recipe.train
    if not t.curriculum:
        if t.curriculum_args:
            raise UserError(
                "train.curriculum_args are set but no train.curriculum uses them",
                where="train.curriculum_args",
                valid="curriculum_args together with train.curriculum (`grpo inspect plugins` "
                "lists the curricula)",
                hint="set train.curriculum, or clear the args with train.curriculum_args={}",
            )
        return None
    entry = plugins.curricula.get(t.curriculum, where="train.curriculum")
    _check_curriculum(entry, t.curriculum_args)
    return entry.fn


def _check_curriculum(entry: Entry, args: dict[str, Any]) -> None:
    """The curriculum must take every keyword the trainer passes, and train.curriculum_args must
    be args it takes, as unknown reward args are refused: a misspelt ``threshold`` would
    otherwise run with the default. A curriculum that reads args through ``**kwargs`` declares
    them with ``@grpocli.recipe_args("name", ...)``."""
    from grpocli.registry.contracts import CURRICULUM, Resolved, check

    check(Resolved.of("curriculum", entry), CURRICULUM, where="train.curriculum", args=args,
          args_where="train.curriculum_args")


def _check_reward_signatures(reward_fns: list[RewardFn], recipe: Recipe, plugins: Plugins,
                             column_names: list[str]) -> None:
    """Every reward must be callable with TRL's keywords, the columns and its args (a TRL reward
    with the full signature works; one that requires something nobody passes stops here)."""
    from grpocli.registry.contracts import Resolved
    from grpocli.rewards.arguments import check_reward_signature

    columns = (set(column_names) | {"prompt"}) - {recipe.data.prompt_column}  # as the loop passes them
    for i, (spec, rf) in enumerate(zip(recipe.rewards, reward_fns, strict=True)):
        if spec.url is not None:  # served: its server calls it (grpocli.reward_server)
            continue
        reward = (Resolved.of("reward", plugins.rewards.get(spec.name)) if spec.name in plugins.rewards
                  else Resolved("reward", spec.name, rf.fn))
        check_reward_signature(i, reward, rf.args, sorted(columns))


def _check_split_combinations(recipe: Recipe) -> None:
    """What a sequence split (train.sequence_parallel > 1) does not run with, named with what does."""
    n = recipe.train.sequence_parallel
    if recipe.generation.backend == "paged":
        raise UserError(
            f"generation.backend = \"paged\" with train.sequence_parallel = {n}: transformers' continuous batching "
            "takes only its own attention implementations, and the split routes the policy's attention through "
            "Ulysses' exchange", where="generation.backend",
            valid="\"hf\", \"vllm\" or \"vllm-server\" with a sequence split",
            hint="generation.backend=vllm (or hf), or train.sequence_parallel=1")
    if recipe.train.memory_limit is not None:
        raise UserError(
            f"train.memory_limit with train.sequence_parallel = {n}: a pass past the limit is split and redone, "
            "but under a sequence split the processes wait on each other in every layer, so one cannot redo a "
            "pass alone", where="train.memory_limit",
            valid="no train.memory_limit with a sequence split (size micro-batches with grpo plan)",
            hint=f"drop train.memory_limit, or train.sequence_parallel=1; `grpo plan RECIPE train.sequence_parallel={n}` "
            "says what fits")


def _check_combinations(recipe: Recipe) -> None:
    """Options that each validate but do not work together."""
    from grpocli.generation.engine_sleep import check_sleep_mode

    g, t = recipe.generation, recipe.train
    _check_pipeline(recipe)
    check_sleep_mode(recipe.vllm.sleep_mode, backend=g.backend, async_steps=g.async_steps,
                     inflight=g.pipeline == "inflight")  # vLLM's platform
    if g.async_steps and g.backend in ON_THE_POLICY:
        raise UserError(
            "generation.async_steps > 0 needs a generation engine apart from the training model",
            where="generation.async_steps",
            valid=f"0 with backend {' or '.join(map(repr, ON_THE_POLICY))}; any value with 'vllm' or 'vllm-server'",
            hint="set generation.backend = \"vllm\" (or \"vllm-server\"), or generation.async_steps = 0",
        )
    if g.backend == "paged" and t.sharding == "fsdp2":
        raise paged_on_sharded_policy("FSDP2")
    if t.sequence_parallel > 1:
        _check_split_combinations(recipe)
    if g.async_steps and (recipe.algorithm.fill_batch or t.curriculum):
        raise UserError(
            "generation.async_steps > 0 cannot be combined with algorithm.fill_batch or train.curriculum "
            "(both choose the next prompts from the last rewards, which async generation has not seen yet)",
            where="generation.async_steps", valid="async_steps = 0, or fill_batch = false and no curriculum",
        )
    if recipe.model.dtype == "float16" and t.mixed_precision == "fp16":
        raise UserError(
            "model.dtype = 'float16' with train.mixed_precision = 'fp16': the loss scaler unscales float32 "
            "gradients only (torch refuses fp16 ones)", where="model.dtype",
            valid="float32 weights with fp16 mixed precision, or bf16 (no loss scaler)",
            hint="model.dtype=float32 (float32 master weights, fp16 compute), or train.mixed_precision=bf16")
    a = recipe.algorithm
    if ADVANTAGES[a.advantage_scale].needs_components and a.reward_combination != "sum":
        summing = names(ADVANTAGES, where=lambda e: not e.needs_components)
        raise UserError(
            f"advantage_scale = {a.advantage_scale!r} normalizes each reward and sums them with their weights, "
            f"which reward_combination = {a.reward_combination!r} is not (gating is not a weighted sum)",
            where="algorithm.advantage_scale", valid=f"{a.advantage_scale} with reward_combination = 'sum'",
            hint=f"set algorithm.reward_combination = \"sum\", or another algorithm.advantage_scale "
            f"({', '.join(summing)})",
        )
    _check_loss_combinations(recipe)
    _check_trackers(recipe.log.report_to)


def _check_pipeline(recipe: Recipe) -> None:
    """generation.pipeline = "inflight" and generation.max_staleness: what they need (an engine that
    generates while the trainer trains, a staleness bound one cycle allows, the engine's log-probs in the
    loss, prompts chosen ahead of the rewards)."""
    from grpocli.generation.backends import INFLIGHT_BACKENDS

    g, t, a = recipe.generation, recipe.train, recipe.algorithm
    if g.pipeline != "inflight":
        if g.max_staleness is not None:
            raise UserError(
                f"generation.max_staleness = {g.max_staleness} bounds in-flight generation, but generation.pipeline "
                "= 'sync'", where="generation.max_staleness",
                valid="a value with generation.pipeline = \"inflight\"; none with 'sync' (generation.async_steps "
                "says how far ahead it generates)",
                hint="set generation.pipeline = \"inflight\", or remove generation.max_staleness")
        return
    can = " or ".join(repr(b) for b in INFLIGHT_BACKENDS)
    if g.backend not in INFLIGHT_BACKENDS:
        why = ("generates with the training model itself, which cannot generate while it trains"
               if g.backend in ON_THE_POLICY else "cannot pause its requests for a weight sync yet")
        raise UserError(
            f"generation.pipeline = \"inflight\" needs an engine that keeps generating while the trainer trains "
            f"and takes new weights between two of its steps; generation.backend = {g.backend!r} {why}",
            where="generation.backend", valid=f"{can} with pipeline 'inflight'; any backend with 'sync'",
            hint=f"set generation.backend = {INFLIGHT_BACKENDS[0]!r}, or generation.pipeline = \"sync\"")
    cycle = t.steps_per_generation * a.num_iterations
    if g.max_staleness is not None and g.max_staleness < cycle:
        raise UserError(
            f"generation.max_staleness = {g.max_staleness} is smaller than in-flight generation needs: a generation "
            f"cycle takes train.steps_per_generation x algorithm.num_iterations = {t.steps_per_generation} x "
            f"{a.num_iterations} = {cycle} optimizer steps, so the tokens sampled while one cycle trains are "
            f"{cycle} versions old when the next cycle trains them", where="generation.max_staleness",
            valid=f"at least {cycle} here", hint=f"set generation.max_staleness={cycle} (its default, when left out)")
    refused = [
        (g.async_steps > 0, f"generation.async_steps = {g.async_steps}", "generating ahead is what 'inflight' does, "
         "bounded by generation.max_staleness", "generation.async_steps=0"),
        (a.fill_batch or bool(t.curriculum), "algorithm.fill_batch or train.curriculum", "both choose the next "
         "prompts from the last rewards, which the groups in flight have not seen", "algorithm.fill_batch=false "
         "and no train.curriculum"),
        (not recipe.vllm.importance_sampling_correction, "vllm.importance_sampling_correction = false", "tokens "
         "sampled by older policy versions need the per-token importance ratio to the engine's log-probs",
         "vllm.importance_sampling_correction=true"),
        (t.num_processes > 1, f"train.num_processes = {t.num_processes}", "the colocated in-flight engine runs "
         "with one training process for now", "train.num_processes=1"),
    ]
    for bad, what, why, fix in refused:
        if bad:
            raise UserError(f"generation.pipeline = \"inflight\" with {what}: {why}", where="generation.pipeline",
                            valid=fix, hint=f"set {fix}, or generation.pipeline = \"sync\"")


def _check_trackers(report_to: list[str]) -> None:
    """Every tracker of log.report_to is installed (TRL raises; Accelerate alone would warn and drop
    it, and the run would log nowhere): UserError before any model loads. Each name is its module."""
    import importlib.util

    missing = [name for name in report_to if importlib.util.find_spec(name) is None]
    if missing:
        have = [name for name in ("tensorboard", "wandb", "trackio") if importlib.util.find_spec(name) is not None]
        raise UserError(
            f"log.report_to names {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed",
            where="log.report_to", valid=f"installed trackers: {', '.join(have) or 'none'}",
            hint=f"pip install {' '.join(missing)} (or 'grpocli[trackers]'), or remove {', '.join(missing)} from "
            "log.report_to (log.report_to=[] logs to metrics.jsonl only)")


def sequence_with_token_sum(loss: str) -> str:
    """What a sequence-level ratio with a token-summing loss computes (TRL 1.16 logs the same warning)."""
    return (f"algorithm.importance_sampling_level = 'sequence' with loss = {loss!r}: each token's term uses its "
            "sequence's ratio and the terms are summed, so each sequence weighs by its length instead of GSPO's "
            "per-sequence objective (as TRL computes it; for the GSPO paper's setup set algorithm.loss = \"grpo\")")


def _check_loss_combinations(recipe: Recipe) -> None:
    """Loss settings that each validate but make no sense together (TRL warns or refuses); the
    rules follow from the properties of each variant's entry (grpocli.algorithms.variants)."""
    a, v = recipe.algorithm, recipe.vllm
    loss, kl = LOSSES[a.loss], KL_ESTIMATORS[a.kl_estimator]
    if kl.refused:
        raise UserError(kl.refused, where="algorithm.kl_estimator",
                        valid=", ".join(names(KL_ESTIMATORS, where=lambda e: not e.refused)),
                        hint="set algorithm.kl_estimator = \"low_var_kl\" (verl's GRPO default) "
                        "or \"k3\" (TRL, DeepSeekMath)")
    if loss.token_level_only and a.importance_sampling_level != "token":
        raise UserError(
            f"loss = {a.loss!r} computes its own sequence-level weight from the token ratios; a sequence-level "
            "importance_sampling_level would be ignored", where="algorithm.importance_sampling_level",
            valid=f"'token' with {a.loss}", hint="set algorithm.importance_sampling_level = \"token\"")
    if loss.filter_inside and a.top_entropy_quantile < 1.0:
        raise UserError(
            f"loss = {a.loss!r} takes its sequence weight over the kept tokens (TRL's GMPO: the geometric mean of the "
            "high-entropy tokens only); grpo applies top_entropy_quantile after the objective, which would compute "
            "something else", where="algorithm.top_entropy_quantile", valid=f"1.0 with {a.loss}",
            hint="set algorithm.top_entropy_quantile = 1.0, or pick another loss")
    if a.importance_sampling_level == "sequence" and loss.sums_tokens:  # TRL 1.16 warns and runs it: so do we
        print(f"note: {sequence_with_token_sum(a.loss)}", file=sys.stderr, flush=True)
    for key in ("delta", "clip_ratio_c"):
        if getattr(a, key) is not None and not loss.clipped:
            clipped = ", ".join(names(LOSSES, where=lambda e: e.clipped))
            raise UserError(
                f"algorithm.{key} bounds the clipped surrogate, which loss = {a.loss!r} does not use",
                where=f"algorithm.{key}", valid=f"a value with loss {clipped}; none otherwise",
                hint=f"remove algorithm.{key}, or pick one of those losses")
    engine_weights = v.importance_sampling_correction and recipe.generation.backend not in ON_THE_POLICY
    if loss.own_engine_weights and engine_weights and IMPORTANCE_SAMPLING_MODES[v.importance_sampling_mode].per_sequence:
        token_modes = names(IMPORTANCE_SAMPLING_MODES, where=lambda e: not e.per_sequence)
        raise UserError(
            f"loss = {a.loss!r} folds the engine's per-token importance weights into its sequence weight; it "
            "needs a token-level correction (TRL refuses this too)", where="vllm.importance_sampling_mode",
            valid=" or ".join(f"'{m}'" for m in token_modes) + f" with {a.loss}",
            hint=f"set vllm.importance_sampling_mode = \"{token_modes[0]}\"")
