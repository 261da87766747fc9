"""`grpo import trl`: a TRL GRPOConfig's fields -> a recipe that trains as TRL would.

Pure functions (no torch, no TRL): `convert(fields, num_processes)` returns the recipe as nested
dicts and one `Line` per field saying what became of it: mapped, converted (with the formula),
default (TRL's default written where grpo's differs) or unsupported (why, and what to do).
TRL's conventions (docs/algorithm.md, "TRL's conventions") are always set.

The units that differ (grpocli.recipe.trl_names.TRL_UNITS):
  TRL counts the batch in completions per device and micro-batch; grpo in prompts per optimizer
  step over all processes:  prompts_per_step = per_device_train_batch_size x
  gradient_accumulation_steps x num_processes / num_generations.
  TRL's steps_per_generation counts micro-batches (default gradient_accumulation_steps); grpo's
  counts optimizer steps:  steps_per_generation = TRL's / gradient_accumulation_steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, get_args

from grpocli.errors import UserError
from grpocli.recipe.openr1_names import OPENR1_FIELDS
from grpocli.recipe.reward_import import REWARD_FIELDS
from grpocli.recipe.reward_import import rewards as _rewards
from grpocli.recipe.schema import TrainSection
from grpocli.recipe.trl_distill import distillation
from grpocli.recipe.trl_names import INHERITED, TRL_DEFAULTS, TRL_FIELDS

#: TRL's conventions, which grpo's defaults differ from (docs/algorithm.md, "TRL's conventions").
CONVENTIONS = {
    "algorithm.drop_zero_spread_groups": False,
    "algorithm.token_normalizer": "generation_batch",
    "algorithm.truncated_rows": "count",
}
#: `trl grpo`'s script and model arguments (trl/scripts/grpo.py) that a --config YAML holds too.
SCRIPT_FIELDS = {
    "model_name_or_path": "model.name_or_path",
    "dtype": "model.dtype",
    "attn_implementation": "model.attn_implementation",
    "dataset_name": "data.dataset",
    "dataset_train_split": "data.split",
    "dataset_test_split": "data.eval_split",
    "use_peft": "model.lora.enabled",
    "lora_r": "model.lora.r",
    "lora_alpha": "model.lora.alpha",
    "lora_dropout": "model.lora.dropout",
    "lora_target_modules": "model.lora.target_modules",
}
BATCH = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
         "generation_batch_size", "num_generations")
SCHEDULERS = get_args(TrainSection.model_fields["lr_scheduler"].annotation)
HINT = "grpo inspect fields --trl NAME"


@dataclass(frozen=True)
class Line:
    name: str
    kind: str  # mapped | converted | default | unsupported | ignored
    text: str

    def render(self) -> str:
        return f"{self.kind:<11} {self.name}: {self.text}"


class _Build:
    """The recipe as it is written (dotted keys) and the lines that say why."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {}
        self.lines: list[Line] = []

    def put(self, name: str, kind: str, key: str, value: Any, how: str = "") -> None:
        self.keys[key] = value
        self.lines.append(Line(name, kind, f"{key} = {_show(value)}" + (f"  ({how})" if how else "")))

    def say(self, name: str, kind: str, text: str) -> None:
        self.lines.append(Line(name, kind, text))


def convert(fields: dict[str, Any], num_processes: int = 1) -> tuple[dict[str, Any], list[Line]]:
    """The recipe (nested dicts, ready for TOML) and one line per field."""
    user = {k: _plain(v) for k, v in fields.items()}
    taught = distillation(user)  # a distillation config's own fields, taken out (grpocli.recipe.trl_distill)
    defaults = TRL_DEFAULTS if taught is None else taught.grpo_defaults(TRL_DEFAULTS)
    merged = {**user, **{k: v for k, v in defaults.items() if k not in user}}
    b = _Build()
    if taught is not None:
        taught.batch(b, merged, num_processes)
    _batch(b, merged, set(user), num_processes)
    for name, value in merged.items():
        if name in BATCH or name == "num_processes":
            continue
        before = len(b.lines)
        _field(b, name, value, merged)
        if name not in user:  # a TRL default grpo's differs from: mark what was written as such
            b.lines[before:] = [Line(ln.name, "default", f"TRL's default, {ln.text}")
                                if ln.kind in ("mapped", "converted") else ln for ln in b.lines[before:]]
        elif len(b.lines) == before and name not in REWARD_FIELDS:  # every field of the config gets its line
            b.say(name, "mapped", f"{_show(value)}: nothing to write (grpo's default does the same, or the "
                  "field is unused with the others)")
    for key, value in CONVENTIONS.items():
        b.put("TRL's conventions", "default", key, value, "docs/algorithm.md: TRL's conventions")
    (_rewards if taught is None else taught.rewards)(b, merged)
    if taught is not None:
        taught.write(b)
    return _nest(b.keys), b.lines


