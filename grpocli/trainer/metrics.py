"""What a training step writes and shows: its metrics.jsonl line (the batch-describing parts of
it and the time keys), rollouts/step-N.jsonl, and the terminal's progress display.

Every figure of a line describes the optimizer batch of that step (its slice of the generation
batch), gathered over all processes: rewards, per-reward metrics (the same code as `grpo eval`,
grpocli.rewards.reward_metrics), completion lengths and the groups without reward spread; with
[[data.sources]], each source's too (`source_metrics`: reward/<source>, rewards/<source>/<reward>/mean).
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

import torch

from grpocli.parallel import Parallel
from grpocli.recipe.data_sources import SOURCE_COLUMN
from grpocli.rewards import Scores, reward_metrics
from grpocli.rewards.timings import slowest_metrics
from grpocli.rundir import RunDir, read_jsonl_lines
from grpocli.trainer.rollouts import Advantages, Rollouts, Scored


class MetricsLog:
    """Appends one JSON line per step (main process only), flushed so a crash loses at most one.

    On resume the file is rewritten with the lines up to the checkpoint's step; lines that cannot
    be read (a torn or non-UTF-8 tail left by SIGKILL or a full disk) are dropped with a warning.
    """

    def __init__(self, run: RunDir, *, resume_step: int) -> None:
        self.path = run.metrics
        run.root.mkdir(parents=True, exist_ok=True)
        found = read_jsonl_lines(self.path)
        if found.skipped:
            lines = ", ".join(map(str, found.skipped[:5])) + (" ..." if len(found.skipped) > 5 else "")
            what = "a torn last line" if found.torn and len(found.skipped) == 1 else f"lines {lines}"
            print(f"warning: {self.path}: dropping {what} (not UTF-8 JSON: a write cut short by a crash "
                  f"or a full disk); the other lines are kept", file=sys.stderr, flush=True)
        kept = [m for m in found.rows if _step(m) <= resume_step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        try:
            tmp.write_text("".join(json.dumps(m) + "\n" for m in kept), encoding="utf-8")
        except OSError as err:  # a full disk: metrics.jsonl itself is untouched
            tmp.unlink(missing_ok=True)
            raise OSError(err.errno, err.strerror, str(tmp)) from err
        os.replace(tmp, self.path)  # steps after the checkpoint we resume from are redone
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._failed = False

    def note_reward_logs(self, run: RunDir, metrics: list[str], columns: list[str]) -> None:
        """Add these log_metric / log_extra names to <run>/reward_logs.json (for `grpo inspect RUN`)."""
        path = run.reward_logs
        try:
            known = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        except (OSError, ValueError):
            known = {}
        merged = {"metrics": sorted({*known.get("metrics", []), *metrics}),
                  "columns": sorted({*known.get("columns", []), *columns})}
        if merged != known:
            path.write_text(json.dumps(merged) + "\n", encoding="utf-8")

    def write(self, metrics: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        try:
            self._file.write(json.dumps(clean) + "\n")
            self._file.flush()
        except OSError as err:  # a full disk: name the file (a file object's errors do not)
            self._failed = True
            raise OSError(err.errno, err.strerror, str(self.path)) from err

    def close(self) -> None:
        try:
            self._file.close()
        except OSError as err:  # flushing what a failed write left in the buffer fails again
            if not self._failed:  # ... and that first error is the one on its way out
                raise OSError(err.errno, err.strerror, str(self.path)) from err


class Progress:
    """A rich progress bar on a terminal, plain lines otherwise, nothing with 'none'."""

    SHOWN = (("reward", "reward"), ("kl", "kl"), ("completions/mean_length", "len"),
             ("frac_reward_zero_std", "zero_std"), ("tokens_per_second", "tok/s"))

    def __init__(self, mode: str, total: int, enabled: bool) -> None:
        self.mode = "rich" if mode == "auto" and sys.stderr.isatty() else ("plain" if mode == "auto" else mode)
        self.enabled = enabled and self.mode != "none"
        self._bar = None
        if self.enabled and self.mode == "rich":
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn("step"), MofNCompleteColumn(), BarColumn(), TimeRemainingColumn(),
                            TextColumn("{task.fields[info]}"), transient=False)
            self._task = self._bar.add_task("train", total=total, info="")
            self._bar.start()

    @property
    def console(self) -> Any:
        """The rich console above the progress bar (None: plain lines or nothing)."""
        return self._bar.console if self._bar is not None else None

    def resume_at(self, step: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=step)

    def update(self, metrics: dict[str, Any], total: int) -> None:
        if not self.enabled:
            return
        info = "  ".join(f"{name} {metrics[key]:.4g}" for key, name in self.SHOWN
                         if isinstance(metrics.get(key), (int, float)))
        if self._bar is not None:
            self._bar.update(self._task, completed=metrics["step"], info=info)
        else:
            print(f"step {metrics['step']}/{total}  {info}", file=sys.stderr, flush=True)

    def note(self, text: str, *, always: bool = False) -> None:
        """A line above the progress display; `always` prints it even with log.progress='none'."""
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
        elif self.enabled or always:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _step(row: dict[str, Any]) -> float:
    """A line's step (0 when it has none; an unreadable one sorts after every checkpoint)."""
    step = row.get("step", 0)
    return step if isinstance(step, (int, float)) else math.inf


