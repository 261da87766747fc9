"""`Session`: everything the loop needs, opened in an order that fails early.

Names (rewards, dataset, curriculum, tools) and the run directory are checked before any model
loads (grpocli.trainer.preflight). The parallel strategy (grpocli.parallel) is chosen once here,
prepares the models, and is what the loop, the step, generation and checkpoints ask about the
processes. The run's counters live in `RunState` (here); the data position in the prompt stream (one
dataset's PromptStream, or a [[data.sources]] mixture's MixtureStream: one integer either way);
both are saved by checkpoints and restored here on resume. `is_due` is the one rule for "every N
steps" (checkpoints, evaluation, rollouts, reference refresh).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from grpocli.data.mixture import MixtureStream
from grpocli.data.stream import PromptStream
from grpocli.errors import UserError
from grpocli.inspection.alerts import Watch
from grpocli.parallel import Parallel
from grpocli.recipe import Recipe, Resolved, sources_json, to_toml
from grpocli.recipe.resume import Change, check_resume, saved_recipe
from grpocli.rewards import RewardFn
from grpocli.rundir import RunDir, resume_point
from grpocli.trainer.autofit import Fit, fit_micro_batch, record
from grpocli.trainer.metrics import MetricsLog, Progress
from grpocli.trainer.rollouts import Scored

if TYPE_CHECKING:
    from grpocli.data.template import RenderedPrompts
    from grpocli.generation.base import GenerationBackend
    from grpocli.multiturn.turns import TurnLoop
    from grpocli.recipe.schema import TrainSection
    from grpocli.registry import Registry


class TrainingStopped(UserError):
    """Training stopped on purpose, exit 2: train.guard tripped with action 'stop' (or no rollback was left),
    or a non-finite loss with on_nonfinite_loss = 'raise' (grpocli.trainer.guard)."""


@dataclass
class RunState:
    step: int = 0                                   # optimizer steps taken
    num_tokens: int = 0                             # prompt + completion tokens generated, all processes
    last_saved: int = 0                             # step of the newest checkpoint (0: none yet)
    curriculum_state: dict[str, Any] = field(default_factory=dict)  # the curriculum's own memory
    pending_rows: list[dict[str, Any]] | None = None  # rows the curriculum chose for the next batch
    unfinished: list[int] = field(default_factory=list)  # stream positions of groups generated in flight and not
                                                         # yet trained (generation.pipeline = "inflight"): again first
    lr_scale: float = 1.0                           # the learning rate's factor after train.guard's rollbacks

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "num_tokens": self.num_tokens, "curriculum_state": self.curriculum_state,
                "pending_rows": self.pending_rows, "unfinished": list(self.unfinished), "lr_scale": self.lr_scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's state (which was saved at its own step)."""
        self.step = self.last_saved = int(state["step"])
        self.num_tokens = int(state.get("num_tokens", 0))
        self.curriculum_state = dict(state.get("curriculum_state") or {})
        self.pending_rows = state.get("pending_rows")
        self.unfinished = [int(p) for p in state.get("unfinished") or []]
        self.lr_scale = float(state.get("lr_scale", 1.0))

    def take_pending(self) -> list[dict[str, Any]] | None:
        """The rows the curriculum chose, once (None when it chose none)."""
        rows, self.pending_rows = self.pending_rows, None
        return rows


def is_due(every: int | None, step: int, since: int | None = None) -> bool:
    """True when something done every ``every`` optimizer steps is due at ``step``.

    Without ``since``: ``step`` is a multiple of ``every``. With ``since`` (the step when it was
    last considered, e.g. the start of a generation cycle of several optimizer steps): a multiple
    of ``every`` lies in (since, step], so no multiple is skipped. ``every`` of 0 or None: never.
    """
    if not every or every <= 0:
        return False
    if since is None:
        return step % every == 0
    return step // every > since // every