def _batch(b: _Build, f: dict[str, Any], given: set[str], nproc: int) -> None:
    """TRL's batch arithmetic (GRPOConfig.__post_init__) in grpo's units."""
    pdb, ga, g = f["per_device_train_batch_size"], f["gradient_accumulation_steps"], f["num_generations"]
    spg, gbs = f.get("steps_per_generation"), f.get("generation_batch_size")
    for name, least in (("per_device_train_batch_size", 1), ("gradient_accumulation_steps", 1),
                        ("num_generations", 2), ("steps_per_generation", 1), ("generation_batch_size", 1)):
        if f.get(name) is not None and f[name] < least:  # TRL's __post_init__ divides by them
            raise UserError(f"{name} = {f[name]}", where=name, valid=f"an integer >= {least} (TRL refuses it too)",
                            hint=f"fix {name} in the config")
    where = f"per_device_train_batch_size={pdb}, gradient_accumulation_steps={ga}, num_processes={nproc}"
    if spg is None and gbs is None:
        spg = ga
    elif spg is None:
        if gbs % (pdb * nproc):
            raise UserError(f"generation_batch_size = {gbs} is not a multiple of per_device_train_batch_size x "
                            f"num_processes = {pdb * nproc}", valid="a multiple of it (TRL refuses it too)", hint=HINT)
        spg = gbs // (pdb * nproc)
    elif gbs is not None and gbs != pdb * nproc * spg:
        raise UserError(f"generation_batch_size = {gbs} and steps_per_generation = {spg} are both set",
                        valid="one of them (TRL refuses both)", hint=HINT)
    per_step = pdb * ga * nproc
    if per_step % g:
        raise UserError(f"one optimizer step holds {per_step} completions ({where}), not a whole number of "
                        f"groups of num_generations = {g}",
                        valid=f"per_device_train_batch_size x gradient_accumulation_steps x num_processes a "
                        f"multiple of {g}", hint="change per_device_train_batch_size or gradient_accumulation_steps")
    if spg % ga:
        raise UserError(f"steps_per_generation = {spg} micro-batches is not a whole number of optimizer steps of "
                        f"gradient_accumulation_steps = {ga}: TRL would generate within an optimizer step, which "
                        "grpo does not", valid=f"a multiple of {ga}", hint="set steps_per_generation to k x "
                        "gradient_accumulation_steps (or leave it unset)")
    b.put("num_generations", "mapped", "generation.num_generations", g)
    b.put("per_device_train_batch_size", "converted", "train.prompts_per_step", per_step // g,
          f"per_device_train_batch_size x gradient_accumulation_steps x num_processes / num_generations = "
          f"{pdb} x {ga} x {nproc} / {g}")
    b.put("per_device_train_batch_size", "mapped", "train.micro_batch_size", pdb,
          "completions per forward/backward on one process")
    b.say("gradient_accumulation_steps", "converted", "in train.prompts_per_step above; grpo splits a step into "
          "micro-batches of train.micro_batch_size itself")
    how = ("TRL's default: gradient_accumulation_steps micro-batches" if "steps_per_generation" not in given
           and "generation_batch_size" not in given else "TRL counts micro-batches, grpo optimizer steps")
    b.put("steps_per_generation", "converted", "train.steps_per_generation", spg // ga,
          f"{how}: {spg} / gradient_accumulation_steps {ga}")
    if "generation_batch_size" in given:
        b.say("generation_batch_size", "converted", f"{gbs} completions = steps_per_generation {spg} x "
              f"per_device_train_batch_size {pdb} x num_processes {nproc}")
    if nproc > 1:
        b.put("num_processes", "converted", "train.num_processes", nproc, "TRL's world size (--num-processes)")


