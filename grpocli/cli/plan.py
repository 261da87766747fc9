"""`grpo plan RECIPE [section.key=value ...] [--gpus N] [--gpu-memory 80GiB] [--config PATH] [--json]`."""

from __future__ import annotations

import re

import typer

HELP = """Predict the device memory of each phase of a training step, without loading weights (the
model's config.json and the recipe only): generation, the log-prob passes, training (weights,
gradients, optimizer state, activations, logits, the reference model, LoRA, FSDP2 sharding over
N processes); the largest micro-batch that fits; whether the recipe fits. If it does not: exit 2,
with the knobs that would make it fit and what each saves.

Examples:

  grpo plan quickstart

  grpo plan my.toml --gpus 8 --gpu-memory 80GiB

  grpo plan my.toml --config Qwen2.5-3B/config.json --gpu-memory 24GiB model.lora.enabled=true

  grpo plan my.toml --json
"""

UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
         "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}
#: The device memory assumed where no CUDA device is present and --gpu-memory is not given.
ASSUMED = "80GiB"


def add_to(app: typer.Typer) -> None:
    app.command("plan", help=HELP, no_args_is_help=True)(plan)


def plan(
    recipe: str = typer.Argument(..., help="Recipe path or built-in recipe name."),
    overrides: list[str] = typer.Argument(None, help="section.key=value overrides.", show_default=False),
    gpus: int = typer.Option(None, "--gpus", min=1, help="Processes (one GPU each); default: train.num_processes."),
    gpu_memory: str = typer.Option(None, "--gpu-memory", help="Memory of each GPU, e.g. 80GiB, 80GB, 24G; default: "
                                   f"the CUDA device's, else {ASSUMED} (said so)."),
    config: str = typer.Option(None, "--config", help="The model's config.json (or a directory holding one), "
                               "instead of reading model.name_or_path's (hub models: no download)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    import json

    from rich.console import Console

    from grpocli.planning import make_plan, shape_of
    from grpocli.planning.plan import not_fitting
    from grpocli.planning.report import render
    from grpocli.recipe import load_recipe

    r = load_recipe(recipe, overrides or []).recipe
    memory, assumed = _device_memory(gpu_memory)
    n = gpus or r.train.num_processes
    result = make_plan(r, shape_of(r.model, config), gpus=n, gpu_memory=memory, memory_assumed=assumed)
    if as_json:
        typer.echo(json.dumps(result.as_dict(), indent=2))
    else:
        render(result, Console(highlight=False, soft_wrap=True))
    if not result.fits:
        raise not_fitting(result, where="grpo plan")


def parse_memory(text: str, where: str = "grpo plan --gpu-memory") -> int:
    """Bytes of '80GiB', '80GB', '24G', '1.5TiB', '512MiB' (binary for G/GiB, decimal for GB); `where`: the
    option, for the error."""
    from grpocli.errors import UserError

    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text or "")
    unit = match.group(2).lower() if match else None
    if not match or unit not in UNITS or float(match.group(1)) <= 0:
        raise UserError(f"cannot read {text!r} as an amount of memory", where=where,
                        valid="a positive number with a unit: 80GiB, 80GB, 24G, 512MiB, 1TiB",
                        hint=f"{where} 80GiB")
    return int(float(match.group(1)) * UNITS[unit])


def _device_memory(given: str | None) -> tuple[int, bool]:
    """(bytes per device, whether they are assumed): --gpu-memory, else the CUDA device's, else 80GiB."""
    if given is not None:
        return parse_memory(given), False
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory, False
    return parse_memory(ASSUMED), True
