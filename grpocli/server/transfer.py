"""TRL's weight transfer: the weight-transfer-engine paths of vLLM's own server, answered by this engine.

TRL 1.16's VLLMClient (init_communicator, update_named_param(s), update_model_params, weight_update)
talks to a vLLM server started with ``--weight-transfer-config '{"backend": "nccl"}'``:

    POST /init_weight_transfer_engine      {"init_info": {master_address, master_port, rank_offset, world_size,
                                            packed[, packed_buffer_size_bytes, packed_num_buffers][, backend]}}
    POST /start_weight_update              {}
    POST /update_weights                   {"update_info": {names, dtype_names, shapes[, packed]}}
    POST /finish_weight_update             {} | {"weight_version": "..."}
    POST /shutdown_weight_transfer_engine  (vLLM's; TRL's close_communicator only drops the trainer's end)

The trainer is rank 0 of the group and hosts its rendezvous at master_address:master_port; this
server (one engine worker) joins as rank ``rank_offset``. /update_weights announces the tensors,
which then arrive as broadcasts from rank 0 in that order: packed (vLLM's format: the tensors' bytes
concatenated; a chunk closes as soon as it holds more than packed_buffer_size_bytes; one broadcast
per chunk) or one broadcast per tensor. The group's backend (init_info "backend"):

    nccl  (default) what TRL's client builds: vLLM's StatelessProcessGroup + PyNcclCommunicator.
          CUDA on both ends, on distinct GPUs.
    gloo  this server's addition for machines without a GPU: the trainer hosts a torch TCPStore at
          master_address:master_port and both ends join a ProcessGroupGloo over it. TRL 1.16's
          client cannot do this by itself (its init_communicator refuses a non-CUDA device).

A session (start ... finish) is one in-place reload of the engine (vLLM's layerwise reload, as in
vLLM's server): the tensors may cover any set of whole layers (a layer that gets none keeps its
weights); names and shapes are checked against the checkpoint before anything is loaded; floating
tensors are cast to the engine's dtype (as vLLM's loaders do); a tied lm_head is refreshed with the
embedding it is tied to. A tensor comes at most once per session: an /update_weights naming one the
session already took (a retried call) is received and dropped with a 409 naming it, and the session
goes on (grpocli.server.update). A session refused before any tensor arrived leaves the weights as they were;
one that fails later leaves the engine refusing generation, with the reason, until an update succeeds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field, model_validator

from grpocli.generation.weights import Named, TensorSpec, dtype_from_name, spec_problems, tied_embedding
from grpocli.server.host import EngineHost
from grpocli.server.peer import TIMEOUT, Peer, join
from grpocli.server.update import repeat_reason
from grpocli.serving.access import ServerError
from grpocli.wire.generation import Body

#: vLLM's default chunk size of a packed broadcast (vllm.distributed.weight_transfer.packed_tensor).
PACKED_BUFFER_BYTES = 1024**3


class InitInfo(Body):

    master_address: str
    master_port: int = Field(ge=1, le=65535)
    rank_offset: int = Field(1, ge=1)
    world_size: int = Field(ge=2)
    packed: bool = False
    packed_buffer_size_bytes: int = Field(PACKED_BUFFER_BYTES, ge=1)
    packed_num_buffers: int = Field(2, ge=1)
    backend: Literal["nccl", "gloo"] = "nccl"


class UpdateInfo(Body):

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    packed: bool | None = None  # vLLM < 0.28 sent it per update; later at init

    @model_validator(mode="after")
    def _same_lengths(self) -> UpdateInfo:
        if not (len(self.names) == len(self.dtype_names) == len(self.shapes)):
            raise ValueError(f"names, dtype_names and shapes differ in length ({len(self.names)}, "
                             f"{len(self.dtype_names)}, {len(self.shapes)})")
        return self


class InitRequest(Body):
    init_info: InitInfo


class UpdateRequest(Body):
    update_info: UpdateInfo | list[UpdateInfo]  # a list: one per engine worker (vLLM's data-parallel form)


class FinishRequest(Body):
    weight_version: str | None = None


def tied_aliases(engine: Any) -> dict[str, str]:
    """{'lm_head.weight': embedding} for a model whose lm_head is tied to its embedding (TRL sends the
    embedding once, under its own name: named_parameters() lists a shared tensor once)."""
    try:
        config = engine.llm.llm_engine.model_config.hf_text_config
    except AttributeError:
        return {}
    embed = tied_embedding(config, engine.spec)
    return {"lm_head.weight": embed} if embed else {}


class TrlTransfer:
    """The group with the trainer and the session in progress (at most one of each)."""

    def __init__(self, host: EngineHost, timeout: float = TIMEOUT) -> None:
        self.host, self.timeout = host, timeout
        self.lock = threading.Lock()
        self.peer: Peer | None = None
        self.packed, self.buffer_bytes = False, PACKED_BUFFER_BYTES
        self.update_id: str | None = None
        self.weight_version: str | None = None

    @property
    def backend(self) -> str:
        import torch

        return "nccl" if torch.cuda.is_available() else "gloo"

    def init(self, info: InitInfo) -> dict[str, Any]:
        workers = self.host.engine.world_size
        if info.world_size != info.rank_offset + workers:
            raise ServerError(400, f"init_info: world_size {info.world_size} with rank_offset {info.rank_offset}, "
                                   f"but this server has {workers} engine worker(s): world_size must be "
                                   f"{info.rank_offset + workers}")
        with self.lock:
            if self.update_id is not None:
                raise ServerError(409, "a weight update is active; finish it before a new group")
            self._close()
            self.peer = join(info, self.timeout, device=getattr(self.host, "device", None))
            self.packed, self.buffer_bytes = info.packed, info.packed_buffer_size_bytes
        return {"message": "Weight transfer initialized", "backend": info.backend, "rank": info.rank_offset}

    def start(self) -> dict[str, Any]:
        with self.lock:
            if self.peer is None:
                raise ServerError(409, "no weight-transfer group: POST /init_weight_transfer_engine first "
                                       "(TRL: VLLMClient.init_communicator())")
            if self.update_id is not None:
                raise ServerError(409, "start_weight_update called while a weight update is already active; "
                                       "call finish_weight_update first")
            u = self.host.begin(None, tied_aliases(self.host.engine), self.timeout, "trl", complete=False)
            self.update_id = u.id
        return {"message": "Weight update started"}

    def update(self, info: UpdateInfo) -> dict[str, Any]:
        try:
            specs = [TensorSpec(n, tuple(s), d) for n, d, s in zip(info.names, info.dtype_names, info.shapes)]
            for spec in specs:
                dtype_from_name(spec.dtype)
        except ValueError as exc:
            raise ServerError(400, f"update_info: {exc}") from None
        packed = self.packed if info.packed is None else info.packed
        with self.lock:
            if self.peer is None:
                raise ServerError(409, "no weight-transfer group: POST /init_weight_transfer_engine first")
            try:
                if self.update_id is None:
                    raise ServerError(409, "start_weight_update must be called before update_weights")
                problems = self._problems(specs)
                if problems:
                    raise ServerError(400, "the weights do not fit the engine's model: " + "; ".join(problems))
                u = self.host.current(self.update_id)
            except ServerError:
                self._drain(specs, packed)  # the trainer is broadcasting: take it, or it waits forever
                self._abort()
                raise
            twice = u.repeated(s.name for s in specs)
            if twice:  # a retried call: taken and dropped; the session goes on without it
                self._drain(specs, packed)
                raise ServerError(409, repeat_reason(u.id, twice))
            failure: ServerError | None = None
            try:
                for named in self._receive(specs, packed):
                    if failure is None:
                        try:
                            u.put([(name, self._cast(t)) for name, t in named])
                        except ServerError as exc:  # keep receiving: the trainer is still broadcasting
                            failure = exc
            except ServerError:
                self._abort()
                raise
            if failure is not None:
                self._abort()
                raise failure
        return {"message": "Weights updated", "tensors": len(specs)}

    def finish(self, weight_version: str | None) -> dict[str, Any]:
        with self.lock:
            if self.update_id is None:
                raise ServerError(409, "finish_weight_update called without a matching start_weight_update")
            update_id, self.update_id = self.update_id, None
            result = self.host.end(update_id)
            if weight_version is not None:
                self.weight_version = weight_version
        return {"message": "Weight update finished", **result}

    def shutdown(self) -> dict[str, Any]:
        with self.lock:
            if self.update_id is not None:
                raise ServerError(409, "cannot release the trainer's group during a weight update")
            self._close()
        return {"message": "Weight transfer shut down"}

    # -- helpers (called with the lock held) -------------------------------------------------------
    def _close(self) -> None:
        if self.peer is not None:
            try:
                self.peer.close()
            finally:
                self.peer = None

    def _abort(self) -> None:
        """End the session after a failure: with nothing loaded yet, the reload just ends (every layer
        keeps its weights); otherwise the engine is marked as holding incomplete weights."""
        update_id, self.update_id = self.update_id, None
        if update_id is None:
            return
        try:
            loaded = bool(self.host.current(update_id).received)
            self.host.end(update_id, abort=loaded)
        except ServerError:
            pass  # already gone; host.broken holds the reason

    def _problems(self, specs: list[TensorSpec]) -> list[str]:
        """Unknown names and wrong shapes; a floating dtype is fine (it is cast to the engine's)."""
        expected = self.host.engine.spec
        floating = ("float64", "float32", "float16", "bfloat16")
        as_cast = [TensorSpec(s.name, s.shape, expected[s.name].dtype)
                   if s.name in expected and s.dtype in floating and expected[s.name].dtype in floating else s
                   for s in specs]
        return spec_problems(expected, as_cast, complete=False) if expected else []

    def _cast(self, tensor: Any) -> Any:
        dtype = self.host.engine.dtype
        return tensor.to(dtype) if tensor.is_floating_point() and tensor.dtype != dtype else tensor

    def _chunks(self, specs: list[TensorSpec], packed: bool) -> Iterator[list[TensorSpec]]:
        if not packed:
            yield from ([s] for s in specs)
            return
        chunk, size = [], 0
        for spec in specs:  # vLLM's packed_tensor: a chunk closes once it is over the buffer size
            chunk.append(spec)
            size += spec.nbytes
            if size > self.buffer_bytes:
                yield chunk
                chunk, size = [], 0
        if chunk:
            yield chunk

    def _receive(self, specs: list[TensorSpec], packed: bool) -> Iterator[list[Named]]:
        import torch

        assert self.peer is not None
        for chunk in self._chunks(specs, packed):
            try:
                if not packed:
                    spec = chunk[0]
                    yield [(spec.name, self.peer.receive(spec.shape, dtype_from_name(spec.dtype)))]
                    continue
                flat = self.peer.receive((sum(s.nbytes for s in chunk),), torch.uint8)
            except ServerError:
                raise
            except Exception as exc:  # a broken group, a timeout
                raise ServerError(502, f"receiving weights from the trainer failed: {type(exc).__name__}: "
                                       f"{exc}") from None
            yield unpack(flat, chunk)

    def _drain(self, specs: list[TensorSpec], packed: bool) -> None:
        try:
            for _ in self._receive(specs, packed):
                pass
        except ServerError:
            pass


def unpack(flat: Any, specs: list[TensorSpec]) -> list[Named]:
    """vLLM's packed chunk cut into tensors (views; a tensor whose bytes start off its dtype's
    alignment is copied, since a view cannot start there)."""
    out, start = [], 0
    for spec in specs:
        dtype = dtype_from_name(spec.dtype)
        piece = flat[start : start + spec.nbytes]
        if piece.storage_offset() % dtype.itemsize:
            piece = piece.clone()
        out.append((spec.name, piece.view(dtype).view(spec.shape)))
        start += spec.nbytes
    return out


def add_transfer_routes(app: Any, host: EngineHost, key: Any) -> TrlTransfer:
    transfer = TrlTransfer(host)
    app.state.trl_transfer = transfer

    @app.post("/init_weight_transfer_engine", dependencies=[key])
    def init_weight_transfer_engine(req: InitRequest) -> dict[str, Any]:
        return transfer.init(req.init_info)

    @app.post("/start_weight_update", dependencies=[key])
    def start_weight_update() -> dict[str, Any]:
        return transfer.start()

    @app.post("/update_weights", dependencies=[key])
    def update_weights(req: UpdateRequest) -> dict[str, Any]:
        info = req.update_info
        if isinstance(info, list):  # one per worker, by global worker rank: this server has one
            if len(info) != host.engine.world_size:
                raise ServerError(400, f"update_info lists {len(info)} workers; this server has "
                                       f"{host.engine.world_size}")
            info = info[0]
        return transfer.update(info)

    @app.post("/finish_weight_update", dependencies=[key])
    def finish_weight_update(req: FinishRequest | None = None) -> dict[str, Any]:
        return transfer.finish(req.weight_version if req is not None else None)

    @app.post("/shutdown_weight_transfer_engine", dependencies=[key])
    def shutdown_weight_transfer_engine() -> dict[str, Any]:
        return transfer.shutdown()

    @app.get("/weight_info")
    def weight_info() -> dict[str, Any]:
        return {"weight_version": transfer.weight_version, "weights_version": host.version}

    return transfer


__all__ = ["InitInfo", "TrlTransfer", "UpdateInfo", "add_transfer_routes", "join", "tied_aliases", "unpack"]
