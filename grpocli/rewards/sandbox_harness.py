"""The first code that runs in a sandboxed process (``grpocli.rewards.sandbox``); stdlib only.

It arrives with its payload through a file descriptor, never as a file the case could change:
``python -I -c BOOT FD`` reads FD (this source, ``case_values``' and, for a judge,
``sandbox_judge``'s, the case's settings and its code), closes it and calls ``main``. Before any
untrusted code runs it: as root at the process level, moves into new mount and network namespaces
and a root of its own like bwrap's (system directories and the interpreter read-only, /sandbox and
/tmp one tmpfs of ``disk_mb``); as root, gives that directory to the case's own uid and drops to it; sets
no_new_privs and the parent-death signal; and sets the rlimits (address space, processes, file size,
CPU seconds, open files, no core files).

Then it plays its role:

- ``script`` (stdin/stdout cases): the solution runs as ``__main__`` on the case's stdin;
- ``answer``: the solution runs, then each request (evaluate an expression of the tests, call a
  function, say what some names are) is answered on the reply descriptor as one line of
  ``case_values`` JSON. The requests come with the payload, or one a line from a judge's pipe. No
  expected value, token or verdict is ever in this process: what it answers is compared elsewhere;
- ``judge``: see ``sandbox_judge``.

Exit codes: 0 ran through, 3 a test failed (judge) or the solution exited before answering,
4 the code raised, 97 the sandbox could not be set up.
"""

import builtins
import ctypes
import json
import os
import resource
import signal
import sys
import traceback

from grpocli.rewards import case_values

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 8192, 16384, 1 << 18)
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
FAILED, CRASHED, SETUP = 3, 4, 97
REQUEST_CAP = 64 << 20  # bytes of one request line from a judge


def _mount(libc, source, target, fstype, flags, data=None):
    if libc.mount(source, target, fstype, flags, data) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target!r}: {os.strerror(errno)}")


