"""`grpo new plugin NAME` and `grpo new recipe`: start a plugin project or a recipe from templates."""

from __future__ import annotations

from pathlib import Path

import typer

new = typer.Typer(
    help="Start a plugin project or a commented recipe.\n\n"
    "Examples: grpo new plugin grpo-myrewards  |  grpo new recipe --from quickstart -o my.toml",
    no_args_is_help=True,
)


def add_to(app: typer.Typer) -> None:
    app.add_typer(new, name="new")


@new.command("plugin", no_args_is_help=True)
def plugin(
    name: str = typer.Argument(..., help="The distribution name, e.g. grpo-myrewards (module grpo_myrewards)."),
    output: Path = typer.Option(Path("."), "-o", "--output", help="The folder to create the project in."),
) -> None:
    """Write a pip-installable plugin project: pyproject with the `grpo` entry point, a reward, a
    dataset, a recipe using them, a test that trains through grpo, and a README."""
    from grpocli.scaffold import write_plugin

    root = write_plugin(name, output)
    typer.echo(f"wrote {root}")
    typer.echo(f"next: cd {root} && pip install -e '.[test]' && grpo inspect plugins && pytest")


@new.command("recipe")
def recipe(
    source: str = typer.Option("quickstart", "--from", help="A built-in recipe (grpo inspect recipes) or a file."),
    output: Path = typer.Option(Path("recipe.toml"), "-o", "--output", help="The recipe to write."),
    force: bool = typer.Option(False, "--force", help="Overwrite OUTPUT if it exists."),
) -> None:
    """Write a recipe with every key explained: SOURCE's values set, the rest commented out at
    their defaults."""
    from grpocli.errors import UserError
    from grpocli.recipe.catalog import find
    from grpocli.scaffold import commented_recipe

    if output.exists() and not force:
        raise UserError(f"{output} exists; nothing was written", where="grpo new recipe -o",
                        valid="a new file, or --force to overwrite it",
                        hint=f"grpo new recipe --from {source} -o {output} --force")
    text = commented_recipe(find(source))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {output} ({len(text.splitlines())} lines)")
    typer.echo(f"next: grpo train {output} --dry-run")
