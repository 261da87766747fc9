"""`RunLock`: one `grpo train` writes to a run directory at a time.

The lock is an OS lock (fcntl.flock) on the run directory itself, not a file's existence: the
kernel drops it when the holding process dies, SIGKILL included, so a crashed run never leaves a
stale lock behind and a resume right after it starts at once, and deleting a file cannot lift it.
While held, `<run>/.grpo.lock` names the holder (pid, host, start time, command line; locked too,
for older grpo versions), so a second run on the same directory stops before it touches
anything (exit 2) and says which process to wait for or stop.

Who holds it: the process that starts training, i.e. `grpo train` itself; with
train.num_processes > 1 that is the launcher, and the processes it starts do not lock (they would
collide with it). Under a launcher grpo did not start (torchrun, `accelerate launch --multi_gpu`),
the main process (rank 0) holds it. `grpo eval` and `grpo inspect` only read a run and take no lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from grpocli.errors import UserError
from grpocli.rundir import RunDir

#: The lock file's name inside the run directory.
LOCK_FILE = ".grpo.lock"
#: How long to wait for a holder that has the lock but has not yet written its details.
_DETAILS_WAIT_S = 1.0


def lock_path(run: RunDir) -> Path:
    """<run>/.grpo.lock: locked while a run writes; a killed run leaves it behind, unlocked."""
    return run.root / LOCK_FILE


@contextlib.contextmanager
def run_lock(run: RunDir) -> Iterator[None]:
    """Hold the run directory's lock for the block; UserError (exit 2) when another process holds it.

    A directory this call created is removed again when the block leaves nothing else in it
    (a run that failed before writing anything leaves no trace)."""
    created = not run.root.exists()
    fds = _acquire(run)
    try:
        yield
    finally:
        _release(run, fds, remove_dir=created)


def _acquire(run: RunDir) -> tuple[int, int]:
    """(the directory's locked descriptor, the details file's)."""
    import fcntl

    dir_fd = _open(run, directory=True)
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(dir_fd)
        raise _in_use(run) from None
    try:
        return dir_fd, _lock_details(run)
    except BaseException:
        os.close(dir_fd)
        raise


def _lock_details(run: RunDir) -> int:
    """Lock and fill <run>/.grpo.lock (a grpo that only knows the file's lock sees it held)."""
    import fcntl

    while True:
        fd = _open(run)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _in_use(run) from None
        if _same_file(fd, lock_path(run)):
            break
        os.close(fd)  # a releasing holder removed the file between our open and our lock: again
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps(_details()) + "\n").encode())
    return fd


def _open(run: RunDir, *, directory: bool = False) -> int:
    run.check_writable()  # a file in the way, or a read-only place: said as such
    try:
        run.root.mkdir(parents=True, exist_ok=True)
        if directory:
            return os.open(run.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return os.open(lock_path(run), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)  # no O_TRUNC: it may be held
    except OSError as exc:
        raise UserError(f"cannot write to the run directory {run.root}: {exc.strerror}", where="train.output_dir",
                        valid="a directory this user can create and write",
                        hint="train.output_dir=runs/new (or fix the directory's permissions)") from None


def _release(run: RunDir, fds: tuple[int, int], *, remove_dir: bool) -> None:
    """Remove the lock file (while still holding it: see _same_file), then unlock by closing."""
    with contextlib.suppress(OSError):
        lock_path(run).unlink()
    if remove_dir:
        with contextlib.suppress(OSError):
            run.root.rmdir()  # only when empty: a run that wrote something keeps its directory
    for fd in reversed(fds):
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    """Whether the locked file is still the one at `path` (a holder unlinks it before unlocking)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _details() -> dict[str, object]:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "command": _command_line()}


def _command_line() -> str:
    try:
        raw = Path("/proc/self/cmdline").read_bytes().rstrip(b"\0")
        argv = [part.decode(errors="replace") for part in raw.split(b"\0")]
    except OSError:
        argv = [sys.executable, *sys.argv]
    return shlex.join(argv)


def holder(run: RunDir) -> dict[str, object]:
    """What the lock file says about the process holding it ({} if it cannot be read)."""
    deadline = time.monotonic() + _DETAILS_WAIT_S
    while True:
        try:
            text = lock_path(run).read_text(encoding="utf-8")
            return dict(json.loads(text))
        except (OSError, ValueError, TypeError):
            if time.monotonic() > deadline:
                return {}
            time.sleep(0.05)  # locked a moment ago, details not written yet


def _in_use(run: RunDir) -> UserError:
    info = holder(run)
    pid = info.get("pid", "?")
    host = info.get("host")
    on_host = f" on {host}" if host and host != socket.gethostname() else ""
    who = (f"process {pid}{on_host}, started {info.get('started', '?')}: {info.get('command', '?')}"
           if info else f"a process whose details {lock_path(run)} does not hold")
    stop = f"kill {pid}" if info and not on_host else "stop it"
    return UserError(
        f"the run directory {run.root} is in use by another grpo train ({who})",
        where="train.output_dir",
        valid="one run writing to a run directory at a time (grpo eval and grpo inspect may read it meanwhile)",
        hint=f"wait for it (grpo inspect {run.root}), {stop}, or train into another directory: "
        "train.output_dir=runs/new",
    )


__all__ = ["LOCK_FILE", "holder", "lock_path", "run_lock"]
