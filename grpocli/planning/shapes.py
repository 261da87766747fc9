"""The shape of a model, from its config alone: sizes, and parameter counts that are exact.

The config comes from `grpo plan --config PATH` (a config.json or a directory holding one), or
from the recipe's `model.name_or_path`: 'tiny' ([model.tiny], the config grpocli.models.tiny
builds), a save_pretrained directory, a packaged or GGUF model (its metadata; no tensor is read)
or a hub id (its config.json alone; offline: from the local Hugging Face cache). Parameter counts
come from the model built on the meta device (no memory, no weights), so biases, tied embeddings
and odd layers count as they are.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError

if TYPE_CHECKING:
    from grpocli.recipe.schema import ModelSection

#: The config fields every shape needs, as transformers names them for decoder-only models.
NEEDED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
#: Bytes per element of the dtypes a recipe or a config names.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


@dataclass(frozen=True)
class LinearShape:
    """One linear layer of a decoder layer (what LoRA adapts): its name and sizes."""

    name: str
    fan_in: int
    fan_out: int


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs to know about a causal language model."""

    source: str                       # where the config was read, in words
    architecture: str                 # e.g. Qwen2ForCausalLM
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tied_embeddings: bool
    params: int                       # every parameter once (a tied lm_head counted once)
    embedding_params: int             # the input embedding
    layer_params: int                 # the largest decoder layer
    layer_linears: tuple[LinearShape, ...]  # the linear layers of one decoder layer
    config_dtype: str | None = None   # the checkpoint's dtype (config torch_dtype / dtype), for model.dtype='auto'

    @property
    def root_params(self) -> int:
        """Parameters outside the decoder layers: embeddings, lm_head (untied), final norm."""
        return self.params - self.num_layers * self.layer_params

    def lora_params(self, r: int, targets: list[str] | str) -> int:
        """Trainable LoRA parameters: r x (in + out) per adapted linear layer of every decoder layer
        ('all-linear': every linear layer but the output one, as peft)."""
        chosen = [lin for lin in self.layer_linears
                  if targets == "all-linear" or any(lin.name == t or lin.name.endswith("." + t) for t in targets)]
        return self.num_layers * sum(r * (lin.fan_in + lin.fan_out) for lin in chosen)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "layer_linears"} | {"root_params": self.root_params}


def shape_of(model: ModelSection, config: str | None = None, *, key: str = "model.name_or_path") -> ModelShape:
    """The shape of `model.name_or_path`, or of the config at `config` (a config.json or a
    directory holding one) when given; a UserError naming the path (and `key`, the recipe key that
    named the model: distill.teacher for a teacher) when it cannot be read."""
    if config is not None:
        path, cfg = _config_file(config)
        return shape_of_config(cfg, source=path, trust_remote_code=model.trust_remote_code, where="grpo plan --config")
    name = model.name_or_path
    if name == "tiny":
        from grpocli.models import build_char_tokenizer, tiny_config

        cfg = tiny_config(model.tiny, build_char_tokenizer(vocab_size=model.tiny.vocab_size))
        return shape_of_config(cfg, source="[model.tiny]", trust_remote_code=False, where="model.tiny")
    from grpocli.models.source import resolve

    source = resolve(name, key=key, gguf=True, hub=False)
    from transformers import AutoConfig

    kwargs: dict[str, Any] = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    where = os.path.join(source.path, source.gguf_file) if source.gguf_file else source.path
    try:
        cfg = AutoConfig.from_pretrained(source.path, local_files_only=source.local_files_only,  # online: config.json only
                                         trust_remote_code=model.trust_remote_code, **kwargs)
    except (OSError, ValueError, KeyError) as err:
        raise UserError(
            f"the config of {where} could not be read: {_first_line(err)}",
            where=key,
            valid="a directory with config.json, a .gguf file or packaged model, or a hub id (offline: one in the "
            "local Hugging Face cache)",
            hint="give the config yourself: grpo plan RECIPE --config PATH/config.json (the model's config.json "
            "from its hub page)" if key == "model.name_or_path" else f"set {key} to a directory holding the "
            "model's config.json (and its weights)",
        ) from None
    return shape_of_config(cfg, source=where, trust_remote_code=model.trust_remote_code, where=key)


