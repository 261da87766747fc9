"""The final answer of a completion, for majority voting (maj@N).

Read as the built-in rewards read it (grpocli.rewards.text): the inside of the last
``<answer>...</answer>``, else of the last ``\\boxed{...}``, else the last number written.
Answers are compared after light normalization (spaces, ``$``, a trailing period, thousands
separators, ``19.0`` == ``19``); no symbolic equivalence.
"""

from __future__ import annotations

import re

from grpocli.rewards.text import answer_tag, last_boxed

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
SPACES = re.compile(r"\s+")


def extract_answer(text: str) -> str | None:
    """The normalized final answer of a completion, or None when it states none."""
    found = answer_tag(text)
    if found is None:
        found = last_boxed(text)
    if found is None:
        numbers = NUMBER.findall(THOUSANDS.sub("", text))
        found = numbers[-1] if numbers else None
    if found is None:
        return None
    return normalize_answer(found)


def normalize_answer(answer: str) -> str | None:
    """Canonical text of an answer: None when it is empty."""
    text = SPACES.sub(" ", answer.strip().strip("$").strip()).rstrip(".").strip()
    if not text:
        return None
    plain = THOUSANDS.sub("", text)
    if NUMBER.fullmatch(plain):
        value = float(plain)
        return str(int(value)) if value.is_integer() else repr(value)
    return text
