"""generation.backend = "auto", the default: the backend measured fastest for the whole step, of those
installed that the recipe allows; config.resolved.toml records which (grpocli.recipe.backend_choice)."""

from __future__ import annotations

import importlib.util

import pytest
import tomllib

from grpocli.recipe import load_recipe

VLLM = importlib.util.find_spec("vllm") is not None
REAL = "model.name_or_path=smollm2-135m-instruct"  # any model but the built-in tiny one


def backend(*overrides: str) -> str:
    return load_recipe(None, list(overrides)).recipe.generation.backend


def test_the_default_is_auto_and_the_tiny_model_gets_hf():
    from grpocli.recipe.schema import GenerationSection

    assert GenerationSection().backend == "auto"
    assert backend() == "hf"  # measured: quickstart 30 s with hf, 49 s with vLLM, 93 s with paged
    assert backend("generation.backend=auto") == "hf"
    assert load_recipe("quickstart").recipe.generation.backend == "hf"


def test_a_real_model_gets_vllm_where_installed_else_paged():
    assert backend(REAL) == ("vllm" if VLLM else "paged")
    # vLLM generates ahead and in flight; paged cannot, so without vLLM those recipes are refused by preflight
    assert backend(REAL, "generation.async_steps=1") == ("vllm" if VLLM else "hf")


@pytest.mark.parametrize("override", [
    "generation.repetition_penalty=1.1",  # transformers' continuous batching drops it
    "train.sharding=fsdp2",  # an FSDP2 policy's forward passes are collectives
    "generation.async_steps=1",
    "generation.pipeline=inflight",
])
def test_without_vllm_auto_avoids_paged_where_paged_is_refused(monkeypatch, override):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a))
    assert backend(REAL) == "paged"
    extra = ["train.num_processes=2"] if "fsdp2" in override else []
    assert backend(REAL, override, *extra) == "hf"


def test_an_explicit_backend_is_kept():
    for name in ("hf", "paged", "vllm", "vllm-server"):
        assert backend(REAL, f"generation.backend={name}") == name


def test_config_resolved_records_what_auto_became(grpo, tmp_path):
    out = tmp_path / "run"
    done = grpo("train", "quickstart", "generation.backend=auto", "train.steps=1", "train.prompts_per_step=2",
                "generation.num_generations=2", f"train.output_dir={out}")
    assert done.returncode == 0, done.stderr
    resolved = tomllib.loads((out / "config.resolved.toml").read_text())
    assert resolved["generation"]["backend"] == "hf"


def test_trl_import_keeps_trls_transformers_generation():
    from grpocli.recipe.trl_import import convert

    recipe, lines = convert({"use_vllm": False})
    assert recipe["generation"]["backend"] == "hf"
    assert convert({})[0]["generation"]["backend"] == "hf"  # TRL's default, use_vllm = false
    assert convert({"use_vllm": True})[0]["generation"]["backend"] == "vllm"
