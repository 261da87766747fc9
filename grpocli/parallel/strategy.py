"""`Parallel`: how the training processes share the work, asked by everything that depends on it.

This class is the plain case: one process, or several under DDP (accelerate's `prepare` wraps
the model; gradients are averaged in the last backward of a step). The sharded strategies
subclass it: `Fsdp2` (grpocli.parallel.fsdp2) and `DeepSpeed` ZeRO-2/3
(grpocli.parallel.deepspeed). `grpocli.parallel.start` picks one when training starts.

What differs between them, and so what the step, the frozen log-prob passes, generation,
checkpoints and weight syncs ask this object instead of testing for a strategy:

* which passes are collectives: under FSDP2 and ZeRO-3 every forward gathers parameters
  (`forward_collective`); under FSDP2 and DeepSpeed every backward reduces gradients. Every
  process must then run as many of them: `forward_passes` / `backward_passes` pad a process's
  list with None, which the caller turns into `idle_forward` / `idle_loss`;
* how a step accumulates (`accumulating`: DDP's no_sync, DeepSpeed's boundary) and clips;
* how weights are made whole (`whole_weights`: ZeRO-3's gather for a weight sync) and how a
  checkpoint writes and reads them (`save_weights`, `load_weights`).

The processes' collectives (`gather`, `total`, `fewest`, `gather_rows`) are here too, so that a
phase that needs every process's figures asks one object. `Parallel.alone()` is one process
without accelerate (`grpo eval`, the servers).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from grpocli.errors import UserError
from grpocli.parallel import status

if TYPE_CHECKING:
    from grpocli.parallel.sequence import SequenceSplit

#: The moving reference model (algorithm.ref_sync_steps > 0), inside a checkpoint's trainer/.
REFERENCE = "reference.safetensors"


class Parallel:
    """One process, or DDP over several (accelerate); base of the sharded strategies."""

    #: Every forward pass gathers parameters (a collective): FSDP2, ZeRO-3.
    forward_collective = False
    #: Every backward pass reduces gradients (a collective): FSDP2, DeepSpeed.
    backward_collective = False
    #: How the processes hold the policy, as `grpo plan` names it: "none" (one process, DDP: a whole
    #: copy each), "fsdp2", "zero2", "zero3".
    sharding = "none"

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator  # None: one process without accelerate (Parallel.alone)
        self.activity: tuple[int, str, float] | None = None  # (step, what, since): `doing`
        self.split: SequenceSplit | None = None  # train.sequence_parallel > 1 (grpocli.parallel.sequence)

    @property
    def recipe_sharding(self) -> str:
        """What config.resolved.toml records as train.sharding: this strategy's `sharding`, where the
        recipe can name it ("none", "fsdp2")."""
        return self.sharding

    @classmethod
    def alone(cls) -> Parallel:
        """One process, no accelerate: `grpo eval`, the servers, tests of one part."""
        return cls(None)

    # -- the processes ---------------------------------------------------------------------
    @property
    def size(self) -> int:
        return 1 if self.accelerator is None else self.accelerator.num_processes

    @property
    def rank(self) -> int:
        return 0 if self.accelerator is None else self.accelerator.process_index

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        return torch.device("cpu") if self.accelerator is None else self.accelerator.device

    @property
    def precision(self) -> str:
        """The mixed precision accelerate applies ("no" where it applies none: fp16 on a CPU)."""
        acc = self.accelerator
        return acc.mixed_precision if acc is not None and acc.native_amp else "no"

    def wait(self) -> None:
        """Every process reaches this point before any goes on."""
        if self.accelerator is not None:
            self.accelerator.wait_for_everyone()

    def unwrap(self, model: Any) -> Any:
        """The model inside accelerate's wrapper (DDP, a DeepSpeed engine)."""
        return model if self.accelerator is None else self.accelerator.unwrap_model(model)

    # -- what each process is doing, for a collective that waits too long -------------------
    def doing(self, step: int, what: str) -> None:
        """Note what this process does now, at `step` (grpocli.parallel.status)."""
        self.activity = (step, what, time.time())
        if self.size > 1:
            status.write(self.rank, step, what, self.activity[2])

    def stalled(self, exc: BaseException, timeout: float) -> UserError | None:
        """The error to stop with when `exc` is torch.distributed giving up on a collective after
        `timeout` seconds (train.collective_timeout), naming the step and what each process was
        doing; None for any other exception."""
        if self.size == 1 or not status.timed_out(exc):
            return None
        return status.stalled(self.rank, self.activity, timeout)

    # -- collectives -----------------------------------------------------------------------
    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """A 1-D tensor from every process (same length on each), concatenated in rank order, on the CPU."""
        if self.size == 1:
            return values.cpu()
        return self.accelerator.gather(values.to(self.device)).cpu()

    def total(self, count: float) -> float:
        """`count` summed over every process."""
        if self.size == 1:
            return float(count)
        summed = self.accelerator.reduce(torch.tensor(float(count), dtype=torch.float64, device=self.device),
                                         reduction="sum")
        return float(summed.item())

    def sums(self, values: list[float] | torch.Tensor) -> list[float]:
        """Each of `values` (a list, or a 1-D tensor on this process's device) summed over every
        process (one all-reduce)."""
        tensor = torch.as_tensor(values, dtype=torch.float64, device=self.device)
        if self.size == 1:
            return tensor.tolist()
        return self.accelerator.reduce(tensor, reduction="sum").tolist()

    def fewest(self, count: int) -> int:
        """The smallest `count` of any process (so that every process takes the same decision)."""
        return int(self.gather(torch.tensor([float(count)])).min())

    def gather_rows(self, rows: list[Any]) -> list[Any]:
        """Every process's list, concatenated in rank order (accelerate's gather_object)."""
        if self.size == 1:
            return rows
        from accelerate.utils import gather_object

        return gather_object(rows)

    def any_process(self, flag: bool) -> bool:
        """Whether `flag` holds on any process, where the processes must stay in step (a loop of
        generate calls under `forward_collective`); elsewhere this process's own `flag`."""
        if not self.forward_collective:
            return flag
        import torch.distributed as dist

        value = torch.tensor([int(flag)], dtype=torch.int64, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    # -- passes ----------------------------------------------------------------------------
    def forward_passes(self, items: list[Any]) -> list[Any]:
        """`items` as many as every process runs forward passes (or generate calls) over: padded
        with None where each pass is a collective, else as given."""
        return padded(items, self.device) if self.forward_collective else list(items)

    def backward_passes(self, items: list[Any]) -> list[Any]:
        """`items` as many as every process runs backward passes over, at least one: a process
        without work still joins the gradient reduction (DDP: in its one pass of `idle_loss`)."""
        return padded(items, self.device) if self.backward_collective else list(items) or [None]

    def idle_loss(self, model: Any) -> torch.Tensor:
        """A loss of 0 from a 1-token forward pass through the prepared model, for a process
        without a micro-batch: its backward joins the gradient reduction the others run (DDP
        reduces only after a forward through its wrapper; a backward without one skips the
        all-reduce, and the next collective then waits forever)."""
        return idle_forward(model)

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate one micro-batch's loss, scaled by the number of processes: DDP, FSDP2 and
        DeepSpeed average the gradients over them, and the loss is already this process's share of
        the whole batch's (grpocli.algorithms.losses), so the average would divide it again."""
        if self.accelerator is None:
            loss.backward()
            return
        self.accelerator.backward(loss * self.size)

    @contextmanager
    def accumulating(self, model: Any, last: bool) -> Iterator[None]:
        """Around one micro-batch's forward and backward: gradients are reduced at the `last` only."""
        if last or self.accelerator is None:
            yield
            return
        with self.accelerator.no_sync(model):
            yield

    def clip_grad_norm(self, model: Any, max_norm: float) -> float:
        """Clip the gradients of every process together (0 or less: no clip); the norm before it."""
        bound = max_norm if max_norm > 0 else math.inf
        if self.accelerator is None:
            return float(torch.nn.utils.clip_grad_norm_(model.parameters(), bound))
        norm = self.accelerator.clip_grad_norm_(model.parameters(), bound)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP2: a DTensor

    def step(self, optimizer: Any, finite: bool) -> None:
        """The optimizer step after clipping, skipped when the gradient is not `finite`, then
        zero_grad. Under fp16 the loss scaler steps either way: it skips a non-finite update itself
        and lowers its scale (skipped here, its record of the unscale stayed, and the next step
        raised "unscale_() has already been called on this optimizer since the last update()")."""
        if finite or getattr(self.accelerator, "scaler", None) is not None:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # -- models ----------------------------------------------------------------------------
    def split_models(self, *models: Any) -> None:
        """Under sequence parallelism, route each in-process model's attention through Ulysses'
        exchange (grpocli.parallel.ulysses); UserError for a model the split cannot run."""
        if self.split is None:
            return
        from grpocli.parallel.ulysses import check_model, use_ulysses

        for model in models:
            if isinstance(model, torch.nn.Module):
                check_model(model, self.split.size)
                use_ulysses(model)

    @property
    def load_device(self) -> torch.device | None:
        """Where the models load: straight onto this process's GPU (None: on the host, then `prepare`)."""
        return self.device if self.device.type == "cuda" else None

    def loading(self) -> Any:
        """Around loading the models (DeepSpeed ZeRO-3: whole, partitioned at `prepare`)."""
        return nullcontext()

    def prepare(self, model: Any, reference: Any, optimizer: Callable[[Any], tuple[Any, Any]]) -> tuple[Any, ...]:
        """(model, reference, optimizer, scheduler): the model wrapped for training (under autocast
        when mixed precision is on, its logits left in the autocast dtype), the reference on this
        process's device; `optimizer(model)` builds the optimizer and its schedule over the
        parameters to train."""
        opt, scheduler = optimizer(model)
        model, opt = self.accelerator.prepare(model, opt)
        keep_logits_dtype(self.unwrap(model), self.accelerator)
        return model, self.place_reference(reference), opt, scheduler

    def place_reference(self, reference: Any) -> Any:
        """An in-process reference model on this process's device (its frozen passes run under
        `autocast`, as the policy's); None or a reference server's client as they are."""
        return reference.to(self.device) if isinstance(reference, torch.nn.Module) else reference

    def autocast(self) -> Any:
        """Around a forward pass outside the prepared model (the reference's): the mixed precision
        the policy's forward runs under, so both give the same numbers for the same weights."""
        acc = self.accelerator
        return acc.autocast() if acc is not None and acc.native_amp else nullcontext()

    def describe(self, model: Any) -> str | None:
        """A line on what runs, printed at start (None: nothing worth saying)."""
        return None

    def low_precision_warning(self, model: Any) -> str | None:
        """A warning when the optimizer updates bf16 / fp16 weights in place, without float32 master
        weights: AdamW's update is then rounded to the weight's precision (bf16 keeps 8 bits of
        mantissa), so at learning rates like 1e-6 most updates are lost, silently. None otherwise
        (DeepSpeed keeps float32 masters of its own)."""
        low = {str(p.dtype).removeprefix("torch.") for p in self.unwrap(model).parameters()
               if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16)}
        if not low:
            return None
        return (f"the optimizer updates {'/'.join(sorted(low))} weights in place, with no float32 master copy: "
                "an update below the weight's precision is lost (at lr 1e-6 most of them). Load the model in "
                "float32 (model.dtype = \"float32\") and compute in bf16 (train.mixed_precision = \"bf16\"): the "
                "same 16 bytes a trained parameter as bf16 weights with float32 masters; where that does not fit, "
                "shard it (train.sharding = \"fsdp2\", or DeepSpeed, which keeps float32 masters itself)")

    def whole_weights(self, model: Any) -> Any:
        """Around reading every weight of `model` whole (a weight sync): ZeRO-3 gathers its partitions."""
        return nullcontext()

    def whole_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """One tensor of the model's state dict, whole (FSDP2: its shards gathered, a collective
        every process joins); here as it is."""
        return tensor

    def local_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """The part of a state-dict tensor this process holds (FSDP2: its shard); here all of it."""
        return tensor

    def shard_like(self, whole: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
        """``whole`` (a whole tensor of ``held``'s shape) laid out as this process holds ``held``
        (FSDP2: its shard of it, a DTensor like ``held``; no collective); here as it is."""
        return whole

    # -- checkpoints -----------------------------------------------------------------------
    def check_replicas(self, model: Any) -> None:
        """DDP: every process must hold the same weights; a cheap fingerprint checks it."""
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return
        with torch.no_grad():
            mine = torch.stack([p.detach().double().sum() for p in model.parameters()])  # [P]
        every = self.accelerator.gather(mine.to(self.device)[None]).cpu()            # [W, P]
        if not torch.allclose(every, every[0].expand_as(every), rtol=1e-6, atol=1e-9):
            raise RuntimeError(f"the {self.size} processes hold different weights: "
                               f"parameter sums {every.sum(dim=1).tolist()}")

    def save_weights(self, folder: Path, *, model: Any, optimizer: Any, reference: Any) -> None:
        """The model (save_pretrained), trainer/optimizer.pt and (a moving reference)
        trainer/reference.safetensors into a checkpoint folder; every process calls it."""
        if not self.main:
            return
        from grpocli.models.files import save_pretrained_quietly

        save_pretrained_quietly(self.unwrap(model), folder)
        torch.save(optimizer.state_dict(), folder / "trainer" / "optimizer.pt")
        save_reference(folder, reference)

    def load_weights(self, folder: Path, *, model: Any, optimizer: Any, reference: Any) -> None:
        """What `save_weights` wrote, into the live model, optimizer and reference. The optimizer
        state is read onto the CPU (every process at once on GPU 0 would not fit) and moved to
        each parameter's device by the optimizer's own load_state_dict."""
        from grpocli.models.files import load_weights

        optim = torch.load(folder / "trainer" / "optimizer.pt", map_location="cpu", weights_only=False)
        load_weights(self.unwrap(model), folder)
        optimizer.load_state_dict(optim)
        load_reference(folder, reference)


def save_reference(folder: Path, reference: Any) -> None:
    """A moving reference model's weights (None: nothing), as safetensors."""
    if reference is None:
        return
    from safetensors.torch import save_model

    save_model(reference, str(folder / "trainer" / REFERENCE))


def load_reference(folder: Path, reference: Any, load_sharded: Callable[..., None] | None = None) -> None:
    """A saved reference into `reference` (None, or none saved: nothing); `load_sharded(model,
    state)` for a sharded one."""
    saved = folder / "trainer" / REFERENCE
    if reference is None or not saved.exists():
        return
    from safetensors.torch import load_file, load_model

    if load_sharded is not None:
        load_sharded(reference, load_file(saved))
    else:
        load_model(reference, str(saved))


def keep_logits_dtype(model: Any, accelerator: Any) -> None:
    """Undo accelerate's float32 outputs, keep its autocast. Under native mixed precision its
    `prepare` wraps the model's forward in autocast and then converts every output to float32
    (`convert_outputs_to_fp32`): a micro-batch's `[r, K, V]` logits in float32, kept for backward
    (about 20 GB at 8 x 4096 tokens and a 152k vocabulary). grpo's log-prob code upcasts one
    block at a time itself (grpocli.algorithms.logprobs), so the logits stay in bf16 / fp16."""
    original = getattr(model, "_original_forward", None)
    if original is None or not accelerator.native_amp:
        return
    from types import MethodType

    from accelerate.utils import get_mixed_precision_context_manager

    autocast = get_mixed_precision_context_manager(accelerator.native_amp, accelerator.autocast_handler)
    func = getattr(original, "__func__", None)
    model.forward = MethodType(autocast(func), model) if func is not None else autocast(original)


def idle_forward(model: Any) -> torch.Tensor:
    """A forward pass over one token whose loss is 0: the gathers of a pass (and, after its
    backward, the gradient reductions), with no effect on the gradients."""
    ids = torch.zeros((1, 1), dtype=torch.long, device=next(model.parameters()).device)
    logits = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits
    return logits.sum() * 0.0


def padded(items: list[Any], device: torch.device) -> list[Any]:
    """`items` padded with None to the most any process has (one all-reduce)."""
    import torch.distributed as dist

    count = torch.tensor([len(items)], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return list(items) + [None] * (int(count) - len(items))
