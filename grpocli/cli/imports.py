"""`grpo import trl CONFIG -o recipe.toml`: a recipe from another trainer's config."""

from __future__ import annotations

from pathlib import Path

import typer

HELP = """Write a recipe from a TRL GRPOConfig that trains as TRL would.

CONFIG is a YAML or JSON of GRPOConfig fields (what `trl grpo --config` takes, script arguments
such as model_name_or_path, dataset_name and reward_funcs included) or a Python file that builds a
GRPOConfig (run in this process with __name__ != "__main__": import only files you would run).

The recipe sets TRL's conventions, writes TRL's defaults where grpo's differ, does TRL's batch
arithmetic (prompts_per_step = per_device_train_batch_size x gradient_accumulation_steps x
processes / num_generations) and converts TRL's steps_per_generation (micro-batches) to grpo's
(optimizer steps). One line per field says what became of it.

Examples:

  grpo import trl grpo_config.yaml -o recipe.toml

  grpo import trl train_grpo.py -o recipe.toml --num-processes 8
"""

imports = typer.Typer(
    help="Write a recipe from another trainer's config.\n\nExample: grpo import trl grpo_config.yaml -o recipe.toml",
    no_args_is_help=True,
)


def add_to(app: typer.Typer) -> None:
    app.add_typer(imports, name="import")


@imports.command("trl", help=HELP, no_args_is_help=True)
def trl(
    config: str = typer.Argument(
        ..., help="A TRL GRPOConfig: .yaml/.yml/.json of its fields, or a .py that builds one."),
    output: str = typer.Option(..., "-o", "--output", help="The recipe to write (.toml)."),
    num_processes: int = typer.Option(1, "--num-processes", min=1, max=1024,
                                      help="TRL's world size (accelerate's --num_processes): the batch counts it."),
    force: bool = typer.Option(False, "--force", help="Overwrite OUTPUT if it exists."),
) -> None:
    import tomli_w

    from grpocli.errors import UserError
    from grpocli.recipe.loader import load_recipe
    from grpocli.recipe.trl_config_file import read_config
    from grpocli.recipe.trl_import import convert

    out = Path(output)
    fields = read_config(config)
    if out.exists() and not force:
        raise UserError(f"{out} exists", valid="a new file, or --force to overwrite it",
                        hint=f"grpo import trl {config} -o {out} --force")
    recipe, lines = convert(fields, num_processes=num_processes)
    for line in lines:
        typer.echo(line.render())
    header = (f"# Imported from the TRL config {config} by `grpo import trl` (num_processes {num_processes}).\n"
              "# TRL's conventions and TRL's defaults where grpo's differ are written out; see docs/coming-from-trl.md "
              "(Coming from TRL).\n")
    try:
        out.write_text(header + tomli_w.dumps(recipe), encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror}", valid="a writable path", hint="-o OTHER.toml") from None
    try:
        load_recipe(str(out))
    except UserError as exc:
        raise UserError(f"{out} was written but does not load: {exc.what}", where=exc.where, valid=exc.valid,
                        hint=f"edit {out}, or the value in {config}") from None
    typer.echo(f"wrote {out}; next: grpo train {out} --dry-run")
