"""`Session`: everything the loop needs, opened in an order that fails early.

Names (rewards, dataset, curriculum) and the run directory are checked before any model loads.
The run's counters live in `RunState` (grpocli.trainer.state); the data position in the
prompt stream; both are saved by checkpoints and restored here on resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from grpocli.data.stream import PromptStream
from grpocli.errors import UserError
from grpocli.inspection.alerts import Watch
from grpocli.recipe import Resolved, to_toml
from grpocli.rundir import RunDir
from grpocli.trainer.metrics import MetricsLog
from grpocli.trainer.progress import Progress
from grpocli.trainer.state import RunState


class TrainingStopped(UserError):
    """Training stopped on purpose (non-finite loss with on_nonfinite_loss='raise')."""

    exit_code = 1


@dataclass
class Session:
    resolved: Resolved
    run: RunDir
    accelerator: Any
    tokenizer: Any
    model: Any
    reference: Any          # None when beta = 0; a ReferenceClient with algorithm.reference = "server"
    optimizer: Any
    scheduler: Any
    backend: Any
    reward_fns: list
    prompts: Any            # RenderedPrompts: dataset rows rendered on access
    stream: PromptStream
    curriculum: Any
    progress: Progress
    metrics: MetricsLog | None = None  # main process only
    turns: Any = None       # grpocli.tools.turns.TurnLoop for multi-turn recipes (tools, environment)
    state: RunState = field(default_factory=RunState)
    watch: Watch = field(default_factory=Watch)

    @property
    def recipe(self):
        return self.resolved.recipe

    @property
    def epoch(self) -> float:
        return self.stream.position / len(self.prompts)

    @classmethod
    def open(cls, resolved: Resolved) -> Session:
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        from grpocli.data.template import RenderedPrompts
        from grpocli.generation.backends import build_backend
        from grpocli.trainer.checkpoint import resume_point
        from grpocli.trainer.deepspeed import (
            accelerator_options,
            describe,
            whole_models,
        )
        from grpocli.trainer.deepspeed import configure as configure_deepspeed
        from grpocli.trainer.preflight import preflight

        r = resolved.recipe
        run = RunDir(resolved.output_dir())
        resume_from = resume_point(run, r.train.resume, r.train.steps)
        checked = preflight(r)  # names first: a typo should not cost a model load
        accelerator = Accelerator(**accelerator_options(), mixed_precision=r.train.mixed_precision,
                                  log_with=r.log.report_to or None, project_dir=str(run.root))
        zero_stage = configure_deepspeed(accelerator, r)  # None without DeepSpeed
        set_seed(r.train.seed)
        if r.train.torch_threads:
            torch.set_num_threads(r.train.torch_threads)
        dataset = checked.dataset
        with whole_models(accelerator):  # ZeRO-3 partitions them at prepare, not at load
            tokenizer, model, reference = _models(r)
        prompts = RenderedPrompts(dataset, r.data, tokenizer)
        model, reference, optimizer, scheduler = _prepare(accelerator, r, model, reference)
        set_seed(r.train.seed + accelerator.process_index)  # each process samples differently
        backend = build_backend(accelerator.unwrap_model(model), tokenizer, r, seed=torch.initial_seed() % 2**31)
        s = cls(resolved=resolved, run=run, accelerator=accelerator, tokenizer=tokenizer, model=model,
                reference=reference, optimizer=optimizer, scheduler=scheduler, backend=backend,
                reward_fns=checked.reward_fns, prompts=prompts,
                stream=PromptStream(prompts, seed=r.train.seed, shuffle=r.data.shuffle),
                curriculum=checked.curriculum,
                progress=Progress(r.log.progress, r.train.steps, accelerator.is_main_process))
        if checked.toolbox is not None:
            from grpocli.tools.turns import TurnLoop

            s.turns = TurnLoop(checked.toolbox, tokenizer, r)
        if zero_stage is not None:
            s.progress.note(describe(accelerator, model, zero_stage), always=accelerator.is_main_process)
        s._start(resume_from)
        return s

    def _start(self, resume_from: tuple[int, Any] | None) -> None:
        from grpocli.trainer.checkpoint import load_checkpoint

        acc, r = self.accelerator, self.recipe
        if resume_from is not None:
            saved = load_checkpoint(resume_from[1], accelerator=acc, model=self.model,
                                    optimizer=self.optimizer, scheduler=self.scheduler,
                                    reference=self.reference)
            self.state.load_state_dict(saved)
            self.stream.load_state_dict(saved)
            self.backend.sync_weights(acc.unwrap_model(self.model))
            self.progress.note(f"resuming from {resume_from[1]} (step {self.state.step})")
        if acc.is_main_process:
            self.run.root.mkdir(parents=True, exist_ok=True)
            # what ran, however it was launched: the processes, and the mixed precision accelerate
            # applied (fp16 on CPU applies none)
            from grpocli.trainer.sharding import FSDP2, is_sharded

            deepspeed = acc.state.deepspeed_plugin is not None  # DeepSpeed's own bf16/fp16, not autocast
            ran = {"num_processes": acc.num_processes,
                   "mixed_precision": acc.mixed_precision if acc.native_amp or deepspeed else "no",
                   "sharding": FSDP2 if is_sharded(acc.unwrap_model(self.model)) else "none"}
            self.run.config.write_text(to_toml(r.model_copy(update={"train": r.train.model_copy(update=ran)})),
                                       encoding="utf-8")
            self.metrics = MetricsLog(self.run, resume_step=self.state.step)
        if r.log.report_to:
            from grpocli.recipe import flatten

            config = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in flatten(r).items()}
            acc.init_trackers(self.resolved.name, config=config)  # flat scalars suit every tracker
        self.progress.resume_at(self.state.step)

    # -- prompts -------------------------------------------------------------------------
    def next_rows(self, n_global: int) -> list[dict[str, Any]]:
        """This process's share of the next n_global prompts (rendered rows)."""
        from grpocli.data.template import complete_rows

        acc = self.accelerator
        per = n_global // acc.num_processes
        chosen = self.state.take_pending()
        if chosen is not None:  # the curriculum chose them
            return complete_rows(chosen, self.recipe.data, self.tokenizer)[:per]
        return self.stream.take(n_global)[acc.process_index * per : (acc.process_index + 1) * per]

    def after_generation(self, rollouts: Any) -> None:
        """Let the curriculum pick the next prompts from how these scored."""
        if self.curriculum is None:
            return
        g = rollouts.group_size
        rows = self.curriculum(
            prompts=[row["prompt"] for row in rollouts.rows],
            completions=[rollouts.completions[i * g : (i + 1) * g] for i in range(rollouts.num_prompts)],
            rewards=rollouts.rewards.view(-1, g).tolist(), metas=rollouts.rows, state=self.state.curriculum_state,
            batch_size=rollouts.num_prompts, next_rows=self.stream, **self.recipe.train.curriculum_args,
        )
        self.state.pending_rows = list(rows) if rows is not None else None

    # -- run state -----------------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any]:
        """state.json of a checkpoint: the run's counters, the data position and the seed."""
        return {**self.state.state_dict(), **self.stream.state_dict(), "seed": self.recipe.train.seed}

    def nonfinite(self, metrics: dict[str, Any]) -> None:
        step = self.state.step
        if self.recipe.train.on_nonfinite_loss == "raise":
            raise TrainingStopped(
                f"the gradient norm at step {step} is not finite (loss {metrics.get('loss')})",
                where=f"step {step}", valid="finite losses",
                hint="lower train.learning_rate, set train.max_grad_norm, or on_nonfinite_loss = 'skip'",
            )
        if self.accelerator.is_main_process:
            self.progress.note(f"step {step}: non-finite gradient norm; the update was skipped", always=True)

    def show(self, metrics: dict[str, Any]) -> None:
        """The progress display, and live alerts (no learning signal, truncation, ...) once they start to hold."""
        self.progress.update(metrics, self.recipe.train.steps)
        if self.accelerator.is_main_process:
            for alert in self.watch.update(metrics):
                self.progress.note(f"warning: {alert.render()}", always=True)

    def close(self) -> None:
        self.progress.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.recipe.log.report_to:
            self.accelerator.end_training()
        self.backend.close()


