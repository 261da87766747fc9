"""The value types of TRL 1.16's GRPOConfig fields and `trl grpo`'s script arguments, for `grpo import trl`.

``TRL_TYPES[name]`` is the type a value must have before it is converted. It is TRL's own
annotation, or narrower where TRL's ``__post_init__`` or the run fails on what the annotation
allows (``num_generations: int | None`` fails on None: here it is ``int``; ``DIFFERS`` lists
each such field and why); tests check every entry against TRL's dataclasses when TRL is
installed. ``check_fields`` checks a config's values:

- Strictly: ``3`` is no bool, ``True`` no int, ``10.0`` no int, ``5`` no string, ``None`` only
  where the type is Optional, a list only where TRL takes one (a float field takes an int, as TRL's).
- A string read from a YAML or JSON file where the field takes a number or a boolean is
  converted as ``trl grpo --config`` converts it (its parser applies the field's type to string
  values: ``int("10")``, ``float("1e-5")``, transformers' ``string_to_bool("yes")``), because
  YAML itself reads ``1e-5`` (no dot) as a string. What that conversion refuses is refused here
  too. A Python file builds GRPOConfig directly, where nothing converts: its strings stay strings.
- A dict field given as text starting with ``{`` is JSON, as TrainingArguments reads it; other
  text is refused (TRL's ``dict | str`` takes it, but it is no mapping to import).

Each bad value is a UserError naming the file, the field, the value and the type TRL takes.
"""

from __future__ import annotations

import json
import reprlib
import types
import typing
from typing import Any

from grpocli.errors import UserError
from grpocli.recipe.trl_distill import DISTILL_TYPES

HINT = "fix the value in the config (`grpo inspect fields --trl {name}` says what the field does)"
_TRUE, _FALSE = ("yes", "true", "t", "y", "1"), ("no", "false", "f", "n", "0")  # transformers' string_to_bool
DICT_FIELDS = ("model_init_kwargs", "generation_kwargs", "chat_template_kwargs",
               "transformers_continuous_batching_config", "gradient_checkpointing_kwargs")  # GRPOConfig._VALID_DICT_FIELDS: JSON text is read

Json = dict[str, Any]
TRL_TYPES: dict[str, Any] = {
    # --- TrainingArguments that a GRPO run sets ---
    "output_dir": str | None, "max_steps": int, "num_train_epochs": float, "learning_rate": float,
    "lr_scheduler_type": str, "warmup_steps": float, "warmup_ratio": float | None, "weight_decay": float,
    "adam_beta1": float, "adam_beta2": float, "max_grad_norm": float, "seed": int, "bf16": bool | None,
    "fp16": bool, "gradient_checkpointing": bool, "per_device_train_batch_size": int,
    "gradient_accumulation_steps": int, "save_steps": float, "save_total_limit": int | None,
    "logging_steps": float, "report_to": str | list[str] | None, "eval_steps": float | None,
    "resume_from_checkpoint": str | bool | None, "save_strategy": str, "eval_on_start": bool, "ddp_timeout": int,
    "push_to_hub": bool, "hub_model_id": str | None, "run_name": str | None, "overwrite_output_dir": bool,
    "gradient_checkpointing_kwargs": Json | None, "logging_strategy": str, "logging_first_step": bool,
    "do_eval": bool,
    # --- GRPOConfig: model and data ---
    "model_init_kwargs": Json | None, "trust_remote_code": bool, "router_aux_loss_coef": float | None,
    "disable_dropout": bool, "cast_lm_head_to_fp32": bool, "shuffle_dataset": bool | None,
    "chat_template_kwargs": Json | None, "pad_to_multiple_of": int | str | None,
    # --- GRPOConfig: generation ---
    "num_generations": int, "num_generations_eval": int | None, "max_completion_length": int | None,
    "generation_batch_size": int | None, "steps_per_generation": int | None, "temperature": float,
    "top_p": float, "top_k": int, "min_p": float | None, "repetition_penalty": float,
    "generation_kwargs": Json | None, "cache_implementation": str | None, "ds3_gather_for_generation": bool,
    "use_transformers_continuous_batching": bool, "transformers_continuous_batching_config": Json | None,
    "use_transformers_paged": bool,
    # --- GRPOConfig: vLLM ---
    "use_vllm": bool, "vllm_mode": str, "vllm_model_impl": str, "vllm_enable_sleep_mode": bool,
    "vllm_structured_outputs_regex": str | None, "vllm_server_base_url": str | None, "vllm_server_host": str,
    "vllm_server_port": int, "vllm_server_timeout": float, "vllm_group_port": int,
    "vllm_gpu_memory_utilization": float, "vllm_max_model_length": int | None, "vllm_tensor_parallel_size": int,
    "vllm_importance_sampling_correction": bool, "vllm_importance_sampling_mode": str,
    "vllm_importance_sampling_clip_max": float | None, "vllm_importance_sampling_clip_min": float | None,
    "vllm_importance_sampling_cap": float | None,
    # --- GRPOConfig: the algorithm ---
    "beta": float, "num_iterations": int, "epsilon": float, "epsilon_high": float | None, "delta": float | None,
    "sapo_temperature_neg": float, "sapo_temperature_pos": float, "vespo_k_pos": float, "vespo_lambda_pos": float,
    "vespo_k_neg": float, "vespo_lambda_neg": float, "importance_sampling_level": str,
    "reward_weights": list[float] | None, "multi_objective_aggregation": str, "scale_rewards": str | bool,
    "loss_type": str, "mask_truncated_completions": bool, "sync_ref_model": bool, "ref_model_mixup_alpha": float,
    "ref_model_sync_steps": int, "top_entropy_quantile": float, "entropy_coef": float, "use_adaptive_entropy": bool,
    "entropy_coef_min": float, "entropy_coef_max": float, "entropy_coef_delta": float, "entropy_target": float,
    "max_tool_calling_iterations": int | None, "off_policy_mask_threshold": float | None,
    "use_bias_correction_kl": bool,
    # --- GRPOConfig: logging ---
    "log_completions": bool, "log_multimodal": bool, "num_completions_to_print": int | None,
    "log_unique_prompts": bool, "log_completions_hub_repo": str | None,
    # --- `trl grpo`'s script and model arguments (trl/scripts/grpo.py) ---
    "model_name_or_path": str | None, "dtype": str | None, "attn_implementation": str | None,
    "dataset_name": str | None, "dataset_train_split": str, "dataset_test_split": str,
    "reward_model_name_or_path": str | None, "reward_funcs": list[str] | None,
    "use_peft": bool, "lora_r": int, "lora_alpha": int, "lora_dropout": float, "lora_target_modules": list[str] | None,
}
#: Fields typed unlike TRL's annotation, and why (tests allow exactly these to differ).
DIFFERS = {
    "num_generations": "TRL's int | None fails on None (GRPOConfig.__post_init__ divides by it)",
    "scale_rewards": "TRL's str also takes true / false, as its docs say (__post_init__: 'group' / 'none')",
    "resume_from_checkpoint": "TRL's str | None; Trainer.train(resume_from_checkpoint=True) resumes from the newest "
                              "checkpoint, and scripts pass the field to it",
    **dict.fromkeys(DICT_FIELDS, "TRL's dict | str | None: text starting with { is read as JSON (as TrainingArguments "
                                 "reads it), other text is no mapping to import"),
}


