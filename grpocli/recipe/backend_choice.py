"""What generation.backend = "auto" becomes: the fastest backend installed, from measurements
(docs/vllm.md, "Generation backends: hf, paged, vLLM": on the 2-core CPU, 1 thread, vLLM 2.3x to 4.5x
and paged 1.07x to 1.5x faster generation than hf). On CUDA the same order is assumed, not measured
here. Packages are found, not imported: loading a recipe imports neither vLLM nor torch, and needs
no device."""

from __future__ import annotations

import importlib.util

#: The order 'auto' tries, fastest first, as the field description says it.
AUTO_ORDER = "'vllm' where vLLM is installed, else 'paged' (else 'hf' where a recipe sets repetition_penalty)"


def fastest_backend(repetition_penalty: object = 1.0) -> str:
    """'vllm' when the vllm package is installed, else 'paged' unless the recipe asks for a repetition
    penalty (which transformers' continuous batching drops), else 'hf'."""
    if importlib.util.find_spec("vllm") is not None:
        return "vllm"
    return "paged" if repetition_penalty == 1.0 else "hf"