def _field(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    special = _SPECIAL.get(name)
    if special:
        special(b, name, value, f)
    elif name in SCRIPT_FIELDS:
        if value is not None:
            b.put(name, "mapped", SCRIPT_FIELDS[name], value)
    elif name in REWARD_FIELDS:
        return  # _rewards
    elif name in OPENR1_FIELDS and name not in TRL_FIELDS:
        key, note = OPENR1_FIELDS[name]
        if key is None:
            b.say(name, "ignored" if "carried as the args" in note else "unsupported", f"open-r1's field: {note}")
        elif value is not None:
            b.put(name, "mapped", key, value, f"open-r1's field: {note}")
    elif name in INHERITED:
        b.say(name, "ignored", "a TrainingArguments field TRL inherits: no grpo equivalent")
    elif name not in TRL_FIELDS:
        b.say(name, "ignored", "not a GRPOConfig field of TRL 1.16, nor a script argument of `trl grpo` or open-r1")
    elif TRL_FIELDS[name][0] is None:
        b.say(name, "unsupported", TRL_FIELDS[name][1])
    elif value is None:
        b.say(name, "mapped", f"unset: {TRL_FIELDS[name][0]} keeps grpo's default")
    else:
        b.put(name, "mapped", TRL_FIELDS[name][0], value)


def _max_steps(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    if value and value > 0:
        b.put(name, "mapped", "train.steps", value, "optimizer steps, as TRL's")
    else:  # TRL's -1: num_train_epochs over the data set
        epochs = f.get("num_train_epochs") or 3.0
        b.put(name, "converted", "train.num_train_epochs", epochs,
              "TRL's max_steps -1 trains num_train_epochs over the data set; grpo derives train.steps from it")


def _epochs(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    if (f.get("max_steps") or -1) > 0:
        b.say(name, "ignored", "max_steps is set: TRL's max_steps wins over num_train_epochs")
    # else: with max_steps (-1, TRL's default) -> train.num_train_epochs


def _scheduler(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    if value in SCHEDULERS:
        b.put(name, "mapped", "train.lr_scheduler", value)
    else:
        b.say(name, "unsupported", f"{value!r}: grpo has {', '.join(SCHEDULERS)}; set train.lr_scheduler")


def _warmup(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    steps = f.get("max_steps") or -1
    if not value:
        return
    if not (math.isfinite(value) and value >= 0):
        raise UserError(f"{name} = {value}", where=name, valid="a finite number >= 0 (steps, or below 1 a ratio)",
                        hint=f"fix {name} in the config")
    if name == "warmup_steps" and value >= 1:
        b.put(name, "mapped", "train.warmup_steps", int(value))
    elif steps > 0:
        b.put(name, "converted", "train.warmup_steps", math.ceil(steps * value),
              f"ceil(max_steps x ratio) = ceil({steps} x {value}), as transformers' get_warmup_steps")
    else:
        b.put(name, "mapped", "train.warmup_ratio", value, "ceil(ratio x steps), steps derived from num_train_epochs")


def _precision(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    if name == "bf16" and value is None:
        value = not f.get("fp16")  # GRPOConfig: bf16 defaults to True unless fp16 is set
    if value:
        b.put(name, "mapped", "train.mixed_precision", name)


def _report_to(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    names = [value] if isinstance(value, str) else list(value or [])
    names = [n for n in names if n != "none"]
    if names == ["all"]:
        b.say(name, "unsupported", "'all': name the trackers in log.report_to (tensorboard, wandb, trackio)")
    else:
        b.put(name, "mapped", "log.report_to", names)


def _model_init_kwargs(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    named = f.get("dtype") or f.get("torch_dtype")  # ModelConfig's field says it
    kwargs = dict(value or ({} if named else {"dtype": "auto"}))  # transformers 5 infers the dtype, as TRL leaves it
    for key, v in kwargs.items():
        key = "dtype" if key == "torch_dtype" else key
        if key in ("dtype", "attn_implementation", "trust_remote_code"):
            b.put(name, "mapped", f"model.{key}", v)
        else:
            b.say(name, "unsupported", f"{key}={v!r}: [model] has dtype, attn_implementation, trust_remote_code")


def _vllm(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    paged = [n for n in ("use_transformers_paged", "use_transformers_continuous_batching") if f.get(n)]
    if name in ("use_transformers_paged", "use_transformers_continuous_batching"):
        return  # read with use_vllm
    if name == "use_vllm":
        if paged and not value:
            b.put(paged[0], "converted", "generation.backend", "paged", "transformers' paged generation")
        elif value:
            backend = "vllm-server" if f.get("vllm_mode") == "server" else "vllm"
            b.put(name, "converted", "generation.backend", backend, f"vllm_mode = {f.get('vllm_mode', 'colocate')!r}")
        else:
            b.put(name, "converted", "generation.backend", "hf", "transformers' generate, as TRL samples without "
                  "vLLM; remove it for grpo's 'auto' (the fastest backend installed)")
        return
    if name == "vllm_mode":
        return  # read with use_vllm
    if not f.get("use_vllm"):
        b.say(name, "ignored", "used only with use_vllm = true")
        return
    if name == "vllm_server_base_url" and value:
        b.put(name, "mapped", "vllm.server_url", value)
    elif name in ("vllm_server_host", "vllm_server_port") and not f.get("vllm_server_base_url"):
        host = f.get("vllm_server_host", "0.0.0.0")
        b.put(name, "converted", "vllm.server_url", f"http://{host}:{f.get('vllm_server_port', 8000)}")
    elif name == "vllm_enable_sleep_mode" and value:
        b.put(name, "converted", "vllm.sleep_mode", 2, "TRL's sleep mode is vLLM's level 2")


def _resume(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    if value is True:
        b.put(name, "converted", "train.resume", "auto", "true: the newest checkpoint in train.output_dir")
    elif isinstance(value, str) and value:
        b.put(name, "mapped", "train.resume", value, "that checkpoint")


def _save_steps(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    if f.get("save_strategy", "steps") == "steps":
        b.put(name, "mapped", "train.save_steps", value)


def _save_strategy(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    epochs = f.get("num_train_epochs") or 3.0
    if value == "no":
        b.put(name, "converted", "train.save_steps", 0, "no checkpoints during the run; grpo still saves at the end")
    elif value == "epoch" and (f.get("max_steps") or -1) <= 0 and epochs <= 1:
        b.put(name, "converted", "train.save_steps", 0, "one epoch: a checkpoint at its end")
    elif value == "epoch":
        b.say(name, "unsupported", "'epoch' with more than one epoch: set train.save_steps to the steps of an epoch "
              "(`grpo train RECIPE --dry-run` prints train.steps)")


def _epsilon(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    b.put(name, "mapped", "algorithm.epsilon_low", value)
    if f.get("epsilon_high") is None:
        b.put(name, "converted", "algorithm.epsilon_high", value, "TRL's epsilon_high defaults to epsilon")


def _scale_rewards(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    value = {True: "group", False: "none"}.get(value, value)
    if f.get("multi_objective_aggregation") == "normalize_then_sum":
        return  # that one decides
    b.put(name, "mapped", "algorithm.advantage_scale", value)


def _aggregation(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    if value == "normalize_then_sum":
        b.put(name, "mapped", "algorithm.advantage_scale", "normalize_then_sum")


def _ref_sync(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    if not f.get("sync_ref_model"):
        return
    if name == "ref_model_sync_steps":
        b.put(name, "mapped", "algorithm.ref_sync_steps", value)
    elif name == "ref_model_mixup_alpha":
        b.put(name, "mapped", "algorithm.ref_sync_alpha", value)


def _bias_kl(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    b.put(name, "mapped", "algorithm.kl_importance_correction", bool(value), "one of TRL's conventions")


def _log_completions(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    if name == "num_completions_to_print":
        return  # with log_completions
    if value:
        every = f.get("logging_steps") or 10
        every = int(every) if every >= 1 else 10  # TRL's float below 1 is a ratio of the steps
        b.put(name, "converted", "log.rollouts_every", every, "every logging_steps")
        shown = f.get("num_completions_to_print") or 8
        b.put(name, "converted", "log.completions_to_print", shown,
              "num_completions_to_print, or 8 where TRL prints them all")


def _generation_kwargs(b: _Build, name: str, value: Any, f: dict[str, Any]) -> None:
    for key, v in (value or {}).items():
        if key in ("stop", "stop_strings"):
            stops = [v] if isinstance(v, str) else v
            if not (isinstance(stops, list) and all(isinstance(s, str) for s in stops)):
                raise UserError(f"generation_kwargs.{key} is {v!r}", where=f"{name}.{key}",
                                valid="a string or a list of strings",
                                hint=f"fix generation_kwargs.{key} in the config")
            b.put(name, "mapped", "generation.stop", stops)
        else:
            b.say(name, "unsupported", f"{key}={v!r}: see `grpo inspect fields generation`")


_SPECIAL = {
    "max_steps": _max_steps, "num_train_epochs": _epochs, "lr_scheduler_type": _scheduler, "warmup_steps": _warmup, "warmup_ratio": _warmup,
    "bf16": _precision, "fp16": _precision, "report_to": _report_to, "model_init_kwargs": _model_init_kwargs,
    "use_vllm": _vllm, "vllm_mode": _vllm, "vllm_server_base_url": _vllm, "vllm_server_host": _vllm,
    "vllm_server_port": _vllm, "vllm_enable_sleep_mode": _vllm, "epsilon": _epsilon,
    "scale_rewards": _scale_rewards, "multi_objective_aggregation": _aggregation, "sync_ref_model": _ref_sync,
    "ref_model_sync_steps": _ref_sync, "ref_model_mixup_alpha": _ref_sync, "use_bias_correction_kl": _bias_kl,
    "log_completions": _log_completions, "num_completions_to_print": _log_completions, "generation_kwargs": _generation_kwargs,
    "resume_from_checkpoint": _resume, "save_strategy": _save_strategy, "save_steps": _save_steps, "use_transformers_paged": _vllm,
    "use_transformers_continuous_batching": _vllm,
}


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _plain(value: Any) -> Any:
    """An enum (TrainingArguments turns lr_scheduler_type into one) -> its value."""
    return getattr(value, "value", value)


def _show(value: Any) -> str:
    return repr(value) if not isinstance(value, bool) else str(value).lower()
