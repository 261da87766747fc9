"""Run one untrusted Python program in a sandbox: a process per case, limits, a private directory.

Two isolation levels (docs/code-sandbox.md says what each protects against):

- ``bwrap``: bubblewrap (https://github.com/containers/bubblewrap, as Flatpak uses it) puts the
  case in new pid, network, IPC and UTS namespaces over a read-only view of the system
  directories and the interpreter (nothing else of the host's files), a private /tmp, and the
  case directory as /sandbox; it dies with its parent.
- ``process``: the case runs as a plain child process in its own session.

At both levels the environment is replaced (PATH, HOME, LANG only), the harness
(``grpocli.rewards.sandbox_harness``) sets rlimits (address space, processes, file size, CPU
seconds) before the code runs, and the case directory is removed afterwards. Run as root (the
common case on training machines), the harness also drops to a uid of its own per worker slot,
taken from a locked pool: RLIMIT_NPROC is not enforced for root, a fork bomb is; the trainer's
processes, files and /proc/<pid>/environ are out of its reach; and every process left behind is
killed with ``kill(-1, SIGKILL)`` issued as that uid (it reaches all of them, whichever session
or process group they moved to). At the process level root also gets a network namespace.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from grpocli.errors import UserError

Isolation = Literal["auto", "bwrap", "process"]
Status = Literal["passed", "failed", "timeout", "crashed"]
HARNESS = Path(__file__).with_name("sandbox_harness.py")
UID_BASE = 1_610_000_000  # far above any login or system uid; 0x6000 slots from here
UID_SLOTS = 4096
BWRAP_PROCESSES = 2  # bwrap's own processes that share the case's uid count (none: they run as root)
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")
INSTALL_HINT = "install bubblewrap: `apt-get install -y bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`"
STARTUP_S = 1.0  # wall seconds a case gets on top of its timeout: bwrap and the interpreter start
READ_CAP = 1 << 20  # bytes of a case's stdout that are compared


@dataclass(frozen=True)
class Limits:
    """What one case may use (each a ``[[rewards]] args`` key of ``code.tests``)."""

    timeout_s: float = 4.0      # wall seconds
    memory_mb: int = 512        # address space (RLIMIT_AS)
    max_processes: int = 16     # processes and threads of the case (RLIMIT_NPROC, enforced under its own uid)
    file_size_mb: int = 16      # largest file it may write, stdout included (RLIMIT_FSIZE)


@dataclass(frozen=True)
class Program:
    """One case to run: the solution, the tests run after it (assert mode) or the stdin (stdio)."""

    solution: str
    mode: Literal["assert", "stdio"]
    tests: str = ""
    stdin: str = ""


@dataclass(frozen=True)
class Outcome:
    status: Status
    stdout: str = ""
    returncode: int | None = None
    stderr: str = ""  # its last 2000 characters


def resolve_isolation(isolation: str, where: str = "isolation") -> str:
    """``auto`` -> ``bwrap`` where bubblewrap works here, else ``process``; UserError (exit 2) when
    ``bwrap`` is asked for and cannot run, saying what is missing and how to install it."""
    if isolation not in ("auto", "bwrap", "process"):
        raise UserError(f"isolation {isolation!r} is unknown", where=where, valid='"auto", "bwrap", "process"')
    if isolation == "process":
        return "process"
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    if isolation == "auto":
        return "process"
    raise UserError(f"isolation 'bwrap' cannot be set up on this machine: {problem}", where=where,
                    valid='"bwrap" where bubblewrap runs, or "process" (weaker: see docs/code-sandbox.md)',
                    hint=INSTALL_HINT)


def interpreter(python: str | None, isolation: str, where: str = "python") -> str:
    """The Python that runs the cases: ``python`` or this one. At the process level as root the case
    runs under its own uid, which must be able to read the interpreter's files: where this one sits
    under a private directory (pyenv in /root), the system's /usr/bin/python3 runs them instead."""
    exe = shutil.which(python) if python else sys.executable
    if not exe or not os.access(exe, os.X_OK):
        raise UserError(f"python {python!r} is not an executable on this machine", where=where,
                        valid="a path to a Python 3 interpreter, or leave it unset (this Python)")
    if isolation != "process" or os.geteuid() != 0 or _others_can_run(exe):
        return exe
    if python is None and _others_can_run("/usr/bin/python3"):
        return "/usr/bin/python3"
    raise UserError(f"python {exe!r} lies in a directory other users cannot enter, and at the process level "
                    "the cases run under their own uid", where=where,
                    valid="an interpreter under world-readable directories (e.g. /usr/bin/python3)",
                    hint='set isolation = "bwrap" (it mounts the interpreter), or args.python')


