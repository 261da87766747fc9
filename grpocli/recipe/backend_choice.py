"""What generation.backend = "auto" (the default) becomes: the backend measured fastest for the whole
step among those installed that the recipe allows (docs/vllm.md, "Which backend 'auto' picks").

Measured on the 2-core CPU, 1 thread: on SmolLM2-135M (smollm2_arithmetic) a synchronous step took
38.6 s with vLLM, 36.8 s with paged and 53.9 s with hf, and vLLM alone generates ahead or in flight
(25.4 s, 20.5 s); on the built-in 'tiny' model quickstart's 80 steps took 30 s with hf, 49 s with
vLLM (its engine start and weight syncs outweigh what it saves) and 93 s with paged. On CUDA the
same order is assumed, not measured here. Packages are found, not imported: loading a recipe imports
neither vLLM nor torch, and needs no device."""

from __future__ import annotations

import importlib.util

#: The built-in offline model ('tiny' builds it from [model.tiny]): transformers' generate is fastest on it.
TINY_MODEL = "tiny"

#: The order 'auto' tries, fastest first, as the field description says it.
AUTO_ORDER = ("'hf' for the built-in 'tiny' model; else 'vllm' where vLLM is installed; else 'paged' where the "
              "recipe allows it (no repetition_penalty, no FSDP2, no generating ahead); else 'hf'")


def fastest_backend(*, model: str, repetition_penalty: float, sharding: str, ahead: bool) -> str:
    """The backend 'auto' becomes. ``ahead``: the recipe generates ahead or in flight
    (generation.async_steps > 0 or pipeline 'inflight'), which only an engine apart from the policy does."""
    if model == TINY_MODEL:
        return "hf"
    if importlib.util.find_spec("vllm") is not None:
        return "vllm"
    paged_refused = repetition_penalty != 1.0 or sharding == "fsdp2" or ahead
    return "hf" if paged_refused else "paged"
