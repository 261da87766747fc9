"""`grpo inspect WHAT`: recipes, a recipe, recipe fields, plugins, data, or a run directory."""

from __future__ import annotations

import typer

HELP = """Look at recipes, plugins, prompts and runs.

  grpo inspect recipes                    built-in recipes

  grpo inspect recipe quickstart          resolved recipe, where each value came from

  grpo inspect fields algorithm           every recipe key: type, default, bounds, meaning

  grpo inspect fields --trl beta          the recipe key for a TRL GRPOConfig field

  grpo inspect plugins                    plugins and the rewards/datasets/curricula they register

  grpo inspect data quickstart --n 3      rendered prompts and their columns

  grpo inspect data mix.toml --steps 50   ... and, for [[data.sources]], each source's prompts in 50 steps vs its weight

  grpo inspect runs/quickstart            a training run (metrics, warnings, metrics.png, the bottleneck)

  grpo inspect runs/quickstart --gpu-memory 80GiB   ... and whether each change it advises fits the GPU

  grpo inspect runs/quickstart --rollouts 20   best and worst rollouts of step 20
"""


def add_to(app: typer.Typer) -> None:
    app.command("inspect", help=HELP, no_args_is_help=True)(inspect)


def inspect(
    what: str = typer.Argument(..., help="recipes | recipe | fields | plugins | data | RUN_DIR"),
    args: list[str] = typer.Argument(None, help="A recipe name/path and overrides.", show_default=False),
    n: int = typer.Option(3, "--n", min=1, help="How many prompts (`inspect data`) or best/worst rollouts to show."),
    rollouts: int = typer.Option(None, "--rollouts", help="Show the best/worst rollouts of this step."),
    steps: int = typer.Option(None, "--steps", min=1, help="`inspect data` of a [[data.sources]] mixture: the steps "
                              "whose draws the mix table counts (default: train.steps, at most 100)."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="Write RUN_DIR/metrics.png (needs matplotlib)."),
    trl: str = typer.Option(None, "--trl", help="`inspect fields`: the recipe keys for TRL GRPOConfig fields "
                            "whose names contain this."),
    gpu_memory: str = typer.Option(None, "--gpu-memory", help="RUN_DIR: memory of each GPU the run had, e.g. 80GiB: "
                                   "the Bottleneck section asks grpo plan whether each change fits (loads torch)."),
) -> None:
    from grpocli.errors import UserError
    from grpocli.inspection import views

    args = list(args or [])
    if what == "recipes":
        views.show_recipes()
    elif what == "fields":
        views.show_fields(args[0] if args else None, trl=trl)
    elif what == "plugins":
        views.show_plugins()
    elif what in ("recipe", "data"):
        if not args:
            raise UserError(
                f"`grpo inspect {what}` needs a recipe",
                valid="a recipe path or a built-in name (`grpo inspect recipes`)",
                hint=f"grpo inspect {what} quickstart",
            )
        if what == "recipe":
            views.show_recipe(args[0], args[1:])
        else:
            views.show_data(args[0], args[1:], n=n, steps=steps)
    else:
        from grpocli.cli.plan import parse_memory
        from grpocli.inspection.overview import show_run

        # a bad size fails before anything prints
        memory = parse_memory(gpu_memory, "grpo inspect RUN_DIR --gpu-memory") if gpu_memory else None
        show_run(what, rollouts_step=rollouts, n=n, write_png=plot)
        if rollouts is None:
            show_bottleneck(what, memory)


def show_bottleneck(path: str, memory: int | None) -> None:
    """The run's Bottleneck section: the phase that bounds its steps and what to turn (grpocli.planning.headroom);
    nothing where no step records its phases."""
    from rich.console import Console
    from rich.markup import escape

    from grpocli.errors import UserError
    from grpocli.planning.headroom import diagnose
    from grpocli.recipe import load_recipe
    from grpocli.rundir import RunDir, read_jsonl

    run = RunDir(path)
    try:
        recipe = load_recipe(str(run.config)).recipe if run.config.exists() else None
    except UserError:
        recipe = None  # a recipe this version no longer reads: the phases alone
    found = diagnose(read_jsonl(run.metrics), recipe, gpu_memory=memory,
                     memory_hint=f"grpo inspect {path} --gpu-memory 80GiB")
    if found is None:
        return
    console = Console(highlight=False, soft_wrap=True)
    console.rule("bottleneck")
    for line in found.lines(command=f"grpo bench {run.config}" if recipe is not None else None):
        console.print(escape(line))
