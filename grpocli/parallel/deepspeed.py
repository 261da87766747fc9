"""DeepSpeed ZeRO-2/3 through accelerate's config (`accelerate launch --config_file
configs/deepspeed_zero{2,3}.yaml ...`), on GPUs and on CPU (DeepSpeed's CPU accelerator, gloo).

accelerate honours its DeepSpeed config only for `Accelerator(cpu=False)`, so `accelerator_options`
opens it that way whenever the launch asks for DeepSpeed (on CPU with a gloo process group:
`cpu=True` would silently train with DDP). `DeepSpeed.configure` fills the DeepSpeed config from
the recipe before `prepare`: the micro-batch size (grpo prepares no DataLoader to read it from),
gradient accumulation 1 (grpo accumulates over its own micro-batches and marks the last), the clip
norm (train.max_grad_norm) and, under bf16, a non-finite check, so that a bad step is skipped.

What changes for the step, as `DeepSpeed` answers it (grpocli.parallel.strategy.Parallel): under
ZeRO `no_sync` does nothing and accelerate's `backward` runs DeepSpeed's whole `engine.step()`
(clip, optimizer step, zero_grad) whenever accelerate's `sync_gradients` is set, so `accumulating`
sets it for the last micro-batch only; ZeRO reduces gradients in every backward (a collective),
so every process runs as many backward passes (`backward_passes`, padded with idle passes as
under FSDP2). Under ZeRO-3 every forward gathers parameters, so the frozen passes (old log-probs,
a ZeRO-3 reference) and generate calls are padded too, and HF generation keeps the processes
together (transformers' `synced_gpus`, on under ZeRO-3).

Elsewhere: checkpoints write the whole model plus DeepSpeed's own partitions (`save_weights`,
`load_weights`: resume is exact); a weight sync gathers ZeRO-3's partitions while it reads them
(`whole_weights`). Refused under ZeRO-3 (UserError): evaluation during training and multi-turn
rollouts (a process could skip a generate call the others gather in) and a moving reference model
(ref_sync_steps > 0).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grpocli.errors import UserError
from grpocli.parallel.strategy import Parallel, load_reference, save_reference

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe

#: The accelerate config keys a DeepSpeed launch reads from (for `where=` in errors).
WHERE = "accelerate config (deepspeed_config)"
#: Inside step-N/trainer/: DeepSpeed's own checkpoint (each process's ZeRO partitions of the
#: optimizer state and fp32 master weights), written and read by the engine.
ZERO_DIR = "deepspeed"
_TAG = "zero"


def asked() -> bool:
    """Whether the launch asks for DeepSpeed (`accelerate launch` with a DeepSpeed config sets this)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def accelerator_options(collective_timeout: float) -> dict[str, Any]:
    """Keyword arguments for `Accelerator(...)`: `cpu=True` without CUDA, except under DeepSpeed,
    which accelerate applies only with `cpu=False` (on CPU: DeepSpeed's CPU accelerator over gloo);
    the process group's timeout (train.collective_timeout seconds) either way."""
    from datetime import timedelta

    from accelerate.utils import InitProcessGroupKwargs

    timeout = timedelta(seconds=collective_timeout)
    # NCCL: a collective past the timeout raises in the waiting thread (as gloo's do), where the run
    # turns it into an error naming what each process was doing, instead of its watchdog aborting
    os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
    if not torch.cuda.is_available():  # where deepspeed is installed, accelerate imports it (unwrap_model),
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # which would warn that it fell back to the CPU
    if not asked():
        return {"cpu": not torch.cuda.is_available(), "kwargs_handlers": [InitProcessGroupKwargs(timeout=timeout)]}
    if importlib.util.find_spec("deepspeed") is None:
        raise UserError("accelerate's config asks for DeepSpeed, which is not installed", where=WHERE,
                        valid="deepspeed installed, or a config without DeepSpeed",
                        hint="pip install deepspeed   (CPU only: DS_BUILD_OPS=0 pip install deepspeed)")
    if torch.cuda.is_available():
        return {"cpu": False, "kwargs_handlers": [InitProcessGroupKwargs(timeout=timeout)]}
    return {"cpu": False, "kwargs_handlers": [InitProcessGroupKwargs(backend="gloo", timeout=timeout)]}


