"""`grpo bench RECIPE train.num_processes=N`: the N processes `grpo train` would start, each measuring.

    grpo bench (this process)                        starts them, then reads rank 0's result and reports
      └─ python -m grpocli.launch.processes ...      grpo's launcher: accelerate launch --multi_gpu (torchrun)
           ├─ rank 0: python -m grpocli.cli.app bench RECIPE ... --result-file F
           └─ rank 1: ...

The launcher is grpo train's (grpocli.launch.launcher.launch_command, run by
grpocli.launch.processes.run_launcher): the same accelerate arguments, the same dying together,
a worker's user error said once (exit 2). Only the command the workers run differs: `bench`
instead of `train`. Each worker enters through grpocli.launch.launcher.launch, as a training
process does, and runs grpocli.benchmark.measurement.measure; the processes gather their peaks and
token counts after the steps, and rank 0 also measures the device's matmul peak and writes its
Measurement and that Peak to the result file (pickle) for this process to report. The workers'
stdout goes to stderr, so that `--json` prints one line.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from grpocli.benchmark.measurement import Measurement
from grpocli.benchmark.peak import Peak
from grpocli.recipe import Resolved

#: The worker's `grpo bench` options that say it is one of the processes (hidden from --help).
RESULT_OPTION = "--result-file"
SINCE_OPTION = "--since"


def run_processes(recipe: str, resolved: Resolved, overrides: list[str], *, steps: int, forced: bool,
                  extras: bool, started_at: float, result: Path) -> tuple[Measurement, Peak]:
    """Start `resolved`'s train.num_processes processes, each `grpo bench RECIPE OVERRIDES` (the scratch run's
    overrides), and return rank 0's measurement and peak. `started_at`: the command's start (time.time())."""
    from grpocli.launch.launcher import launch_command
    from grpocli.launch.processes import LAUNCHED, run_launcher

    n = resolved.recipe.train.num_processes
    cmd = launch_command(resolved, [], n, command=[
        "bench", recipe, *overrides, "--steps", str(steps), *(["--forced-lengths"] if forced else []),
        *([] if extras else ["--only-steps"]), RESULT_OPTION, str(result), SINCE_OPTION, repr(started_at)])
    with _stdout_to_stderr():
        code = run_launcher(cmd, env={**os.environ, LAUNCHED: "1"})  # a worker's UserError is raised here
    if code:
        raise SystemExit(code)
    with open(result, "rb") as f:
        return pickle.load(f)


def bench_process(resolved: Resolved, overrides: list[str], *, result: Path, started_at: float, forced: bool,
                  extras: bool) -> None:
    """One of the processes `run_processes` started: measure, as a training process trains
    (grpocli.launch.launcher.launch: dies with the launcher, says its user errors once); rank 0
    writes its Measurement and the device's matmul peak to `result`."""
    from grpocli.launch.launcher import launch

    started = time.perf_counter() - (time.time() - started_at)  # the command's start on this clock

    def measured(resolved: Resolved) -> None:
        from grpocli.benchmark.measurement import measure
        from grpocli.benchmark.peak import matmul_peak

        with contextlib.redirect_stdout(sys.stderr):
            m = measure(resolved, started=started, extras=extras, forced=forced)
            if os.environ.get("RANK", "0") != "0":
                return
            import torch

            peak = matmul_peak(m.device, getattr(torch, m.dtype))
        tmp = result.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            pickle.dump((m, peak), f)
        os.replace(tmp, result)  # whole or absent

    launch(resolved, overrides, measured)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 on 2 meanwhile (the processes inherit it): this command's stdout holds its figures only."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
