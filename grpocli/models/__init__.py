"""Models: load the policy, reference and tokenizer of a [model] section; build tiny ones offline.

    source.py     where a model comes from: a directory, a GGUF file, a packaged model, a hub id
    packaged.py   models shipped inside an installed Python package as a GGUF file
    loader.py     the tokenizer, the policy and the reference model of a [model] section
    gguf_copy.py  a GGUF model dequantized once: the dense copy kept in grpo's cache (model.gguf_cache)
    files.py      save_pretrained without a progress bar; safetensors weights read back
    export.py     checkpoints as standalone models (LoRA adapters merged into their base)
    tiny.py       tiny Qwen2 models from [model.tiny]: no download, bit-identical for a seed
    tokenizer.py  the built-in character-level tokenizer, built offline

Names are imported lazily (PEP 562), so ``import grpocli.models`` imports neither torch nor
transformers; each submodule imports them inside its functions.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_char_tokenizer": "grpocli.models.tokenizer",
    "build_tiny_model": "grpocli.models.tiny",
    "tiny_config": "grpocli.models.tiny",
    "check_model": "grpocli.models.loader",
    "load_tokenizer": "grpocli.models.loader",
    "load_policy": "grpocli.models.loader",
    "load_reference": "grpocli.models.loader",
    "save_model": "grpocli.models.export",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'grpocli.models' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
