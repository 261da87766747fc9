"""The one error type users see: what failed, where, what is valid, what to run next.

Every command catches `UserError`, prints it without a traceback and exits with code 2.
"""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Iterable

#: Code points named at most, for a name full of look-alikes.
LOOKALIKES_SHOWN = 4
#: Cyrillic and Greek letters that print like ASCII ones (Unicode's confusables, the common part),
#: so that a name typed with them still finds the key it imitates.
ASCII_LOOKALIKES = str.maketrans(
    "аеорсухѕіјԁһӏАВЕКМНОРСТХЅІЈαεικνορτυχΑΒΕΗΙΚΜΝΟΡΤΥΧΖ",
    "aeopcyxsijdhlABEKMHOPCTXSIJaeikvoptuxABEHIKMNOPTYXZ",
)


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
    """' (did you mean "x"?)' for the closest candidate, or '' when none is close. Where ``name``
    holds characters that are not ASCII and the candidate lacks (a Cyrillic "е" typed for "e"
    looks the same), those are named by position and code point, since the two print alike."""
    candidates = list(candidates)
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6) or difflib.get_close_matches(
        name.translate(ASCII_LOOKALIKES), candidates, n=1, cutoff=0.6)
    if not close:
        return ""
    odd = [(i, c) for i, c in enumerate(name) if not c.isascii() and c not in close[0]]
    if not odd:
        return f' (did you mean "{close[0]}"?)'
    named = ", ".join(f"{c!r} U+{ord(c):04X} {unicodedata.name(c, 'unnamed')} at position {i + 1}"
                      for i, c in odd[:LOOKALIKES_SHOWN])
    more = f" and {len(odd) - LOOKALIKES_SHOWN} more" if len(odd) > LOOKALIKES_SHOWN else ""
    return (f' (did you mean "{close[0]}"? {name!r} holds non-ASCII characters that look like ASCII ones: '
            f"{named}{more}; retype it in ASCII)")


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
