"""A tiny model saved to a folder, as TRL and `grpo train` load one by name."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from grpocli.models.tiny import build_tiny_model
    from grpocli.models.tokenizer import build_char_tokenizer
    from grpocli.recipe.schema import TinyModel

    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_char_tokenizer()
    build_tiny_model(TinyModel(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tokenizer,
                     seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
