"""Sandboxed processes for untrusted Python: one per case (two for tests that are code: a judge and
the solution), within limits, in a private directory of bounded size.

Two isolation levels (docs/code-sandbox.md says what each protects against, as root and as a
normal user):

- ``bwrap``: bubblewrap (https://github.com/containers/bubblewrap, as Flatpak uses it) puts the
  process in new pid, network, IPC and UTS namespaces over a read-only view of the system
  directories and the interpreter (nothing else of the host's files); its only writable place is
  /sandbox, a tmpfs of ``disk_mb`` (/tmp leads into it); it dies with its parent.
- ``process``: a plain child process in its own session. Run as root, the harness gives it new
  mount and network namespaces and a root of its own like bwrap's (the same directories shown
  read-only, /sandbox a tmpfs of ``disk_mb``, /proc with hidepid=2). Run as a normal user it is
  only a process of that user, in a directory of its own (docs/code-sandbox.md says what follows).

At both levels the environment is replaced (PATH, HOME, LANG, TMPDIR only), the harness
(``grpocli.rewards.sandbox_harness``) sets rlimits (address space, processes, file size, CPU
seconds) before the code runs, and as root each process runs under a uid of its own
(``grpocli.rewards.uid_pool``): every process it left is killed with ``kill(-1, SIGKILL)`` issued as
that uid.

Nothing passes through the case's directory. The harness, its settings and the code arrive on a
descriptor of an anonymous file; stdin, stdout, stderr, the replies and a judge's verdict are
anonymous files or pipes the trainer made, read back with a size limit once the process ended or
its time ran out. The trainer never opens what the case's directory holds: it only removes it
(never following links, making directories the case locked writable again first).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import IO, Literal

from grpocli.errors import UserError
from grpocli.rewards.uid_pool import processes_of

Status = Literal["passed", "failed", "timeout", "crashed"]
BWRAP_PROCESSES = 2  # bwrap's own processes that share the case's uid (none when root: they run as root)
INSTALL_HINT = "install bubblewrap: `apt-get install -y bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`"
STARTUP_S = 1.0  # wall seconds a case gets on top of its timeout: bwrap and the interpreter start
TIMED_OUT = (signal.SIGXCPU, signal.SIGKILL)
MODULES = ("case_values", "sandbox_judge", "sandbox_harness")  # sent to the process, in this order
BOOT = ("import json,os,sys,types\n"
        "with os.fdopen(int(sys.argv[1]),'rb') as f: p=json.loads(f.read())\n"
        "for n in ('grpocli','grpocli.rewards'): sys.modules[n]=types.ModuleType(n); sys.modules[n].__path__=[]\n"
        "for n,s in p['modules']:\n"
        " m=sys.modules[n]=types.ModuleType(n); setattr(sys.modules['grpocli.rewards'],n.rpartition('.')[2],m)\n"
        " exec(compile(s,n,'exec'),m.__dict__)\n"
        "m.main(p)\n")


@dataclass(frozen=True)
class Limits:
    """What one case may use (each a ``[[rewards]] args`` key of ``code.tests``)."""

    timeout_s: float = 4.0      # wall seconds
    memory_mb: int = 512        # address space of each process (RLIMIT_AS)
    max_processes: int = 16     # processes and threads (RLIMIT_NPROC, enforced under its own uid)
    file_size_mb: int = 16      # largest file it may write, stdout included (RLIMIT_FSIZE)
    disk_mb: int = 64           # all it may write to its directory and /tmp (a tmpfs; not as a normal user at the process level)


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
        argv = [exe, *_bwrap_args(None, 1), "--", sys.executable, "-I", "-c", "pass"]
        try:
            run = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30, env=_environment("/sandbox"))
            _BWRAP_CHECKED[exe] = None if run.returncode == 0 else (
                f"`bwrap` failed to make its namespaces: {run.stderr.strip()[-300:]} (user namespaces may be "
                "disabled: sysctl kernel.unprivileged_userns_clone=1, or run as root)")
        except (OSError, subprocess.TimeoutExpired) as exc:
            _BWRAP_CHECKED[exe] = f"`bwrap` could not run: {exc}"
    return _BWRAP_CHECKED[exe]


@cache
def _sources() -> tuple[tuple[str, str], ...]:
    here = Path(__file__).parent
    return tuple((f"grpocli.rewards.{name}", (here / f"{name}.py").read_text(encoding="utf-8")) for name in MODULES)


@dataclass
class Child:
    """One sandboxed process and the anonymous files its stdout and stderr go to."""

    proc: subprocess.Popen
    stdout: IO[bytes]
    stderr: IO[bytes]
    workdir: Path | None = None
    returncode: int | None = field(default=None, init=False)

    def wait(self, deadline: float) -> int | None:
        """Its exit status, or None when it still runs at ``deadline`` (time.monotonic)."""
        try:
            self.returncode = self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None
        return self.returncode

    def timed_out(self) -> bool:
        """Ended by a time limit: SIGXCPU (RLIMIT_CPU) or SIGKILL."""
        code = self.proc.poll()
        return code is not None and signal_of(code) in TIMED_OUT

    def output(self, cap: int) -> str:
        return head(self.stdout, cap).decode("utf-8", errors="replace")

    def errors(self) -> str:
        size = os.fstat(self.stderr.fileno()).st_size
        return os.pread(self.stderr.fileno(), 2000, max(0, size - 2000)).decode("utf-8", errors="replace")

    def stop(self) -> None:
        """SIGKILL it, every process below it and its session (bwrap's namespace dies with its init),
        wait until they are gone (the kernel ends killed processes asynchronously), close its files,
        remove its directory."""
        below = tree_of(self.proc.pid)  # before the kill: orphans still hang from the tree
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        ended = time.monotonic() + 5
        while below and (below := below & tree_of(None)) and time.monotonic() < ended:  # no scan when none was left
            time.sleep(0.01)
        self.stdout.close()
        self.stderr.close()
        if self.workdir is not None:
            remove_tree(self.workdir)


def tree_of(root: int | None) -> set[int]:
    """Live processes (zombies left out) below ``root`` by parent or in its session; every live
    process when ``root`` is None. One scan of /proc."""
    parents: dict[int, list[int]] = {}
    found: set[int] = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()  # after the name, which may hold spaces
        except OSError:
            continue
        if len(fields) < 4 or fields[0] in "ZX":
            continue
        pid, ppid, session = int(entry), int(fields[1]), int(fields[3])
        parents.setdefault(ppid, []).append(pid)
        if root is None or (session == root and pid != root):
            found.add(pid)
    todo = [] if root is None else [root]
    while todo:
        for child in parents.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def head(file: IO[bytes], cap: int) -> bytes:
    """The first ``cap`` bytes of an anonymous file the trainer made (never a path: nothing to swap)."""
    return os.pread(file.fileno(), cap, 0)


def signal_of(returncode: int) -> int:
    """The signal that ended a process (bwrap exits 128 + the signal that killed the case), else 0."""
    if returncode < 0:
        return -returncode
    return returncode - 128 if returncode > 128 else 0


def spawn(role: str, payload: dict, limits: Limits, isolation: str, python: str, uid: int | None, *,
          stdin: IO[bytes] | None = None, fds: dict[str, int] | None = None) -> Child:
    """Start the harness in ``role`` with ``payload`` (its code, requests or tests) under ``isolation``,
    passing it the descriptors ``fds`` (same numbers inside)."""
    fds = fds or {}
    extra = BWRAP_PROCESSES if isolation == "bwrap" and uid is None else 0
    case = {"role": role, "uid": uid, "fds": fds, "memory_mb": limits.memory_mb, "file_size_mb": limits.file_size_mb,
            "nproc": limits.max_processes + extra + (0 if uid is not None else len(processes_of(os.getuid()))),
            "cpu_s": int(limits.timeout_s) + 2, "disk_mb": limits.disk_mb}
    workdir = None
    if isolation == "process":
        workdir = Path(tempfile.mkdtemp(prefix="grpo-sandbox-"))
        if uid is None:
            (workdir / "tmp").mkdir()
        else:
            links, binds = _shown(python)
            case.update(private_root=True, workdir=str(workdir), links=links, binds=binds)
    inside = str(workdir) if isolation == "process" and uid is None else "/sandbox"
    stdout, stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 - the Child closes them
    try:
        with tempfile.TemporaryFile() as boot:
            boot.write(json.dumps({**payload, "modules": _sources(), "case": case}).encode())
            boot.flush()
            boot.seek(0)
            argv = [python, "-I", "-c", BOOT, str(boot.fileno())]
            if isolation == "bwrap":
                argv = [shutil.which("bwrap") or "bwrap", *_bwrap_args(python, limits.disk_mb), "--", *argv]
            proc = subprocess.Popen(argv, stdin=stdin if stdin is not None else subprocess.DEVNULL, stdout=stdout,
                                    stderr=stderr, cwd=workdir or "/", close_fds=True,
                                    pass_fds=(boot.fileno(), *fds.values()), env=_environment(inside),
                                    start_new_session=True)
    except BaseException:
        stdout.close()
        stderr.close()
        if workdir is not None:
            remove_tree(workdir)
        raise
    return Child(proc, stdout, stderr, workdir)


def remove_tree(path: Path) -> None:
    """Remove a case's directory: first every directory in it made writable and searchable by its owner
    (a case may lock what it made: ``chmod 000``), each reached without following links (an O_PATH
    descriptor, changed through /proc/self/fd: it needs no permission on the directory itself)."""
    pending = [str(path)]
    while pending:
        directory = pending.pop()
        try:
            handle = os.open(directory, os.O_PATH | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if not stat.S_ISDIR(os.fstat(handle).st_mode):
                continue
            os.chmod(f"/proc/self/fd/{handle}", 0o700)
            with os.scandir(f"/proc/self/fd/{handle}") as entries:
                pending += [os.path.join(directory, e.name) for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError:
            pass
        finally:
            os.close(handle)
    shutil.rmtree(path, ignore_errors=True)


def _environment(home: str) -> dict[str, str]:
    """The case's whole environment: nothing of the parent's."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": f"{home}/tmp"}


