"""`grpo export RUN_OR_CHECKPOINT OUT_DIR`: a checkpoint as a standalone model directory."""

from __future__ import annotations

from pathlib import Path

import typer

HELP = """Write a checkpoint as a standalone model (safetensors + tokenizer) that transformers'
AutoModelForCausalLM.from_pretrained and vLLM load. LoRA adapters are merged into their base model.

Examples:

  grpo export runs/quickstart out/quickstart-model          (the run's newest checkpoint)

  grpo export runs/quickstart/checkpoints/step-100 out/step-100

  grpo export adapters/ out/merged --base-model Qwen/Qwen2.5-0.5B-Instruct
"""


def add_to(app: typer.Typer) -> None:
    app.command("export", help=HELP, no_args_is_help=True)(export)


def export(
    source: str = typer.Argument(..., help="A run directory (its newest checkpoint) or a checkpoint directory."),
    out_dir: str = typer.Argument(..., help="Where the model goes: a new or empty directory."),
    base_model: str = typer.Option(
        None, "--base-model", help="LoRA checkpoints: the base model (default: the run's model.name_or_path, "
        "else adapter_config.json's base_model_name_or_path)."),
) -> None:
    run_export(source, out_dir, base_model=base_model)


def run_export(source: str, out_dir: str, *, base_model: str | None = None) -> Path:
    """Resolve the checkpoint, check OUT_DIR, then load, merge and write; returns OUT_DIR."""
    from rich.console import Console

    from grpocli.evaluation.targets import resolve_checkpoint, while_reading
    from grpocli.models.export import checkpoint_model, export_model

    notes = Console(stderr=True, highlight=False, soft_wrap=True)
    where = "grpo export RUN_OR_CHECKPOINT"
    target = resolve_checkpoint(source, where=where)
    out = Path(out_dir).expanduser()
    check_out_dir(out)
    with while_reading(target, "grpo export", where):  # a run still training may prune it meanwhile
        model = checkpoint_model(target.path, base=base_model, where=where)
        for note in (target.note, model.note):
            if note:
                notes.print(f"note: {note}")
        kind = "LoRA adapters merged into their base" if model.adapter else "full weights"
        notes.print(f"exporting {target.path} ({kind}) to {out}")
        export_model(model, out, where=where)
    notes.print(f"wrote {out}: load it with AutoModelForCausalLM.from_pretrained({str(out)!r}), "
                f"vLLM, or `grpo vllm-serve --model {out}`")
    return out


def check_out_dir(out: Path) -> None:
    """OUT_DIR must be new or an empty directory, and its parent writable."""
    from grpocli.errors import UserError

    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is a file", where="grpo export OUT_DIR",
                        valid="a new or empty directory", hint=f"pick another OUT_DIR, e.g. {out}-model")
    if out.is_dir() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not empty", where="grpo export OUT_DIR",
                        valid="a new or empty directory (nothing is overwritten)",
                        hint=f"pick another OUT_DIR, or remove it first: rm -r {out}")
