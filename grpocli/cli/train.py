"""`grpo train RECIPE [section.key=value ...]`."""

from __future__ import annotations

import time

import typer

HELP = """Train a model with GRPO from a recipe.

RECIPE is a path to a .toml file or the name of a built-in recipe (`grpo inspect recipes`).
Any recipe key can be set after it as section.key=value (values are TOML); TRL's shapes
(--learning_rate 1e-6, learning_rate=1e-6) are answered with the key they mean.

Examples:

  grpo train quickstart

  grpo train my.toml train.learning_rate=2e-6 generation.num_generations=16

  GRPO_TRAIN__STEPS=50 grpo train quickstart
"""


def add_to(app: typer.Typer) -> None:
    unknown_as_overrides = {"allow_extra_args": True, "ignore_unknown_options": True}  # --learning_rate: a hint
    app.command("train", help=HELP, no_args_is_help=True, context_settings=unknown_as_overrides)(train)


def train(
    recipe: str = typer.Argument(..., help="Recipe path or built-in recipe name."),
    overrides: list[str] = typer.Argument(None, help="section.key=value overrides.", show_default=False),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate the recipe, print it and stop."),
) -> None:
    started = time.monotonic()
    from grpocli.recipe import load_recipe, to_toml
    from grpocli.recipe.override_hints import check_override_shapes

    overrides = overrides or []
    first = recipe.startswith("-")  # `grpo train --learning_rate 1e-6 quickstart`
    check_override_shapes([recipe, *overrides] if first else overrides, command="grpo train",
                          recipe="RECIPE" if first else recipe, options=("--dry-run", "--help"))
    resolved = load_recipe(recipe, overrides)
    if dry_run:
        from grpocli.recipe.duration import resolve_duration
        from grpocli.trainer.preflight import preflight

        checked = preflight(resolved.recipe)
        resolved, notes = resolve_duration(resolved, len(checked.dataset))  # num_train_epochs, warmup_ratio
        for note in notes:
            typer.echo(note, err=True)
        typer.echo(to_toml(resolved.recipe))
        return
    from grpocli.launch.launcher import launch, reports_the_run
    from grpocli.trainer.loop import train as train_here

    launch(resolved, overrides, train_here)  # a run that fails or stops raises; this one finished
    if reports_the_run():
        _summary(resolved.output_dir(), time.monotonic() - started)


def _summary(root, seconds: float) -> None:
    """The run's last lines: steps, time, reward, the command that looks at it (grpocli.inspection.run_summary)."""
    import sys

    from grpocli.inspection.run_summary import summary_lines

    print("\n".join(summary_lines(root, seconds)), file=sys.stderr, flush=True)
