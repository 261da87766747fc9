"""Weights on their way from the trainer to a vLLM engine: names, spec, buckets, wire formats.

Follows TRL's weight sync (``GRPOTrainer._move_model_to_vllm``: merge LoRA adapters, clean peft
names, send, unmerge) with three changes: LoRA adapters are added to their base weights out of
place as each tensor is sent (grpocli.generation.lora; peft's in-place merge and unmerge rounds the
frozen bf16 base a little each sync), tensors travel in buckets of up to ``max_bytes`` (TRL makes
one HTTP call and one broadcast per tensor), and the spec (names, shapes, dtypes) is checked
against the engine's checkpoint before the first update, so a wrong model fails with a list of
differences instead of a hang or garbage.

Wire formats: over HTTP a bucket is a safetensors file in memory (``safetensors.torch.save``);
over a process group (gloo on CPU, NCCL on GPUs) it is one flat uint8 tensor, broadcast once, plus
its spec sent as JSON. Process groups are built from torch's own ``TCPStore`` and
``ProcessGroupGloo`` / ``ProcessGroupNCCL`` (no global ``init_process_group``, so Accelerate's
group in the trainer is untouched), as vLLM's ``StatelessProcessGroup`` does.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from grpocli.generation.lora import LoraTerm, Uncovered, lora_terms
from grpocli.parallel import Parallel

#: Bucket size unless the caller picks one (verl and open-instruct use 0.5-1 GiB buckets).
DEFAULT_BUCKET_BYTES = 512 * 2**20
#: safetensors dtype codes -> torch dtype names.
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                       "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                       "BOOL": "bool"}

Named = tuple[str, torch.Tensor]


@dataclass(frozen=True)
class TensorSpec:
    """One tensor as the engine expects it: checkpoint name, shape, dtype name ('bfloat16')."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> TensorSpec:
        return cls(name, tuple(tensor.shape), dtype_name(tensor.dtype))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @property
    def nbytes(self) -> int:
        n = 1
        for x in self.shape:
            n *= x
        return n * torch.empty((), dtype=dtype_from_name(self.dtype)).element_size()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