class DeepSpeed(Parallel):
    """ZeRO-2 or ZeRO-3 from accelerate's DeepSpeed config (module docstring)."""

    backward_collective = True

    def __init__(self, accelerator: Any, recipe: Recipe) -> None:
        super().__init__(accelerator)
        self.plugin = accelerator.state.deepspeed_plugin
        self.stage = _stage(self.plugin)
        self.sharding = f"zero{self.stage}"  # grpo plan's name: "zero2", "zero3"
        self.forward_collective = self.stage == 3
        self.configure(recipe)

    @property
    def precision(self) -> str:
        return self.accelerator.mixed_precision  # DeepSpeed's own bf16/fp16, not autocast

    @property
    def recipe_sharding(self) -> str:
        return "none"  # ZeRO comes from accelerate's config, which train.sharding does not name

    def configure(self, recipe: Recipe) -> None:
        """Fill accelerate's DeepSpeed config from the recipe before `prepare`; UserError for
        settings grpo's step cannot honour."""
        cfg, t = self.plugin.deepspeed_config, recipe.train
        if self.stage not in (2, 3):
            raise UserError(f"DeepSpeed ZeRO stage {self.stage} is not supported by grpo's training step",
                            where=f"{WHERE}: zero_stage", valid="2 or 3",
                            hint="configs/deepspeed_zero2.yaml or configs/deepspeed_zero3.yaml")
        _agree(cfg, "gradient_accumulation_steps", 1,
               "grpo accumulates over its micro-batches itself (train.micro_batch_size)")
        _agree(cfg, "gradient_clipping", t.max_grad_norm, "set by train.max_grad_norm")
        if cfg.get("train_micro_batch_size_per_gpu", "auto") == "auto":  # DeepSpeed reports it; grpo feeds its own
            cfg["train_micro_batch_size_per_gpu"] = t.micro_batch_size or 1
        for dtype in ("bf16", "fp16"):  # train.mixed_precision decides, as under DDP (not accelerate's setting)
            cfg.setdefault(dtype, {})["enabled"] = t.mixed_precision == dtype
        if t.mixed_precision == "bf16":
            cfg["bf16"].setdefault("check_grad_overflow", True)  # a non-finite norm skips the update, as under DDP
        if self.stage == 3:
            _refuse_under_zero3(recipe)
            cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True  # whole checkpoints

    @contextmanager
    def accumulating(self, model: Any, last: bool) -> Iterator[None]:
        """DeepSpeed clips and steps after the backward marked last (accelerate's sync_gradients)."""
        with super().accumulating(model, last):
            self.accelerator.gradient_state._set_sync_gradients(last)
            yield

    # -- models ----------------------------------------------------------------------------
    @contextmanager
    def loading(self) -> Iterator[None]:
        """Models load whole inside (as under DDP: the same weights for a seed), unless the config
        sets zero3_init_flag: transformers builds every model partitioned (deepspeed.zero.Init)
        whenever a ZeRO-3 config is registered with it, which accelerate does at `Accelerator()`;
        registered again after, so that generation keeps the processes in step (`synced_gpus`)."""
        if self.plugin.zero3_init_flag:
            yield
            return
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
        try:
            yield
        finally:
            self.plugin.set_deepspeed_weakref()

    def place_reference(self, reference: Any) -> Any:
        """An in-process reference model: under ZeRO-3 partitioned like the policy, in an engine
        without an optimizer (TRL's `prepare_deepspeed`), each of its forwards a collective too;
        under ZeRO-2 on this process's device in the dtype DeepSpeed trains the policy in."""
        if not isinstance(reference, torch.nn.Module):
            return reference
        if self.stage != 3:
            cfg = self.plugin.deepspeed_config
            dtype = next((d for k, d in (("bf16", torch.bfloat16), ("fp16", torch.float16))
                          if cfg.get(k, {}).get("enabled") is True), None)
            return reference.to(device=self.device, dtype=dtype)
        import copy

        import deepspeed

        config = copy.deepcopy(self.plugin.deepspeed_config)
        config.pop("optimizer", None)
        config.pop("scheduler", None)
        engine, *_ = deepspeed.initialize(model=reference, config=config)
        engine.eval()
        return engine

    @property
    def load_device(self) -> torch.device | None:
        return None  # whole on the host: DeepSpeed's engine places (ZeRO-3: partitions) them

    def low_precision_warning(self, model: Any) -> str | None:
        return None  # DeepSpeed's bf16 / fp16 optimizer keeps float32 master weights

    def describe(self, model: Any) -> str:
        """The stage, processes, device, precision and (ZeRO-3) how many parameter tensors are
        partitioned and how much of the policy this process holds."""
        cfg = self.plugin.deepspeed_config
        precision = next((k for k in ("bf16", "fp16") if cfg.get(k, {}).get("enabled") is True), "fp32")
        line = (f"DeepSpeed ZeRO-{self.stage} (accelerate config): {self.size} processes, "
                f"{self.device.type}, {precision}")
        if self.stage == 3:
            params = list(model.module.parameters())
            whole = [bool(getattr(p, "ds_persist", False)) for p in params]  # persistent: kept gathered
            held = sum(p.ds_numel if w else p.ds_tensor.numel() for p, w in zip(params, whole))
            line += (f"; {whole.count(False)} of {len(params)} parameter tensors partitioned, this process holds "
                     f"{held} of {sum(p.ds_numel for p in params)} elements")
        return line

    def whole_weights(self, model: Any) -> Any:
        """Under ZeRO-3 every parameter whole while open, on every process (each must enter it: an
        all-gather per tensor); what changes inside is dropped on exit. The whole model is held at
        once, as TRL's ds3_gather_for_generation does."""
        if self.stage != 3:
            return nullcontext()
        import deepspeed

        params = [p for p in model.parameters() if hasattr(p, "ds_id")]
        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)

    # -- checkpoints -----------------------------------------------------------------------
    def save_weights(self, folder: Path, *, model: Any, optimizer: Any, reference: Any) -> None:
        """The whole weights as a save_pretrained model (ZeRO-3: gathered by accelerate's
        `get_state_dict`, a layer at a time), and trainer/deepspeed/ with every process's partitions
        (ZeRO-2 holds the weights whole: written as under DDP); trainer/optimizer.pt only names that folder."""
        from grpocli.models.files import save_pretrained_quietly

        weights = self.accelerator.get_state_dict(model) if self.stage == 3 else None  # whole on the main process only
        if self.main:
            save_pretrained_quietly(self.unwrap(model), folder, state_dict=weights)
            torch.save({"deepspeed": f"trainer/{ZERO_DIR}/{_TAG}"}, folder / "trainer" / "optimizer.pt")
            save_reference(folder, reference)
        del weights
        model.save_checkpoint(str(folder / "trainer" / ZERO_DIR), tag=_TAG, save_latest=False)

    def load_weights(self, folder: Path, *, model: Any, optimizer: Any, reference: Any) -> None:
        """Restore the weights and optimizer partitions DeepSpeed saved: exact under the same number
        of processes and ZeRO stage. A RuntimeError for a checkpoint without them."""
        torch.load(folder / "trainer" / "optimizer.pt", map_location="cpu", weights_only=False)  # a damaged one fails
        zero = folder / "trainer" / ZERO_DIR
        if not (zero / _TAG).is_dir():
            raise RuntimeError(f"{zero}/{_TAG} is missing: the checkpoint was not written under DeepSpeed")
        loaded, _ = model.load_checkpoint(str(zero), tag=_TAG, load_module_strict=False, load_optimizer_states=True,
                                          load_lr_scheduler_states=False)
        if loaded is None:
            raise RuntimeError(f"DeepSpeed could not load {zero}/{_TAG}")
        load_reference(folder, reference)


