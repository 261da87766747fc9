"""vllm.lora_sync = "adapter" ("auto" on CUDA): a LoRA policy's weight sync sends only its adapters, and vLLM
applies them.

The colocated engine starts from the base model's weights and holds them once (``enable_lora``); each
sync saves the adapters (peft's ``save_pretrained``: adapter_config.json and adapter_model.safetensors,
A and B of each adapted layer) under a new version, and later requests name that version in their
``LoRARequest``: a new name and id each time, so no prefix cached under an older adapter is reused.
No base weight is sent or touched. TRL's AsyncGRPO, verl (``lora.merge=False``) and SkyRL do the same.
On a 7B model with r = 16 on every linear layer a sync is ~40 MB instead of ~15 GB.

Where vLLM's LoRA cannot serve the policy's adapters, the merged sync (the whole model, adapters
added; grpocli.generation.weights) is used instead, with a one-line note that says why
(`adapter_problem`).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

#: vLLM's max_lora_rank choices (vllm.config.lora.MaxLoRARanks).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def adapter_problem(model: Any, *, inflight: bool = False, processes: int = 1, sharded: bool = False) -> str | None:
    """Why this policy's adapters cannot be synced alone (None: they can). Not a peft model: nothing to say."""
    from grpocli.generation.lora import Uncovered, lora_terms

    if not hasattr(model, "peft_config"):
        return "the policy has no LoRA adapters"
    config = model.peft_config[model.active_adapter]
    try:
        lora_terms(model)
    except Uncovered as why:
        return f"vLLM serves plain LoRA on linear layers only ({why})"
    if getattr(config, "modules_to_save", None):
        return f"modules_to_save {sorted(config.modules_to_save)} train whole modules, which vLLM's LoRA cannot load"
    if int(config.r) > VLLM_RANKS[-1]:
        return f"rank {config.r} is above vLLM's largest max_lora_rank ({VLLM_RANKS[-1]})"
    if inflight:
        return "generation.pipeline = 'inflight' keeps requests over a sync, which adapter versions do not yet"
    if processes > 1:
        return "more than one training process (each engine would need its own adapter directory)"
    if sharded:
        return "a sharded policy (FSDP2 or ZeRO-3: its adapters are not whole in one process)"
    return None


def adapter_versions(model: Any, vllm_section: Any, *, inflight: bool, parallel: Any,
                     server: str | None = None) -> AdapterVersions | None:
    """AdapterVersions where the engine takes the policy's adapters alone (vllm.lora_sync = "adapter", or "auto"
    on CUDA, and `adapter_problem` finds nothing), else None: the merged sync, with a one-line note on stderr
    for a LoRA policy that asked for adapters. ``server``: why the vLLM servers cannot load them (None: they
    can, or the engine is colocated); a server's adapters come from the main process alone."""
    import sys

    import torch

    asked = vllm_section.lora_sync
    if asked == "auto":  # vLLM's CPU LoRA path generated 4.5x slower than merged weights (docs/vllm.md)
        asked = "adapter" if torch.cuda.is_available() else "merged"
    if asked != "adapter" or not hasattr(model, "peft_config"):
        return None
    colocated = server is None
    problem = adapter_problem(model, inflight=inflight,
                              processes=parallel.size if parallel and colocated else 1,
                              sharded=bool(getattr(parallel, "forward_collective", False)))
    if problem is None and vllm_section.sleep_mode and colocated:
        problem = "vllm.sleep_mode discards the engine's weights, which only a merged sync sends again"
    problem = problem or server or None
    if problem is not None:
        print(f"note: vllm.lora_sync = 'adapter' falls back to merged weights: {problem}", file=sys.stderr, flush=True)
        return None
    from grpocli.generation.lora import lora_terms

    return AdapterVersions(tensors=2 * len(lora_terms(model)))


def server_lacks(model: Any, lora_rank: int, urls: list[str]) -> str:
    """Why the vLLM servers at ``urls`` cannot load the policy's adapters ("" where they can): they serve no LoRA
    of its rank, or one is on another machine (the server reads the adapter from its own disk)."""
    if not hasattr(model, "peft_config"):
        return ""
    import urllib.parse

    from grpocli.generation.server_client import LOCAL_HOSTS

    rank = int(model.peft_config[model.active_adapter].r)
    if lora_rank < rank:
        return (f"the vLLM server serves no LoRA adapters of rank {rank} (start it with grpo vllm-serve --lora-rank "
                f"{rank})")
    far = [u for u in urls if urllib.parse.urlparse(u).hostname not in LOCAL_HOSTS]
    if far:
        return f"the server at {far[0]} reads adapters from its own disk, and it is on another machine (not yet)"
    return ""


def engine_lora_kwargs(model: Any) -> dict[str, Any]:
    """vLLM.LLM's LoRA arguments for the policy's adapters: one adapter at a time, its rank rounded up."""
    rank = int(model.peft_config[model.active_adapter].r)
    return {"enable_lora": True, "max_loras": 1, "max_cpu_loras": 2,
            "max_lora_rank": next(r for r in VLLM_RANKS if r >= rank)}


class AdapterVersions:
    """The adapters of each sync, saved where the engine reads them (shared memory where it has room), the
    latest kept; ``request()`` names the version requests use."""

    def __init__(self, tensors: int) -> None:
        self.tensors = tensors  # A and B of each adapted layer: what each sync sends
        shm = Path("/dev/shm")
        self.root = Path(tempfile.mkdtemp(prefix="grpo-lora-", dir=shm if shm.is_dir() else None))
        self.version = 0
        self.path: Path | None = None
        self.bytes = 0

    def save(self, model: Any) -> int:
        """The adapters as version N+1 (the one before it removed); the bytes written."""
        self.version += 1
        path = self.root / f"v{self.version}"
        model.save_pretrained(str(path), safe_serialization=True, save_embedding_layers=False)  # adapters only
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
        self.path = path
        self.bytes = sum(f.stat().st_size for f in path.iterdir() if f.suffix == ".safetensors")
        return self.bytes

    @property
    def name(self) -> str:
        """The latest version's name (in vLLM's LoRARequest and a server's /v1/load_lora_adapter)."""
        return f"grpo-v{self.version}"

    def request(self) -> Any:
        """vLLM's LoRARequest of the latest version (None before the first save)."""
        if self.path is None:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(self.name, self.version, str(self.path))

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


__all__ = ["AdapterVersions", "VLLM_RANKS", "adapter_problem", "adapter_versions", "engine_lora_kwargs", "server_lacks"]