def write_rollouts(run: RunDir, step: int, scored: Scored, advantages: Advantages, parallel: Parallel, *,
                   prompt_column: str = "prompt") -> None:
    """rollouts/step-N.jsonl: prompt, completion, each reward, total reward, advantage, and under
    "columns" the prompt's other dataset columns (the gold answer, ...), as eval's samples.jsonl;
    a row some reward could not score (on_error = "mask") has "masked": the names of those rewards;
    "seconds": each reward's seconds on the row, where known (grpocli.rewards.timings).

    Every process must call it: each one's rows are gathered in rank order and the main process
    writes them all; `group` is the group's index over all processes.
    """
    rollouts = scored.rollouts
    g = rollouts.group_size
    first = parallel.rank * rollouts.num_prompts
    columns = [dataset_columns(row, prompt_column) for row in rollouts.rows]  # [B]
    masked = [[k for k, v in scored.masked_by.items() if v[i]] for i in range(len(rollouts.completions))]  # [B*G]
    seconds = [{k: v[i] for k, v in scored.row_seconds.items() if v[i] is not None}  # [B*G] rewards.timings
               for i in range(len(rollouts.completions))]
    rows = [{
        "step": step,
        "group": first + i // g,
        "prompt": rollouts.rows[i // g]["prompt_text"],
        "completion": completion,
        "rewards": {k: v[i] for k, v in scored.per_reward.items()},
        "reward": float(scored.rewards[i]),
        "advantage": float(advantages.values[i]),
        "truncated": bool(rollouts.truncated[i]),
        "kept": bool(advantages.keep[i]),
        "columns": columns[i // g],
        **({"extra": {k: _jsonable(v[i] if i < len(v) else None) for k, v in scored.extra.items()}}
           if scored.extra else {}),
        **({"conversation": rollouts.conversations[i]} if rollouts.conversations is not None else {}),
        **({"masked": masked[i]} if masked[i] else {}),
        **({"seconds": seconds[i]} if seconds[i] else {}),
    } for i, completion in enumerate(rollouts.completions)]
    rows = parallel.gather_rows(rows)
    if not parallel.main:
        return
    run.rollouts.mkdir(parents=True, exist_ok=True)
    tmp = run.rollout_file(step).with_suffix(".tmp")
    try:
        tmp.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    except OSError as err:  # a full disk: name the file, leave no partial one
        tmp.unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(tmp)) from err
    os.replace(tmp, run.rollout_file(step))


def dataset_columns(row: dict[str, Any], prompt_column: str) -> dict[str, Any]:
    """A dataset row's columns other than the prompt (and its rendered text), JSON-ready."""
    skip = (prompt_column, "prompt", "prompt_text")
    return {k: _jsonable(v) for k, v in row.items() if k not in skip}


def logged_metrics(parallel: Parallel, logged: dict[str, list[float]]) -> dict[str, float]:
    """The mean of each rewards' log_metric value over every process (TRL logs their mean)."""
    names = sorted({name for names in parallel.gather_rows([sorted(logged)]) for name in names})
    out = {}
    for name in names:
        values = logged.get(name, [])
        sums = parallel.gather(torch.tensor([float(sum(values)), float(len(values))], dtype=torch.float64))
        count = float(sums.view(-1, 2)[:, 1].sum())
        out[name] = float(sums.view(-1, 2)[:, 0].sum()) / count if count else math.nan
    return out


def _jsonable(value: Any) -> Any:
    """A value a reward logged, as JSON can hold it (its repr otherwise)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def reward_summary(parallel: Parallel, part: Scored) -> dict[str, float]:
    """reward, reward_std (over the samples every reward scored: a masked one's total means nothing;
    NaN when none is) and rewards/<name>/{mean,std,num_none,num_errors,masked,seconds} over every
    process; /seconds is the slowest process's wall seconds of the reward's batch calls on the
    generation batch this step's slice came from (fill rounds added; the rescore of masked rows not);
    /slowest_seconds the slowest row of the step's slice, for rewards that report rows' seconds."""
    rewards = parallel.gather(part.rewards)                                      # [W*B*G]
    per_reward = {}
    for name, values in part.per_reward.items():
        mine = torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)
        every = parallel.gather(mine).tolist()                                   # [W*B*G]
        per_reward[name] = [None if math.isnan(v) else v for v in every]
    names = list(part.per_reward)
    errors = parallel.gather(torch.tensor([float(part.errors.get(n, 0)) for n in names]))
    counts = errors.view(-1, len(names)).sum(dim=0).tolist() if names else []  # [R] summed over processes
    rows = torch.tensor([part.masked_by.get(n, [False] * len(part.rewards)) for n in names], dtype=torch.float32)
    masked = (parallel.gather(rows.T.reshape(-1)).view(-1, len(names)) > 0 if names   # [W*B*G, R]
              else torch.zeros(len(rewards), 0, dtype=torch.bool))
    scores = Scores(per_reward, rewards.tolist(), {n: int(c) for n, c in zip(names, counts) if c},
                    masked={n: masked[:, j].tolist() for j, n in enumerate(names)})
    scored = rewards[~masked.any(dim=1)]                                         # [<= W*B*G]
    out = {"reward": float(scored.mean()) if len(scored) else math.nan,
           "reward_std": float(scored.std()) if len(scored) > 1 else 0.0, **reward_metrics(scores)}
    if part.seconds:  # every process has them (grpocli.trainer.rollouts.score_rollouts)
        slowest = parallel.gather(torch.tensor([part.seconds.get(n, 0.0) for n in names])).view(-1, len(names))
        out.update({f"rewards/{n}/seconds": float(t) for n, t in zip(names, slowest.max(dim=0).values.tolist())})
    out.update(slowest_metrics(parallel, names, part.row_seconds))  # rewards/<name>/slowest_seconds
    out.update(source_metrics(parallel, part, rewards.tolist(), per_reward, masked.any(dim=1).tolist()))
    return out


def source_metrics(parallel: Parallel, part: Scored, totals: list[float], per_reward: dict[str, list[float | None]],
                   masked: list[bool]) -> dict[str, float]:
    """With [[data.sources]] (rows that carry SOURCE_COLUMN), per source of the step's samples over every process:
    reward/<source> (the mean total of its samples every reward scored), rewards/<source>/<reward>/mean (over its
    values that are not None: only the rewards that score the source) and data/<source>/prompts (its prompts in
    the step). ``totals``, ``per_reward`` and ``masked`` are the gathered [W*B*G] values of reward_summary."""
    rows, g = part.rollouts.rows, part.rollouts.group_size
    if not rows or SOURCE_COLUMN not in rows[0]:  # the same on every process: one dataset, or a mixture
        return {}
    labels = parallel.gather_rows([row.get(SOURCE_COLUMN) for row in rows for _ in range(g)])  # [W*B*G]
    out: dict[str, float] = {}
    for name in dict.fromkeys(label for label in labels if label is not None):
        mine = [i for i, label in enumerate(labels) if label == name]
        scored = [totals[i] for i in mine if not masked[i]]
        out[f"reward/{name}"] = sum(scored) / len(scored) if scored else math.nan
        out[f"data/{name}/prompts"] = len(mine) / g
        for reward, values in per_reward.items():
            present = [values[i] for i in mine if values[i] is not None]
            if present:
                out[f"rewards/{name}/{reward}/mean"] = sum(present) / len(present)
    return out


def group_metrics(parallel: Parallel, part: Advantages, drop_flat: bool) -> dict[str, float]:
    """TRL's frac_reward_zero_std and open-instruct's real_batch_size_ratio (share of groups that
    enter the loss) over every process's groups of this batch."""
    flat = parallel.gather(part.flat.float())                                   # [W*B]
    return {"frac_reward_zero_std": float(flat.mean()),
            "real_batch_size_ratio": float((1 - flat).mean()) if drop_flat else 1.0}


def length_metrics(parallel: Parallel, part: Rollouts) -> dict[str, float]:
    """TRL's completions/* metrics over every process. A multi-turn completion's length is the
    model's own tokens, as TRL counts it (tool turns are not the model's); its whole length, tool
    turns included (what generation.max_completion_length bounds), is completions/mean_total_length."""
    lengths = parallel.gather(part.model_lengths())                             # [W*B*G]
    truncated = parallel.gather(part.truncated.float()) > 0                     # [W*B*G]
    terminated = lengths[~truncated]
    out = {
        "completions/mean_length": float(lengths.mean()),
        "completions/min_length": float(lengths.min()),
        "completions/max_length": float(lengths.max()),
        "completions/clipped_ratio": float(truncated.float().mean()),
        "completions/mean_terminated_length": float(terminated.mean()) if len(terminated) else 0.0,
        "completions/min_terminated_length": float(terminated.min()) if len(terminated) else 0.0,
        "completions/max_terminated_length": float(terminated.max()) if len(terminated) else 0.0,
    }
    if part.completion_mask is not None:  # multi-turn: model and tool tokens together
        out["completions/mean_total_length"] = float(parallel.gather(part.completion_lengths()).mean())
    return out


def computed_metrics(stats: dict[str, float], *, distilled: bool = False) -> dict[str, float]:
    """kl, entropy and TRL's clip_ratio/* from the loss tokens the step computed; none at all when it
    computed none (every group flat, or every row masked): a 0 there would read as a collapse, so
    the keys are absent and `grpo inspect` says which steps computed nothing. `distilled` ([distill]):
    distill/reverse_kl, the mean over loss tokens of student - teacher log-prob of the sampled token
    (the sampled estimate of the reverse KL to the teacher, per token)."""
    tokens = stats["tokens"]
    if not tokens:
        return {}
    teacher = {"distill/reverse_kl": stats.get("teacher_kl", 0.0) / tokens} if distilled else {}
    return {**teacher, "kl": stats["kl"] / tokens, "entropy": stats["entropy"] / tokens,
            "clip_ratio/low_mean": stats["clip_low"] / tokens, "clip_ratio/low_min": stats["clip_low_min"],
            "clip_ratio/high_mean": stats["clip_high"] / tokens, "clip_ratio/high_max": stats["clip_high_max"],
            "clip_ratio/region_mean": stats["clip_region"] / tokens}


# -- the time keys ------------------------------------------------------------------------
def training_parts(stats: dict[str, float]) -> dict[str, float]:
    """The parts of time/training, named under it so that sums over the time/<phase> keys count
    each second once; 0.0 for a skipped update that ran neither."""
    return {"time/training/forward_backward": stats.get("time/forward_backward", 0.0),
            "time/training/optimizer": stats.get("time/optimizer", 0.0)}


def cycle_shares(seconds: dict[str, float], logprob_seconds: float, steps: int) -> dict[str, float]:
    """Each of the cycle's optimizer steps gets an equal share of the time spent once per cycle:
    generation, rewards (`seconds`) and log-prob passes; summed over the cycle's steps they give
    its totals."""
    return {"time/generation": seconds["time/generation"] / steps, "time/rewards": seconds["time/rewards"] / steps,
            "time/logprobs": logprob_seconds / steps}
