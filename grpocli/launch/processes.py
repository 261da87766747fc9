"""The processes of a run with train.num_processes > 1: how they die together and report once.

    grpo train                                   holds the run lock (grpocli.launch.lock)
      └─ python -m grpocli.launch.processes     the launcher: accelerate launch --multi_gpu,
           │                                     whose torchrun agent runs in this process
           ├─ rank 0: python -m grpocli.cli.app train ...
           └─ rank 1: ...

Dying together. Each child asks the kernel to SIGKILL it when its parent dies
(prctl(PR_SET_PDEATHSIG), Linux) and then checks that its parent is still the one that started it
(it may have died before the request). So any death of `grpo train`, SIGKILL included, kills the
launcher, and the launcher's death kills every worker: a chain the kernel runs, nothing polls and
a kill -9 cannot skip it. Process groups cannot do this: torchrun starts each worker in a session
of its own. Where prctl is missing (not Linux), a daemon thread watches the parent pid instead.

Saying an error once. A worker that stops on a UserError writes it into the folder `grpo train`
named (GRPOCLI_ERRORS) and exits with its code without printing; a worker that fails after
another one stopped (a collective whose peer left) exits quietly too. The launcher then exits
with that code without torchrun's report, and `grpo train` raises the first error written, which
the CLI prints once: exit 2 for a user error, no traceback. A worker that crashes on a bug prints
its own traceback; the launcher adds one line naming the rank and how it ended, and exits 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from grpocli.errors import Stopped, UserError
from grpocli.parallel import status
from grpocli.parallel.status import STATUS_DIR

#: Set in the environment of launched processes, so that they train instead of launching again.
LAUNCHED = "GRPOCLI_LAUNCHED"  # not GRPO_*: those are recipe keys
#: The module `grpo train` runs as its launcher: accelerate launch, quiet about failed workers.
LAUNCHER = "grpocli.launch.processes"
#: The `grpo train` that started the launcher: the launcher dies with it.
TRAIN_PID = "GRPOCLI_TRAIN_PID"
#: The launcher that started the workers: each worker dies with it.
LAUNCHER_PID = "GRPOCLI_LAUNCHER_PID"
#: Folder where workers leave their user errors for `grpo train` to print once.
ERRORS = "GRPOCLI_ERRORS"

_PR_SET_PDEATHSIG = 1


def run_launcher(cmd: list[str], env: dict[str, str]) -> int:
    """Run the launcher command (`python -m grpocli.launch.processes ...`) from `grpo train` and
    return its exit code; raise the first worker's UserError instead where one stopped the run.

    SIGTERM and SIGINT are passed on to the launcher (in a process group of its own, so that
    Ctrl-C reaches it once), whose torchrun agent passes them to the workers and gives them 30 s
    to stop (grpocli.trainer.signals); then `Stopped` is raised here, for `grpo train` to say
    what the run kept."""
    with tempfile.TemporaryDirectory(prefix="grpo-errors-") as errors:
        proc = subprocess.Popen(cmd, env={**env, TRAIN_PID: str(os.getpid()), ERRORS: errors, STATUS_DIR: errors},
                                process_group=0)
        with _passed_on(proc) as received:
            code = proc.wait()
        first = first_error(Path(errors))
    if received:
        raise Stopped(received[0])
    if code and first is not None:
        raise first
    return code


@contextlib.contextmanager
def _passed_on(proc: subprocess.Popen) -> Iterator[list[int]]:
    """SIGTERM and SIGINT sent to this process go to `proc` instead; yields the signals received."""
    received: list[int] = []

    def pass_on(signum: int, frame: object) -> None:
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    main = threading.current_thread() is threading.main_thread()
    old = {sig: signal.signal(sig, pass_on) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        yield received
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


# -- dying together ------------------------------------------------------------------------
def die_with_parent(parent: int) -> None:
    """SIGKILL this process when `parent` (its parent now) dies; exit at once if it already has."""
    if sys.platform.startswith("linux") and _prctl_deathsig(signal.SIGKILL):
        if os.getppid() != parent:  # died before the request: no signal will come
            os._exit(1)
        return
    threading.Thread(target=_watch_parent, args=(parent,), name="grpo-parent-watch", daemon=True).start()


def _prctl_deathsig(sig: int) -> bool:
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


# -- saying an error once ------------------------------------------------------------------
@contextlib.contextmanager
def worker() -> Iterator[None]:
    """The body of one training process under a launcher: dies with it; its errors said once."""
    if LAUNCHER_PID in os.environ:
        die_with_parent(int(os.environ[LAUNCHER_PID]))
    elif "TORCHELASTIC_RUN_ID" in os.environ:  # a torchrun the user started: die with it too
        die_with_parent(os.getppid())
    folder = os.environ.get(ERRORS)
    if not folder:
        yield
        return
    try:
        yield
    except Stopped as exc:  # SIGTERM / SIGINT passed on by `grpo train`, which says what was kept
        raise SystemExit(exc.exit_code) from None
    except UserError as exc:
        _record(Path(folder), exc)
        raise SystemExit(exc.exit_code) from None
    except Exception:
        other = first_error(Path(folder))
        if other is None:
            raise  # a bug: its traceback is the report
        raise SystemExit(other.exit_code) from None  # a consequence of another process's error


def _record(folder: Path, exc: UserError) -> None:
    data = {"time": time.time(), "exit_code": exc.exit_code, "what": exc.what, "where": exc.where,
            "valid": exc.valid, "hint": exc.hint}
    target = folder / f"rank-{os.environ.get('RANK', os.getpid())}.json"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, target)  # readers see a whole record or none


def first_error(folder: Path) -> UserError | None:
    """The earliest user error a worker recorded in `folder`, as a UserError with its exit code."""
    found = []
    for path in folder.glob("rank-*.json"):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text(encoding="utf-8")))
    if not found:
        return None
    data = min(found, key=lambda d: d.get("time", 0.0))
    exc = UserError(str(data.get("what")), where=data.get("where"), valid=data.get("valid"), hint=data.get("hint"))
    exc.exit_code = int(data.get("exit_code", 2))
    return exc


# -- the launcher --------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    """`python -m grpocli.launch.processes ACCELERATE-LAUNCH-ARGS`: accelerate launch without
    torchrun's failure report (the workers' own messages say what failed)."""
    if TRAIN_PID in os.environ:
        die_with_parent(int(os.environ[TRAIN_PID]))
    os.environ[LAUNCHER_PID] = str(os.getpid())
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    _quiet_elastic_logs()
    args = launch_command_parser().parse_args(argv)
    try:
        launch_command(args)
    except SignalException as exc:  # Ctrl-C or a kill: torchrun has stopped the workers already
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        folder = os.environ.get(ERRORS)
        recorded = first_error(Path(folder)) if folder else None
        if recorded is not None:
            return recorded.exit_code  # `grpo train` prints it
        rank, failure = exc.get_first_failure()
        if failure.exitcode == UserError.exit_code:
            return failure.exitcode  # a user error the worker printed itself (outside `worker()`)
        how = (f"was killed by {failure.signal_name()}" if failure.exitcode < 0
               else f"exited with code {failure.exitcode} (its traceback, if any, is above)")
        print(f"error: training process rank {rank} (pid {failure.pid}) {how}", file=sys.stderr, flush=True)
        doing = status.last_said(-1)  # what each process was doing when it stopped
        if doing:
            print("  the processes were at: " + "; ".join(doing), file=sys.stderr, flush=True)
        return 1
    return 0


def _quiet_elastic_logs() -> None:
    """torchrun's agent logs each failure and each worker it stops; the launcher says it in one line."""
    import logging

    import torch.distributed.run  # noqa: F401  (creates the agent's loggers)

    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("torch.distributed.elastic") and isinstance(logger, logging.Logger):
            logger.setLevel(logging.CRITICAL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