# -- the policy's weights under checkpoint names ---------------------------------------------
class PolicyWeights:
    """The policy's tensors under checkpoint names, each floating one cast to ``dtype`` on the way.

    Tied tensors (lm_head = embed_tokens) are listed in ``aliases`` (alias -> first name) and left
    out of ``specs()`` and ``unique()``, as ``save_pretrained`` leaves them out of a checkpoint;
    iteration still yields them, because vLLM's CPU backend refreshes a tied lm_head only when it
    is loaded too (a receiver repeats the tensor under its alias).

    A peft model's adapter tensors are left out and its names cleaned (TRL's naming: the base
    model's names; ``modules_to_save`` copies under the module's own name, ``original_module``
    left out). ``entries`` holds each tensor as the model holds it, so a LoRA base weight there
    is ``W`` alone; ``terms`` (clean name -> `LoraTerm`) holds the adapters that iteration adds
    to it as it is reached (``W + scaling * B @ A``, a new tensor: the model is never written),
    and `state()` gives the sums as this process holds its tensors (the in-process reference mix).

    The parallel strategy makes each tensor whole (`Parallel.whole_tensor`). An FSDP2 policy
    (grpocli.parallel.fsdp2) holds DTensor shards: iteration gathers each whole tensor when it is
    reached (a collective; for a LoRA base weight W, then A, then B), so every process must walk
    the same tensors in the same order: all of them iterate (a colocated engine each), or one
    sends while the others call `take_part()`. No process holds more than one whole tensor beyond
    what the receiver keeps (a bucket on its way, the engine's own weights).
    """

    def __init__(self, model: Any, peft: bool, dtype: torch.dtype | None, parallel: Parallel,
                 terms: dict[str, LoraTerm] | None = None) -> None:
        """``terms``: `lora_terms(model)` (state-dict name -> adapter), added to those weights when
        they are sent; None or {} sends every tensor as the model holds it."""
        self.dtype, self.parallel = dtype, parallel
        self.entries: list[Named] = []
        self.aliases: dict[str, str] = {}
        self.terms: dict[str, LoraTerm] = {}
        first: dict[tuple[int, tuple[int, ...]], str] = {}
        terms = terms or {}
        prefix = getattr(model, "prefix", "lora_")  # peft's adapter parameter prefix
        reached = 0
        for key, tensor in model.state_dict().items():
            reached += key in terms
            name = key
            if peft:  # TRL's name cleaning for merged adapters
                if prefix in name or "original_module" in name:
                    continue
                name = name.removeprefix("base_model.model.").replace(".base_layer", "")
                name = name.replace("modules_to_save.default.", "")
            if key in terms:
                self.terms[name] = terms[key]
            local = parallel.local_tensor(tensor)  # FSDP2: this process's shard
            at = (local.untyped_storage().data_ptr() + local.storage_offset() * local.element_size(),
                  tuple(tensor.shape))
            if at in first:
                self.aliases[name] = first[at]
            else:
                first[at] = name
            self.entries.append((name, tensor.detach()))
        if reached != len(terms):  # a peft layout lora_terms misread: never send W without its adapter
            raise ValueError(f"{len(terms) - reached} LoRA base weights are not in the model's state dict")

    def _sent_dtype(self, tensor: torch.Tensor) -> torch.dtype:
        return self.dtype if self.dtype is not None and tensor.is_floating_point() else tensor.dtype

    def _whole(self, name: str, tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
        """``tensor`` whole (FSDP2: gathered now, by every process), its adapter added (A and B
        gathered after it), in ``dtype`` (None: the sent dtype)."""
        tensor = self.parallel.whole_tensor(tensor)
        dtype = dtype or self._sent_dtype(tensor)
        term = self.terms.get(name)
        if term is not None:
            return term.merged(tensor, dtype, self.parallel.whole_tensor)
        return tensor.to(dtype)

    def take_part(self) -> None:
        """On the processes that do not send: join the gathers of `unique()` (FSDP2; else nothing happens)."""
        for name, tensor in self.entries:
            if name not in self.aliases:
                self.parallel.whole_tensor(tensor)  # dropped at once
                if name in self.terms:
                    self.terms[name].whole(self.parallel.whole_tensor)  # A, then B, as `_whole` gathers them

    def specs(self) -> list[TensorSpec]:
        """What a checkpoint of this policy holds (no aliases), in the dtype that is sent."""
        return [TensorSpec(name, tuple(t.shape), dtype_name(self._sent_dtype(t)))
                for name, t in self.entries if name not in self.aliases]

    def __iter__(self) -> Iterator[Named]:
        """Every tensor, aliases included (what vLLM's reload_weights takes in this process)."""
        for name, tensor in self.entries:
            yield name, self._whole(name, tensor, None)

    def unique(self) -> Iterator[Named]:
        """Every tensor once (what travels; the receiver repeats each under its aliases)."""
        for name, tensor in self.entries:
            if name not in self.aliases:
                yield name, self._whole(name, tensor, None)

    def state(self) -> Mapping[str, torch.Tensor]:
        """Every tensor under its name as this process holds it (FSDP2: its shard, a DTensor), in
        the model's dtype, adapters added: what grpocli.reference.mixing's ``mix_state`` takes.

        A LoRA base weight's sum is computed when it is looked up (FSDP2: W, A and B gathered,
        the sum cut back to this process's shard), and dropped by the caller after use: every
        process must look up the same names in the same order (``mix_state`` walks the
        reference's state dict)."""
        return _HeldState(self)


class _HeldState(Mapping):
    """`PolicyWeights.state()`: a mapping whose LoRA base weights are summed when looked up."""

    def __init__(self, weights: PolicyWeights) -> None:
        self.weights, self.held = weights, dict(weights.entries)

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor, parallel = self.held[name], self.weights.parallel
        if name not in self.weights.terms:
            return tensor
        return parallel.shard_like(self.weights._whole(name, tensor, tensor.dtype), tensor)

    def __iter__(self) -> Iterator[str]:
        return iter(self.held)

    def __len__(self) -> int:
        return len(self.held)


@contextmanager
def policy_weights(model: Any, dtype: torch.dtype | None = None,
                   parallel: Parallel | None = None, *, adapters: bool = True) -> Iterator[PolicyWeights]:
    """The policy's weights (PolicyWeights), whole as the parallel strategy makes them (DeepSpeed
    ZeRO-3 gathers its partitions while this is open; default: one process).

    A peft LoRA model's adapters are added out of place as each base weight is reached
    (grpocli.generation.lora): its base weights stay bit for bit as they were. A peft model that
    path does not cover (DoRA, embedding or conv LoRA, several active adapters, other tuners; the
    list in grpocli.generation.lora) falls back to peft's ``merge_adapter`` while this is open and
    ``unmerge_adapter`` after, with a warning naming the layer: its base weights then round a
    little each sync (in bf16), as TRL's sync does. ``adapters=False``: a peft model's base weights
    alone (what an engine that applies the adapters itself starts from; vllm.lora_sync = "adapter")."""
    peft = hasattr(model, "peft_config") and hasattr(model, "merge_adapter")
    parallel = parallel or Parallel.alone()
    with parallel.whole_weights(model):
        terms: dict[str, LoraTerm] = {}
        in_place = False
        if peft and adapters:
            try:
                terms = lora_terms(model)
            except Uncovered as why:
                warnings.warn(f"weight sync: {why}; the adapters are merged into the base weights in place and "
                              "unmerged after (peft's merge_adapter), which rounds the base weights a little "
                              "each sync", stacklevel=3)
                in_place = True
        if in_place:
            model.merge_adapter()
        try:
            yield PolicyWeights(model, peft, dtype, parallel, terms)
        finally:
            if in_place:
                model.unmerge_adapter()


# -- specs ---------------------------------------------------------------------------------
def checkpoint_spec(directory: str | Path, dtype: torch.dtype | None = None) -> dict[str, TensorSpec]:
    """Names and shapes from a checkpoint's safetensors headers (no tensor is read).

    Floating tensors get ``dtype`` (the engine's) when given: that is what updates must send.
    Empty when the directory holds no safetensors files (then only shapes seen later are checked).
    """
    from safetensors import safe_open

    out: dict[str, TensorSpec] = {}
    for path in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                piece = f.get_slice(name)
                kind = _SAFETENSORS_DTYPES.get(piece.get_dtype(), piece.get_dtype().lower())
                if dtype is not None and kind in ("float64", "float32", "float16", "bfloat16"):
                    kind = dtype_name(dtype)
                out[name] = TensorSpec(name, tuple(piece.get_shape()), kind)
    return out


def spec_problems(expected: dict[str, TensorSpec], got: Iterable[TensorSpec], *,
                  complete: bool = True, limit: int = 8) -> list[str]:
    """Human-readable differences: unknown names, wrong shapes or dtypes, (missing names)."""
    from grpocli.errors import did_you_mean

    problems, names = [], set()
    for spec in got:
        names.add(spec.name)
        want = expected.get(spec.name)
        if want is None:
            problems.append(f"{spec.name}: not in the engine's model{did_you_mean(spec.name, expected)}")
        elif want.shape != spec.shape:
            problems.append(f"{spec.name}: shape {list(spec.shape)}, the engine's is {list(want.shape)}")
        elif want.dtype != spec.dtype:
            problems.append(f"{spec.name}: dtype {spec.dtype}, the engine's is {want.dtype}")
    if complete:
        missing = sorted(set(expected) - names)
        if missing:
            problems.append(f"{len(missing)} of the engine's tensors missing: {', '.join(missing[:4])}"
                            + (", ..." if len(missing) > 4 else ""))
    if len(problems) > limit:
        problems = [*problems[:limit], f"... and {len(problems) - limit} more"]
    return problems


# -- buckets ---------------------------------------------------------------------------------
def buckets(named: Iterable[Named], max_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[list[Named]]:
    """Group tensors in order into lists of at most max_bytes (a bigger tensor goes alone)."""
    bucket: list[Named] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def pack_bucket(bucket: list[Named]) -> bytes:
    """A bucket as a safetensors file in memory (the HTTP body)."""
    from safetensors.torch import save

    return save({name: t.detach().to("cpu").contiguous() for name, t in bucket})


def unpack_bucket(data: bytes) -> list[Named]:
    """The inverse of pack_bucket; ValueError on anything that is not a safetensors file."""
    from safetensors.torch import load

    try:
        return list(load(data).items())
    except Exception as exc:  # safetensors raises its own SafetensorError
        raise ValueError(f"the body is not a safetensors file ({exc})") from None


#: Each tensor of a flat bucket starts at a multiple of this, so every dtype can view its bytes.
ALIGN = 16


def _offsets(specs: list[TensorSpec]) -> tuple[list[int], int]:
    """Start of each tensor in a flat bucket, and the bucket's total size (bytes)."""
    offsets, end = [], 0
    for spec in specs:
        start = -(-end // ALIGN) * ALIGN
        offsets.append(start)
        end = start + spec.nbytes
    return offsets, end


def flatten_bucket(bucket: list[Named], device: torch.device | str = "cpu") -> tuple[torch.Tensor, list[TensorSpec]]:
    """One flat uint8 tensor (for a single broadcast) and the specs that cut it apart."""
    specs = [TensorSpec.of(name, t) for name, t in bucket]
    offsets, total = _offsets(specs)
    flat = torch.zeros(total, dtype=torch.uint8, device=device)
    for (_, t), start, spec in zip(bucket, offsets, specs):
        flat[start : start + spec.nbytes] = t.detach().contiguous().reshape(-1).view(torch.uint8).to(device)
    return flat, specs


def unflatten_bucket(flat: torch.Tensor, specs: list[TensorSpec]) -> list[Named]:
    """The inverse of flatten_bucket (views into ``flat``)."""
    offsets, total = _offsets(specs)
    if total != flat.numel():
        raise ValueError(f"the bucket holds {flat.numel()} bytes, its spec describes {total}")
    return [(spec.name, flat[start : start + spec.nbytes].view(dtype_from_name(spec.dtype)).view(spec.shape))
            for start, spec in zip(offsets, specs)]


def bucket_bytes(specs: list[TensorSpec]) -> int:
    """Size of the flat bucket these specs describe (with alignment padding)."""
    return _offsets(specs)[1]


# -- process groups for weight broadcasts ----------------------------------------------------
def open_group(backend: str, store: Any, rank: int, world_size: int, timeout: float,
               hostname: str | None = None) -> Any:
    """A two-party (or larger) gloo/NCCL group over ``store``, outside torch.distributed's world."""
    import torch.distributed as dist

    store = dist.PrefixStore("grpo-weights", store)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timedelta(seconds=timeout)
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=hostname) if hostname
                         else dist.ProcessGroupGloo.create_default_device()]
        return dist.ProcessGroupGloo(store, rank, world_size, opts)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timedelta(seconds=timeout)
        group = dist.ProcessGroupNCCL(store, rank, world_size, opts)
        return group
    raise ValueError(f"unknown weight transport backend {backend!r} (valid: gloo, nccl)")


def tied_embedding(config: Any, names: Iterable[str]) -> str | None:
    """The embedding a tied ``lm_head.weight`` repeats, among ``names``, for a model ``config`` (a transformers
    config) that ties them and ``names`` that do not hold the lm_head already: a trainer sends a tied tensor
    once, under the embedding's name, and vLLM's layerwise reload keeps the old lm_head unless it comes too."""
    names = list(names)
    if not getattr(config, "tie_word_embeddings", False) or "lm_head.weight" in names:
        return None
    if "model.embed_tokens.weight" in names:
        return "model.embed_tokens.weight"
    return next((n for n in names if n.endswith("embed_tokens.weight")), None)


def broadcast(group: Any, tensor: torch.Tensor, timeout: float, root: int = 0) -> None:
    """Broadcast from ``root`` and wait at most ``timeout`` seconds (then TimeoutError, or the
    backend's own error)."""
    work = group.broadcast(tensor, root, timedelta(seconds=timeout))
    if not work.wait(timedelta(seconds=timeout)):
        raise TimeoutError(f"the weight broadcast did not finish within {timeout:g} s")


__all__ = [
    "DEFAULT_BUCKET_BYTES", "TensorSpec", "broadcast", "tied_embedding", "bucket_bytes", "buckets", "checkpoint_spec",
    "dtype_from_name", "dtype_name", "flatten_bucket", "open_group", "pack_bucket", "policy_weights",
    "PolicyWeights", "spec_problems", "unflatten_bucket", "unpack_bucket",
]
