"""Run code.tests or single sandbox cases as whoever runs this, for the sandbox's tests.

The tests start this file (``run_as``) as themselves (root, in CI) or under ``setpriv --reuid=65534
...`` for an unprivileged user: a JSON job on stdin, the result as JSON on stdout. A job is ``{"completions": [...], "tests": [...], "args": {...}}`` (the
scores, the logged counts) or ``{"programs": [[solution, mode, tests, stdin], ...], "limits": {...},
"isolation": ...}`` (each case's status and stdout). The result also says the uid it ran as and
the peak memory of this process (KiB).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NOBODY = 65534
ROOT = Path(__file__).resolve().parent.parent


def peak_kib() -> int:
    """This process's peak resident memory since it started this program (VmHWM of its own address
    space). Not getrusage's ru_maxrss: that keeps the peak of the process it was forked from (a pytest
    worker at 4.8 GB read as this helper's own, once that worker had run the heavy tests)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def run_job(job: dict) -> dict:
    from grpocli.rewards.code_tests import code_tests
    from grpocli.rewards.sandbox import Limits, interpreter
    from grpocli.rewards.sandbox_cases import Program, run_program

    result: dict = {"uid": os.getuid()}
    if "programs" in job:
        limits = Limits(**job.get("limits", {}))
        python = interpreter(None, job["isolation"])
        outs = [run_program(Program(*p), limits, job["isolation"], python) for p in job["programs"]]
        result["outcomes"] = [[o.status, o.stdout] for o in outs]
    else:
        logged: dict[str, float] = {}
        n = len(job["completions"])
        result["scores"] = code_tests([""] * n, job["completions"], tests=job["tests"], log_metric=logged.__setitem__,
                                      **job.get("args", {}))
        result["logged"] = logged
    result["peak_kib"] = peak_kib()
    return result


def _setpriv(python: str) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python]


def _environment(tmp: str) -> dict[str, str]:
    sites = [p for p in sys.path if p.endswith("site-packages")]
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([str(ROOT), *sites]),
            "TMPDIR": tmp, "HOME": tmp, "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1"}


@functools.cache
def nobody_python() -> tuple[str | None, str]:
    """(a Python the unprivileged user can run, with grpo's packages, that can start itself again; or
    None) and why not."""
    if os.geteuid() != 0:
        return None, "not root: no other user to switch to (these tests already run unprivileged)"
    if shutil.which("setpriv") is None:
        return None, "setpriv (util-linux) is not installed"
    tmp = tempfile.mkdtemp(prefix="grpo-nobody-")
    os.chown(tmp, NOBODY, NOBODY)
    probe = ("import subprocess, sys, grpocli.rewards.code_tests\n"
             "subprocess.run([sys.executable, '-I', '-c', 'pass'], check=True)")
    why = ""
    try:
        for python in dict.fromkeys([sys.executable, "/usr/bin/python3"]):
            try:
                done = subprocess.run([*_setpriv(python), "-c", probe], capture_output=True, text=True, timeout=120,
                                      env=_environment(tmp), cwd="/", check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                why += f"{python}: {exc}; "
                continue
            version = subprocess.run([*_setpriv(python), "-c", "import sys; print(sys.version_info[:2])"],
                                     capture_output=True, text=True, timeout=60, cwd="/", check=False)
            if done.returncode == 0 and version.stdout.strip() == str(tuple(sys.version_info[:2])):
                return python, ""
            why += f"{python}: {(done.stderr or version.stderr).strip()[-200:]}; "
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return None, f"no Python that uid {NOBODY} can run with grpo's packages ({why})"


def run_as(user: str, job: dict, tmp: Path, timeout: float = 600) -> dict:
    """``run_job(job)`` in a fresh process (its peak memory its own) as ``user``: "root" (this uid, in
    CI root) or "nobody" (uid 65534, by setpriv); its temp dir ``tmp``, made here and owned by that user."""
    tmp.mkdir(mode=0o700, exist_ok=True)
    argv = [sys.executable, __file__]
    if user == "nobody":
        python, why = nobody_python()
        assert python, why
        os.chown(tmp, NOBODY, NOBODY)
        argv = [*_setpriv(python), __file__]
    done = subprocess.run(argv, input=json.dumps(job), capture_output=True, text=True, timeout=timeout,
                          env=_environment(str(tmp)), cwd="/", check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["uid"] == (NOBODY if user == "nobody" else os.getuid())
    return result


if __name__ == "__main__":
    json.dump(run_job(json.load(sys.stdin)), sys.stdout)
