"""`grpo eval RECIPE`: sample, score with the recipe's rewards, pass@k."""

from __future__ import annotations

import typer

HELP = """Evaluate a model: sample, score with the recipe's rewards, report pass@k, mean@N, maj@N.

Examples:

  grpo eval quickstart --checkpoint runs/quickstart/checkpoints/step-100 --n 8 --k 1,4,8

  grpo eval quickstart --base --checkpoint runs/quickstart      (base vs newest checkpoint)

  grpo eval quickstart --checkpoint runs/quickstart --temperature 0.6 --top-p 0.95 --max-tokens 256

A LoRA checkpoint (adapters only) is loaded onto its base model and merged.
"""


def add_to(app: typer.Typer) -> None:
    app.command("eval", help=HELP, no_args_is_help=True)(evaluate)


def evaluate(
    recipe: str = typer.Argument(..., help="Recipe path or built-in recipe name."),
    overrides: list[str] = typer.Argument(None, help="section.key=value overrides.", show_default=False),
    checkpoint: list[str] = typer.Option(
        None, "--checkpoint", help="Checkpoint dir or run dir (repeat to compare).", show_default=False),
    base: bool = typer.Option(False, "--base", help="Also evaluate the recipe's base model (compare)."),
    split: str = typer.Option(None, "--split", help="Dataset split (default: eval.split, data.eval_split, test)."),
    n: int = typer.Option(None, "--n", min=1, help="Samples per prompt (default: eval.n = 8)."),
    k: str = typer.Option(None, "--k", help="Comma-separated k values for pass@k, each <= n (default: eval.k)."),
    num_prompts: int = typer.Option(
        None, "--num-prompts", min=0, help="Evaluate the first N prompts (0: all; default: eval.num_prompts)."),
    threshold: float = typer.Option(
        None, "--threshold", help="A sample succeeds when its reward is >= this (default: eval.success_threshold)."),
    output_dir: str = typer.Option(
        None, "--output-dir", help="Where samples and summaries go (default: the checkpoint's run dir /eval)."),
    temperature: float = typer.Option(
        None, "--temperature", help="Sampling temperature (default: eval.temperature, else generation.temperature)."),
    top_p: float = typer.Option(None, "--top-p", help="Nucleus sampling (default: eval.top_p, else generation.top_p)."),
    max_tokens: int = typer.Option(
        None, "--max-tokens", help="Longest completion in tokens (default: eval.max_tokens, else "
        "generation.max_completion_length)."),
) -> None:
    from grpocli.evaluation.eval_run import run_eval

    run_eval(recipe, overrides or [], checkpoints=checkpoint or [], split=split, n=n, k=k, base=base,
             num_prompts=num_prompts, threshold=threshold, output_dir=output_dir, temperature=temperature,
             top_p=top_p, max_tokens=max_tokens)
