"""A GGUF model's dense copy (grpocli.models.gguf_copy, model.gguf_cache): made once and then read
instead of the file, equal to what the file loads bit for bit, made again when the file changes,
off with model.gguf_cache = false; a cache folder that cannot be written is said, and the file loads."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from gguf_files import FILE, TEXT, tiny_llama, write_gguf

from grpocli.models import load_policy, load_reference, load_tokenizer
from grpocli.models.gguf_copy import MADE_FROM, _convert, _copy_name
from grpocli.models.source import resolve
from grpocli.models.tokenizer import build_char_tokenizer
from grpocli.recipe.schema import ModelSection

pytest.importorskip("gguf", reason="the gguf package (pip install 'grpocli[gguf]') writes the test file")


@pytest.fixture
def gguf_file(tmp_path):
    (tmp_path / "model").mkdir()
    write_gguf(tiny_llama(), build_char_tokenizer(), tmp_path / "model" / FILE)
    return tmp_path / "model" / FILE


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "gguf"


def _copies(cache) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def _no_gguf_parse(monkeypatch) -> None:
    """From here on, reading the GGUF file fails the test: a load must come from the copy."""
    import gguf

    def refuse(*args, **kwargs):
        raise AssertionError("the GGUF file was parsed again")

    monkeypatch.setattr(gguf.GGUFReader, "__init__", refuse)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_copy_is_made_once_and_loads_what_the_file_loads(gguf_file, cache, monkeypatch, dtype):
    direct = ModelSection(name_or_path=str(gguf_file), dtype=dtype, gguf_cache=False)
    from_file, file_tokenizer = load_policy(direct, seed=0).state_dict(), load_tokenizer(direct)
    assert _copies(cache) == []  # gguf_cache = false writes nothing

    cached = ModelSection(name_or_path=str(gguf_file), dtype=dtype)
    tokenizer = load_tokenizer(cached)  # converts: tokenizer and weights
    [copy] = _copies(cache)
    assert copy.startswith(f"tiny-llama.F32-{dtype}-")
    made = json.loads((cache / copy / MADE_FROM).read_text())
    assert made["gguf_file"] == str(gguf_file.resolve()) and made["size"] == gguf_file.stat().st_size
    _no_gguf_parse(monkeypatch)
    policy, reference = load_policy(cached, seed=0), load_reference(cached, seed=0)
    for model in (policy, reference):
        state = model.state_dict()
        assert set(state) == set(from_file)
        assert all(state[k].dtype == getattr(torch, dtype) and torch.equal(state[k], from_file[k]) for k in state)
    assert all(p.requires_grad for p in policy.parameters()) and not getattr(policy, "is_quantized", False)
    assert "quantization_config" not in policy.config.to_dict()
    assert tokenizer(TEXT).input_ids == file_tokenizer(TEXT).input_ids == build_char_tokenizer()(TEXT).input_ids
    assert tokenizer.chat_template == file_tokenizer.chat_template
    assert (tokenizer.eos_token, tokenizer.pad_token) == (file_tokenizer.eos_token, file_tokenizer.pad_token)
    assert _copies(cache) == [copy]


def test_a_changed_file_is_converted_again(gguf_file, cache):
    section = ModelSection(name_or_path=str(gguf_file))
    load_tokenizer(section)
    [first] = _copies(cache)
    stat = gguf_file.stat()
    os.utime(gguf_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # rewritten a second later
    load_tokenizer(section)
    assert len(_copies(cache)) == 2 and first in _copies(cache)


def test_two_conversions_of_one_file_at_once_end_with_one_whole_copy(gguf_file, cache):
    """The second process to finish finds the first's copy in place: no error, no half copy left."""
    source = resolve(str(gguf_file), key="model.name_or_path", gguf=True)
    target = cache / _copy_name(source, torch.float32)
    _convert(source, torch.float32, target)
    _convert(source, torch.float32, target)
    assert _copies(cache) == [target.name] and (target / MADE_FROM).exists()


def test_a_cache_that_cannot_be_written_is_said_and_the_file_loads(gguf_file, tmp_path, monkeypatch, caplog):
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "a-file"))
    with caplog.at_level(logging.WARNING, logger="grpocli.models.gguf_copy"):
        tokenizer = load_tokenizer(ModelSection(name_or_path=str(gguf_file)))
    assert tokenizer(TEXT).input_ids == build_char_tokenizer()(TEXT).input_ids
    assert f"could not keep a dense copy of {FILE} in {tmp_path / 'a-file' / 'gguf'}" in caplog.text
    assert "loading the GGUF file itself" in caplog.text
