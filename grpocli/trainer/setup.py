"""A training session: everything the loop needs, opened in an order that fails early.

Names (rewards, dataset, curriculum) and the run directory are checked before any model loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from grpocli.errors import UserError
from grpocli.inspection.alerts import Watch
from grpocli.recipe import Resolved, to_toml
from grpocli.rundir import RunDir
from grpocli.data.stream import PromptStream
from grpocli.trainer.metrics import MetricsLog, Progress


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
    reference: Any
    optimizer: Any
    scheduler: Any
    backend: Any
    reward_fns: list
    prompts: Any            # RenderedPrompts: dataset rows rendered on access
    stream: PromptStream
    curriculum: Any
    metrics: Any
    progress: Progress
    step: int = 0
    last_saved: int = 0
    num_tokens: int = 0
    curriculum_state: dict = field(default_factory=dict)
    pending_rows: list | None = None
    group_stats: dict = field(default_factory=dict)
    mismatch: dict = field(default_factory=dict)
    warnings: Watch = field(default_factory=Watch)

    @property
    def recipe(self):
        return self.resolved.recipe

    @property
    def epoch(self) -> float:
        return self.stream.position / len(self.prompts)

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    @classmethod
    def open(cls, resolved: Resolved) -> Session:
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        r = resolved.recipe
        run = RunDir(resolved.output_dir())
        resume_from = _resume_point(run, r.train.resume, r.train.steps)
        # names first: a typo should not cost a model load
        from grpocli.data.source import load_dataset_for
        from grpocli.data.template import RenderedPrompts
        from grpocli.trainer.preflight import preflight

        checked = preflight(r)
        plugins, reward_fns, curriculum = checked.plugins, checked.reward_fns, checked.curriculum
        accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision=r.train.mixed_precision,
                                  log_with=r.log.report_to or None, project_dir=str(run.root))
        set_seed(r.train.seed)
        if r.train.torch_threads:
            torch.set_num_threads(r.train.torch_threads)
        dataset = load_dataset_for(r.data, plugins.datasets, r.data.split, r.train.seed)
        tokenizer, model, reference = _models(r)
        prompts = RenderedPrompts(dataset, r.data, tokenizer)
        optimizer, scheduler = _optimizer(r, model)
        model, optimizer = accelerator.prepare(model, optimizer)
        set_seed(r.train.seed + accelerator.process_index)  # each process samples differently
        backend = _backend(r, accelerator.unwrap_model(model), tokenizer)
        s = cls(resolved=resolved, run=run, accelerator=accelerator, tokenizer=tokenizer, model=model,
                reference=reference, optimizer=optimizer, scheduler=scheduler, backend=backend,
                reward_fns=reward_fns, prompts=prompts,
                stream=PromptStream(prompts, seed=r.train.seed, shuffle=r.data.shuffle),
                curriculum=curriculum, metrics=None,
                progress=Progress(r.log.progress, r.train.steps, accelerator.is_main_process))
        s._start(resume_from)
        return s

    def _start(self, resume_from: tuple[int, Any] | None) -> None:
        from grpocli.trainer.checkpoint import load_checkpoint

        acc, r = self.accelerator, self.recipe
        if resume_from is not None:
            state = load_checkpoint(resume_from[1], accelerator=acc, model=self.model,
                                    optimizer=self.optimizer, scheduler=self.scheduler,
                                    reference=self.reference)
            self.step = self.last_saved = state["step"]
            self.stream.position = state["position"]
            self.num_tokens = state.get("num_tokens", 0)
            self.curriculum_state = state.get("curriculum_state", {})
            self.pending_rows = state.get("pending_rows")
            self.backend.sync_weights(acc.unwrap_model(self.model))
            self.progress.note(f"resuming from {resume_from[1]} (step {self.step})")
        if acc.is_main_process:
            self.run.root.mkdir(parents=True, exist_ok=True)
            self.run.config.write_text(to_toml(r), encoding="utf-8")
            self.metrics = MetricsLog(self.run, resume_step=self.step)
        if r.log.report_to:
            from grpocli.recipe import flatten

            config = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in flatten(r).items()}
            acc.init_trackers(self.resolved.name, config=config)  # flat scalars suit every tracker
        self.progress.resume_at(self.step)

    # -- prompts -------------------------------------------------------------------------
    def next_rows(self, n_global: int) -> list[dict[str, Any]]:
        """This process's share of the next n_global prompts (rendered rows)."""
        from grpocli.data.template import complete_rows

        acc = self.accelerator
        per = n_global // acc.num_processes
        if self.pending_rows is not None:  # the curriculum chose them
            rows, self.pending_rows = self.pending_rows, None
            return complete_rows(rows, self.recipe.data, self.tokenizer)[:per]
        return self.stream.take(n_global)[acc.process_index * per : (acc.process_index + 1) * per]

    def render(self, row: dict[str, Any]) -> str:
        return row["prompt_text"]

    def after_generation(self, rollouts: Any) -> None:
        """Let the curriculum pick the next prompts from how these scored."""
        if self.curriculum is None:
            return
        g = rollouts.group_size
        rewards = rollouts.rewards.view(-1, g).tolist()
        rows = self.curriculum(
            prompts=[row["prompt"] for row in rollouts.rows],
            completions=[rollouts.completions[i * g : (i + 1) * g] for i in range(rollouts.num_prompts)],
            rewards=rewards, metas=rollouts.rows, state=self.curriculum_state,
            batch_size=rollouts.num_prompts, next_rows=self.stream, **self.recipe.train.curriculum_args,
        )
        self.pending_rows = list(rows) if rows is not None else None

    # -- reference model -----------------------------------------------------------------
    def maybe_refresh_reference(self) -> None:
        """TRL's sync_ref_model: every ref_sync_steps, ref = alpha * policy + (1 - alpha) * ref."""
        a = self.recipe.algorithm
        if self.reference is None or not a.ref_sync_steps or self.step % a.ref_sync_steps:
            return
        policy = self.accelerator.unwrap_model(self.model).state_dict()
        with torch.no_grad():
            for name, ref_param in self.reference.state_dict().items():
                ref_param.mul_(1 - a.ref_sync_alpha).add_(policy[name].to(ref_param.dtype), alpha=a.ref_sync_alpha)

    # -- run state -----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"step": self.step, "position": self.stream.position, "num_tokens": self.num_tokens,
                "curriculum_state": self.curriculum_state, "pending_rows": self.pending_rows,
                "seed": self.recipe.train.seed}

    def nonfinite(self, metrics: dict[str, Any]) -> None:
        if self.recipe.train.on_nonfinite_loss == "raise":
            raise TrainingStopped(
                f"the gradient norm at step {self.step} is not finite (loss {metrics.get('loss')})",
                where=f"step {self.step}", valid="finite losses",
                hint="lower train.learning_rate, set train.max_grad_norm, or on_nonfinite_loss = 'skip'",
            )
        if self.accelerator.is_main_process:
            self.progress.note(f"step {self.step}: non-finite gradient norm; the update was skipped", always=True)

    def watch(self, metrics: dict[str, Any]) -> None:
        """Live warnings (no learning signal, truncation, ...), shown once when they start to hold."""
        if self.accelerator.is_main_process:
            for warning in self.warnings.update(metrics):
                self.progress.note(f"warning: {warning.render()}", always=True)

    def close(self) -> None:
        self.progress.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.recipe.log.report_to:
            self.accelerator.end_training()
        self.backend.close()


