"""Write a model + tokenizer directory that transformers, vLLM and `grpo eval` can all load.

The layout is save_pretrained's: config.json, model.safetensors, generation_config.json,
tokenizer.json and tokenizer_config.json. The chat template is written *into*
tokenizer_config.json (``save_jinja_files=False``) rather than a separate chat_template.jinja,
so that older transformers releases and other loaders find it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


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