def _config_file(config: str) -> tuple[str, Any]:
    """(the config.json's path, its transformers config) for `grpo plan --config`."""
    path = os.path.expanduser(config)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    valid = "a model's config.json (as save_pretrained writes it, with model_type and " + ", ".join(NEEDED) + \
        ") or a directory holding one"
    if not os.path.isfile(path):
        raise UserError(f"no config.json at {path}", where="grpo plan --config", valid=valid,
                        hint="download only the config: hf download ORG/NAME config.json --local-dir DIR")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path} is not a readable JSON file: {err}", where="grpo plan --config",
                        valid=valid) from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise UserError(f"{path} has no model_type, so transformers cannot tell which architecture it is",
                        where="grpo plan --config", valid=valid)
    from transformers import AutoConfig

    try:
        return path, AutoConfig.for_model(**raw)
    except Exception as err:  # noqa: BLE001 - transformers' ValueErrors and huggingface_hub's validation errors alike
        raise UserError(f"{path} is not a config transformers reads: {_first_line(err)}",
                        where="grpo plan --config", valid=valid,
                        hint="upgrade transformers if the architecture is new") from None


def shape_of_config(cfg: Any, *, source: str, trust_remote_code: bool = False,
                    where: str = "model.name_or_path") -> ModelShape:
    """The shape of a transformers config (a live model's own `config` too: it is not changed), from
    the model it describes built on the meta device; a UserError at `where` naming `source` when it
    is not a decoder-only causal language model's."""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    missing = [k for k in NEEDED if getattr(text, k, None) is None]
    if missing:
        raise UserError(f"the config of {source} has no {', '.join(missing)}", where=where,
                        valid="a decoder-only causal language model's config with " + ", ".join(NEEDED))
    model = _meta_model(cfg, source=source, trust_remote_code=trust_remote_code, where=where)
    layers = _decoder_layers(model)
    if not layers:
        raise UserError(f"found no decoder layers in the model of {source}", where=where,
                        valid="a transformers causal language model with _no_split_modules")
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    embedding = model.get_input_embeddings()
    output = model.get_output_embeddings()
    tied = output is not None and output.weight is embedding.weight
    # transformers 5 reads a config.json's torch_dtype as `dtype` (asking for torch_dtype warns); older ones keep it
    dtype = getattr(text, "dtype", None) if hasattr(text, "dtype") else getattr(text, "torch_dtype", None)
    return ModelShape(
        source=source, architecture=type(model).__name__, vocab_size=text.vocab_size,
        hidden_size=text.hidden_size, num_layers=len(layers), num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=text.intermediate_size, tied_embeddings=tied,
        params=sum(p.numel() for p in model.parameters()), embedding_params=embedding.weight.numel(),
        layer_params=max(sum(p.numel() for p in layer.parameters()) for layer in layers),
        layer_linears=tuple(_linears(layers[0])),
        config_dtype=str(dtype).removeprefix("torch.") if dtype is not None else None,
    )


def _meta_model(cfg: Any, *, source: str, trust_remote_code: bool, where: str) -> Any:
    """The model of `cfg` on the meta device: every parameter's shape, no memory."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):  # a copy: from_config may set attributes (attention implementation, dtype)
            return AutoModelForCausalLM.from_config(copy.deepcopy(cfg), trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, TypeError, AttributeError, ImportError) as err:
        raise UserError(f"the config of {source} does not describe a causal language model transformers can "
                        f"build: {_first_line(err)}", where=where,
                        valid="a causal language model's config (AutoModelForCausalLM)") from None


def _decoder_layers(model: Any) -> list[Any]:
    """The decoder layers: the classes in `_no_split_modules` (as FSDP2 wraps them)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names and m is not model]


def _linears(layer: Any) -> list[LinearShape]:
    import torch

    return [LinearShape(name, m.in_features, m.out_features)
            for name, m in layer.named_modules() if isinstance(m, torch.nn.Linear)]


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def dtype_bytes(name: str | None, default: int = 4) -> int:
    """Bytes per element of a dtype named by a recipe or a config ('auto' / unknown: `default`)."""
    return DTYPE_BYTES.get(str(name).removeprefix("torch."), default)