def _private_root(libc, case):
    """Process level, as root: new mount and network namespaces and a root of its own, as bwrap makes
    it: the system directories and the interpreter read-only (the trainer lists them), /proc showing
    only its own uid's processes, five devices, and /sandbox a tmpfs of disk_mb (/tmp leads into it).
    Nothing else of the host is in its view; the old root is left behind by MS_MOVE and chroot."""
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS | CLONE_NEWNET)")
    _mount(libc, None, b"/", None, MS_REC | MS_PRIVATE)  # nothing below reaches the host's namespace
    new = case["workdir"]
    _mount(libc, b"tmpfs", new.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=0755")
    for target, link in case["links"]:
        os.symlink(target, new + link)
    for path in case["binds"]:
        os.makedirs(new + path, exist_ok=True)
        _mount(libc, path.encode(), (new + path).encode(), None, MS_BIND)
        _mount(libc, None, (new + path).encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.mkdir(new + "/proc")
    _mount(libc, b"proc", (new + "/proc").encode(), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"hidepid=2")
    os.mkdir(new + "/dev")
    for device in ("null", "zero", "full", "random", "urandom"):
        open(f"{new}/dev/{device}", "w").close()  # a mount point
        _mount(libc, f"/dev/{device}".encode(), f"{new}/dev/{device}".encode(), None, MS_BIND)
    os.mkdir(new + "/sandbox")
    size = f"size={case['disk_mb']}m,nr_inodes=65536,mode=0700".encode()
    _mount(libc, b"tmpfs", (new + "/sandbox").encode(), b"tmpfs", MS_NOSUID | MS_NODEV, size)
    os.mkdir(new + "/sandbox/tmp")
    if not os.path.lexists(new + "/tmp"):  # else an interpreter lives under /tmp: TMPDIR leads to /sandbox/tmp
        os.symlink("/sandbox/tmp", new + "/tmp")
    os.chdir(new)
    _mount(libc, b".", b"/", None, MS_MOVE)
    os.chroot(".")
    _mount(libc, None, b"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir("/sandbox")


def _setup(case):
    libc = ctypes.CDLL(None, use_errno=True)
    uid = case.get("uid")
    if uid is not None and os.getuid() == 0:
        if case.get("private_root"):
            _private_root(libc, case)
        for path in (".", "tmp"):  # the case's directory: the tmpfs bwrap or the lines above made
            os.chown(path, uid, uid)
        os.chmod("tmp", 0o1777)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # real, effective and saved: no way back to root
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
    if case["role"] == "judge":
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace or /proc/<pid>/mem, fd/ even for its own uid
    mb = 1024 * 1024
    for limit, value in ((resource.RLIMIT_AS, case["memory_mb"] * mb), (resource.RLIMIT_NPROC, case["nproc"]),
                         (resource.RLIMIT_FSIZE, case["file_size_mb"] * mb), (resource.RLIMIT_CPU, case["cpu_s"]),
                         (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, 256)):
        resource.setrlimit(limit, (value, value))


def _exit_code(exc):
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def _finish(code):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - the code may have closed or replaced it
            pass
    os._exit(code)


def _script(solution):
    scope = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(solution, "solution.py", "exec"), scope)  # noqa: S102 - the sandboxed code itself
    except SystemExit as exc:
        _finish(_exit_code(exc))
    except BaseException:  # noqa: BLE001 - the solution's own error
        traceback.print_exc()
        _finish(CRASHED)
    _finish(0)


class _Replies:
    """Lines of JSON to the reply descriptor, written whole."""

    def __init__(self, fd):
        self.fd, self.write = fd, os.write

    def send(self, message):
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        while data:
            data = data[self.write(self.fd, data):]


def _function(scope, name):
    """``name`` in the solution's globals, else the method of a ``Solution`` class (LeetCode's form)."""
    if name in scope:
        return scope[name]
    if isinstance(scope.get("Solution"), type) and hasattr(scope["Solution"], name):
        return getattr(scope["Solution"](), name)
    raise NameError(f"name {name!r} is not defined")


def _kind(scope, name):
    if name not in scope:
        return [name, "missing"]
    if callable(scope[name]):
        return [name, "callable"]
    try:
        return [name, "value", case_values.encode(scope[name])]
    except case_values.NotPlain:
        return [name, "opaque"]


def _answer_one(scope, request):
    try:
        op = request[0]
        if op == "names":
            return ["names", [_kind(scope, name) for name in request[1]]]
        if op == "exec":
            exec(compile(request[1], "tests.py", "exec"), scope)  # noqa: S102 - the tests' imports
            value = None
        elif op == "eval":
            value = eval(compile(request[1], "tests.py", "eval"), scope)  # a call of the tests
        else:
            value = _function(scope, request[1])(*request[2], **request[3])
    except BaseException as exc:  # noqa: BLE001 - the solution's error, sent as such
        return ["raised", type(exc).__name__, str(exc)[:500]]
    try:
        return ["ok", case_values.encode(value)]
    except case_values.NotPlain as exc:
        return ["opaque", str(exc)[:200]]


def _requests(payload, fd):
    if payload.get("requests") is not None:
        yield from payload["requests"]
        return
    with os.fdopen(fd, "rb") as pipe:
        while True:
            line = pipe.readline(REQUEST_CAP)
            if not line:
                return
            yield line


def _answer(payload, fds):
    replies = _Replies(fds["reply"])
    scope = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(payload["solution"], "solution.py", "exec"), scope)  # noqa: S102 - the sandboxed code
    except SystemExit as exc:
        replies.send(["exit", _exit_code(exc)])
        _finish(FAILED if _exit_code(exc) == 0 else _exit_code(exc))
    except BaseException as exc:  # noqa: BLE001 - the solution's own error
        traceback.print_exc()
        replies.send(["fatal", type(exc).__name__, str(exc)[:500]])
        _finish(CRASHED)
    for line in _requests(payload, fds.get("requests")):
        try:
            request = case_values.loads(line)
        except ValueError as exc:
            replies.send(["raised", "ValueError", f"a request that does not parse: {exc}"])
            continue
        replies.send(_answer_one(scope, request))
    _finish(0)


def main(payload):
    case = payload["case"]
    try:
        _setup(case)
    except Exception:  # noqa: BLE001 - any failure here means no sandbox: never run the code
        traceback.print_exc()
        _finish(SETUP)
    if case["role"] == "script":
        _script(payload["solution"])
    elif case["role"] == "answer":
        _answer(payload, case["fds"])
    else:
        from grpocli.rewards import sandbox_judge

        sandbox_judge.judge(payload, case["fds"])
