"""`grpo import trl CONFIG -o recipe.toml`: a recipe from another trainer's config."""

from __future__ import annotations

from pathlib import Path

import typer

HELP = """Write a recipe from a TRL GRPOConfig that trains as TRL would.

CONFIG is a YAML or JSON of GRPOConfig fields (what `trl grpo --config` takes, script arguments
such as model_name_or_path, dataset_name and reward_funcs included, open-r1's recipes too) or a TRL
training script. A script runs in a child process as `python SCRIPT.py ARGS` would (ARGS: what follows
--), its code for real, with stand-ins for what would train or download: GRPOTrainer records its
arguments and does not train, load_dataset and from_pretrained record names, and the network is off.
Import only scripts you would run. Reward functions defined in the script are copied, with its imports,
functions and constants, to OUTPUT_rewards.py beside the recipe.

The recipe sets TRL's conventions, writes TRL's defaults where grpo's differ, does TRL's batch
arithmetic (prompts_per_step = per_device_train_batch_size x gradient_accumulation_steps x
processes / num_generations) and converts TRL's steps_per_generation (micro-batches) to grpo's
(optimizer steps). One line per field says what became of it.

Examples:

  grpo import trl grpo_config.yaml -o recipe.toml

  grpo import trl train_grpo.py -o recipe.toml --num-processes 8

  grpo import trl grpo.py -o recipe.toml -- --config config_demo.yaml
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
    script_args: list[str] = typer.Argument(None, help="After --: the script's own arguments (e.g. --config x.yaml)."),
) -> None:
    from grpocli.errors import UserError
    from grpocli.recipe.trl_config_file import read_source
    from grpocli.recipe.trl_import import convert

    out = Path(output)
    fields, notes = read_source(config, script_args or [])  # a bad value or a failing script stops here: nothing is written
    if out.exists() and not force:
        raise UserError(f"{out} exists", valid="a new file, or --force to overwrite it",
                        hint=f"grpo import trl {config} -o {out} --force")
    try:
        recipe, lines = convert(fields, num_processes=num_processes)
    except UserError as exc:  # a value TRL's arithmetic refuses: named with the file
        raise UserError(exc.what, where=f"{config}: {exc.where}" if exc.where else config, valid=exc.valid,
                        hint=exc.hint) from None
    prefix, copied = _script_rewards(recipe, Path(config), out)
    header = (f"# Imported from the TRL config {config} by `grpo import trl` (num_processes {num_processes}).\n"
              "# TRL's conventions and TRL's defaults where grpo's differ are written out; see docs/coming-from-trl.md "
              "(Coming from TRL).\n")
    text = header + toml_text(recipe, config)
    for line in lines:
        typer.echo(line.render().replace("'__script__:", f"'{prefix}:"))
    for note in notes:
        typer.echo(f"{'script':<11} {note}")
    try:
        if copied:
            copied()
        write_checked(text, out, config)
    except BaseException:
        if copied:
            _rewards_file(out).unlink(missing_ok=True)
        raise
    typer.echo(f"wrote {out}; next: grpo train {out} --dry-run")


def _rewards_file(out: Path) -> Path:
    return out.with_name(f"{out.stem}_rewards.py")


def _script_rewards(recipe: dict, script: Path, out: Path):
    """Reward functions defined in the script: their names become OUTPUT_rewards.py:function (relative
    to the working directory, as grpo reads them); returns that file's name and the call that writes it
    (None when the script defines none)."""
    import os

    from grpocli.recipe.trl_script import copy_rewards

    entries = [e for e in recipe.get("rewards", []) if e["name"].startswith("__script__:")]
    if not entries:
        return "", None
    target = _rewards_file(out)
    where = os.path.relpath(target) if not os.path.relpath(target).startswith("..") else str(target.resolve())
    for e in entries:
        e["name"] = f"{where}:{e['name'].split(':', 1)[1]}"
    names = [e["name"].rsplit(":", 1)[1] for e in entries]
    return where, lambda: copy_rewards(script, target, names)


def toml_text(recipe: dict, config: str) -> str:
    """The recipe as TOML; UserError naming the key where a value TOML cannot hold (null) came from."""
    import tomli_w

    from grpocli.errors import UserError

    null = _null_key(recipe)
    if null is not None:
        raise UserError(f"{config} gives {null} no value (null), which a recipe cannot hold",
                        where=f"{config}: {_trl_fields(null) or null}", valid="a value, or leave the field out",
                        hint=f"fix the value in {config}")
    return tomli_w.dumps(recipe)


def write_checked(text: str, out: Path, config: str) -> None:
    """Write ``text`` to ``out`` only once it loads as a recipe: it is loaded from a file beside ``out``,
    which replaces ``out`` (atomically) where it loads and is removed where not; a file already at
    ``out`` is left as it was. UserError naming the recipe key and the TRL field it came from."""
    import os

    from grpocli.errors import UserError
    from grpocli.recipe.loader import load_recipe

    trial = out.with_name(f".{out.name}.grpo-import-{os.getpid()}.toml")
    try:
        trial.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror}", valid="a writable path", hint="-o OTHER.toml") from None
    try:
        load_recipe(str(trial))
        os.replace(trial, out)
    except UserError as exc:
        said = exc.what.replace(f" [from file {trial}]", "").replace(str(trial), str(out))
        fields = sorted({f for key in _keys_in(said) for f in _trl_fields(key).split(", ") if f})
        raise UserError(f"the recipe from {config} would not load, so {out} was not written: {said}",
                        where=f"{config}: {', '.join(fields)}" if fields else config, valid=exc.valid,
                        hint=f"fix the value in {config} (`grpo inspect fields KEY` says what a key takes)") from None
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror}", valid="a writable path", hint="-o OTHER.toml") from None
    finally:
        trial.unlink(missing_ok=True)


def _null_key(value: object, key: str = "") -> str | None:
    """The dotted key of the first None in a nested recipe, or None."""
    if value is None:
        return key
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _null_key(v, f"{key}.{k}" if key else str(k))
        if found is not None:
            return found
    return None


def _keys_in(text: str) -> list[str]:
    """The dotted recipe keys a loader message names (``generation.num_generations: ...``)."""
    import re

    return re.findall(r"\b([a-z_]{1,40}(?:\.[a-z_]{1,40}){1,3})\b", text)


def _trl_fields(key: str) -> str:
    """The TRL fields (and `trl grpo` arguments) that write recipe key ``key``, comma-separated."""
    from grpocli.recipe.trl_import import SCRIPT_FIELDS
    from grpocli.recipe.trl_names import TRL_FIELDS

    pairs = [*((n, k) for n, (k, _) in TRL_FIELDS.items()), *SCRIPT_FIELDS.items()]
    return ", ".join(n for n, k in pairs if k and (key == k or key.startswith(k + ".")))
