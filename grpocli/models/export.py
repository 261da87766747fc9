"""Checkpoints as standalone models: open one (full weights, or LoRA adapters merged into their
base model) and write a model + tokenizer directory that transformers, vLLM and `grpo eval` load.

A LoRA run's checkpoints hold only the adapters (peft's save_pretrained: adapter_config.json +
adapter_model.safetensors). Their base model is, in this order: the one asked for (``base``,
`grpo export --base-model`), the [model] of the run the checkpoint belongs to (its
config.resolved.toml: what the adapters were trained on, a 'tiny' model's shape and seed
included), the base_model_name_or_path of adapter_config.json, the recipe's [model].
``CheckpointModel`` says which (no torch); ``open_model`` loads it, merging the adapters into the
base weights with peft's merge_and_unload.

The layout written is save_pretrained's: config.json, model.safetensors, generation_config.json,
tokenizer.json and tokenizer_config.json. The chat template is written *into*
tokenizer_config.json (``save_jinja_files=False``) rather than a separate chat_template.jinja,
so that older transformers releases and other loaders find it too.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomllib

from grpocli.errors import UserError
from grpocli.rundir import free_space, is_write_failure, megabytes, write_error

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from grpocli.recipe.schema import ModelSection

ADAPTER_CONFIG = "adapter_config.json"
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


@dataclass(frozen=True)
class CheckpointModel:
    """How to open a checkpoint as one model."""

    section: ModelSection        # what to load: the checkpoint itself, or the adapters' base model
    seed: int                    # the seed a 'tiny' base model is built with
    adapter: Path | None = None  # LoRA adapters merged into the section's weights
    note: str = ""               # where the base model came from


def is_adapter(path: Path) -> bool:
    """A peft adapter checkpoint (adapter_config.json, no config.json of a full model)."""
    return (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


def checkpoint_model(path: Path, *, model: ModelSection | None = None, seed: int = 0,
                     base: str | None = None, where: str = "--checkpoint") -> CheckpointModel:
    """The model of the checkpoint directory ``path``; ``model`` and ``seed`` (the recipe's) are
    used where the checkpoint and its run say nothing, ``base`` overrides an adapter's base model."""
    from grpocli.recipe.schema import ModelSection

    path = Path(path)
    run = run_model(path)
    if not is_adapter(path):
        fallback = model or (run[0].model_copy(update={"dtype": "auto"}) if run else ModelSection(dtype="auto"))
        has_tokenizer = _has_tokenizer(path)
        if not has_tokenizer and model is None and run is None:
            raise UserError(f"the checkpoint {path} holds no tokenizer and belongs to no run", where=where,
                            valid="a directory written by save_pretrained with tokenizer files",
                            hint=f"save the tokenizer into {path} (tokenizer.save_pretrained)")
        tokenizer = None if has_tokenizer else (fallback.tokenizer or fallback.name_or_path)
        return CheckpointModel(_plain(fallback, name_or_path=str(path), tokenizer=tokenizer), seed)
    named = _adapter_base(path)
    if base is not None:
        section, note = (run[0] if run else model or ModelSection()), f"base model {base} (--base-model)"
        section = section.model_copy(update={"name_or_path": base})
    elif run is not None:
        section, seed = run[0], run[1]
        note = f"base model {section.name_or_path}, from {path.parent.parent / 'config.resolved.toml'}"
    elif named:
        section = (model or ModelSection()).model_copy(update={"name_or_path": named})
        note = f"base model {named}, from {path / ADAPTER_CONFIG}"
    elif model is not None:
        section, note = model, f"base model {model.name_or_path}: the recipe's ({ADAPTER_CONFIG} names none)"
    else:
        raise UserError(f"cannot tell which base model the LoRA adapters in {path} belong to", where=where,
                        valid="a checkpoint inside its run directory (config.resolved.toml names the base), "
                        f"or adapters whose {ADAPTER_CONFIG} names base_model_name_or_path",
                        hint="--base-model NAME_OR_PATH (the model the adapters were trained on)")
    tokenizer = str(path) if _has_tokenizer(path) else section.tokenizer
    return CheckpointModel(_plain(section, tokenizer=tokenizer), seed, adapter=path, note=note)


def run_model(path: Path) -> tuple[ModelSection, int] | None:
    """The [model] and train.seed of the run a checkpoint (runs/x/checkpoints/step-N) belongs to."""
    from pydantic import ValidationError

    from grpocli.recipe.schema import ModelSection

    config = path.parent.parent / "config.resolved.toml"
    if path.parent.name != "checkpoints" or not config.is_file():
        return None
    try:
        data = tomllib.loads(config.read_text(encoding="utf-8"))
        return ModelSection.model_validate(data.get("model", {})), int(data.get("train", {}).get("seed", 0))
    except (OSError, tomllib.TOMLDecodeError, ValidationError, TypeError, ValueError):
        return None


def open_model(cm: CheckpointModel, *, device: Any = None, where: str = "--checkpoint") -> PreTrainedModel:
    """The model ``cm`` describes, in eval mode, adapters merged into the base weights."""
    from grpocli.models.loader import load_policy

    model = load_policy(cm.section, cm.seed)
    if cm.adapter is not None:
        model = merge_adapter(model, cm.adapter, base=cm.section.name_or_path, where=where)
    model.eval()
    return model.to(device) if device is not None else model


def merge_adapter(base_model: Any, adapter: Path, *, base: str, where: str) -> PreTrainedModel:
    """peft's PeftModel.from_pretrained on ``base_model``, then merge_and_unload."""
    try:
        from peft import PeftModel
    except ImportError:
        raise UserError(f"{adapter} holds LoRA adapters, and loading them needs the peft package",
                        where=where, valid="peft installed", hint="pip install 'grpocli[peft]'") from None
    try:
        return PeftModel.from_pretrained(base_model, str(adapter)).merge_and_unload()
    except (RuntimeError, ValueError, KeyError, OSError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"the LoRA adapters in {adapter} do not fit the base model {base}: {first}",
                        where=where, valid="the base model (and, for 'tiny', the shape and seed) they were "
                        "trained on", hint="--base-model NAME_OR_PATH, or keep the checkpoint in its run "
                        "directory (config.resolved.toml names the base)") from None


def export_model(cm: CheckpointModel, out_dir: Path, *, where: str = "OUT_DIR") -> Path:
    """Write the model of ``cm`` and its tokenizer to ``out_dir`` (absent or empty), atomically."""
    from transformers.utils import logging as hf_logging

    from grpocli.models.loader import load_tokenizer

    out_dir = Path(out_dir)
    tokenizer = load_tokenizer(cm.section)
    model = open_model(cm, where=where)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar for one small file
    try:
        try:
            save_model(model, tokenizer, tmp)
        except Exception as err:
            if not is_write_failure(err):
                raise
            raise _export_failed(out_dir, err, model, where) from None
        if out_dir.is_dir():
            out_dir.rmdir()  # empty: checked before
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if shown:
            hf_logging.enable_progress_bar()
    return out_dir


def _export_failed(out_dir: Path, err: BaseException, model: Any, where: str) -> UserError:
    """A full disk (or a size limit) while exporting: what it needs, what is free; nothing was left."""
    needed = sum(p.numel() * p.element_size() for p in model.parameters())
    return UserError(
        f"could not write the model to {out_dir}: {write_error(err)}; the export needs about "
        f"{megabytes(needed)} (its weights), {free_space(out_dir.parent, needed)}; nothing was written "
        f"to {out_dir} (the partial copy is removed)", where=where,
        valid=f"a directory on a disk with {megabytes(needed)} free",
        hint=f"free space (df -h {out_dir.parent}) or pick an OUT_DIR on another disk, then run the same command again",
    )


def save_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    directory: str | Path,
    *,
    merge_lora: bool = True,
) -> Path:
    """Save ``model`` and ``tokenizer`` to ``directory`` (created) and return it.

    A peft model is saved with its LoRA adapters merged into a copy of the base weights
    (``merge_lora=True``, loadable by AutoModelForCausalLM and vLLM), or as its adapters only
    (adapter_config.json + adapter_model.safetensors, ``merge_lora=False``). ``model`` itself is
    left unchanged either way.
    """
    import copy

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if merge_lora and hasattr(model, "merge_and_unload"):
        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(directory)  # safetensors is the default
    tokenizer.save_pretrained(directory, save_jinja_files=False)
    return directory


def _plain(section: ModelSection, **update: Any) -> ModelSection:
    """``section`` for inference: no fresh LoRA adapters, no gradient checkpointing."""
    return section.model_copy(update={"gradient_checkpointing": False,
                                      "lora": section.lora.model_copy(update={"enabled": False}), **update})


def _has_tokenizer(path: Path) -> bool:
    return any((path / name).is_file() for name in TOKENIZER_FILES)


def _adapter_base(path: Path) -> str | None:
    """adapter_config.json's base_model_name_or_path ('' and null: none)."""
    try:
        named = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    return named or None