def _others_can_run(exe: str) -> bool:
    """Whether a uid other than the owner can traverse to ``exe`` and its prefix (by path and real path)."""
    for path in {Path(os.path.abspath(exe)), Path(os.path.realpath(exe))}:
        for parent in path.parents:
            try:
                if not os.stat(parent).st_mode & 0o001:
                    return False
            except OSError:
                return False
    return True


_BWRAP_CHECKED: dict[str, str | None] = {}


def bwrap_problem() -> str | None:
    """None when ``bwrap`` is on the PATH and can make its namespaces here; else what is wrong."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "the `bwrap` command is not installed (not on PATH)"
    if exe not in _BWRAP_CHECKED:
        argv = [exe, *_bwrap_mounts(None), "--", sys.executable, "-I", "-c", "pass"]
        try:
            run = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30, env=_environment("/"))
            _BWRAP_CHECKED[exe] = None if run.returncode == 0 else (
                f"`bwrap` failed to make its namespaces: {run.stderr.strip()[-300:]} (user namespaces may be "
                "disabled: sysctl kernel.unprivileged_userns_clone=1, or run as root)")
        except (OSError, subprocess.TimeoutExpired) as exc:
            _BWRAP_CHECKED[exe] = f"`bwrap` could not run: {exc}"
    return _BWRAP_CHECKED[exe]


def run_program(program: Program, limits: Limits, isolation: str, python: str | None = None) -> Outcome:
    """Run ``program`` under ``isolation`` (``bwrap`` or ``process``) within ``limits``; never raises
    for what the program does. Everything it started is killed and its directory removed on return."""
    python = python or sys.executable
    with _UidSlot() as uid:
        root = Path(tempfile.mkdtemp(prefix="grpo-sandbox-"))
        try:
            return _run_in(root, program, limits, isolation, python, uid)
        finally:
            if uid is not None:
                _kill_uid(uid)
                _remove_owned(uid)
            shutil.rmtree(root, ignore_errors=True)


def _run_in(root: Path, program: Program, limits: Limits, isolation: str, python: str, uid: int | None) -> Outcome:
    case_dir = root / "case"
    case_dir.mkdir(mode=0o700)
    token = secrets.token_hex(16)
    extra = BWRAP_PROCESSES if isolation == "bwrap" and uid is None else 0
    config = {"mode": program.mode, "uid": uid, "unshare_net": isolation == "process",
              "memory_mb": limits.memory_mb, "file_size_mb": limits.file_size_mb,
              "nproc": limits.max_processes + extra + (0 if uid is not None else _processes_of(os.getuid())),
              "cpu_s": int(limits.timeout_s) + 2}
    (case_dir / "solution.py").write_text(program.solution, encoding="utf-8")
    (case_dir / "tests.py").write_text(program.tests, encoding="utf-8")
    (case_dir / "stdin.txt").write_text(program.stdin, encoding="utf-8")
    (case_dir / "case.json").write_text(_json(config), encoding="utf-8")
    shutil.copyfile(HARNESS, case_dir / "harness.py")
    if uid is not None:
        root.chmod(0o711)
        for path in (case_dir, *case_dir.iterdir()):
            os.chown(path, uid, uid)
    inside = "/sandbox" if isolation == "bwrap" else str(case_dir)
    argv = [python, "-I", f"{inside}/harness.py", f"{inside}/case.json"]
    if isolation == "bwrap":
        argv = [shutil.which("bwrap") or "bwrap", *_bwrap_mounts(case_dir, python), "--", *argv]
    out_path, err_path = root / "stdout", root / "stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err, \
            open(case_dir / "stdin.txt", "rb") as stdin_file:
        stdin = subprocess.PIPE if program.mode == "assert" else stdin_file
        proc = subprocess.Popen(argv, stdin=stdin, stdout=out, stderr=err, cwd=case_dir, close_fds=True,
                                env=_environment(inside), start_new_session=True)
        if program.mode == "assert":
            _send(proc, token)
        try:
            returncode = proc.wait(timeout=limits.timeout_s + STARTUP_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return Outcome("timeout", stderr=err_path.read_bytes()[-2000:].decode("utf-8", errors="replace"))
        finally:
            _kill_group(proc)
    with open(err_path, "rb") as f:
        f.seek(max(0, err_path.stat().st_size - 2000))
        stderr = f.read().decode("utf-8", errors="replace")
    return replace(_judge(program, returncode, token, case_dir, out_path), stderr=stderr)


def _judge(program: Program, returncode: int, token: str, case_dir: Path, out_path: Path) -> Outcome:
    with open(out_path, "rb") as f:
        stdout = f.read(READ_CAP).decode("utf-8", errors="replace")
    if returncode > 128:  # bwrap exits 128 + the signal that killed the case
        returncode = 128 - returncode
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return Outcome("timeout", stdout, returncode)
    if program.mode == "assert":
        try:
            verdict = (case_dir / ".verdict").read_text(errors="replace").strip()
        except OSError:
            verdict = ""
        if returncode == 0 and verdict == token:
            return Outcome("passed", stdout, returncode)
        return Outcome("failed" if returncode in (0, 3) else "crashed", stdout, returncode)
    if returncode != 0:
        return Outcome("crashed", stdout, returncode)
    return Outcome("passed" if same_output(stdout, program.tests) else "failed", stdout, returncode)


def same_output(got: str, expected: str) -> bool:
    """Equal after stripping each line and trailing blank lines (APPS / TACO's comparison), or as
    whitespace-separated tokens where every token is a number equal within 1e-6."""
    def lines(s: str) -> list[str]:
        return [line.strip() for line in s.strip().splitlines()]

    if lines(got) == lines(expected):
        return True
    a, b = got.split(), expected.split()
    if len(a) != len(b) or a == b:
        return a == b
    try:
        return all(abs(float(x) - float(y)) <= 1e-6 * max(1.0, abs(float(y))) for x, y in zip(a, b))
    except ValueError:
        return False


def _send(proc: subprocess.Popen, token: str) -> None:
    try:
        proc.stdin.write(f"{token}\n".encode())
        proc.stdin.close()
    except OSError:  # it already exited
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the case's session (its process group); bwrap's namespace dies with its init."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.kill()
        proc.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        pass


def _environment(home: str) -> dict[str, str]:
    """The case's whole environment: nothing of the parent's."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1"}


