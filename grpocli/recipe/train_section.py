"""[train]: optimization and run control (steps, batch, learning rate and schedule, precision,
processes and sharding, checkpoints). A section of the recipe schema (grpocli.recipe.schema)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ByteSize, Field, field_validator

from grpocli.recipe.bounds import MAX_COMPLETIONS_PER_BATCH, MAX_SEED
from grpocli.recipe.guard_section import GuardSection
from grpocli.recipe.section import FREE_ON_RESUME, Section


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
        description="Passes over the training split instead of train.steps, counted as TRL counts them: steps = "
        "ceil(epochs x whole generation batches in the split x steps_per_generation x algorithm.num_iterations), worked out once the split loads and recorded as train.steps in config.resolved.toml. "
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
    micro_batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        8, description="Completions per forward/backward pass on one process. 'auto': the largest whose "
        "log-prob and training passes `grpo plan` predicts to fit the device's memory (or train.memory_limit), "
        "recorded with the reason in config.resolved.toml and checked against the first step's measured peak; the "
        "split never changes the loss (bnpo's per-micro-batch loss refuses 'auto'). A pass that runs out of memory "
        "halves it and redoes the step either way.",
    )
    max_tokens_per_micro_batch: Annotated[int, Field(ge=16)] | Literal["auto"] | None = Field(
        None, description="Token budget per micro-batch (packed rows); overrides micro_batch_size. 'auto': the largest "
        "micro-batch that fits (as micro_batch_size 'auto') times data.max_prompt_length + "
        "generation.max_completion_length."
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
    sequence_parallel: int = Field(
        1, ge=1, le=64,
        description="Processes that split each sequence (Ulysses, as verl's ulysses_sequence_parallel_size): N "
        "processes take turns at each one's micro-batches, each holding 1/N of a row's tokens through every layer; "
        "attention exchanges heads with all-to-all, so each sees the whole row for 1/N of the heads. Activation and "
        "logits memory per process fall about N-fold for the same micro-batch; the loss and gradients are the "
        "unsplit step's. N divides train.num_processes and the model's attention and key-value heads; it composes "
        "with DDP, FSDP2, packing and shared prompts. 1: off.",
        json_schema_extra=FREE_ON_RESUME,
    )
    logits_chunk_tokens: int = Field(
        1024, ge=16, le=1048576,
        description="Token positions whose logits are upcast to float32 at once in the log-prob and entropy "
        "passes (TRL's selective_log_softmax idea, in blocks): one block takes this x vocabulary x 4 bytes, e.g. "
        "1024 x 152k x 4 = 620 MiB for Qwen2.5. Smaller bounds that block at long completions; the log-probs "
        "are the same.",
        json_schema_extra=FREE_ON_RESUME,
    )
    memory_limit: ByteSize | None = Field(
        None, gt=0, description="Most memory one pass may take on one process, e.g. '8GiB': on a CPU the process's "
        "peak resident set, on a GPU torch's max_memory_allocated (default: the GPU itself; on a CPU no limit). A "
        "pass past it counts as out of memory: its micro-batches are split and the step redone, as after a CUDA "
        "out-of-memory; micro_batch_size = 'auto' sizes micro-batches to it.",
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
    on_nonfinite_loss: Literal["guard", "skip", "raise"] = Field(
        "guard", description="A NaN/inf loss or gradient norm (its update is never applied): 'guard': "
        "train.guard.action decides (default 'skip': say so and go on); 'skip': say so and go on, whatever "
        "train.guard.action; 'raise': stop with exit 2, naming the step.",
        json_schema_extra=FREE_ON_RESUME,
    )
    guard: GuardSection = Field(
        default_factory=GuardSection, description="What a run does when a step goes wrong: a non-finite loss, KL "
        "past a bound, entropy collapsing (skip, roll back to the last checkpoint, or stop).",
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
