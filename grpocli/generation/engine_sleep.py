"""The colocated engine's sleep (vllm.sleep_mode): it gives its GPU memory back while the trainer
trains and takes it again to generate, in TRL 1.16's order (``trl/generation/vllm_generation.py``,
``vllm_enable_sleep_mode``):

* the engine starts with ``enable_sleep_mode=True`` and sleeps as soon as it has loaded;
* a weight sync first wakes the weights (``wake_up(tags=["weights"])``, after emptying torch's
  cache), then loads the new ones into them: the KV cache stays asleep;
* a generation wakes the weights if they still sleep (level 2 discarded them, so the policy's
  weights are sent again first: vLLM's ``reload_weights`` would read the first checkpoint from
  disk instead), then the KV cache (``wake_up(tags=["kv_cache"])``), generates, and sleeps again.

Level 1 keeps a host copy of the weights (the copy vLLM makes when it sleeps, so it holds the last
synced weights); level 2 keeps nothing and needs the trainer's weights at every wake. vLLM offers
sleep mode only on some platforms (CUDA, ROCm, XPU: ``current_platform.is_sleep_mode_available()``);
`check_sleep_mode` says so before an engine starts anywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpocli.errors import UserError


def check_sleep_mode(level: int, *, backend: str, async_steps: int = 0, inflight: bool = False) -> None:
    """UserError (exit 2) where vllm.sleep_mode = ``level`` cannot apply: a backend other than the
    colocated engine, generating ahead or in flight, or a vLLM without sleep mode on this platform (vLLM on a CPU).
    Imports vLLM only for a recipe that asks for sleep mode with the colocated engine."""
    if not level:
        return
    off = "or turn it off: vllm.sleep_mode=0"
    if backend != "vllm":
        raise UserError(
            f"sleep mode (level {level}) applies only to the colocated vLLM engine, not to generation.backend = "
            f"{backend!r} ('hf' generates with the training model itself; a vLLM server process has its own "
            "GPU, which the trainer does not share)", where="vllm.sleep_mode",
            valid="0 (off) with 'hf' or 'vllm-server'; 1 or 2 with generation.backend = \"vllm\"",
            hint=f"set generation.backend = \"vllm\" to train beside a sleeping engine, {off}",
        )
    if async_steps:
        raise UserError(
            f"sleep mode (level {level}) with generation.async_steps = {async_steps}: a sleeping engine cannot "
            "generate ahead while the trainer trains", where="vllm.sleep_mode",
            valid="sleep_mode 0 with async_steps > 0, or async_steps = 0 with sleep mode",
            hint=f"set generation.async_steps=0, {off}",
        )
    if inflight:
        raise UserError(
            f"sleep mode (level {level}) with generation.pipeline = \"inflight\": a sleeping engine cannot generate "
            "while the trainer trains", where="vllm.sleep_mode",
            valid="sleep_mode 0 with pipeline 'inflight', or pipeline 'sync' with sleep mode",
            hint=f"set generation.pipeline=sync, {off}")
    problem = platform_problem()
    if problem:
        raise UserError(
            f"vLLM's sleep mode (level {level}) needs a CUDA GPU (or ROCm / XPU), and {problem}",
            where="vllm.sleep_mode", valid="0 here; 1 or 2 where vLLM runs on CUDA",
            hint=f"train on a GPU machine, {off} (or drop the key from the recipe)",
        )


def platform_problem() -> str | None:
    """Why vLLM here has no sleep mode (its own platform check), or None where it has one."""
    try:
        from vllm.platforms import current_platform  # vLLM's platform only, not its engine (seconds less)
    except ImportError:
        from grpocli.generation.vllm_install import import_vllm

        import_vllm("generation.backend")  # says how to install it
        raise

    if current_platform.is_sleep_mode_available():
        return None
    name = getattr(current_platform, "device_name", None) or type(current_platform).__name__
    return f"this vLLM runs on {name!r}, which has none (vllm.platforms.current_platform.is_sleep_mode_available())"


class EngineSleep:
    """Whether the engine's weights and KV cache sleep, and the calls that change it (module docstring).
    ``send_weights(model)`` loads a policy's weights into the engine (the backend's weight sync);
    ``level`` 0: every call here does nothing."""

    def __init__(self, engine: Any, level: int, send_weights: Callable[[Any], None]) -> None:
        self.engine, self.level, self.send_weights = engine, level, send_weights
        self.weights_asleep = self.kv_asleep = False
        self.weights_lost = False   # level 2: the engine's weights must be sent again before it generates
        self.sleeps = 0             # how many times it went to sleep (a test reads it)

    def sleep(self) -> None:
        if not self.level or (self.weights_asleep and self.kv_asleep):
            return
        self.engine.sleep(self.level)
        self.weights_asleep = self.kv_asleep = True
        self.weights_lost = self.level == 2
        self.sleeps += 1

    def wake_weights(self) -> None:
        """Before weights are loaded into the engine: its weight memory mapped again."""
        if not self.weights_asleep:
            return
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # TRL: else the wake can run out of memory the trainer's cache holds
        self.engine.wake_up(["weights"])
        self.weights_asleep = False

    def before_generation(self, policy: Any) -> None:
        """Awake and holding the policy's weights: level 2 sends them again when its sleep discarded them."""
        if not self.level:
            return
        if self.weights_lost:
            self.send_weights(policy)  # wakes the weights itself (the backend's sync_weights)
        self.wake_weights()
        if self.kv_asleep:
            self.engine.wake_up(["kv_cache"])
            self.kv_asleep = False

    def weights_sent(self) -> None:
        self.weights_lost = False


__all__ = ["EngineSleep", "check_sleep_mode", "platform_problem"]
