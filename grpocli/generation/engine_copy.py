"""The policy saved as a checkpoint for a colocated vLLM engine to start from, and where it fits.

Each training process writes a full copy for its own engine (a few seconds' life: the engine
loads it and the directory is removed). It goes to /dev/shm (shared memory: no disk I/O) where
that has room for every process on this machine, else to the system temporary directory
(``tempfile.gettempdir()``: TMPDIR, /tmp); where neither has room the run stops with a UserError
naming the sizes. Docker gives a container 64 MB of /dev/shm unless told otherwise, less than
any real model. The processes agree on the place (a collective), so none stops while the others
wait for it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from grpocli.errors import UserError
from grpocli.generation.weights import policy_weights
from grpocli.parallel import Parallel

#: Room kept for what is written besides the weights: config, generation config, tokenizer files.
EXTRA_BYTES = 64 * 2**20
SHM = "/dev/shm"
GB = 1e9


def policy_bytes(model: Any) -> int:
    """Bytes of the policy's weights as the copy holds them: every parameter once (tied ones
    once), at its dtype and whole size (an FSDP2 DTensor's shape is the whole tensor's; a
    ZeRO-3 parameter says its own in ``ds_numel``). LoRA adapters count too (a slight over-estimate:
    the copy holds them merged)."""
    total = 0
    for p in model.parameters():
        total += int(getattr(p, "ds_numel", p.numel())) * p.element_size()
    return total


def local_processes(parallel: Parallel, environ: Mapping[str, str] | None = None) -> int:
    """How many training processes write a copy on this machine at once: LOCAL_WORLD_SIZE (set by
    torchrun and accelerate launch), else all of them."""
    import os

    env = os.environ if environ is None else environ
    try:
        return max(1, int(env.get("LOCAL_WORLD_SIZE", "")))
    except ValueError:
        return max(1, parallel.size)


def candidate_dirs() -> list[str]:
    """Where a copy may go, best first: /dev/shm where it exists, then the temporary directory."""
    places = [SHM] if Path(SHM).is_dir() else []
    tmp = tempfile.gettempdir()
    return places + ([tmp] if tmp not in places else [])


def pick_dir(need: int, places: Sequence[str], free: Callable[[str], int]) -> int:
    """Index in ``places`` of the first with ``need`` bytes free; ``len(places)`` where none has."""
    for i, place in enumerate(places):
        if free(place) >= need:
            return i
    return len(places)


def copy_dir(model: Any, parallel: Parallel | None = None, *,
             disk_usage: Callable[[str], Any] = shutil.disk_usage) -> str:
    """A new temporary directory for the engine's copy of ``model``, where there is room for the
    copies of all this machine's processes; every process of ``parallel`` takes the same kind of
    place (or all stop with the UserError)."""
    parallel = parallel or Parallel.alone()
    one = policy_bytes(model) + EXTRA_BYTES
    copies = local_processes(parallel)
    places = candidate_dirs()
    free = {place: int(disk_usage(place).free) for place in places}
    mine = pick_dir(one * copies, places, free.__getitem__)
    chosen = -parallel.fewest(-mine)  # the worst answer of any process: all take that place
    if chosen >= len(places):
        raise no_room_error(one, copies, free)
    return tempfile.mkdtemp(prefix="grpo-vllm-", dir=places[chosen])


def no_room_error(one: int, copies: int, free: dict[str, int]) -> UserError:
    each = f" each, {copies} processes on this machine" if copies > 1 else ""
    places = ", ".join(f"{place} has {room / GB:.2f} GB free" for place, room in free.items())
    return UserError(
        f"no room for the vLLM engine's start-up copy of the policy: it needs {one / GB:.2f} GB{each}; "
        f"{places}", where="generation.backend = \"vllm\"",
        valid=f"/dev/shm or the temporary directory with {one * copies / GB:.2f} GB free",
        hint="give the container more shared memory (docker run --shm-size=...), or point TMPDIR at a "
             "disk with room (TMPDIR=/path grpo train ...), or use generation.backend = \"vllm-server\"",
    )


def write_engine_copy(model: Any, tokenizer: Any, directory: str | Path, parallel: Parallel | None = None, *,
                      disk_usage: Callable[[str], Any] = shutil.disk_usage, adapters: bool = True) -> Path:
    """The policy as a checkpoint vLLM can start from: config, tokenizer, and the weights that
    `sync_weights` sends (LoRA adapters merged, peft names cleaned, FSDP2 shards gathered one
    tensor at a time). Every training process writes its own copy for its own engine, so neither
    transformers' save_pretrained (it writes on the main process only once torch.distributed is
    up, and cannot read DTensor shards) nor a deepcopy of the model (FSDP2 refuses it) is used.
    A directory without room for the weights is a UserError, raised before anything is written
    there (after the gather, which every process joins). ``adapters=False``: a LoRA policy's base weights
    alone (an engine that applies the adapters itself)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    with policy_weights(model, parallel=parallel, adapters=adapters) as weights:  # every process walks the same tensors (FSDP2 gathers)
        tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in weights.unique()}
    need = sum(t.numel() * t.element_size() for t in tensors.values()) + EXTRA_BYTES
    room = int(disk_usage(str(directory)).free)
    if room < need:
        raise no_room_error(need, 1, {str(directory): room})
    base.config.save_pretrained(directory)
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(directory)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(directory, save_jinja_files=False)
    return directory


__all__ = ["EXTRA_BYTES", "candidate_dirs", "copy_dir", "local_processes", "pick_dir", "policy_bytes",
           "write_engine_copy"]
