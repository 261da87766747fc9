"""The longest sequence a model's positions hold, read from its config without loading it, and the
check that a recipe's prompt + completion fits, before any model loads: grpocli.trainer.preflight runs it
for `grpo train`, grpocli.evaluation.eval_run for each model `grpo eval` samples from."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError

if TYPE_CHECKING:
    from grpocli.recipe import Recipe
    from grpocli.recipe.schema import ModelSection


#: rope_scaling types whose factor stretches the positions a model was trained on (transformers' linear,
#: dynamic-NTK and YaRN scalings): the longest sequence becomes original_max_position_embeddings x factor, as
#: Qwen2.5's model cards extend 32K to 128K ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings":
#: 32768}). The others (llama3, longrope) give max_position_embeddings already stretched.
STRETCHING_ROPE = ("linear", "dynamic", "yarn", "deepseek_yarn")
#: Lets a sequence past the model's positions through, as it lets vLLM's engine (its own variable).
ALLOW_LONG = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


@dataclass(frozen=True)
class Positions:
    """The longest sequence a model's positions hold, and where that was read."""

    length: int
    said: str              # in words: "model.tiny.max_position_embeddings = 1024", "its config.json (...) says ..."
    unstretched: int       # the positions before rope scaling (what a rope_scaling factor would multiply)
    tiny: bool = False     # from [model.tiny] (then model.tiny.max_position_embeddings changes it)


def check_positions(recipe: Recipe) -> None:
    """UserError (exit 2) when data.max_prompt_length + generation.max_completion_length (or + eval.max_tokens,
    where periodic evaluation generates longer) is longer than the model's positions, before any model loads:
    a model with learned positions fails on such a sequence, one with rotary positions runs on where it was
    never trained. The positions come from [model.tiny] or the model's config.json (`model_positions`); a model
    whose config is not on disk as JSON is not checked here. VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 lets it through,
    as it does vLLM's own check (grpocli.generation.engine_context.check_context_length)."""
    key, completion = "generation.max_completion_length", recipe.generation.max_completion_length
    e = recipe.eval
    if e.every and e.max_tokens is not None and e.max_tokens > completion:
        key, completion = "eval.max_tokens", e.max_tokens
    positions = _check_model(recipe, recipe.model, key, completion, evaluated=key == "eval.max_tokens")
    if positions is not None and recipe.generation.backend == "vllm" and not positions.tiny:
        _check_engine_context(recipe)


def check_eval_positions(recipe: Recipe, model: ModelSection, key: str, completion: int) -> None:
    """`grpo eval`'s check: data.max_prompt_length + the completions it samples (`key`: --max-tokens,
    eval.max_tokens or generation.max_completion_length) against the positions of ``model`` (the base model or
    a checkpoint), before it loads; as `check_positions` otherwise."""
    _check_model(recipe, model, key, completion, evaluated=True)


def _check_model(recipe: Recipe, model: ModelSection, key: str, completion: int, *,
                 evaluated: bool) -> Positions | None:
    """`_check_length` for ``model``'s positions where they are known and not allowed past; those positions."""
    positions = model_positions(model)
    if positions is None or os.environ.get(ALLOW_LONG) == "1":
        return None
    _check_length(recipe, positions, key, completion, model.name_or_path, evaluated)
    return positions


def _check_engine_context(recipe: Recipe) -> None:
    """A colocated vLLM engine's context check (grpocli.generation.engine_context.check_context_length, vLLM's
    own reading: no YaRN factor) before the policy loads rather than as the engine starts."""
    from grpocli.generation.engine_context import check_context_length

    v, file = recipe.vllm, _config_json(recipe.model.name_or_path)
    if file is None:
        return
    where = "vllm.max_model_len" if v.max_model_len else "data.max_prompt_length + generation.max_completion_length"
    length = v.max_model_len or recipe.data.max_prompt_length + recipe.generation.max_completion_length
    check_context_length(os.path.dirname(file), length, where)