def _shown(python: str | None) -> tuple[list[list[str]], list[str]]:
    """What of the host a case sees: (symlinks [target, path] the system's layout has at the top, host
    directories shown read-only): the system directories and the interpreter's prefixes."""
    links: list[list[str]] = []
    binds: list[str] = []
    for top in ("/usr", "/etc", "/bin", "/lib", "/lib64", "/lib32", "/sbin"):
        if os.path.islink(top):
            links.append([os.readlink(top), top])
        elif os.path.isdir(top):
            binds.append(top)
    exe = python or sys.executable
    for path in sorted({sys.prefix, sys.base_prefix, str(Path(os.path.realpath(exe)).parents[1]),
                        str(Path(os.path.abspath(exe)).parents[1])}):
        if not any(path == m or path.startswith(m + "/") for m in binds):
            binds.append(path)  # an interpreter under /tmp too: /tmp inside is the case's
    return links, binds


def _bwrap_args(python: str | None, disk_mb: int) -> list[str]:
    """bwrap's arguments: namespaces, the system directories and the interpreter read-only, /sandbox a
    tmpfs of ``disk_mb`` with /tmp leading into it, everything else read-only."""
    args = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--proc", "/proc", "--dev", "/dev"]
    made: set[str] = {"/", "/proc", "/dev"}  # directories that exist inside
    links, binds = _shown(python)
    for target, link in links:
        args += ["--symlink", target, link]
        made.add(link)
    for path in binds:
        for parent in reversed(Path(path).parents):
            if str(parent) not in made:
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        args += ["--ro-bind", path, path]
        made.add(path)
    args += ["--perms", "0700", "--size", str(disk_mb << 20), "--tmpfs", "/sandbox",
             "--perms", "1777", "--dir", "/sandbox/tmp"]
    if "/tmp" not in made:  # else an interpreter lives under /tmp: TMPDIR still leads to /sandbox/tmp
        args += ["--symlink", "/sandbox/tmp", "/tmp"]
    return [*args, "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/sandbox"]
