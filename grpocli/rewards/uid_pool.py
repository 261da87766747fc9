"""The uids the sandbox runs cases under when grpo is root: a pool of slots locked with flock, and the
killing of everything a uid left behind.

Root runs each case process under a uid of its own, far above any login or system uid: RLIMIT_NPROC
is not enforced for root, a fork bomb is; the trainer's processes and files are out of its reach; and
``kill(-1, SIGKILL)`` sent as that uid reaches every process it left, wherever it moved.

The locks live in ``/run/grpo-sandbox-uids``, a directory only root may write: a pool under the temp
dir could be made beforehand by another local user, who would then choose where a root run creates
files. The directory is checked on each use (a real directory, owned by root, writable by root only)
and its lock files are opened without following links.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

UID_BASE = 1_610_000_000  # far above any login or system uid
UID_SLOTS = 4096
POOL_DIR = Path("/run/grpo-sandbox-uids")


class PoolError(RuntimeError):
    """The pool's directory is not safe to use (what is wrong is said)."""


def pool_dir() -> Path:
    """POOL_DIR, made if missing, after checking that only root can write it and its parent."""
    for path in (POOL_DIR.parent, POOL_DIR):
        if path == POOL_DIR:
            try:
                path.mkdir(mode=0o700)
            except FileExistsError:
                pass
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
            raise PoolError(f"the sandbox's uid pool {path} must be a directory owned by root that only root "
                            f"can write (it is mode {stat.filemode(info.st_mode)}, owner uid {info.st_uid}): "
                            "remove it, or make it so")
    return POOL_DIR


class UidSlots:
    """``count`` uids of the pool held for one case (root only; None otherwise), by flocks on their files.
    Whatever a crashed run left under a uid is killed when it is taken, and again when it is given back."""

    def __init__(self, count: int = 1) -> None:
        self.count = count
        self.fds: list[int] = []
        self.uids: list[int] = []

    def __enter__(self) -> list[int] | None:
        if os.geteuid() != 0:
            return None
        locks = pool_dir()
        start = secrets.randbelow(UID_SLOTS)
        try:
            for i in range(UID_SLOTS):
                if len(self.uids) == self.count:
                    return self.uids
                slot = (start + i) % UID_SLOTS
                fd = os.open(locks / str(slot), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self.fds.append(fd)
                self.uids.append(UID_BASE + slot)
                kill_uid(UID_BASE + slot)
        except BaseException:
            self.__exit__()
            raise
        if len(self.uids) == self.count:
            return self.uids
        self.__exit__()
        raise RuntimeError(f"all {UID_SLOTS} sandbox uids are in use")

    def __exit__(self, *exc: object) -> None:
        for uid in self.uids:
            kill_uid(uid)
        for fd in self.fds:
            os.close(fd)  # releases the lock
        self.fds, self.uids = [], []


def processes_of(uid: int) -> list[int]:
    """Pids of the live processes whose real uid is ``uid`` (a scan of /proc; zombies left out)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("State:") and line.split()[1] in "ZX":
                        break  # dead, waiting to be reaped by init: nothing left to kill
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(entry))
                        break
        except (OSError, ValueError):
            continue
    return pids


def kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid``: ``kill(-1)`` sent as that uid reaches exactly those, in one
    pass of the kernel (a fork bomb cannot outrun it); a /proc scan confirms, root kills stragglers."""
    kill = shutil.which("kill", path="/usr/bin:/bin")
    for _ in range(50):
        pids = processes_of(uid)
        if not pids:
            return
        if kill is not None:
            subprocess.run([kill, "-s", "KILL", "--", "-1"], check=False, user=uid, group=uid, extra_groups=[],
                           env={}, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        else:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(0.01)  # the kernel reaps killed processes asynchronously