def _check_length(recipe: Recipe, positions: Positions, key: str, completion: int, name: str,
                  evaluated: bool) -> None:
    """UserError when data.max_prompt_length + `completion` (set by `key`) is past `positions` (of model `name`);
    `evaluated`: the sequence is one evaluation samples, not training."""
    prompt, cap = recipe.data.max_prompt_length, positions.length
    if prompt + completion <= cap:
        return

    def setting(value: int) -> str:  # an option (grpo eval's --max-tokens) or a recipe key
        return f"{key} {value}" if key.startswith("--") else f"{key}={value}"

    shorter = [setting(cap - prompt)] if prompt < cap else []
    if completion < cap:
        shorter.append(f"data.max_prompt_length={cap - completion}")
    if not shorter:
        shorter = [f"data.max_prompt_length={cap // 2} {setting(cap - cap // 2)}"]
    longer = ""
    if positions.tiny and prompt + completion <= _tiny_positions_max():
        longer = f", or model.tiny.max_position_embeddings={prompt + completion}"
    elif not positions.tiny:
        factor = 2.0 ** math.ceil(math.log2((prompt + completion) / positions.unstretched))
        stretched = int(positions.unstretched * factor)
        longer = (", or stretch the model's positions with rope scaling in its config.json, as Qwen2.5's model "
                  f'cards do for long texts: "rope_scaling": {{"type": "yarn", "factor": {factor:g}, '
                  f'"original_max_position_embeddings": {positions.unstretched}}}, with "max_position_embeddings": '
                  f"{stretched} (transformers 5 and vLLM read it as the stretched length)")
    model = "the tiny model" if positions.tiny else name
    raise UserError(
        f"the engine's context and the longest {'evaluated' if evaluated else 'training'} sequence "
        f"({prompt} + {completion} = {prompt + completion} "
        f"tokens) are longer than the model's positions: {positions.said}",
        where=f"data.max_prompt_length + {key}",
        valid=f"data.max_prompt_length + {key} at most {cap} for {model}",
        hint=f"set {' or '.join(shorter)}{longer} ({ALLOW_LONG}=1 runs it anyway)",
    )


def _tiny_positions_max() -> int:
    """The largest model.tiny.max_position_embeddings the schema takes (its bound, read off the field)."""
    from grpocli.recipe.schema import TinyModel

    return next(m.le for m in TinyModel.model_fields["max_position_embeddings"].metadata if hasattr(m, "le"))


def model_positions(model: ModelSection) -> Positions | None:
    """The longest sequence ``model``'s positions hold, without loading it: model.tiny.max_position_embeddings
    for 'tiny', else what the config.json of a model directory or a cached hub id says (`config_positions`).
    None where that config is not at hand as JSON: a GGUF file or folder and a packaged model
    (grpocli.models reads no config of theirs; transformers builds it from the GGUF metadata as it loads), a hub
    id not yet in the local Hugging Face cache (reading its config would be a request to the hub), a config
    that does not parse (loading it says why) or that names no length."""
    from grpocli.models.loader import TINY

    if model.name_or_path == TINY:
        n = model.tiny.max_position_embeddings
        return Positions(n, f"model.tiny.max_position_embeddings = {n}", unstretched=n, tiny=True)
    file = _config_json(model.name_or_path)
    if file is None:
        return None
    try:
        with open(file, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return config_positions(config, source=file) if isinstance(config, dict) else None


def config_positions(config: dict[str, Any], *, source: str) -> Positions | None:
    """The longest sequence a config.json's positions hold: the smallest of the length keys vLLM reads
    (grpocli.generation.engine_context.CONTEXT_KEYS: max_position_embeddings, n_positions, max_seq_len, ...; a
    multimodal config's text_config), stretched by a linear / dynamic / YaRN rope_scaling (or transformers 5's
    rope_parameters) with a factor to original_max_position_embeddings (else that length) x factor where that is
    longer. None when it names no length. ``source`` names the file in the words."""
    from grpocli.generation.engine_context import CONTEXT_KEYS

    text = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    given = [(int(text[k]), k) for k in CONTEXT_KEYS
             if isinstance(text.get(k), (int, float)) and not isinstance(text[k], bool) and text[k] > 0]
    if not given:
        return None
    length, key = min(given)
    said = f"its config.json ({source}) says {key} = {length}"
    for rope_key in ("rope_scaling", "rope_parameters"):
        rope = text.get(rope_key)
        if not isinstance(rope, dict):
            continue
        kind, factor = rope.get("rope_type", rope.get("type")), rope.get("factor")
        if kind not in STRETCHING_ROPE or not isinstance(factor, (int, float)) or factor <= 1:
            continue
        original = rope.get("original_max_position_embeddings")
        original = int(original) if isinstance(original, (int, float)) and original > 0 else length
        if int(original * factor) > length:
            return Positions(int(original * factor), f"{said}, stretched by {rope_key} ({kind}, factor {factor:g}) "
                             f"from {original} to {int(original * factor)}", unstretched=original)
    return Positions(length, said, unstretched=length)


def _config_json(name: str) -> str | None:
    """The config.json of model.name_or_path where it is on disk: a model directory's, or a hub id's in the
    local Hugging Face cache (no request); None otherwise (see `model_positions`)."""
    from grpocli.models import packaged

    path = os.path.expanduser(name)
    if os.path.isdir(path):  # a save_pretrained directory; a folder holding a GGUF file has no config.json
        file = os.path.join(path, "config.json")
        return file if os.path.isfile(file) else None
    if os.path.exists(path) or path.lower().endswith(".gguf") or packaged.is_packaged(name):
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not a hub id (huggingface_hub's HFValidationError is one); check_model said so already
        return None
    return cached if isinstance(cached, str) else None
