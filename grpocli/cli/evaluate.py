"""`grpo eval RECIPE`: sample, score with the recipe's rewards, pass@k."""

from __future__ import annotations

import typer

HELP = """Evaluate a model: sample, score with the recipe's rewards, report pass@k.

Example:

  grpo eval quickstart --checkpoint runs/quickstart/checkpoints/step-100 --n 8 --k 1,4,8
"""


def add_to(app: typer.Typer) -> None:
    app.command("eval", help=HELP, no_args_is_help=True)(evaluate)


def evaluate(
    recipe: str = typer.Argument(..., help="Recipe path or built-in recipe name."),
    overrides: list[str] = typer.Argument(None, help="section.key=value overrides.", show_default=False),
    checkpoint: list[str] = typer.Option(None, "--checkpoint", help="Checkpoint dir (repeat to compare)."),
    split: str = typer.Option(None, "--split", help="Dataset split (default: data.eval_split or test)."),
    n: int = typer.Option(8, "--n", min=1, help="Samples per prompt."),
    k: str = typer.Option("1", "--k", help="Comma-separated k values for pass@k, each <= n."),
) -> None:
    from grpocli.errors import UserError

    try:
        from grpocli.evaluation.run import run_eval
    except ImportError:
        raise UserError(
            "`grpo eval` is not implemented in this version yet",
            hint="track the eval issue; meanwhile `grpo inspect RUN_DIR` reads training runs",
        ) from None
    run_eval(recipe, overrides or [], checkpoints=checkpoint or [], split=split, n=n, k=k)
