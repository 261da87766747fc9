"""The one error type users see: what failed, where, what is valid, what to run next.

Every command catches `UserError`, prints it without a traceback and exits with code 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """A mistake in the user's input (recipe, arguments, plugin, data), not a bug in grpo."""

    exit_code = 2

    def __init__(
        self,
        what: str,
        *,
        where: str | None = None,
        valid: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.what = what
        self.where = where
        self.valid = valid
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        lines = [self.what if not self.where else f"{self.where}: {self.what}"]
        if self.valid:
            lines.append(f"  valid: {self.valid}")
        if self.hint:
            lines.append(f"  next: {self.hint}")
        return "\n".join(lines)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """' (did you mean "x"?)' for the closest candidate, or '' when none is close."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


class Stopped(BaseException):
    """A run stopped by a signal (SIGTERM from a scheduler or `kill`, SIGINT from Ctrl-C): not an
    error, so not an Exception (a reward's `except Exception` cannot swallow it). The command says
    what was kept and exits with 128 + the signal's number, as a process killed by it would."""

    def __init__(self, signum: int, kept: str = "") -> None:
        self.signum = signum
        self.kept = kept
        super().__init__(kept)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def name(self) -> str:
        import signal

        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"
