"""Built-in reward ``code.tests``: run the Python code of each completion against its row's tests.

Tests are read in the formats the common code-RL datasets write them:

- a list of assert statements, or one string of test code (MBPP's ``test_list``, open-instruct's
  code tests, HumanEval's ``test`` + a ``check(...)`` call): each string is one case; it passes when
  every assert holds (``grpocli.rewards.sandbox_cases`` says where each is evaluated and compared);
- ``{"inputs": [...], "outputs": [...]}`` (APPS, TACO, PrimeIntellect, verl's prime code): stdin /
  stdout cases, or call cases with ``"fn_name"`` (the function called with each input's args);
- a list of ``{"input": ..., "output": ...}`` (DeepCoder; ``"testtype": "functional"`` with a
  ``fn_name`` calls a function), or open-r1's ``verification_info`` ``{"test_cases": [...]}``;
- any of these as a JSON string, as datasets often store them.

The code is the last ```python block of the completion (open-r1's ``extract_code``), else the last
``` block, else the whole text. Every case runs in its own sandboxed process
(``grpocli.rewards.sandbox``), which never holds the expected values; the score is the passed fraction or, with ``mode =
"all_or_nothing"``, 1.0 only when every case passes. Rows without tests score None. The batch's
case counts go to the metrics through TRL's ``log_metric``: ``sandbox/passed``, ``sandbox/failed``,
``sandbox/timeout``, ``sandbox/crashed``.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import Counter
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grpocli.errors import UserError
from grpocli.registry.contracts import recipe_args
from grpocli.rewards.sandbox import Limits, interpreter, resolve_isolation
from grpocli.rewards.sandbox_cases import Program, run_program
from grpocli.rewards.text import completion_text
from grpocli.rewards.timings import RowClock

CODE_BLOCK = re.compile(r"```(python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)
STATUSES = ("passed", "failed", "timeout", "crashed")


class CodeTestsArgs(BaseModel):
    """The ``[[rewards]] args`` of ``code.tests``."""

    model_config = ConfigDict(extra="forbid")
    tests_column: str = Field("tests", min_length=1, description="The dataset column that holds each row's tests.")
    mode: Literal["fraction", "all_or_nothing"] = Field(
        "fraction", description="Score the passed fraction of the cases, or 1.0 only when all pass.")
    case_timeout: float = Field(4.0, gt=0, le=600, description="Wall seconds one case may run (CPU seconds: + 2).")
    memory_mb: int = Field(512, ge=64, le=1 << 20, description="Address space of one case's process (RLIMIT_AS).")
    max_processes: int = Field(
        16, ge=1, le=4096, description="Processes and threads one case may have (RLIMIT_NPROC; enforced when "
        "grpo runs as root, where each case runs under a uid of its own).")
    file_size_mb: int = Field(16, ge=1, le=1 << 16,
                              description="Largest file one case may write, its stdout included (RLIMIT_FSIZE).")
    disk_mb: int = Field(64, ge=1, le=1 << 16, description="All one case may write to its directory and /tmp "
                         "together (a tmpfs, counted in memory; bwrap, and the process level as root).")
    workers: int = Field(2, ge=1, le=256, description="Cases run at once.")
    isolation: Literal["auto", "bwrap", "process"] = Field(
        "auto", description="'bwrap': bubblewrap namespaces (no network, own pids, read-only system, private "
        "/tmp); 'process': a child process with limits (as root also its own uid, network and root directory); "
        "'auto': bwrap where it runs, else process. "
        "See docs/code-sandbox.md.")
    python: str | None = Field(None, description="The interpreter that runs the cases (default: grpo's own).")

    def limits(self) -> Limits:
        return Limits(timeout_s=self.case_timeout, memory_mb=self.memory_mb, max_processes=self.max_processes,
                      file_size_mb=self.file_size_mb, disk_mb=self.disk_mb)


ARG_NAMES = tuple(CodeTestsArgs.model_fields)


def parse_args(args: dict[str, Any], where: str = "rewards.args") -> tuple[CodeTestsArgs, str, str]:
    """The args checked, the isolation level to use and the interpreter; UserError (exit 2) for a value out
    of bounds or a sandbox this machine cannot set up. No model is needed: preflight calls it."""
    try:
        parsed = CodeTestsArgs(**{k: v for k, v in args.items() if k in ARG_NAMES})
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        field = CodeTestsArgs.model_fields.get(str(first["loc"][0]))
        raise UserError(f"code.tests arg {key}: {first['msg']}", where=f"{where}.{key}",
                        valid=field.description if field else ", ".join(ARG_NAMES)) from None
    isolation = resolve_isolation(parsed.isolation, where=f"{where}.isolation")
    python = interpreter(parsed.python, isolation, where=f"{where}.python")
    _probe(isolation, python, where)
    return parsed, isolation, python


_PROBED: set[tuple[str, str, str]] = set()


def _probe(isolation: str, python: str, where: str) -> None:
    """One trivial case must pass here, once per level, interpreter and temp dir: a sandbox that cannot
    run (a temp dir its uid cannot enter, an interpreter it cannot read) would score every case 0."""
    key = (isolation, python, tempfile.gettempdir())
    if key in _PROBED:
        return
    out = run_program(Program("ok = True", "assert", tests="assert ok"), Limits(timeout_s=30), isolation, python)
    if out.status != "passed":
        raise UserError(
            f"the {isolation!r} sandbox could not run a trivial case on this machine ({out.status}, exit "
            f"{out.returncode}): {out.stderr.strip()[-600:] or '(no output)'}",
            where=f"{where}.isolation", valid="a sandbox in which `assert True` passes",
            hint="at the process level as root the temp dir ($TMPDIR) and the interpreter must be reachable by "
            'other users (e.g. TMPDIR=/tmp); or set isolation = "bwrap" (see docs/code-sandbox.md)')
    _PROBED.add(key)


def extract_code(text: str) -> str:
    """The last ```python block, else the last ``` block, else the whole text."""
    blocks = CODE_BLOCK.findall(text)
    python = [code for lang, code in blocks if lang]
    if python or blocks:
        return (python or [code for _, code in blocks])[-1]
    return text


def cases_of(tests: Any, fn_name: str | None = None) -> list[tuple[str, str, str]]:
    """(mode, tests, stdin) per case of one row's tests, in any format above: ``assert`` with the test code,
    ``stdio`` with the expected stdout, ``call`` with ``{"fn", "args", "expected"}`` as JSON."""
    if tests is None:
        return []
    if isinstance(tests, str):
        stripped = tests.strip()
        if stripped[:1] in "[{" and stripped:
            try:
                return cases_of(json.loads(stripped), fn_name)
            except json.JSONDecodeError:
                pass
        return [("assert", tests, "")] if stripped else []
    if isinstance(tests, dict):
        fn_name = tests.get("fn_name") or fn_name
        if "test_cases" in tests:
            return cases_of(tests["test_cases"], fn_name)
        if "inputs" in tests and "outputs" in tests:
            return [_io_case(i, o, fn_name) for i, o in zip(tests["inputs"], tests["outputs"])]
        if "input" in tests and "output" in tests:
            functional = tests.get("testtype", tests.get("type")) == "functional"
            return [_io_case(tests["input"], tests["output"], fn_name if functional or fn_name else None)]
    if isinstance(tests, (list, tuple)):
        return [case for item in tests for case in cases_of(item, fn_name)]
    raise UserError(f"code.tests cannot read a test of type {type(tests).__name__}: {str(tests)[:120]!r}",
                    valid='assert strings, {"inputs": [...], "outputs": [...]} (+ "fn_name"), '
                    '[{"input": ..., "output": ...}], or these as JSON',
                    hint="see docs/code-sandbox.md for the test formats")


def _io_case(given: Any, expected: Any, fn_name: str | None) -> tuple[str, str, str]:
    if fn_name:
        if not str(fn_name).isidentifier():
            raise UserError(f"code.tests: fn_name {fn_name!r} is not a Python name", valid="a function name")
        args = given if isinstance(given, list) else [_json_or_text(line) for line in str(given).splitlines()]
        want = _json_or_text(expected) if isinstance(expected, str) else expected
        return "call", json.dumps({"fn": fn_name, "args": args, "expected": want}), ""
    return "stdio", _lines(expected), _lines(given)


def _lines(value: Any) -> str:
    """A stdin or stdout as text; a list holds its lines."""
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except (json.JSONDecodeError, TypeError):
        return value


@recipe_args(*ARG_NAMES)  # read through **kwargs, with the dataset's columns
def code_tests(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
    """Run the code of each completion against its row's tests in a sandbox; the passed fraction (or all-or-nothing)."""
    args, isolation, python = parse_args(kwargs)
    rows = kwargs.get(args.tests_column)
    if rows is None:
        present = ", ".join(sorted(k for k in kwargs if k not in ARG_NAMES)) or "(none)"
        raise UserError(f"reward 'code.tests' needs a dataset column {args.tests_column!r}, which the batch "
                        "does not have", valid=f"columns and args present: {present}",
                        hint="set args.tests_column in this [[rewards]] entry to the column with the tests")
    fn_names = kwargs.get("fn_name") or [None] * len(rows)
    jobs = []  # (row, Program)
    per_row = []
    for row, (completion, tests, fn_name) in enumerate(zip(completions, rows, fn_names)):
        code = extract_code(completion_text(completion))
        cases = cases_of(tests, fn_name)
        per_row.append(len(cases))
        jobs += [(row, Program(code, mode, tests=text, stdin=stdin)) for mode, text, stdin in cases]
    limits = args.limits()
    clock = RowClock(len(per_row), kwargs)  # a row's seconds: its cases' sandbox runs, summed (rewards.timings)

    def run(job: tuple[int, Program]) -> Any:
        with clock.row(job[0]):
            return run_program(job[1], limits, isolation, python)

    with ThreadPoolExecutor(max_workers=args.workers, thread_name_prefix="sandbox") as pool:
        outcomes = list(pool.map(run, jobs))
    clock.report()
    passed = Counter(row for (row, _), out in zip(jobs, outcomes) if out.status == "passed")
    counts = Counter(out.status for out in outcomes)
    log_metric = kwargs.get("log_metric")
    if callable(log_metric):
        for status in STATUSES:
            log_metric(f"sandbox/{status}", float(counts[status]))
    return [None if n == 0 else _score(passed[row], n, args.mode) for row, n in enumerate(per_row)]


def _score(passed: int, cases: int, mode: str) -> float:
    if mode == "all_or_nothing":
        return 1.0 if passed == cases else 0.0
    return passed / cases


def check_args(args: dict[str, Any], columns: Collection[str] = (), *, where: str = "rewards.args") -> None:
    """Before any model loads: the args' values, and that the sandbox can be set up here."""
    parse_args(args, where)


code_tests.check_args = check_args  # run at preflight by grpocli.rewards.arguments.check_reward_signature
code_tests.takes_row_seconds = True  # reports each row's sandbox seconds (grpocli.rewards.timings)
#: Set by the operator of a reward server alone (grpo reward-serve --args), never by a request: what runs the code.
code_tests.operator_args = ("python", "isolation")
