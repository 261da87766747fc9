"""`grpo train RECIPE [section.key=value ...]`."""

from __future__ import annotations

import typer

HELP = """Train a model with GRPO from a recipe.

RECIPE is a path to a .toml file or the name of a built-in recipe (`grpo inspect recipes`).
Any recipe key can be set after it as section.key=value (values are TOML).

Examples:

  grpo train quickstart

  grpo train my.toml train.learning_rate=2e-6 generation.num_generations=16

  GRPO_TRAIN__STEPS=50 grpo train quickstart
"""


def add_to(app: typer.Typer) -> None:
    app.command("train", help=HELP, no_args_is_help=True)(train)


def train(
    recipe: str = typer.Argument(..., help="Recipe path or built-in recipe name."),
    overrides: list[str] = typer.Argument(None, help="section.key=value overrides.", show_default=False),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate the recipe, print it and stop."),
) -> None:
    from grpocli.recipe import load_recipe, to_toml

    resolved = load_recipe(recipe, overrides or [])
    if dry_run:
        from grpocli.recipe.duration import resolve_duration
        from grpocli.trainer.preflight import preflight

        checked = preflight(resolved.recipe)
        resolved, notes = resolve_duration(resolved, len(checked.dataset))  # num_train_epochs, warmup_ratio
        for note in notes:
            typer.echo(note, err=True)
        typer.echo(to_toml(resolved.recipe))
        return
    from grpocli.launch.launcher import launch
    from grpocli.trainer.loop import train as train_here

    launch(resolved, overrides or [], train_here)