def check_fields(fields: dict[str, Any], where: str, *, from_text: bool) -> dict[str, Any]:
    """``fields`` with each known field's value checked against ``TRL_TYPES`` (converted where
    ``from_text``, a YAML or JSON file, as ``trl grpo --config`` converts strings); fields TRL does
    not have pass unchanged (the import names them). UserError for the first bad value."""
    out = {}
    for name, value in fields.items():
        if not isinstance(name, str):
            raise UserError(f"{where} has the key {_show(name)} ({type(name).__name__}), not a field name",
                            where=where, valid="GRPOConfig field names (strings) as keys",
                            hint="fix the key in the config (`grpo inspect fields --trl NAME` lists the fields)")
        known = name in TRL_TYPES or name in DISTILL_TYPES
        out[name] = checked(name, value, where, from_text=from_text) if known else value
    return out


def checked(name: str, value: Any, where: str, *, from_text: bool) -> Any:
    """The value of field ``name``, checked (and converted from text where TRL's parser would)."""
    from pydantic import TypeAdapter, ValidationError

    kind = TRL_TYPES[name] if name in TRL_TYPES else DISTILL_TYPES[name]
    if from_text and isinstance(value, str):
        value = _from_text(name, value, kind, where)
    if name in DICT_FIELDS and isinstance(value, str) and value.startswith("{"):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise _bad(name, value, kind, where, f"its JSON does not parse: {exc}") from None
    try:
        return TypeAdapter(kind).validate_python(value, strict=True)
    except ValidationError:
        raise _bad(name, value, kind, where) from None


def _from_text(name: str, text: str, kind: Any, where: str) -> Any:
    """A string as `trl grpo --config` reads it for a field of type ``kind`` (its parser's type function)."""
    members = _members(kind)
    if str in members:
        return text
    for target in (bool, int, float):
        if target in members:
            try:
                if target is bool:
                    return _to_bool(text)
                return target(text)
            except ValueError:
                raise _bad(name, text, kind, where, "TRL's parser refuses it too") from None
    return text


def _to_bool(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(text)


def _members(kind: Any) -> tuple[Any, ...]:
    """The types a union is made of (the type itself otherwise), generics as their origin."""
    parts = typing.get_args(kind) if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union \
        else (kind,)
    return tuple(typing.get_origin(p) or p for p in parts)


def described(kind: Any) -> str:
    """A type in words: 'an integer, or null'."""
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "a mapping (or its JSON text, {...})", type(None): "null"}
    parts = []
    for part in typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,):
        origin, args = typing.get_origin(part) or part, typing.get_args(part)
        text = words.get(origin, getattr(origin, "__name__", str(origin)))
        if origin is list and args:
            text = f"a list of {described(args[0]).removeprefix('a ').removeprefix('an ')}s"
        parts.append(text)
    return ", or ".join(parts)


def _bad(name: str, value: Any, kind: Any, where: str, why: str = "") -> UserError:
    shown = "null" if value is None else f"{_show(value)} ({type(value).__name__})"
    return UserError(f"{name} is {shown}{'; ' + why if why else ''}: TRL takes {described(kind)}",
                     where=f"{where}: {name}", valid=described(kind), hint=HINT.format(name=name))


def _show(value: Any) -> str:
    bounded = reprlib.Repr()
    bounded.maxstring = bounded.maxother = 60
    try:
        return bounded.repr(value)
    except Exception:  # noqa: BLE001 - an int past 4300 digits, a __repr__ that raises
        return f"<a {type(value).__name__}>"


__all__ = ["DIFFERS", "TRL_TYPES", "check_fields", "checked", "described"]
