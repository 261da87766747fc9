"""The first code that runs inside a sandboxed case (``grpocli.rewards.sandbox``); stdlib only.

Copied into the case's private directory and run as ``python -I sandbox_harness.py case.json``.
Before any untrusted code runs it: reads the pass token from stdin (assert cases) and puts
/dev/null there; as root, moves into a new network namespace (process level) and drops to the
case's own unprivileged uid, so that RLIMIT_NPROC counts and the trainer cannot be signalled;
sets no_new_privs and the parent-death signal; and sets the rlimits (address space, processes,
file size, CPU seconds, no core files). Then it runs the solution: as a script fed the case's
stdin (stdio cases) or followed by the test code in the same globals (assert cases), writing
the token to ``.verdict`` only when the tests returned. Exit codes: 0 ran through, 3 a test
assertion failed, 4 the code raised, 97 the sandbox could not be set up.
"""

import ctypes
import json
import os
import resource
import signal
import sys
import traceback

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
FAILED, CRASHED, SETUP = 3, 4, 97


def _setup(case):
    libc = ctypes.CDLL(None, use_errno=True)
    uid = case.get("uid")
    if uid is not None and os.getuid() == 0:
        if case.get("unshare_net") and libc.unshare(CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # real, effective and saved: no way back to root
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
    mb = 1024 * 1024
    for limit, value in ((resource.RLIMIT_AS, case["memory_mb"] * mb), (resource.RLIMIT_NPROC, case["nproc"]),
                         (resource.RLIMIT_FSIZE, case["file_size_mb"] * mb), (resource.RLIMIT_CPU, case["cpu_s"]),
                         (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, 256)):
        resource.setrlimit(limit, (value, value))


def _run(case, token):
    with open("solution.py", encoding="utf-8") as f:
        solution = f.read()
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(solution, "solution.py", "exec"), scope)  # noqa: S102 - the sandboxed code itself
    if case["mode"] != "assert":
        return
    with open("tests.py", encoding="utf-8") as f:
        tests = f.read()
    exec(compile(tests, "tests.py", "exec"), scope)  # noqa: S102 - the row's tests
    fd = os.open(".verdict", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, token)
    os.close(fd)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        case = json.load(f)
    token = b""
    if case["mode"] == "assert":
        token = sys.stdin.buffer.readline().strip()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    try:
        _setup(case)
    except Exception:  # noqa: BLE001 - any failure here means no sandbox: never run the code
        traceback.print_exc()
        os._exit(SETUP)
    del case["uid"]
    try:
        _run(case, token)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if case["mode"] == "assert" and code == 0:
            code = FAILED  # sys.exit(0) before the tests ran: they did not pass
        sys.stdout.flush()
        os._exit(code)
    except AssertionError:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(FAILED)
    except BaseException:  # noqa: BLE001 - the solution's own error
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(CRASHED)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