@dataclass
class Session:
    resolved: Resolved
    run: RunDir
    parallel: Parallel      # how the processes share the work (grpocli.parallel)
    tokenizer: Any
    model: Any              # the policy, prepared for training (DDP, FSDP2, a DeepSpeed engine)
    reference: Any          # None when beta = 0; a model; a ReferenceClient with algorithm.reference = "server"
    optimizer: Any
    scheduler: Any
    backend: GenerationBackend
    reward_fns: list[RewardFn]
    prompts: RenderedPrompts  # dataset rows rendered on access (with [[data.sources]]: every source's, MixedRows)
    stream: PromptStream | MixtureStream  # the order they are drawn in
    curriculum: Callable[..., Any] | None
    progress: Progress
    turns: TurnLoop | None = None  # multi-turn recipes (tools, environment)
    datasets: Registry | None = None  # the dataset loaders preflight found (evaluation loads its split with them)
    metrics: MetricsLog | None = None  # main process only
    state: RunState = field(default_factory=RunState)
    watch: Watch = field(default_factory=Watch)
    fit: Fit | None = None  # what train.micro_batch_size = "auto" became, and why (grpocli.trainer.autofit)
    teacher: Any = None     # [distill]: a frozen model, or a ReferenceClient for a served one (grpocli.trainer.teacher)

    @property
    def recipe(self) -> Recipe:
        return self.resolved.recipe

    @property
    def policy(self) -> Any:
        """The policy without the strategy's wrapper (what generation, weight syncs and the frozen passes use)."""
        return self.parallel.unwrap(self.model)

    @property
    def epoch(self) -> float:
        return self.stream.position / len(self.prompts)

    @classmethod
    def open(cls, resolved: Resolved) -> Session:
        from accelerate.utils import set_seed

        from grpocli.generation.backends import build_backend
        from grpocli.parallel import start
        from grpocli.recipe.duration import resolve_duration
        from grpocli.trainer.preflight import preflight

        r = resolved.recipe
        run = RunDir(resolved.output_dir())
        # num_train_epochs needs the split's rows: then the names are checked (and the split loaded) first
        early = preflight(r) if r.train.num_train_epochs is not None else None
        rows = len(early.dataset) if early else 0
        resume_from = resume_point(run, r.train.resume, resolve_duration(resolved, rows)[0].recipe.train.steps)
        saved = _saved(resume_from, run)
        resolved, durations = resolve_duration(resolved, rows, saved=saved.get("train"))
        resolved, fit = fit_micro_batch(resolved, saved)  # "auto" sizes, before a model loads (grpocli.trainer.autofit)
        r = resolved.recipe
        changed = check_resume(resolved, resume_from[1], run.config) if resume_from else []
        checked = early or preflight(r)  # names first: a typo should not cost a model load
        parallel = start(r, run.root, resolved.name)
        _check_memory(r, parallel)  # a recipe that cannot fit stops before a model loads
        set_seed(r.train.seed)
        if r.train.torch_threads:
            torch.set_num_threads(r.train.torch_threads)
        with parallel.loading():  # ZeRO-3 partitions the models at prepare, not at load
            tokenizer, model, reference, teacher = _models(r, parallel)
        parallel.split_models(model, reference, teacher)  # train.sequence_parallel: Ulysses attention
        prompts, stream = _prompt_stream(checked, r, tokenizer)  # one dataset, or [[data.sources]] mixed
        model, reference, optimizer, scheduler = parallel.prepare(model, reference, lambda m: _optimizer(r.train, m))
        set_seed(r.train.seed + parallel.rank)  # each process samples differently
        backend = build_backend(parallel.unwrap(model), tokenizer, r, seed=torch.initial_seed() % 2**31,
                                parallel=parallel)
        turns = None
        if checked.toolbox is not None:
            from grpocli.multiturn.turns import TurnLoop

            turns = TurnLoop(checked.toolbox, tokenizer, r, parallel)
        s = cls(resolved=resolved, run=run, parallel=parallel, tokenizer=tokenizer, model=model,
                reference=reference, optimizer=optimizer, scheduler=scheduler, backend=backend,
                reward_fns=checked.reward_fns, prompts=prompts,
                stream=stream,
                curriculum=checked.curriculum, turns=turns, datasets=checked.plugins.datasets,
                progress=Progress(r.log.progress, r.train.steps, parallel.main), fit=fit, teacher=teacher)
        for note in durations:
            s.progress.note(note, always=parallel.main)
        described, warning = parallel.describe(model), parallel.low_precision_warning(model)
        if described:
            s.progress.note(described, always=parallel.main)
        if warning:
            s.progress.note(f"warning: {warning}", always=parallel.main)
        if backend.lockstep:  # generating with the sharded policy itself
            s.progress.note("warning: generation.backend = \"hf\" on a sharded policy gathers every layer's "
                            "parameters for every token it generates (slow on GPUs); generation.backend = \"vllm\" "
                            "or \"vllm-server\" generates from a whole copy", always=parallel.main)
        s._start(resume_from, changed)
        return s

    def _start(self, resume_from: tuple[int, Any] | None, changed: list[Change]) -> None:
        from grpocli.trainer.checkpoint import load_checkpoint

        p, r = self.parallel, self.recipe
        if resume_from is not None:
            saved = load_checkpoint(resume_from[1], parallel=p, model=self.model, optimizer=self.optimizer,
                                    scheduler=self.scheduler, reference=self.reference)
            self.state.load_state_dict(saved)
            self.stream.load_state_dict(saved)
            self.backend.sync_weights(self.policy)
            self.progress.note(f"resuming from {resume_from[1]} (step {self.state.step})")
        if p.main:
            self.run.root.mkdir(parents=True, exist_ok=True)
            self._keep_history(resume_from, changed)
            # what ran, however it was launched: the processes, the mixed precision applied, the sharding
            ran = {"num_processes": p.size, "mixed_precision": p.precision, "sharding": p.recipe_sharding}
            ran_recipe = r.model_copy(update={"train": r.train.model_copy(update=ran)})
            self.run.config.write_text(to_toml(ran_recipe), encoding="utf-8")
            self.run.config_sources.write_text(sources_json(self.resolved, ran_recipe), encoding="utf-8")
            if self.fit is not None:
                record(self.run.config, self.fit.reason())
                self.progress.note(self.fit.reason(), always=True)
            self.metrics = MetricsLog(self.run, resume_step=self.state.step)
        if r.log.report_to:
            from grpocli.recipe import flatten

            config = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in flatten(r).items()}
            p.accelerator.init_trackers(self.resolved.name, config=config)  # flat scalars suit every tracker
        self.progress.resume_at(self.state.step)

    def _keep_history(self, resume_from: tuple[int, Any] | None, changed: list[Change]) -> None:
        """Keep what earlier parts of the run ran with, before config.resolved.toml and metrics.jsonl
        are written for this one (a resume with a changed recipe; a start over a run that never checkpointed)."""
        if resume_from is None:
            kept = self.run.set_aside_attempt()
            if kept is not None:
                self.progress.note(
                    f"warning: {self.run.root} holds metrics of {kept[1]} steps but no checkpoint to resume from "
                    "(that run stopped before its first one; train.save_steps sets how often they are written): "
                    f"training starts at step 0, and that run's metrics, config and rollouts are kept in {kept[0]}",
                    always=True)
            return
        saved = saved_recipe(resume_from[1], self.run.config) if changed else None
        if saved is not None:
            kept_at = self.run.keep_config(self.state.step, saved[1])
            said = "; ".join(c.render() for c in changed if c.key != "train.allow_changes")
            self.progress.note(f"resuming with {said}; the config steps up to "
                               f"{self.state.step} ran with is kept in {kept_at}", always=True)

    # -- prompts -------------------------------------------------------------------------
    def next_rows(self, n_global: int) -> list[dict[str, Any]]:
        """This process's share of the next n_global prompts (rendered rows)."""
        from grpocli.data.template import complete_rows

        chosen = self.state.take_pending()
        if chosen is not None:  # the curriculum chose them
            return complete_rows(chosen, self.recipe.data, self.tokenizer)[: n_global // self.parallel.size]
        return [row for _, row in self.next_numbered_rows(n_global)]

    def next_numbered_rows(self, n_global: int) -> list[tuple[int, dict[str, Any]]]:
        """This process's share of the next n_global prompts, each with its position in the prompt
        stream: first the ones a checkpoint left unfinished (`RunState.unfinished`), then the stream's next."""
        p = self.parallel
        per = n_global // p.size
        again, self.state.unfinished = self.state.unfinished[:n_global], self.state.unfinished[n_global:]
        start = self.stream.position
        fresh = self.stream.take(n_global - len(again))
        numbered = [(pos, self.stream.row_at(pos)) for pos in again] + list(zip(range(start, start + len(fresh)),
                                                                                 fresh, strict=True))
        return numbered[p.rank * per : (p.rank + 1) * per]

    def after_generation(self, scored: Scored) -> None:
        """Let the curriculum pick the next prompts from how these scored."""
        if self.curriculum is None:
            return
        rollouts, g = scored.rollouts, scored.rollouts.group_size
        rows = self.curriculum(
            prompts=[row["prompt"] for row in rollouts.rows],
            completions=[rollouts.completions[i * g : (i + 1) * g] for i in range(rollouts.num_prompts)],
            rewards=scored.rewards.view(-1, g).tolist(), metas=rollouts.rows, state=self.state.curriculum_state,
            batch_size=rollouts.num_prompts, next_rows=self.stream, **self.recipe.train.curriculum_args,
        )
        self.state.pending_rows = list(rows) if rows is not None else None

    # -- run state -----------------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any]:
        """state.json of a checkpoint: the run's counters, the data position and the seed."""
        return {**self.state.state_dict(), **self.stream.state_dict(), "seed": self.recipe.train.seed}

    def show(self, metrics: dict[str, Any]) -> None:
        """The progress display, and live alerts (no learning signal, truncation, ...) once they start to hold."""
        self.progress.update(metrics, self.recipe.train.steps)
        if self.parallel.main:
            for alert in self.watch.update(metrics):
                self.progress.note(f"warning: {alert.render()}", always=True)

    def close(self) -> None:
        self.progress.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.recipe.log.report_to:
            self.parallel.accelerator.end_training()
        self.backend.close()


def _saved(resume_from: tuple[int, Any] | None, run: RunDir) -> dict[str, Any]:
    """The recipe the checkpoint to resume from was trained with, as tables ({}: no resume, or no record)."""
    import tomllib

    saved = saved_recipe(resume_from[1], run.config) if resume_from else None
    try:
        return tomllib.loads(saved[1]) if saved else {}
    except (tomllib.TOMLDecodeError, AttributeError):
        return {}


def _prompt_stream(checked: Any, r: Recipe, tokenizer: Any) -> tuple[Any, PromptStream | MixtureStream]:
    """The rendered prompts and the order they are drawn in: the dataset's PromptStream, or with [[data.sources]]
    each source rendered with its own keys and drawn by weight (grpocli.data.mixture); its rows carry `_source`."""
    from grpocli.data.mixture import MixedRows
    from grpocli.data.template import RenderedPrompts

    if not r.data.sources:
        prompts = RenderedPrompts(checked.dataset, r.data, tokenizer)
        return prompts, PromptStream(prompts, seed=r.train.seed, shuffle=r.data.shuffle)
    parts = [(source.label, RenderedPrompts(rows, source.section(r.data), tokenizer))
             for source, rows in zip(r.data.sources, checked.sources, strict=True)]
    stream = MixtureStream(parts, [source.weight for source in r.data.sources], seed=r.train.seed,
                           shuffle=r.data.shuffle)
    return MixedRows(parts), stream


def _models(r: Recipe, parallel: Parallel) -> tuple[Any, Any, Any, Any]:
    """The tokenizer, policy, reference (None when beta = 0) and teacher (None without [distill]); a local
    teacher loads first (a wrong one costs no policy load), a served one is connected to after the policy."""
    from grpocli.models import load_policy, load_reference, load_tokenizer
    from grpocli.trainer.teacher import connect_teacher, open_teacher

    device = parallel.load_device  # a GPU: the weights load straight onto it, not whole on the host
    tokenizer = load_tokenizer(r.model)
    teacher = open_teacher(r, tokenizer, device=device)
    model = load_policy(r.model, r.train.seed, device=device)
    teacher = teacher or connect_teacher(r, model, parallel)
    reference = None  # beta = 0: no KL term, no reference
    if r.algorithm.beta > 0 and r.algorithm.reference == "server":  # a grpo ref-serve: no copy here
        from grpocli.reference.client import ReferenceClient

        reference = ReferenceClient.connect(r.algorithm, parallel)
    elif r.algorithm.beta > 0:
        reference = load_reference(r.model, r.train.seed, device=device)
    return tokenizer, model, reference, teacher


def _check_memory(r: Recipe, parallel: Parallel) -> None:
    """train.memory_check on a CUDA device: grpo plan's prediction against the device's memory (UserError if
    it does not fit); nothing on other devices."""
    if not r.train.memory_check or parallel.device.type != "cuda":
        return
    from grpocli.planning import check_fits

    total = torch.cuda.get_device_properties(parallel.device).total_memory
    check_fits(r, gpus=parallel.size, gpu_memory=total, sharding=parallel.sharding)


def _optimizer(t: TrainSection, model: Any) -> tuple[Any, Any]:
    """AdamW over the parameters to train (fused where torch has it for their dtype and device, as
    TRL uses) and [train]'s learning-rate schedule."""
    from transformers import get_scheduler

    params = [p for p in model.parameters() if p.requires_grad]
    fused = all(p.dtype in (torch.float32, torch.float16, torch.bfloat16) for p in params) and all(
        p.device.type in ("cpu", "cuda") for p in params)
    optimizer = torch.optim.AdamW(params, lr=t.learning_rate, betas=(t.adam_beta1, t.adam_beta2),
                                  weight_decay=t.weight_decay, fused=fused)
    scheduler = get_scheduler(t.lr_scheduler, optimizer, num_warmup_steps=t.warmup_steps,
                              num_training_steps=t.steps)
    return optimizer, scheduler


__all__ = ["RunState", "Session", "TrainingStopped", "is_due"]
