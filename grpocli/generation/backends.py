"""`generation.backend` -> the backend that samples: one table, used by training and `grpo eval`.

Each entry builds a backend (`grpocli.generation.base.GenerationBackend`) that samples from a
loaded transformers model: ``BACKENDS[name](model, tokenizer, recipe, seed=...)``. vLLM is
imported only inside the vLLM entries.
"""

from __future__ import annotations

from typing import Any, Callable


def hf_backend(model: Any, tokenizer: Any, recipe: Any, *, seed: int) -> Any:
    """transformers' generate on the model itself (weights are always current)."""
    from grpocli.generation.hf import HFBackend

    return HFBackend(model, tokenizer, max_prompt_length=recipe.data.max_prompt_length)


def vllm_colocated_backend(model: Any, tokenizer: Any, recipe: Any, *, seed: int) -> Any:
    """A vLLM engine in this process, built from the model's weights and reloaded in place."""
    from grpocli.generation.vllm_colocate import VllmColocateBackend

    return VllmColocateBackend(model, tokenizer, max_prompt_length=recipe.data.max_prompt_length,
                               max_completion_length=recipe.generation.max_completion_length,
                               vllm_section=recipe.vllm, dtype=recipe.model.dtype, seed=seed)


def vllm_server_backend(model: Any, tokenizer: Any, recipe: Any, *, seed: int) -> Any:
    """The `grpo vllm-serve` process(es) at vllm.server_url (one URL or a fleet); the model's
    weights are sent to every server at once."""
    from grpocli.generation.vllm_client import VllmServerBackend

    return VllmServerBackend(model, tokenizer, vllm_section=recipe.vllm,
                             max_prompt_length=recipe.data.max_prompt_length)


#: generation.backend -> factory(model, tokenizer, recipe, *, seed) -> backend.
BACKENDS: dict[str, Callable[..., Any]] = {
    "hf": hf_backend,
    "vllm": vllm_colocated_backend,
    "vllm-server": vllm_server_backend,
}


def build_backend(model: Any, tokenizer: Any, recipe: Any, *, seed: int) -> Any:
    """The recipe's generation backend around ``model`` (the recipe schema allows only table names)."""
    return BACKENDS[recipe.generation.backend](model, tokenizer, recipe, seed=seed)
