"""`grpo check-rewards RECIPE`: score probe completions with the recipe's rewards before training."""

from __future__ import annotations

import typer

HELP = """Check the recipe's rewards before training: score probe completions of sample dataset rows
(the gold answer in the recipe's format, a wrong answer in that format, the answer without the
format, an empty completion, a long padded one, a repeated one; with --sample N the model's own)
and flag rewards that fail, return None, are constant, cannot tell right from wrong, or pay for
format or length alone. A reward that scores every probe the same is scored on extra completions
(reasoning steps, lists, code, a refusal): one of them scoring differently makes it "not exercised"
(a warning: the probes lack what it pays for). Exits 2 when a reward fails or is constant.

Examples:

  grpo check-rewards quickstart

  grpo check-rewards my.toml --rows 16 --format think+answer --answer-column solution

  grpo check-rewards quickstart --sample 4       (also the model's own completions)
"""


def add_to(app: typer.Typer) -> None:
    app.command("check-rewards", help=HELP, no_args_is_help=True)(check_rewards)


def check_rewards(
    recipe: str = typer.Argument(..., help="Recipe path or built-in recipe name."),
    overrides: list[str] = typer.Argument(None, help="section.key=value overrides.", show_default=False),
    rows: int = typer.Option(8, "--rows", help="Dataset rows to probe (the first N of data.split)."),
    sample: int = typer.Option(
        0, "--sample", help="Also sample N completions per row with the recipe's model and backend (loads the model)."),
    answer_column: str = typer.Option(
        None, "--answer-column", help="Column with the gold answer (default: answer, solution, ground_truth, gold, "
        "reference, target or label, the first present).", show_default=False),
    fmt: str = typer.Option(
        "auto", "--format", help="The completion format: auto (from the system prompt, template, prompt or the "
        "format rewards), plain, or parts joined by '+' out of think, answer, boxed."),
) -> None:
    from grpocli.evaluation.reward_audit import check_rewards as run

    run(recipe, overrides or [], rows=rows, sample=sample, answer_column=answer_column, fmt=fmt)
