"""`grpo bench RECIPE [section.key=value ...] [--steps N] [--vs-trl] [--json]`."""

from __future__ import annotations

import json
import time

import typer

HELP = """Measure a few real steps of a recipe and forecast the whole run.

Runs --steps optimizer steps of RECIPE (step 1 is warm-up) in a scratch run directory (the recipe's train.output_dir is not touched). Prints per phase (generation, rewards, log-prob passes, training, weight sync) seconds and tokens/s; the step's FLOPs, the FLOP/s achieved and MFU against this device's matmul peak, measured here at the training dtype; peak memory; and a forecast of train.steps steps at the completion lengths the model produces now (one evaluation and one checkpoint are timed too, unless --only-steps).

With train.num_processes = N > 1 the bench runs the N processes `grpo train` would start (train.sequence_parallel and the rest as the recipe says): tokens/s are over all of them (rank 0's own beside them), FLOPs and MFU are rank 0's, the peak memory is the largest of the processes'.

--vs-trl (one process only) runs grpo and TRL's GRPOTrainer (pip install trl) at equal work on this recipe in fresh processes, alternating, every completion forced to max_completion_length, and prints the ratio.

Examples:

  grpo bench smollm2_arithmetic

  grpo bench quickstart --steps 5 --json

  grpo bench quickstart --vs-trl --repeats 2 --steps 4

  grpo bench quickstart train.num_processes=2 train.sequence_parallel=2 --forced-lengths --only-steps
"""


def add_to(app: typer.Typer) -> None:
    app.command("bench", help=HELP, no_args_is_help=True)(bench)