def _models(r: Any) -> tuple[Any, Any, Any]:
    from grpocli.models import load_policy, load_reference, load_tokenizer

    tokenizer = load_tokenizer(r.model)
    model = load_policy(r.model, r.train.seed)
    reference = None  # beta = 0: no KL term, no reference
    if r.algorithm.beta > 0 and r.algorithm.reference == "server":  # a grpo ref-serve: no copy here
        from grpocli.reference.client import ReferenceClient

        reference = ReferenceClient.connect(r.algorithm)
    elif r.algorithm.beta > 0:
        reference = load_reference(r.model, r.train.seed)
    return tokenizer, model, reference


def _prepare(accelerator: Any, r: Any, model: Any, reference: Any) -> tuple[Any, Any, Any, Any]:
    """The policy wrapped for data-parallel training (DDP, FSDP2: grpocli.trainer.sharding, or DeepSpeed
    from accelerate's config: grpocli.trainer.deepspeed), its optimizer and schedule; under FSDP2 and
    ZeRO-3 an in-process reference model is sharded the same way."""
    from grpocli.trainer.sharding import FSDP2, mark, shard, sharding_of

    if sharding_of(r, accelerator) != FSDP2:
        from grpocli.trainer.deepspeed import zero3_reference

        optimizer, scheduler = _optimizer(r, model)
        model, optimizer = accelerator.prepare(model, optimizer)
        return model, zero3_reference(accelerator, reference), optimizer, scheduler
    if accelerator.is_fsdp2:  # accelerate's FSDP2 plugin (a GPU launch whose config selects it)
        optimizer, scheduler = _optimizer(r, model)
        model, optimizer = accelerator.prepare(model, optimizer)
        mark(model)
    else:  # grpo shards: accelerate applies FSDP on GPUs only, and only from its config
        model = shard(model, accelerator, r.train.mixed_precision)
        optimizer, scheduler = _optimizer(r, model)  # over the shards
        optimizer = accelerator.prepare(optimizer)
    if isinstance(reference, torch.nn.Module):  # not a grpo ref-serve client: that holds no weights here
        reference = shard(reference, accelerator, r.train.mixed_precision)
    return model, reference, optimizer, scheduler


def _optimizer(r: Any, model: Any) -> tuple[Any, Any]:
    from transformers import get_scheduler

    t = r.train
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=t.learning_rate, betas=(t.adam_beta1, t.adam_beta2),
                                  weight_decay=t.weight_decay, fused=_fused_ok(params))
    scheduler = get_scheduler(t.lr_scheduler, optimizer, num_warmup_steps=t.warmup_steps,
                              num_training_steps=t.steps)
    return optimizer, scheduler


def _fused_ok(params: list) -> bool:
    """Fused AdamW (one kernel for all parameters, as TRL uses) where torch has it for the dtype."""
    return all(p.dtype in (torch.float32, torch.float16, torch.bfloat16) for p in params) and all(
        p.device.type in ("cpu", "cuda") for p in params)


__all__ = ["Session", "TrainingStopped"]
