"""This server's end of a trainer's weight-transfer group (TRL's init_communicator): joining it
over NCCL (vLLM's stateless group, CUDA) or gloo (a torch TCPStore the trainer hosts), and
receiving what rank 0 broadcasts. Used by grpocli.server.transfer.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

from grpocli.generation.devices import use_device
from grpocli.generation.weights import broadcast, open_group
from grpocli.server.host import ServerError

#: Longest wait for the trainer: to join the group, and for one broadcast (s).
TIMEOUT = 300.0


class Peer:
    """This server's end of the group: receives what rank 0 broadcasts (NCCL: onto ``device``, the
    engine's GPU, which each request thread makes its current one first)."""

    def __init__(self, backend: str, group: Any, timeout: float, device: Any = None) -> None:
        self.backend, self.group, self.timeout, self.device = backend, group, timeout, device

    def receive(self, shape: tuple[int, ...], dtype: Any) -> Any:
        import torch

        if self.backend == "gloo":
            out = torch.empty(shape, dtype=dtype)
            broadcast(self.group, out, self.timeout, root=0)
            return out
        use_device(self.device)
        out = torch.empty(shape, dtype=dtype, device=f"cuda:{torch.cuda.current_device()}")
        self.group.broadcast(out, src=0)
        torch.cuda.current_stream().synchronize()  # the engine thread reads it on another stream
        return out

    def close(self) -> None:
        destroy = getattr(self.group, "destroy", None)
        if destroy is not None:
            destroy()
        self.group = None


def join(info: Any, timeout: float = TIMEOUT, device: Any = None) -> Peer:
    """Join the trainer's group as rank ``rank_offset`` (blocks until the trainer joins too); NCCL on
    ``device`` (the engine's GPU; None: this thread's current one)."""
    import torch

    rank = info.rank_offset
    if info.backend == "nccl":
        if not torch.cuda.is_available():
            raise ServerError(400, "init_info asks for NCCL (TRL's VLLMClient sends weights over NCCL only) but this "
                                   "server has no CUDA device; on CPU send init_info 'backend': 'gloo', or use grpo's "
                                   "own /weights/* protocol")
        try:
            from vllm.distributed.weight_transfer.nccl_common import (
                stateless_init_process_group,
            )
        except ImportError as exc:
            raise ServerError(501, f"this vLLM has no NCCL weight transfer ({exc})") from None
        use_device(device)
        group = stateless_init_process_group(info.master_address, info.master_port, rank, info.world_size,
                                             device=torch.cuda.current_device())
        return Peer("nccl", group, timeout, device)
    import torch.distributed as dist

    try:
        store = dist.TCPStore(info.master_address, info.master_port, info.world_size, False,
                              timedelta(seconds=timeout))
        group = open_group("gloo", store, rank, info.world_size, timeout,
                           hostname=local_address(info.master_address, info.master_port))
    except Exception as exc:  # torch's DistStoreError / RuntimeError: the trainer did not come
        raise ServerError(502, f"could not join the trainer's gloo group at {info.master_address}:"
                               f"{info.master_port}: {exc}") from None
    return Peer("gloo", group, timeout)


def local_address(remote: str, port: int) -> str:
    """The address of this machine's interface that reaches ``remote`` (gloo binds its device to it)."""
    family = socket.AF_INET6 if ":" in remote else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((remote, port))  # UDP: picks a route, sends nothing
            return sock.getsockname()[0]
        except OSError:
            return remote