def _bwrap_mounts(case_dir: Path | None, python: str | None = None) -> list[str]:
    """bwrap's arguments: namespaces, the system directories and the interpreter read-only, a private
    /tmp, the case directory read-write as /sandbox (a private tmpfs there for the probe)."""
    args = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    made: set[str] = {"/", "/proc", "/dev", "/tmp"}  # directories that exist inside
    bound: set[str] = set()                            # host directories shown inside as they are
    for top in ("/usr", "/etc", "/bin", "/lib", "/lib64", "/lib32", "/sbin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
            bound.add(top)
        made.add(top)
    exe = python or sys.executable
    for path in sorted({sys.prefix, sys.base_prefix, str(Path(os.path.realpath(exe)).parents[1]),
                        str(Path(os.path.abspath(exe)).parents[1])}):
        if any(path == m or path.startswith(m + "/") for m in bound):
            continue  # already shown (an interpreter under /tmp is not: /tmp inside is a fresh tmpfs)
        for parent in reversed(Path(path).parents):
            if str(parent) not in made:
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        args += ["--ro-bind", path, path]
        made.add(path)
        bound.add(path)
    if case_dir is None:
        return [*args, "--tmpfs", "/sandbox", "--chdir", "/sandbox"]
    return [*args, "--bind", str(case_dir), "/sandbox", "--chdir", "/sandbox"]


def _json(config: dict) -> str:
    import json

    return json.dumps(config)


class _UidSlot:
    """A uid of the pool held for one case (root only; None otherwise), by an flock on its file."""

    def __enter__(self) -> int | None:
        self.fd = None
        if os.geteuid() != 0:
            return None
        locks = Path(tempfile.gettempdir()) / "grpo-sandbox-uids"
        locks.mkdir(mode=0o700, exist_ok=True)
        start = secrets.randbelow(UID_SLOTS)
        for i in range(UID_SLOTS):
            slot = (start + i) % UID_SLOTS
            fd = os.open(locks / str(slot), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.fd = fd
            _kill_uid(UID_BASE + slot)  # whatever a crashed run may have left under it
            return UID_BASE + slot
        raise RuntimeError(f"all {UID_SLOTS} sandbox uids are in use")

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock


def _processes_of(uid: int) -> list[int]:
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


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid``: ``kill(-1)`` sent as that uid reaches exactly those, in one
    pass of the kernel (a fork bomb cannot outrun it); a /proc scan confirms, root kills stragglers."""
    kill = shutil.which("kill", path="/usr/bin:/bin")
    for _ in range(50):
        pids = _processes_of(uid)
        if not pids:
            return
        if kill is not None:
            subprocess.run([kill, "-s", "KILL", "--", "-1"], check=False, user=uid, group=uid, extra_groups=[], env={}, cwd="/",
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(0.01)  # the kernel reaps killed processes asynchronously


def _remove_owned(uid: int) -> None:
    """Remove what ``uid`` left in the world-writable directories (process level: /tmp is shared)."""
    for top in SHARED_TMP:
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue
