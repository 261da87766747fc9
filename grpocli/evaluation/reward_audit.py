"""`grpo check-rewards RECIPE`: score probe completions with the recipe's rewards before training.

The recipe, its rewards and its dataset are resolved as `grpo train` resolves them; the first
``rows`` rows of the training split (data.split) are rendered with the tokenizer, as training
renders them, and each gets the probes of grpocli.evaluation.probes; with ``sample`` > 0 the
model also samples that many completions per row through the recipe's generation backend
(with [generation]'s sampling and train.seed), scored as the probe ``sampled``. One table shows
each reward's mean score per probe, then each flag (grpocli.evaluation.probe_scores) on a line.
A reward that scores every probe alike is scored on extra completions (grpocli.evaluation.extra_probes):
one they move is "not exercised" (a warning). A reward that fails or is constant makes the command
end with a UserError (exit 2).
No model is loaded unless ``sample`` > 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from grpocli.errors import UserError
from grpocli.evaluation.extra_probes import extra_probes, recheck_constant
from grpocli.evaluation.probe_scores import RewardReport, score_probes
from grpocli.evaluation.probes import (
    Format,
    Probe,
    build_probes,
    detect_format,
    format_texts,
    gold_column,
    gold_text,
    parse_format,
)

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe
    from grpocli.rewards import RewardFn


@dataclass
class Audit:
    """What `grpo check-rewards` found: the format and gold column used, the probes, the reports."""

    fmt: Format
    gold: str | None
    probes: list[Probe]
    reports: list[RewardReport]


def check_rewards(recipe: str, overrides: list[str], *, rows: int = 8, sample: int = 0,
                  answer_column: str | None = None, fmt: str = "auto", console: Console | None = None) -> Audit:
    """Probe the recipe's rewards, print the table and flags; UserError (exit 2) for a reward
    that fails or is constant."""
    from grpocli.data.source import load_dataset_for
    from grpocli.data.template import RenderedPrompts
    from grpocli.models import load_tokenizer
    from grpocli.recipe import load_recipe
    from grpocli.registry import load_plugins
    from grpocli.rewards import resolve
    from grpocli.rewards.scoring import trainer_state

    console = console or Console(highlight=False, soft_wrap=True)
    _check_counts(rows, sample)
    chosen = None if fmt.strip().lower() == "auto" else parse_format(fmt)
    resolved = load_recipe(recipe, overrides)
    r = resolved.recipe
    if r.data.sources:  # probes read one dataset's rows and columns
        first = r.data.sources[0]
        raise UserError(
            f"grpo check-rewards probes one dataset, and this recipe mixes {len(r.data.sources)} [[data.sources]]",
            where="data.sources", valid="a recipe with data.dataset (one source at a time)",
            hint=f"probe each source alone with the rewards that score it: grpo check-rewards {recipe} data.sources=[] "
            f"'data.dataset=\"{first.dataset}\"'" + (f" 'data.args={_inline(first.args)}'" if first.args else ""))
    plugins = load_plugins()
    reward_fns = resolve(r.rewards, plugins.rewards)
    dataset = load_dataset_for(r.data, plugins.datasets, r.data.split, r.train.seed)
    gold = gold_column(list(dataset.column_names), answer_column)
    tokenizer = load_tokenizer(r.model)
    prompts = RenderedPrompts(dataset, r.data, tokenizer)
    picked = [prompts[i] for i in range(min(rows, len(prompts)))]
    found = chosen or detect_format(format_texts(r, picked), reward_fns)
    golds = [gold_text(row.get(gold)) for row in picked] if gold else None
    probes = build_probes(golds, len(picked), found, lambda t: len(tokenizer(t, add_special_tokens=False)["input_ids"]),
                          r.generation.max_completion_length)
    if sample:
        probes.append(_sampled(r, tokenizer, picked, sample))
    state = trainer_state(global_step=0, max_steps=r.train.steps)  # TRL's keyword, as at the first step
    reports = score_probes(reward_fns, picked, probes, tokenizer, prompt_column=r.data.prompt_column, state=state)
    recheck_constant(reward_fns, reports, picked, extra_probes(golds, len(picked), found), tokenizer,
                     prompt_column=r.data.prompt_column, state=state)  # constant, or the probes lack its pattern?
    audit = Audit(found, gold, probes, reports)
    if r.tools or r.multi_turn.environment:  # the probes are single-turn: say so, not silently
        console.print("note: the recipe trains with tools ([[tools]] / multi_turn.environment); the probes are "
                      "single-turn completions, without tool calls or environments")
    _print(console, resolved.name, audit, len(picked), r)
    _raise_if_fatal(reward_fns, reports)
    return audit


def _check_counts(rows: int, sample: int) -> None:
    if rows < 1:
        raise UserError(f"--rows {rows} checks no row", where="--rows", valid="an integer >= 1", hint="--rows 8")
    if sample < 0:
        raise UserError(f"--sample {sample} is negative", where="--sample",
                        valid="0 (no model) or the completions to sample per row", hint="--sample 4")


def _sampled(r: Recipe, tokenizer: Any, rows: list[dict[str, Any]], n: int) -> Probe:
    """``n`` completions per row from the recipe's model through its generation backend."""
    from transformers import set_seed

    from grpocli.evaluation.eval_run import model_for, open_backend
    from grpocli.evaluation.targets import BASE, Target
    from grpocli.generation.base import Sampling

    sampling = Sampling.from_section(r.generation)
    tokenizer, backend = open_backend(model_for(r, Target(BASE, None, None)), r, sampling)
    try:
        set_seed(r.train.seed)
        generated = backend.generate([row["prompt_text"] for row in rows], n, sampling)  # [B*n]
    finally:
        backend.close()
    texts = tokenizer.batch_decode(generated.completion_ids, skip_special_tokens=True)
    return Probe("sampled", [i // n for i in range(len(texts))], texts, [list(x) for x in generated.completion_ids])


def _print(console: Console, name: str, audit: Audit, rows: int, r: Recipe) -> None:
    gold = f"gold column {audit.gold!r}" if audit.gold else "no gold column (right vs wrong not checked)"
    title = (f"grpo check-rewards {name}: mean score per probe over {rows} rows of split {r.data.split!r}; "
             f"format {audit.fmt.label} ({audit.fmt.source}); {gold}")
    table = Table(title=title, title_justify="left")
    table.add_column("reward")
    for probe in audit.probes:
        table.add_column(probe.name, justify="right")
    for report in audit.reports:
        table.add_row(report.name, *(_cell(report, p.name) for p in audit.probes))
    console.print(table)
    example = {p.name: p.texts[0] for p in audit.probes if p.texts}
    console.print("probes of row 0: " + "; ".join(f"{k}: {_short(v)}" for k, v in example.items()))
    marks = [(report.name, f) for report in audit.reports for f in report.flags]
    for reward, flag in marks:
        console.print(f"{'FAIL' if flag.fatal else 'warn'} {reward}: {flag.kind}: {flag.reason}")
    if not marks:
        console.print("ok: every reward tells the probes apart as a reward should")


def _cell(report: RewardReport, probe: str) -> str:
    if probe in report.failures:
        return "error"
    mean = report.mean(probe)
    if mean is None:
        return "None"
    nones = sum(v is None for v in report.values.get(probe, []))
    return f"{mean:.3g}" + (f" ({nones} None)" if nones else "")


def _short(text: str, head: int = 12, tail: int = 28) -> str:
    """The text's repr, its middle left out when long (the answer is at the end)."""
    shown = repr(text)
    return shown if len(shown) <= head + tail + 3 else f"{shown[:head]}...{shown[-tail:]}"


def _raise_if_fatal(reward_fns: list[RewardFn], reports: list[RewardReport]) -> None:
    bad = [(i, rep) for i, rep in enumerate(reports) if rep.fatal]
    if not bad:
        return
    said = "; ".join(f"{rep.name} ({f.kind}: {f.reason})" for _, rep in bad for f in rep.flags if f.fatal)
    where = ", ".join(f"rewards[{i}] ({rep.name})" for i, rep in bad)
    advice = "; ".join(dict.fromkeys(f"{rep.name}: {rep.hint}" for _, rep in bad if rep.hint))
    raise UserError(f"{len(bad)} of {len(reports)} rewards cannot train: {said}", where=where,
                    valid="a reward that returns one float (or None) per completion and scores the probes "
                    "differently", hint=(f"{advice}; " if advice else "") + "fix the reward (or drop it from "
                    "[[rewards]]), then run grpo check-rewards again; a format reward whose format the probes "
                    "lack: name the format with --format (e.g. think+answer)")


def _inline(args: dict[str, Any]) -> str:
    """A table as a command-line value: {num_samples = 50}."""
    import json

    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in args.items()) + "}"
