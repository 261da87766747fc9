"""`generation.backend` -> the backend that samples: one table, used by training and `grpo eval`.

Each entry builds a backend (`grpocli.generation.base.GenerationBackend`) that samples from a
loaded transformers model: ``BACKENDS[name](model, tokenizer, recipe, seed=..., parallel=...)``,
where `parallel` is the training run's strategy (grpocli.parallel; one process by default): it
says which process sends weights and how the model's weights are made whole. vLLM is imported
only inside the vLLM entries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from grpocli.parallel import Parallel
    from grpocli.recipe.schema import Recipe


def hf_backend(model: Any, tokenizer: Any, recipe: Recipe, *, seed: int, parallel: Parallel | None) -> Any:
    """transformers' generate on the model itself (weights are always current)."""
    from grpocli.generation.hf import HFBackend

    return HFBackend(model, tokenizer, max_prompt_length=recipe.data.max_prompt_length, parallel=parallel)


def paged_backend(model: Any, tokenizer: Any, recipe: Recipe, *, seed: int, parallel: Parallel | None) -> Any:
    """transformers' continuous batching (paged attention) on the model itself (weights are always current)."""
    from grpocli.generation.paged import PagedBackend

    return PagedBackend(model, tokenizer, max_prompt_length=recipe.data.max_prompt_length, parallel=parallel)


def vllm_colocated_backend(model: Any, tokenizer: Any, recipe: Recipe, *, seed: int, parallel: Parallel | None) -> Any:
    """A vLLM engine in this process, built from the model's weights and reloaded in place."""
    from grpocli.generation.vllm_colocate import VllmColocateBackend

    return VllmColocateBackend(model, tokenizer, max_prompt_length=recipe.data.max_prompt_length,
                               max_completion_length=recipe.generation.max_completion_length,
                               vllm_section=recipe.vllm, dtype=recipe.model.dtype, seed=seed, parallel=parallel,
                               inflight=recipe.generation.pipeline == "inflight")


def vllm_server_backend(model: Any, tokenizer: Any, recipe: Recipe, *, seed: int, parallel: Parallel | None) -> Any:
    """The vLLM server(s) at vllm.server_url (one URL or a fleet); the model's
    weights are sent to every server at once."""
    from grpocli.generation.vllm_client import VllmServerBackend

    return VllmServerBackend(model, tokenizer, vllm_section=recipe.vllm,
                             max_prompt_length=recipe.data.max_prompt_length, parallel=parallel)


#: generation.backend -> factory(model, tokenizer, recipe, *, seed, parallel) -> backend.
BACKENDS: dict[str, Callable[..., Any]] = {
    "hf": hf_backend,
    "paged": paged_backend,
    "vllm": vllm_colocated_backend,
    "vllm-server": vllm_server_backend,
}


#: The backends that generate in flight (generation.pipeline = "inflight"): their backend's
#: ``start_inflight(version)`` returns a grpocli.generation.inflight.InflightBackend.
INFLIGHT_BACKENDS = ("vllm", "vllm-server")


def build_backend(model: Any, tokenizer: Any, recipe: Recipe, *, seed: int, parallel: Parallel | None = None) -> Any:
    """The recipe's generation backend around ``model`` (the recipe schema allows only table names)."""
    return BACKENDS[recipe.generation.backend](model, tokenizer, recipe, seed=seed, parallel=parallel)
