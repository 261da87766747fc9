"""One case of ``code.tests``, run in the sandbox and judged where the solution cannot reach.

Three ways, by what the row's tests are; in none of them does the solution's process hold an expected
value, a test file, a token or a verdict:

- stdin/stdout: the process gets the input on stdin; the trainer compares what it printed;
- a function call (``fn_name``) or asserts ``take_apart`` can read (``assert add(1, 2) == 3``): the
  process runs the solution and answers each request (call this, evaluate that) with a plain value
  (``case_values``) on an anonymous file; the trainer decodes the answers and compares them with the
  expected values it kept;
- any other test code (HumanEval's ``check(candidate)``): a judge process runs it, with stand-ins that
  call the solution's functions in the solution's process over two pipes (``sandbox_judge``); the
  judge writes its token to a file only it holds, and only when the tests ran through.

As root the two processes of a judged case run under two uids of the pool. Whatever a case does, the
trainer waits at most ``timeout_s`` + 1 s and reads at most REPLY_CAP bytes of answers and READ_CAP
of stdout.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

from grpocli.rewards import assertions, case_values
from grpocli.rewards.assertions import Check
from grpocli.rewards.sandbox import STARTUP_S, Child, Limits, Outcome, Status, head, spawn
from grpocli.rewards.uid_pool import UidSlots

READ_CAP = 1 << 20  # bytes of a case's stdout that are compared
REPLY_CAP = 4 << 20  # bytes of answers read back from one case
FAILED = 3  # the harness's exit code for a failed test (sandbox_harness.FAILED)


@dataclass(frozen=True)
class Program:
    """One case: the solution and what it is tested with. ``tests`` holds the test code (assert), the
    expected stdout (stdio), or ``{"fn": ..., "args": [...], "expected": ...}`` as JSON (call)."""

    solution: str
    mode: Literal["assert", "stdio", "call"]
    tests: str = ""
    stdin: str = ""


def run_program(program: Program, limits: Limits, isolation: str, python: str | None = None) -> Outcome:
    """Run ``program`` under ``isolation`` (``bwrap`` or ``process``) within ``limits`` and judge it; never
    raises for what the program does. Everything it started is killed and its directory removed on return."""
    python = python or sys.executable
    deadline = time.monotonic() + limits.timeout_s + STARTUP_S
    if program.mode == "stdio":
        return _stdio(program, limits, isolation, python, deadline)
    if program.mode == "call":
        spec = json.loads(program.tests)
        request = ["call", spec["fn"], case_values.encode(list(spec["args"])), case_values.encode({})]
        return _answers(program, [request], [Check("json", spec["expected"])], limits, isolation, python, deadline)
    taken = assertions.take_apart(program.tests)
    if taken is None:
        return _judged(program, limits, isolation, python, deadline)
    return _answers(program, *taken, limits, isolation, python, deadline)


def _stdio(program: Program, limits: Limits, isolation: str, python: str, deadline: float) -> Outcome:
    with UidSlots(1) as uids, tempfile.TemporaryFile() as stdin:
        stdin.write(program.stdin.encode())
        stdin.seek(0)
        child = spawn("script", {"solution": program.solution}, limits, isolation, python, uids and uids[0],
                      stdin=stdin)
        try:
            code = child.wait(deadline)
            if code is None or child.timed_out():
                return _outcome(child, "timeout")
            if code != 0:
                return _outcome(child, "crashed")
            return _outcome(child, "passed" if same_output(child.output(READ_CAP), program.tests) else "failed")
        finally:
            child.stop()


def _answers(program: Program, requests: list[list], checks: list[Check | None], limits: Limits, isolation: str,
             python: str, deadline: float) -> Outcome:
    lines = [json.dumps(r, separators=(",", ":")) for r in requests]
    with UidSlots(1) as uids, tempfile.TemporaryFile() as replies:
        child = spawn("answer", {"solution": program.solution, "requests": lines}, limits, isolation, python,
                      uids and uids[0], fds={"reply": replies.fileno()})
        try:
            code = child.wait(deadline)
            if code is None or child.timed_out():
                return _outcome(child, "timeout")
            return _outcome(child, _verdict(_read_replies(replies), checks, code))
        finally:
            child.stop()


def _read_replies(replies) -> list | None:
    """The answers, one message a line; None when there is more than REPLY_CAP or a line is not one."""
    data = head(replies, REPLY_CAP + 1)
    if len(data) > REPLY_CAP:
        return None
    try:
        messages = [case_values.loads(line) for line in data.splitlines()]
    except ValueError:
        return None
    return messages if all(isinstance(m, list) and m for m in messages) else None


def _verdict(messages: list | None, checks: list[Check | None], code: int) -> Status:
    if messages is None:
        return "failed"  # what it wrote there is not answers: tampering, or far too much
    if messages and messages[0][0] in ("fatal", "exit"):
        exited_cleanly = messages[0][0] == "exit" and messages[0][1:2] == [0]
        return "failed" if exited_cleanly else "crashed"
    for i, check in enumerate(checks):
        if i >= len(messages):
            return "failed" if code in (0, FAILED) else "crashed"
        kind = messages[i][0]
        if kind == "raised":
            return "crashed"
        if kind != "ok" or len(messages[i]) != 2:
            return "failed"  # not plain data, or not an answer
        if check is not None and not _holds(check, messages[i][1]):
            return "failed"
    return "passed" if code == 0 else "crashed"


def _holds(check: Check, got: object) -> bool:
    try:
        return check.holds(got)
    except (RecursionError, MemoryError, ValueError, TypeError, OverflowError):  # nested ~1000 deep, say
        return False


def _judged(program: Program, limits: Limits, isolation: str, python: str, deadline: float) -> Outcome:
    token = secrets.token_hex(16)
    payload = {"tests": program.tests, "names": assertions.free_names(program.tests), "token": token}
    with UidSlots(2) as uids, tempfile.TemporaryFile() as verdict:
        to_solution, to_judge = os.pipe(), os.pipe()  # (read, write) each
        children: list[Child] = []
        try:
            children.append(spawn("judge", payload, limits, isolation, python, uids and uids[0],
                                  fds={"requests": to_solution[1], "replies": to_judge[0], "verdict": verdict.fileno()}))
            children.append(spawn("answer", {"solution": program.solution, "requests": None}, limits, isolation,
                                  python, uids and uids[1], fds={"requests": to_solution[0], "reply": to_judge[1]}))
        except BaseException:
            for child in children:
                child.stop()
            raise
        finally:
            for fd in (*to_solution, *to_judge):
                os.close(fd)
        judge, solution = children
        try:
            code = judge.wait(deadline)
            if code is None or judge.timed_out() or solution.timed_out():
                return _outcome(solution, "timeout", judge)
            if code == 0 and head(verdict, 64) == token.encode():
                return _outcome(solution, "passed", judge)
            ended = solution.proc.poll()
            solution_crashed = ended not in (None, 0, FAILED)
            return _outcome(solution, "failed" if code == FAILED and not solution_crashed else "crashed", judge)
        finally:
            solution.stop()
            judge.stop()


def _outcome(child: Child, status: Status, judge: Child | None = None) -> Outcome:
    errors = child.errors() + (judge.errors()[-1000:] if judge is not None else "")
    return Outcome(status, child.output(READ_CAP), child.proc.returncode, errors[-2000:])


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
