"""A model's context as vLLM reads it from config.json, and the check that an engine's context fits it:
exit 2 naming the setting before vLLM loads, where vLLM 0.32 would fail later with a pydantic traceback.
Used by the colocated engine (grpocli.generation.vllm_colocate), `grpo vllm-serve --max-model-len` and the
trainer's preflight and grpo eval (grpocli.generation.positions). Light: JSON only, no torch, no vLLM."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from grpocli.errors import UserError

#: The config.json keys vLLM reads a model's context length from (the smallest given wins;
#: vllm.transformers_utils.model_arch_config_convertor), and the RoPE types whose factor it does
#: not multiply in (their max_position_embeddings is already scaled).
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_target_positions",
                "max_sequence_length", "max_seq_length", "seq_len")
_SCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def _text_config(model_dir: str | Path) -> dict[str, Any] | None:
    """config.json as JSON (a multimodal config's text_config); None where it is missing or does not parse."""
    import json

    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg


def _rope(text: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The rope scaling's type and parameters (transformers 5's rope_parameters, or rope_scaling)."""
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    rope = rope if isinstance(rope, dict) else {}
    return rope.get("rope_type", rope.get("type")), rope


def model_context(model_dir: str | Path) -> tuple[int, str] | None:
    """The longest context vLLM allows ``model_dir``'s model, and the config.json key it comes from,
    worked out as vLLM does; None where the config does not say (vLLM then takes what it is given)."""
    text = _text_config(model_dir)
    if text is None:
        return None
    given = [(text[k], k) for k in CONTEXT_KEYS if isinstance(text.get(k), (int, float))]
    if isinstance(text.get("model_max_length"), (int, float)):
        given = [(text["model_max_length"], "model_max_length")]  # vLLM: it overrides the others
    if not given:
        return None
    length, key = min(given)
    kind, rope = _rope(text)
    if kind not in (*_SCALED_ROPE, None, "default"):
        length *= rope.get("factor") or 1.0
    return int(length), key


def yarn_length(model_dir: str | Path, length: int) -> int | None:
    """original_max_position_embeddings (else ``length``) x factor of a YaRN rope scaling where that is longer
    than ``length``, the context vLLM reads: vLLM 0.32 multiplies no YaRN factor in (it takes
    max_position_embeddings as already stretched, as transformers 5 does), so a config.json written as
    Qwen2.5's model cards write it (32768 positions, factor 4) holds 32768 tokens for vLLM; None otherwise."""
    text = _text_config(model_dir)
    kind, rope = _rope(text or {})
    factor, original = rope.get("factor"), rope.get("original_max_position_embeddings") or length
    if kind not in ("yarn", "deepseek_yarn") or not isinstance(factor, (int, float)):
        return None
    stretched = int(original * factor) if isinstance(original, (int, float)) else 0
    return stretched if stretched > length else None


def check_context_length(model_dir: str | Path, max_model_len: int | None, where: str) -> None:
    """UserError (exit 2) before vLLM loads when ``max_model_len`` is longer than the model's context
    (vLLM's own check fails later, as a pydantic traceback); ``where`` names the setting(s) it came
    from. VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 allows it, as in vLLM."""
    context = model_context(model_dir)
    if max_model_len is None or context is None or os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1":
        return
    length, key = context
    if max_model_len <= length:
        return
    stretched = yarn_length(model_dir, length)
    if stretched is not None and max_model_len <= stretched:
        raise UserError(
            f"the engine's context ({max_model_len} tokens) is longer than vLLM reads the model's: its config.json "
            f"says {key} = {length}, stretched to {stretched} by YaRN rope scaling, but vLLM takes {key} = {length} "
            "as the stretched length (it multiplies no YaRN factor in)", where=where, valid=f"at most {length}",
            hint=f'set "{key}": {stretched} in that config.json ({Path(model_dir) / "config.json"}), as transformers '
                 "5 reads it too (or export VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)",
        )
    fix = f"{where}={length}" if "+" not in where else f"make {where} at most {length}"
    raise UserError(
        f"the engine's context ({max_model_len} tokens) is longer than the model's: its config.json says "
        f"{key} = {length}", where=where, valid=f"at most {length}",
        hint=f"{fix} (or export VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 for a model whose position encoding "
             "takes longer sequences)",
    )


__all__ = ["CONTEXT_KEYS", "check_context_length", "model_context", "yarn_length"]
