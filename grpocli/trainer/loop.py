"""The GRPO training loop. One generation batch per cycle, read top to bottom:

    1. prompts        the stream (or the curriculum) gives B prompts, split over processes
    2. generate       G completions per prompt from the backend
    3. rewards        every reward function, weighted; per-reward metrics
    4. advantages     group-relative, over all processes; zero-spread groups dropped
    5. micro-batches  only sequences that carry signal; old / reference log-probs if needed
    6. update         num_iterations x steps_per_generation optimizer steps
    7. sync           new weights to the generation backend
    8. record         metrics.jsonl, rollouts, checkpoint
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch

from grpocli.algorithms import ADVANTAGES, overlong_penalty, zero_spread_groups
from grpocli.evaluation.training import evaluate_during_training, prepare_evaluation
from grpocli.generation.base import Sampling
from grpocli.recipe import Resolved
from grpocli.rewards import score
from grpocli.trainer.batching import make_micro_batches, select_sequences
from grpocli.trainer.checkpoint import save_checkpoint
from grpocli.trainer.metrics import gather_floats, length_metrics, write_rollouts
from grpocli.trainer.packing import choose_layout
from grpocli.trainer.mismatch import importance_weights, mismatch_metrics
from grpocli.trainer.prefetch import Prefetcher
from grpocli.trainer.rollouts import Rollouts
from grpocli.trainer.setup import Session, TrainingStopped
from grpocli.trainer.step import LossSettings, fill_logprobs, optimizer_step


# A step whose groups were all flat skips optimizer.step() but still advances the schedule.
warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")


def train(resolved: Resolved) -> None:
    """Run `grpo train` in this process (one of several under `accelerate launch`)."""
    s = Session.open(resolved)
    loop = None
    try:
        prepare_evaluation(s)  # a wrong eval split fails now, not at the first evaluation
        loop = Loop(s)
        loop.run()
    finally:
        if loop is not None and loop.prefetch:
            loop.prefetch.close()
        s.close()


class Loop:
    def __init__(self, s: Session) -> None:
        self.s = s
        r = s.recipe
        self.sampling = Sampling.from_section(r.generation)
        self.settings = LossSettings(
            loss=r.algorithm.loss, epsilon_low=r.algorithm.epsilon_low,
            epsilon_high=r.algorithm.epsilon_high, beta=r.algorithm.beta,
            kl_estimator=r.algorithm.kl_estimator, temperature=r.generation.temperature,
            max_completion_length=r.generation.max_completion_length,
        )
        self.cycle = r.train.steps_per_generation * r.algorithm.num_iterations
        self.last_sync = 0.0
        self.prefetch = None
        if r.generation.async_steps:
            self.prefetch = Prefetcher(s.backend, ahead=r.generation.async_steps, sampling=self.sampling,
                                       n=r.generation.num_generations, render=s.render)

    def run(self) -> None:
        s, r = self.s, self.s.recipe
        while s.step < r.train.steps:
            timings: dict[str, float] = {"time/weight_sync": self.last_sync}
            cycle_start = s.step
            rollouts = self.collect(timings)                       # phases 1-4
            slices = self.slices(rollouts, timings)                         # phase 5
            for _ in range(r.algorithm.num_iterations):                     # phase 6
                for part, batches in slices:
                    if s.step >= r.train.steps:
                        break
                    t0 = time.perf_counter()
                    stats = optimizer_step(s.accelerator, s.model, s.optimizer, batches, self.settings,
                                           max_grad_norm=r.train.max_grad_norm)
                    lr = s.scheduler.get_last_lr()[0]
                    s.scheduler.step()
                    s.step += 1
                    timings["time/training"] = time.perf_counter() - t0
                    self.record(part, stats, timings, lr)           # phase 8
            t0 = time.perf_counter()
            if self.prefetch:
                self.prefetch.drain()  # a sync never overlaps a generation
            s.backend.sync_weights(s.accelerator.unwrap_model(s.model))    # phase 7
            s.maybe_refresh_reference()
            self.last_sync = time.perf_counter() - t0  # logged with the next cycle's steps
            evaluated = evaluate_during_training(s, s.step, since=cycle_start)
            if evaluated and s.accelerator.is_main_process:
                s.metrics.write({"step": s.step, **evaluated})
            self.maybe_checkpoint()
        s.progress.note(f"done: {s.step} steps; run directory {s.run.root}")

    # -- phases 1-4 ----------------------------------------------------------------------
    def collect(self, timings: dict[str, float]) -> Rollouts:
        s, r = self.s, self.s.recipe
        n_prompts = r.train.prompts_per_step * r.train.steps_per_generation
        if self.prefetch:  # generated while the previous batches trained
            t0 = time.perf_counter()
            rows, generated, generated_at = self.prefetch.next(lambda: s.next_rows(n_prompts), s.step)
            timings["time/generation"] = time.perf_counter() - t0  # the wait, not the overlap
            timings["generation/staleness"] = s.step - generated_at
            rollouts = self.sample(rows, timings, generated)
        else:
            rollouts = self.sample(s.next_rows(n_prompts), timings)                  # 1-3. [B*G]
        if r.algorithm.fill_batch:  # DAPO dynamic sampling: more rounds until no group is flat
            parts = [rollouts]
            for _ in range(r.algorithm.max_fill_rounds):
                have = sum(int((~self.flat_groups(p)).sum()) for p in parts)
                if self.fewest_over_processes(have) >= rollouts.num_prompts:
                    break
                parts.append(self.sample(s.next_rows(n_prompts), timings))
            rollouts = self.keep_informative(parts, rollouts.num_prompts)
            timings["fill_rounds"] = len(parts) - 1
        self.advantages(rollouts)                                                     # 4.
        s.after_generation(rollouts)
        return rollouts

    def sample(self, rows: list[dict], timings: dict[str, float], generated: Any = None) -> Rollouts:
        """Generate G completions for each row (unless given) and score them."""
        s, r = self.s, self.s.recipe
        if generated is None:
            t0 = time.perf_counter()
            generated = s.backend.generate([s.render(row) for row in rows], r.generation.num_generations,
                                           self.sampling)                             # [B*G]
            timings["time/generation"] = timings.get("time/generation", 0.0) + time.perf_counter() - t0
        rollouts = Rollouts(
            rows=rows, prompt_ids=generated.prompt_ids, completion_ids=generated.completion_ids,
            completions=s.tokenizer.batch_decode(generated.completion_ids, skip_special_tokens=True),
            truncated=torch.tensor(generated.truncated, dtype=torch.bool),
            group_size=r.generation.num_generations, engine_logprobs=generated.logprobs,
        )
        t0 = time.perf_counter()
        self.score(rollouts)
        timings["time/rewards"] = timings.get("time/rewards", 0.0) + time.perf_counter() - t0
        return rollouts

    @staticmethod
    def flat_groups(rollouts: Rollouts) -> torch.Tensor:
        return zero_spread_groups(rollouts.rewards.view(-1, rollouts.group_size))  # [B]

    def fewest_over_processes(self, count: int) -> int:
        """The smallest `count` of any process (all processes then take the same decision)."""
        return int(gather_floats(self.s.accelerator, torch.tensor([float(count)])).min())

    def keep_informative(self, parts: list[Rollouts], n: int) -> Rollouts:
        """The first n groups with reward spread (flat ones only where too few were found)."""
        merged = Rollouts.concat(parts)
        flat = self.flat_groups(merged).tolist()
        order = [i for i, f in enumerate(flat) if not f] + [i for i, f in enumerate(flat) if f]
        return merged.select_groups(sorted(order[:n]))

    def score(self, rollouts: Rollouts) -> None:
        s, r = self.s, self.s.recipe
        column = r.data.prompt_column
        scores = score(
            s.reward_fns, rollouts.prompts(column), rollouts.completions,
            rollouts.columns(exclude=(column, "prompt_text")), r.algorithm.reward_combination,
            completion_ids=rollouts.completion_ids,
        )
        total = torch.tensor(scores.total, dtype=torch.float32)  # [B*G]
        op = r.algorithm.overlong_penalty
        if op.buffer_length:
            total += overlong_penalty(rollouts.completion_lengths(), r.generation.max_completion_length,
                                      op.buffer_length, op.penalty)
        rollouts.rewards, rollouts.per_reward, rollouts.reward_errors = total, scores.per_reward, scores.errors

    def advantages(self, rollouts: Rollouts) -> None:
        """Group-relative advantages over all processes' groups, then this process's slice."""
        s, r = self.s, self.s.recipe
        g = rollouts.group_size
        everyone = gather_floats(s.accelerator, rollouts.rewards).view(-1, g)       # [W*B, G]
        adv = ADVANTAGES[r.algorithm.advantage_scale](everyone)                     # [W*B, G]
        zero = zero_spread_groups(everyone)                                          # [W*B]
        b, rank = rollouts.num_prompts, s.accelerator.process_index
        mine = slice(rank * b, (rank + 1) * b)
        keep = ~zero[mine] if r.algorithm.drop_zero_spread_groups else torch.ones(b, dtype=torch.bool)
        rollouts.advantages = adv[mine].reshape(-1)                                  # [B*G]
        rollouts.keep = keep.repeat_interleave(g)                                     # [B*G]
        s.group_stats = {"frac_reward_zero_std": float(zero.float().mean()),
                         "real_batch_size_ratio": float((~zero).float().mean())
                         if r.algorithm.drop_zero_spread_groups else 1.0}

    # -- phase 5 -------------------------------------------------------------------------
    def slices(self, rollouts: Rollouts, timings: dict[str, float]) -> list[tuple[Rollouts, list]]:
        """Split the generation batch into steps_per_generation optimizer batches of micro-batches."""
        s, r = self.s, self.s.recipe
        n_slices = r.train.steps_per_generation
        per = rollouts.num_prompts // n_slices
        out, t_logp, sums = [], 0.0, []
        for k in range(n_slices):
            part = rollouts.select_groups(list(range(k * per, (k + 1) * per)))
            batches = make_micro_batches(
                part, select_sequences(part, r.algorithm.mask_truncated_completions),
                max_sequences=r.train.micro_batch_size, max_tokens=r.train.max_tokens_per_micro_batch,
                layout=choose_layout(s.accelerator.unwrap_model(s.model)),
            )
            t0 = time.perf_counter()
            correct = r.vllm.importance_sampling_correction and part.engine_logprobs is not None
            if self.cycle > 1 or correct:  # the policy moves before these are used, or the engine differs
                fill_logprobs(s.accelerator.unwrap_model(s.model), batches, self.settings.temperature, "old_logp")
            if s.reference is not None:
                fill_logprobs(s.reference, batches, self.settings.temperature, "ref_logp")
            if correct:
                sums.append(importance_weights(part, batches, r.vllm.importance_sampling_cap))
            t_logp += time.perf_counter() - t0
            out.append((part, batches))
        timings["time/logprobs"] = t_logp
        s.mismatch = mismatch_metrics(s.accelerator, sums) if sums else {}
        return out

    # -- phase 8 -------------------------------------------------------------------------
    def record(self, part: Rollouts, stats: dict[str, float],
               timings: dict[str, float], lr: float) -> None:
        s, r = self.s, self.s.recipe
        acc = s.accelerator
        rewards = gather_floats(acc, part.rewards)                                   # [W*B*G]
        tokens = max(stats["tokens"], 1.0)
        generated = gather_floats(acc, part.completion_lengths()).sum()
        s.num_tokens += int(generated) + acc.reduce(
            torch.tensor(sum(len(p) for p in part.prompt_ids) * part.group_size, device=acc.device),
            reduction="sum").item()
        step_time = sum(v for k, v in timings.items() if k.startswith("time/"))
        metrics: dict[str, Any] = {
            "step": s.step, "epoch": s.epoch, "loss": stats["loss"],
            "reward": float(rewards.mean()), "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
            **self.reward_metrics(part), **length_metrics(part), **s.group_stats, **s.mismatch,
            "kl": stats["kl"] / tokens, "entropy": stats["entropy"] / tokens,
            "clip_ratio/low_mean": stats["clip_low"] / tokens, "clip_ratio/high_mean": stats["clip_high"] / tokens,
            "clip_ratio/region_mean": stats["clip_region"] / tokens,
            "grad_norm": stats["grad_norm"], "learning_rate": lr, "num_tokens": s.num_tokens,
            **{k: stats[k] for k in ("packed_ratio", "packed_token_ratio", "time/forward_backward",
                                     "time/optimizer") if k in stats},  # parts of time/training
            "skipped_update": stats["skipped"], **timings,
            "tokens_per_second": float(generated) / step_time if step_time else 0.0,
        }
        if stats["skipped"] and stats["tokens"]:
            s.nonfinite(metrics)
        if acc.is_main_process:
            s.metrics.write(metrics)
        if r.log.rollouts_every and s.step % r.log.rollouts_every == 0:
            write_rollouts(s.run, s.step, part, acc)  # every process: the main one writes all groups
        if r.log.report_to:
            acc.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=s.step)
        s.progress.update(metrics, r.train.steps)
        s.watch(metrics)

    def reward_metrics(self, part: Rollouts) -> dict[str, float]:
        out = {}
        for name, values in part.per_reward.items():
            v = gather_floats(self.s.accelerator, torch.tensor(
                [float("nan") if x is None else float(x) for x in values], dtype=torch.float32))
            ok = v[~torch.isnan(v)]
            out[f"rewards/{name}/mean"] = float(ok.mean()) if len(ok) else float("nan")
            out[f"rewards/{name}/std"] = float(ok.std()) if len(ok) > 1 else 0.0
            if part.reward_errors.get(name):
                out[f"rewards/{name}/errors"] = part.reward_errors[name]
        return out

    def maybe_checkpoint(self) -> None:
        s, r = self.s, self.s.recipe
        every = r.train.save_steps
        due = every and (s.step // every) > (s.last_saved // every)
        if due or s.step >= r.train.steps:
            save_checkpoint(
                s.run, s.step, accelerator=s.accelerator, model=s.model, tokenizer=s.tokenizer,
                optimizer=s.optimizer, scheduler=s.scheduler, state=s.state(), keep=r.train.save_total_limit,
                reference=s.reference if r.algorithm.ref_sync_steps else None,  # it moves: resume needs it
            )
            s.last_saved = s.step


__all__ = ["Loop", "TrainingStopped", "train"]