def _stage(plugin: Any) -> int:
    return int(plugin.deepspeed_config.get("zero_optimization", {}).get("stage", 0))


def _agree(cfg: dict[str, Any], key: str, value: float, why: str) -> None:
    """Set `key` to `value` where the config says 'auto' or nothing; UserError where it says otherwise."""
    given = cfg.get(key, "auto")
    if given != "auto" and float(given) != float(value):
        raise UserError(f"the DeepSpeed config sets {key} = {given}; under grpo it is {value} ({why})",
                        where=f"{WHERE}: {key}", valid=f"{value} or 'auto'",
                        hint=f"drop {key} from the accelerate config (configs/deepspeed_zero2.yaml has none)")
    cfg[key] = value


def _refuse_under_zero3(recipe: Recipe) -> None:
    """What grpo cannot do with ZeRO-3's partitioned parameters yet."""
    if recipe.eval.every > 0:  # a process without eval prompts would skip generate calls the others gather in
        raise UserError("evaluation during training is not supported under DeepSpeed ZeRO-3 yet",
                        where="eval.every", valid="0 under ZeRO-3",
                        hint="eval.every=0 and `grpo eval --checkpoint` afterwards, or ZeRO-2, or train.sharding=fsdp2")
    if recipe.tools or recipe.multi_turn.environment is not None:  # turns differ per process: gathers would not match
        raise UserError("multi-turn rollouts (tools, environment) are not supported under DeepSpeed ZeRO-3 yet",
                        where="tools / multi_turn.environment", valid="single-turn recipes under ZeRO-3",
                        hint="ZeRO-2 (configs/deepspeed_zero2.yaml), or train.sharding=fsdp2")
    if recipe.algorithm.beta > 0 and recipe.algorithm.ref_sync_steps > 0:
        raise UserError("a moving reference model (ref_sync_steps > 0) is not supported under DeepSpeed ZeRO-3",
                        where="algorithm.ref_sync_steps", valid="0 under ZeRO-3",
                        hint="algorithm.ref_sync_steps=0, or ZeRO-2 (configs/deepspeed_zero2.yaml)")


__all__ = ["DeepSpeed", "accelerator_options", "asked"]