def _resume_point(run: RunDir, resume: str, steps: int) -> tuple[int, Any] | None:
    from pathlib import Path

    if resume not in ("auto", "never"):
        path = Path(resume)
        if not (path / "trainer" / "state.json").exists():
            raise UserError(f"no checkpoint at {resume}", where="train.resume",
                            valid=", ".join(str(p) for _, p in run.list_checkpoints()) or "'auto' or 'never'",
                            hint=f"ls {run.checkpoints}")
        return int(path.name.rsplit("-", 1)[-1]), path
    latest = run.latest_checkpoint()
    if run.has_run() and resume == "never":
        raise UserError(
            f"the run directory {run.root} already holds a run", where="train.output_dir",
            valid="an empty or new directory", hint="pick another: train.output_dir=runs/new, or resume: train.resume=auto",
        )
    if latest is not None and latest[0] >= steps:
        raise UserError(
            f"the run in {run.root} is already complete (checkpoint step-{latest[0]}, train.steps = {steps})",
            where="train.output_dir", valid=f"train.steps > {latest[0]} to train on, or a new output_dir",
            hint=f"grpo inspect {run.root}   or   grpo train ... train.output_dir=runs/new",
        )
    return latest


def _models(r: Any) -> tuple[Any, Any, Any]:
    from grpocli.models import load_policy, load_reference, load_tokenizer

    tokenizer = load_tokenizer(r.model)
    model = load_policy(r.model, r.train.seed)
    reference = load_reference(r.model, r.train.seed) if r.algorithm.beta > 0 else None
    return tokenizer, model, reference


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


def _backend(r: Any, model: Any, tokenizer: Any) -> Any:
    gen = r.generation
    if gen.backend == "hf":
        from grpocli.generation.hf import HFBackend

        return HFBackend(model, tokenizer, max_prompt_length=r.data.max_prompt_length)
    if gen.backend == "vllm":  # an engine in this process, weights reloaded in place
        from grpocli.generation.vllm_colocate import VllmColocateBackend

        return VllmColocateBackend(model, tokenizer, max_prompt_length=r.data.max_prompt_length,
                                   max_completion_length=gen.max_completion_length, vllm_section=r.vllm,
                                   dtype=r.model.dtype, seed=torch.initial_seed() % 2**31)
    # "vllm-server": a `grpo vllm-serve` process; the policy's weights are sent at once
    from grpocli.generation.vllm_client import VllmServerBackend

    return VllmServerBackend(model, tokenizer, vllm_section=r.vllm, max_prompt_length=r.data.max_prompt_length)


__all__ = ["Session", "TrainingStopped"]
