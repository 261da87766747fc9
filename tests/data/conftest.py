"""Fixtures for grpocli.data tests: the real offline tokenizer and the built-in registries."""

from __future__ import annotations

import pytest

from grpocli.data import builtin, curricula
from grpocli.registry.names import Registry


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """`datasets` writes its arrow cache under tmp_path, not ~/.cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets-cache"))


@pytest.fixture(scope="session")
def tokenizer():
    from grpocli.models.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture
def registry() -> Registry:
    """The dataset registry as the plugin manager fills it from grpocli.data.builtin."""
    reg = Registry("dataset")
    builtin.register_datasets(register=reg.registrar("grpocli.data.builtin", "grpocli"))
    return reg


@pytest.fixture
def curriculum_registry() -> Registry:
    reg = Registry("curriculum")
    curricula.register_curricula(register=reg.registrar("grpocli.data.curricula", "grpocli"))
    return reg

