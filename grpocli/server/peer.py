"""This server's end of a trainer's weight-transfer group (TRL's init_communicator): joining it
over NCCL (vLLM's stateless group, CUDA) or gloo (a torch TCPStore the trainer hosts), and
receiving what rank 0 broadcasts. Used by grpocli.server.transfer.

The trainer's rendezvous must take a connection within ``MASTER_WAIT`` s of the request (a 504
naming the address otherwise); joining the group and each broadcast then wait up to ``TIMEOUT``.
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta
from typing import Any

from grpocli.generation.devices import use_device
from grpocli.generation.weights import broadcast, open_group
from grpocli.serving.access import ServerError

#: Longest wait for the trainer: to join the group, and for one broadcast (s).
TIMEOUT = 300.0
#: Longest wait for the trainer's rendezvous (master_address:master_port) to take a connection (s).
#: TRL's client opens it right after posting /init_weight_transfer_engine: a second is plenty.
MASTER_WAIT = 10.0


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
    if info.backend == "nccl" and not torch.cuda.is_available():
        raise ServerError(400, "init_info asks for NCCL (TRL's VLLMClient sends weights over NCCL only) but this "
                               "server has no CUDA device; on CPU send init_info 'backend': 'gloo', or use grpo's "
                               "own /weights/* protocol")
    reach(info.master_address, info.master_port)
    if info.backend == "nccl":
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


def reach(address: str, port: int, wait: float = MASTER_WAIT) -> None:
    """Return once something takes a TCP connection at ``address:port`` (the trainer's rendezvous);
    a 400 for an address that does not resolve, a 504 naming it after ``wait`` s without an answer
    (a dead or wrong master would otherwise hold the request for the whole group timeout)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            socket.create_connection((address, port), timeout=max(0.1, min(2.0, deadline - time.monotonic()))).close()
            return
        except socket.gaierror as exc:
            raise ServerError(400, f"init_info.master_address: {address!r} does not resolve ({exc.strerror})") from None
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise ServerError(504, f"init_info: nothing answered at master_address:master_port {address}:{port} "
                                       f"within {wait:g} s ({exc.strerror or exc}); the trainer opens that "
                                       "rendezvous as it posts this request (TRL: VLLMClient.init_communicator): "
                                       "check the address and port, and that the trainer is running") from None
            time.sleep(0.1)


def local_address(remote: str, port: int) -> str:
    """The address of this machine's interface that reaches ``remote`` (gloo binds its device to it)."""
    family = socket.AF_INET6 if ":" in remote else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((remote, port))  # UDP: picks a route, sends nothing
            return sock.getsockname()[0]
        except OSError:
            return remote
