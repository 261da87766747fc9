"""`grpo compare RUN_A RUN_B [...]`: config differences, metrics, evaluations and rollouts side by side."""

from __future__ import annotations

from pathlib import Path

import typer

HELP = """Compare training runs: the config keys that differ (and where each value came from), the key
metrics side by side, the evaluations in one table, and the same prompt's rollouts in each run.
Runs still being written are read as far as they go.

  grpo compare runs/a runs/b                      everything; writes compare.png (curves overlaid)

  grpo compare runs/a runs/b runs/c --step 20     the rollouts of step 20

  grpo compare runs/a runs/b --prompt 2 --no-plot the second prompt the runs share; no PNG
"""


def add_to(app: typer.Typer) -> None:
    app.command("compare", help=HELP, no_args_is_help=True)(compare)


def compare(
    runs: list[str] = typer.Argument(..., metavar="RUN_A RUN_B [...]", help="Two or more run directories.",
                                     show_default=False),
    step: int = typer.Option(None, "--step", min=1, help="Set side by side the rollouts of this step "
                             "(default: the newest step with rollouts in every run)."),
    prompt: int = typer.Option(1, "--prompt", min=1, help="Which of the prompts every run drew at that step."),
    png: Path = typer.Option(Path("compare.png"), "--png", help="Where to write the PNG of the runs' curves."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="Write the PNG (needs matplotlib)."),
) -> None:
    from grpocli.inspection.comparison_view import show_comparison

    show_comparison(runs, step=step, prompt=prompt, png=png if plot else None)
