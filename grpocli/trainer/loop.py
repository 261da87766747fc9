"""The GRPO training loop, one generation cycle at a time, read top to bottom:

    1. prompts        the stream (or the curriculum) gives B prompts, split over processes
    2. generate       Rollouts: G completions per prompt from the backend (multi-turn recipes: the
                      turn loop of grpocli.multiturn.turns, tools run between the model's turns);
                      generation.pipeline = "inflight": the first B groups the engine completed
                      (grpocli.trainer.pipeline), 1-2 in one
    3. rewards        Scored: every reward function, weighted, plus DAPO's overlong penalty
                      (`rollouts.score_rollouts`)
    4. advantages     Advantages: group-relative, over all processes (the recipe's estimator,
                      `rollouts.compute_advantages`); groups without reward spread marked
    5. slices         steps_per_generation Slices: the optimizer batch's micro-batches and the
                      frozen log-probs its loss needs (old policy, reference, engine weights), in
                      passes of train.logprob_micro_batch_size sequences where it is set
    6. update         num_iterations passes over the slices: one optimizer step per slice (the saved
                      activations in host memory with train.activation_offloading)
    7. sync           new weights to the generation backend after the cycle's last update (a colocated
                      engine asleep under vllm.sleep_mode wakes its weights first, then loads them;
                      in flight: between two engine steps, the requests in flight kept)
    8. record         one metrics.jsonl line per optimizer step; rollouts, evaluation, checkpoint; the
                      step's StepRecord to an observer where one watches (`grpo bench`: grpocli.trainer.observer)

Each phase returns what it computes as an immutable value (grpocli.trainer.rollouts: Rollouts,
Scored, Advantages, Sampled, Batch, Slice; the step's statistics); no phase fills in an
earlier one's value. The run's counters are `Session.state` (grpocli.trainer.session.RunState), and
the processes are asked through `Session.parallel` (grpocli.parallel).
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import torch

from grpocli.algorithms.packing import choose_layout
from grpocli.errors import Stopped
from grpocli.evaluation.live_probes import LiveProbes
from grpocli.evaluation.periodic import PeriodicEval
from grpocli.generation.base import Generated, Sampling
from grpocli.parallel.trackers import prefixed
from grpocli.recipe import Resolved
from grpocli.reference.client import ReferenceClient
from grpocli.reference.mixing import refresh_reference
from grpocli.rewards.scoring import trainer_state
from grpocli.rundir import RunDir, stopped_run
from grpocli.trainer.autofit import first_peak
from grpocli.trainer.batching import optimizer_batches
from grpocli.trainer.checkpoint import save_checkpoint
from grpocli.trainer.completion_log import completion_rows, print_completions
from grpocli.trainer.guard import Guard
from grpocli.trainer.metrics import (
    computed_metrics,
    cycle_shares,
    group_metrics,
    length_metrics,
    logged_metrics,
    reward_summary,
    training_parts,
    write_rollouts,
)
from grpocli.trainer.mismatch import importance_weights, mismatch_metrics
from grpocli.trainer.observer import StepObserver, StepRecord
from grpocli.trainer.offloading import ActivationOffloading
from grpocli.trainer.pipeline import InflightPipeline
from grpocli.trainer.prefetch import Prefetcher
from grpocli.trainer.refill import more_rounds
from grpocli.trainer.resizing import Resizing
from grpocli.trainer.rollouts import (
    Batch,
    Rollouts,
    Sampled,
    Slice,
    compute_advantages,
    score_rollouts,
)
from grpocli.trainer.session import Session, TrainingStopped, is_due
from grpocli.trainer.signals import StopSignals
from grpocli.trainer.step import Frozen, LossSettings, frozen_logprobs, optimizer_step


def train(resolved: Resolved) -> None:
    """Run `grpo train` in this process (one of several under `accelerate launch`); a collective that
    waits past train.collective_timeout stops it, saying what each process was doing (`Parallel.stalled`);
    SIGTERM or SIGINT stops it saying what was kept (grpocli.trainer.signals)."""
    with StopSignals(checkpoint_first=resolved.recipe.train.checkpoint_on_signal) as stops:
        try:
            _train(resolved, stops)
        except Stopped as stop:
            main = os.environ.get("RANK", "0") == "0"
            raise Stopped(stop.signum, kept=stopped_run(RunDir(resolved.output_dir())) if main else "") from None


def _train(resolved: Resolved, stops: StopSignals) -> None:
    s = Session.open(resolved)
    loop = None
    try:
        loop = Loop(s, stops)  # a wrong eval split fails here, before the first step
        loop.run()
    except RuntimeError as exc:
        stalled = s.parallel.stalled(exc, resolved.recipe.train.collective_timeout)
        if stalled is None:
            raise
        raise stalled from None
    finally:
        if loop is not None:
            loop.close()
        s.close()


class Loop:
    def __init__(self, s: Session, stops: StopSignals | None = None, *, observer: StepObserver | None = None,
                 steps_only: bool = False) -> None:
        """`observer`: told of each step (grpocli.trainer.observer); `steps_only`: no evaluation and no
        checkpoint between the steps (`grpo bench` times one of each after them)."""
        self.s = s
        self.stops = stops or StopSignals(checkpoint_first=False)  # none installed: signals act as Python's default
        self.observer, self.steps_only = observer, steps_only
        self.observed_at = 0.0  # when the previous step was recorded (perf_counter)
        r = s.recipe
        self.sampling = Sampling.from_section(r.generation)
        self.settings = LossSettings.of(r.algorithm, r.generation, r.distill, r.train.logits_chunk_tokens)
        self.evaluation = PeriodicEval.open(r, tokenizer=s.tokenizer, backend=s.backend, reward_fns=s.reward_fns,
                                            parallel=s.parallel, run_root=s.run.root, turns=s.turns,
                                            datasets=s.datasets)
        self.offload = ActivationOffloading(s.model) if r.train.activation_offloading else None
        self.layout = choose_layout(s.policy)  # how micro-batches lay out their rows (the model's attention)
        self.guard = Guard(s)  # train.guard: non-finite, KL, entropy after each step (grpocli.trainer.guard)
        self.probes = LiveProbes.open(r, s.reward_fns, s.tokenizer, s.progress, s.run.config,
                                      on=s.parallel.main and not steps_only)  # the check-rewards probes, live
        self.resizing = Resizing.of(r, s.parallel, note=lambda text: s.progress.note(text, always=True))  # OOM: split
        self.prefetch = self.pipeline = None
        self.idle_seen = 0.0  # the generation worker's idle seconds so far (async_steps)
        if r.generation.async_steps:
            self.prefetch = Prefetcher(s.backend, ahead=r.generation.async_steps, sampling=self.sampling,
                                       n=r.generation.num_generations)
        if r.generation.pipeline == "inflight":  # the engine steps on its own thread from now on
            self.pipeline = InflightPipeline.start(s, self.sampling)

    def doing(self, what: str, *, done: bool = False) -> None:
        """Say what this process does now (the next step's phases; `done`: the step just taken)."""
        self.s.parallel.doing(self.s.state.step + (0 if done else 1), what)

    def run(self) -> None:
        r, state = self.s.recipe, self.s.state
        if r.eval.on_start and state.step == 0 and self.evaluation is not None and not self.steps_only:
            self.maybe_evaluate(since=-1)  # TRL's eval_on_start
        self.observed_at = time.perf_counter()
        while state.step < r.train.steps:
            cycle_start = state.step
            batch = self.generate()                                                   # 1-4
            slices = self.prepare(batch)                                              # 5
            plan = [sl for _ in range(r.algorithm.num_iterations) for sl in slices][: r.train.steps - state.step]
            shares = cycle_shares(batch.seconds, sum(sl.seconds for sl in slices), len(plan))  # each step's share
            for k, sl in enumerate(plan):
                stats = self.update(sl)                                               # 6
                state.step += 1
                state.num_tokens += batch.num_tokens if k == 0 else 0
                self.maybe_refresh_reference()
                sync = self.sync() if k == len(plan) - 1 else 0.0                     # 7
                seconds = {**shares, "time/weight_sync": sync, "time/training": stats["time/training"]}  # they add up
                self.record(batch, sl, stats, seconds, completion_tokens=batch.completion_tokens / len(plan))  # 8
                self.observe(batch, slices, sl, stats, seconds, completion_tokens=batch.completion_tokens / len(plan),
                             cycle_steps=len(plan))
                if self.guard.act():  # rolled back to a checkpoint (of this cycle's start or before): generate again
                    break
            if not self.steps_only and state.step > cycle_start:  # not after a rollback
                self.maybe_evaluate(since=cycle_start)
                self.maybe_checkpoint()
            self.maybe_stop()  # `grpo train` ends a finished run with its summary (grpocli.inspection.run_summary)

    # -- phases 1-4 ----------------------------------------------------------------------
    def generate(self) -> Batch:
        """B prompts, G completions each, scored; advantages over every process's groups."""
        s, r = self.s, self.s.recipe
        n_prompts = r.train.prompts_per_step * r.train.steps_per_generation
        info: dict[str, float] = {}
        waited = 0.0
        if self.pipeline:  # 1-2. the first complete groups of an engine that never stops
            self.doing("generation (waiting for complete groups)")
            taken = self.pipeline.next_batch(s.state.step)
            waited = taken.waited  # the wait, not the overlap
            info.update(taken.info)
            sampled = [self.sample(taken.rows, taken.generated)]
        elif self.prefetch:  # generated while the previous batches trained
            t0 = time.perf_counter()
            rows, generated, generated_at = self.prefetch.next(lambda: s.next_rows(n_prompts), s.state.step)
            waited = time.perf_counter() - t0  # the wait, not the overlap
            info["generation/staleness"] = s.state.step - generated_at
            idle = self.prefetch.idle_seconds()
            info["generation/engine_idle"], self.idle_seen = idle - self.idle_seen, idle
            sampled = [self.sample(rows, generated)]
        else:
            sampled = [self.sample(s.next_rows(n_prompts))]                            # 1-3. [B*G]
        # DAPO's fill rounds until no group is flat (algorithm.fill_batch), or one for groups a failing reward
        # left with < 2 scored samples (grpocli.trainer.refill); `sampled` gets each round
        self.doing("advantages (every process's rewards gathered: first, the groups to fill or refill)")
        scored = more_rounds(sampled, lambda n: self.sample(s.next_rows(n)), r.algorithm, s.parallel, info,
                             n_prompts=n_prompts, may_refill=not (self.pipeline or self.prefetch))
        seconds = {"time/generation": sum((x.generation_s for x in sampled), waited),
                   "time/rewards": sum(x.rewards_s for x in sampled)}
        self.doing("advantages (every process's rewards gathered)")
        advantages = compute_advantages(s.parallel, scored, r.algorithm, reward_fns=s.reward_fns,   # 4.
                                        max_completion_length=r.generation.max_completion_length,
                                        keep_flat=self.settings.distill == "reverse_kl")
        s.after_generation(scored)
        rollouts = scored.rollouts
        completion_tokens = s.parallel.total(float(rollouts.model_lengths().sum()))  # the model's, as TRL
        prompt_tokens = s.parallel.total(sum(len(p) for p in rollouts.prompt_ids) * rollouts.group_size)
        info.update(logged_metrics(s.parallel, scored.logged_metrics))  # rewards' log_metric
        if s.turns is not None:  # tools/..., multi_turn/...
            info.update(s.turns.metrics([x.turns for x in sampled]))
        info.update(getattr(s.backend, "metrics", dict)())               # a server fleet's vllm/...
        return Batch(scored, advantages, seconds, info, int(prompt_tokens + completion_tokens), completion_tokens)

    def sample(self, rows: list[dict], generated: Generated | None = None) -> Sampled:
        """G completions for each row (generated now unless given), scored, and the seconds each took."""
        s, r = self.s, self.s.recipe
        g = r.generation.num_generations
        conversations, generation_s = None, 0.0
        if generated is None:
            self.doing("generation")
            t0 = time.perf_counter()
            if s.turns is not None:  # multi-turn: the whole batch advances turn by turn
                conversations = s.turns.sample(s.backend, rows, g, self.sampling)
                generated = conversations.generated                                   # [B*G]
            else:
                generated = s.backend.generate([row["prompt_text"] for row in rows], g, self.sampling)  # [B*G]
            generation_s = time.perf_counter() - t0
        rollouts = Rollouts(
            rows=rows, prompt_ids=generated.prompt_ids, completion_ids=generated.completion_ids,
            completions=s.tokenizer.batch_decode(generated.completion_ids, skip_special_tokens=True),
            truncated=torch.tensor(generated.truncated, dtype=torch.bool), group_size=g,
            engine_logprobs=generated.logprobs,
            completion_mask=conversations.completion_mask if conversations is not None else None,
            conversations=conversations.messages if conversations is not None else None,
            environments=conversations.environments if conversations is not None else None,
        )
        self.doing("rewards")
        t0 = time.perf_counter()
        state = trainer_state(global_step=s.state.step, max_steps=r.train.steps, epoch=s.epoch,
                              num_tokens=s.state.num_tokens)  # TRL's trainer_state keyword
        scored = score_rollouts(rollouts, s.reward_fns, r, state=state,  # 3. (a process that dies names them)
                                doing=lambda names: self.doing(f"rewards, calling {names}"))
        return Sampled(scored, conversations.stats if conversations is not None else None, generation_s,
                       time.perf_counter() - t0)

    # -- phase 5 -------------------------------------------------------------------------
    def prepare(self, batch: Batch) -> list[Slice]:
        """steps_per_generation optimizer batches, each with the frozen log-probs its loss needs."""
        s, r = self.s, self.s.recipe
        p, policy = s.parallel, s.policy
        moves = r.train.steps_per_generation * r.algorithm.num_iterations > 1  # the policy moves before use
        self.doing("frozen log-prob passes (old policy, reference, teacher)")
        out, layout = [], self.layout
        for part, adv, ob in optimizer_batches(p, batch.scored, batch.advantages, algorithm=r.algorithm,
                                               train=self.resizing.train, layout=layout,
                                               zero_advantage_rows_matter=self.settings.zero_advantage_rows_matter):
            t0 = time.perf_counter()
            mbs = ob.micro_batches
            correct = r.vllm.importance_sampling_correction and part.rollouts.engine_logprobs is not None
            old = None  # the policy that generated, or the ratio to the engine, needs it
            if moves or correct:
                old = self.frozen(policy, part.rollouts, mbs, layout)
            (ref, local_ref), (teacher, local_teacher) = (self.scored_by(m, part.rollouts, mbs, layout)
                                                          for m in (s.reference, s.teacher))
            weights, mismatch = None, {}
            if correct:
                weights, sums = importance_weights(part.rollouts, mbs, old, r.vllm)
                mismatch = mismatch_metrics(p, sums)
            out.append(Slice(part, adv, ob, Frozen(old, ref, weights, teacher), mismatch, time.perf_counter() - t0,
                             passes=(old is not None) + local_ref + local_teacher))
        return out

    def scored_by(self, model: Any, rollouts: Rollouts, mbs: tuple, layout: Any) -> tuple[Any, bool]:
        """(log-probs of the micro-batches under the reference or teacher `model`, whether a pass ran here):
        (None, False) without one; a server (a ReferenceClient) scores them there."""
        if isinstance(model, ReferenceClient):  # algorithm.reference = "server"; a served distill.teacher
            return model.micro_batch_logprobs(rollouts, mbs, self.settings.temperature), False
        if model is None:
            return None, False
        return self.frozen(model, rollouts, mbs, layout), True

    def frozen(self, model: Any, rollouts: Rollouts, mbs: tuple, layout: Any) -> tuple[torch.Tensor, ...]:
        """A model's log-probs of the micro-batches without gradient, in smaller passes after an out-of-memory."""
        def run(chunks: tuple | None) -> tuple[torch.Tensor, ...]:
            return frozen_logprobs(self.s.parallel, model, mbs, self.settings.temperature, chunks,
                                   budget=self.resizing.budget, chunk_tokens=self.settings.chunk_tokens)
        return self.resizing.frozen(run, rollouts, mbs, layout, self.s.state.step + 1)

    # -- phases 6-7 ----------------------------------------------------------------------
    def update(self, sl: Slice) -> dict[str, float]:
        """One optimizer step; its statistics (summed over processes), learning rate and time."""
        s, r = self.s, self.s.recipe
        self.doing("update (forward and backward passes, gradient all-reduce)")
        t0 = time.perf_counter()
        stats = self.resizing.step(  # split and redone after an out-of-memory (grpocli.trainer.resizing)
            lambda x: optimizer_step(s.parallel, s.model, s.optimizer, x.batch, x.frozen, self.settings,
                                     max_grad_norm=r.train.max_grad_norm, offload=self.offload,
                                     budget=self.resizing.budget), sl, self.layout, s.state.step + 1)
        lr = s.scheduler.get_last_lr()[0]
        with warnings.catch_warnings():  # a skipped update still advances the schedule
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
            s.scheduler.step()
        return {**stats, "learning_rate": lr, "time/training": time.perf_counter() - t0}

    def sync(self) -> float:
        """Send the new weights to the generation backend; the seconds it took."""
        self.doing("weight sync to the generation backend", done=True)
        t0 = time.perf_counter()
        if self.prefetch:
            self.prefetch.drain()  # a sync never overlaps a generation
        if self.pipeline:  # between two engine steps: nothing drained, the requests in flight go on
            self.pipeline.sync(self.s.policy, self.s.state.step)
        else:
            self.s.backend.sync_weights(self.s.policy)
        return time.perf_counter() - t0

    def maybe_refresh_reference(self) -> None:
        """TRL's SyncRefModelCallback: every ref_sync_steps optimizer steps, ref = a * policy + (1 - a) * ref,
        each tensor once (a tied lm_head too); with a reference server, the server mixes what is sent."""
        s, a = self.s, self.s.recipe.algorithm
        if s.reference is not None and is_due(a.ref_sync_steps, s.state.step):
            refresh_reference(s.reference, s.policy, s.parallel, a.ref_sync_alpha)

    # -- phase 8 -------------------------------------------------------------------------
    def record(self, batch: Batch, sl: Slice, stats: dict[str, float], seconds: dict[str, float], *,
               completion_tokens: float) -> None:
        """The step's metrics.jsonl line: its slice's figures, its phases' seconds (its own, and its share
        of the cycle's) and its share of the completion tokens generated (so tokens_per_second is the
        cycle's throughput)."""
        s, r = self.s, self.s.recipe
        p, step = s.parallel, s.state.step
        self.doing("metrics (every process's figures gathered)", done=True)
        step_time = sum(seconds.values())
        memory = self.resizing.metrics()  # memory/oom_splits, memory/peak
        first_peak(s, memory.get("memory/peak"))  # what "auto" chose against what the first step took
        metrics: dict[str, Any] = {
            "step": step, "epoch": s.epoch, "loss": stats["loss"],
            **reward_summary(p, sl.scored), **length_metrics(p, sl.scored.rollouts),
            **group_metrics(p, sl.advantages, r.algorithm.drop_zero_spread_groups), **sl.mismatch,
            **computed_metrics(stats, distilled=s.teacher is not None),
            "grad_norm": stats["grad_norm"], "learning_rate": stats["learning_rate"], "num_tokens": s.state.num_tokens,
            **{k: stats[k] for k in ("packed_ratio", "packed_token_ratio") if k in stats},
            "skipped_update": stats["skipped"], **seconds, **training_parts(stats), **batch.info, **memory,
            "tokens_per_second": completion_tokens / step_time if step_time else 0.0, "step_time": step_time,
        }
        metrics.update(self.probes.after(step, sl.scored))  # eval.reward_probes_every: check-rewards' probes (main)
        self.guard.check(metrics)  # a trip marks the line (guard/tripped); it is acted on once the step is recorded
        if p.main:
            s.metrics.write(metrics)
            if sl.scored.logged_metrics or sl.scored.extra:  # rewards' log_metric / log_extra names
                s.metrics.note_reward_logs(s.run, list(sl.scored.logged_metrics), list(sl.scored.extra))
        if is_due(r.log.rollouts_every, step):
            write_rollouts(s.run, step, sl.scored, sl.advantages, p,  # every process: the main one writes all groups
                           prompt_column=r.data.prompt_column)
        if r.log.report_to:
            p.accelerator.log(prefixed(metrics), step=step)  # TRL's train/ names
        s.show(metrics)
        if r.log.completions_to_print and p.main:  # TRL's num_completions_to_print
            print_completions(step, completion_rows(sl.scored, sl.advantages, r.log.completions_to_print), s.progress)

    def observe(self, batch: Batch, slices: list[Slice], sl: Slice, stats: dict[str, float], seconds: dict[str, float],
                *, completion_tokens: float, cycle_steps: int) -> None:
        """The step's StepRecord to the observer, if any (grpocli.trainer.observer)."""
        if self.observer is None:
            return
        self.observer.on_step(StepRecord.of(
            self.s.state.step, batch, slices, sl, skipped=bool(stats["skipped"]), seconds=seconds,
            wall=time.perf_counter() - self.observed_at, completion_tokens=completion_tokens, cycle_steps=cycle_steps))
        self.observed_at = time.perf_counter()  # the observer's time is not the next step's

    def maybe_evaluate(self, *, since: int) -> None:
        s = self.s
        if self.evaluation is None or not is_due(self.evaluation.every, s.state.step, since=since):
            return
        self.doing("evaluation", done=True)
        evaluated = self.evaluation.run(s.state.step)
        if s.parallel.main:
            s.metrics.write({"step": s.state.step, **evaluated})
        if s.recipe.log.report_to:
            s.parallel.accelerator.log(prefixed(evaluated), step=s.state.step)  # eval/ names, as TRL

    def maybe_checkpoint(self, *, now: bool = False) -> None:
        s, r, state = self.s, self.s.recipe, self.s.state
        if now or is_due(r.train.save_steps, state.step, since=state.last_saved) or state.step >= r.train.steps:
            self.doing("checkpoint (the main process writes, the others wait)", done=True)
            saved = s.checkpoint_state()
            if self.pipeline:  # the groups in flight (the live run keeps them): generated again first on resume
                saved["unfinished"] = sorted(s.parallel.gather_rows(self.pipeline.unfinished())) + state.unfinished
            save_checkpoint(
                s.run, state.step, parallel=s.parallel, model=s.model, tokenizer=s.tokenizer,
                optimizer=s.optimizer, scheduler=s.scheduler, state=saved,
                keep=r.train.save_total_limit,
                reference=s.reference if r.algorithm.ref_sync_steps else None,  # it moves: resume needs it
            )
            state.last_saved = state.step

    def maybe_stop(self) -> None:
        """With train.checkpoint_on_signal: a signal came during the steps just taken (on any process,
        the largest signal number agreed by all), so write their checkpoint and stop."""
        if not self.stops.checkpoint_first:
            return
        signum = -self.s.parallel.fewest(-(self.stops.pending or 0))  # the largest, the same on every process
        if signum:
            if self.s.state.last_saved != self.s.state.step:
                self.maybe_checkpoint(now=True)
            raise Stopped(signum)

    def close(self) -> None:
        if self.prefetch:
            self.prefetch.close()
        if self.pipeline:
            self.pipeline.close()


__all__ = ["Batch", "Loop", "Sampled", "Slice", "TrainingStopped", "train"]