def bench(
    recipe: str = typer.Argument(..., help="Recipe path or built-in recipe name."),
    overrides: list[str] = typer.Argument(None, help="section.key=value overrides.", show_default=False),
    steps: int = typer.Option(3, "--steps", min=1, max=1000, help="Optimizer steps to run (step 1 is warm-up)."),
    vs_trl: bool = typer.Option(False, "--vs-trl", help="Compare with TRL's GRPOTrainer at equal work."),
    repeats: int = typer.Option(2, "--repeats", min=1, max=20, help="--vs-trl: trials per framework."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON line instead of the table."),
    forced_lengths: bool = typer.Option(False, "--forced-lengths",
                                        help="Every completion exactly max_completion_length tokens (EOS suppressed)."),
    only_steps: bool = typer.Option(False, "--only-steps", help="Do not time an evaluation and a checkpoint."),
    timeout: float = typer.Option(600, "--timeout", min=10, help="--vs-trl: seconds each trial may take."),
    gpu_memory: str = typer.Option(None, "--gpu-memory", help="Memory of each GPU to check the advice against, "
                                   "e.g. 80GiB (default: the CUDA device's; on a CPU none, said so)."),
    result_file: str = typer.Option(None, "--result-file", hidden=True,
                                    help="One of a multi-process bench's processes: rank 0 writes its result here."),
    since: float = typer.Option(None, "--since", hidden=True, help="With --result-file: the command's start (epoch s)."),
) -> None:
    started, started_at = time.perf_counter(), time.time()
    from grpocli.recipe import load_recipe

    overrides = overrides or []
    resolved = load_recipe(recipe, overrides)  # the whole run, for the forecast; a bad key fails here
    if result_file is not None:  # one of the processes a multi-process bench started (grpocli.benchmark.processes)
        from pathlib import Path

        from grpocli.benchmark.processes import bench_process

        bench_process(resolved, overrides, result=Path(result_file), started_at=since or started_at,
                      forced=forced_lengths, extras=not only_steps)
        return
    n = resolved.recipe.train.num_processes
    if vs_trl and n > 1:
        from grpocli.errors import UserError

        raise UserError(f"--vs-trl compares one process of each framework; the recipe runs train.num_processes = {n}",
                        where="grpo bench --vs-trl", valid="train.num_processes=1 with --vs-trl",
                        hint=f"grpo bench {recipe} ... train.num_processes=1 --vs-trl, or without --vs-trl to "
                        f"measure grpo on {n} processes")
    if vs_trl:
        from grpocli.benchmark.vs_trl import compare, text

        out = compare(recipe, overrides, steps=max(steps, 2), repeats=repeats, threads=resolved.recipe.train.torch_threads,
                      timeout=timeout, say=(lambda line: None) if as_json else typer.echo)
        if as_json:
            typer.echo(json.dumps({k: v for k, v in out.items() if k != "trials"}))
        else:
            typer.echo(text(out))
        return
    from grpocli.cli.plan import parse_memory

    memory = parse_memory(gpu_memory, "grpo bench RECIPE --gpu-memory") if gpu_memory else None
    _measure(recipe, resolved, overrides, steps=steps, started=started, started_at=started_at, as_json=as_json,
             forced=forced_lengths, extras=not only_steps, gpu_memory=memory)


def _measure(recipe: str, resolved, overrides: list[str], *, steps: int, started: float, started_at: float,
             as_json: bool, forced: bool, extras: bool, gpu_memory: int | None = None) -> None:
    import contextlib
    import shlex
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    from grpocli.benchmark.forecast import forecast
    from grpocli.benchmark.report import figures, text
    from grpocli.recipe import load_recipe
    from grpocli.rundir import read_jsonl

    r = resolved.recipe
    scratch = tempfile.mkdtemp(prefix="grpo-bench-")
    try:
        run = [*overrides, f"train.steps={steps}", f"train.output_dir={scratch}/run", "log.progress=none",
               "log.report_to=[]", "train.resume=never"]
        bench = load_recipe(recipe, run)
        if r.train.num_processes > 1:  # the processes grpo train would start, each measuring
            from grpocli.benchmark.processes import run_processes

            m, peak = run_processes(recipe, bench, run, steps=steps, forced=forced, extras=extras,
                                    started_at=started_at, result=Path(scratch) / "measurement.pickle")
        else:
            from grpocli.benchmark.measurement import measure
            from grpocli.benchmark.peak import matmul_peak

            with contextlib.redirect_stdout(sys.stderr):  # stdout holds the figures only (libraries' logs go to stderr)
                m = measure(bench, started=started, extras=extras, forced=forced)
            peak = matmul_peak(m.device, _dtype(m.dtype))
        history = read_jsonl(Path(scratch) / "run" / "metrics.jsonl")  # the steps' lines, for the bottleneck
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if forced:
        m.notes.append("completions forced to max_completion_length (--forced-lengths)")
    fc = forecast(m, steps=r.train.steps, max_completion_length=r.generation.max_completion_length,
                  eval_every=r.eval.every, save_steps=r.train.save_steps)
    f = figures(resolved.name, m, peak, fc)
    found = _bottleneck(history, r, m.device, gpu_memory, recipe=recipe)
    if as_json:
        typer.echo(json.dumps({**f, "bottleneck": found.as_dict() if found else None}))
        return
    lines = found.lines(command=shlex.join(["grpo", "bench", recipe]), given=overrides) if found else []
    typer.echo("\n".join([text(f), *([""] if lines else []), *lines]))


def _bottleneck(history: list[dict], r, device: str, memory: int | None, *, recipe: str):
    """The measured steps' bottleneck and what to turn, checked by the plan on --gpu-memory's size, else
    this CUDA device's; None where no step was recorded."""
    from grpocli.planning.headroom import diagnose

    if memory is None and device.startswith("cuda"):
        import torch

        memory = torch.cuda.get_device_properties(torch.device(device)).total_memory
    return diagnose(history, r, gpu_memory=memory, gpus=r.train.num_processes, gpu=device.startswith("cuda"),
                    memory_hint=f"grpo bench {recipe} ... --gpu-memory 80GiB")


def _dtype(name: str):
    import torch

    return getattr(torch, name)
