"""A judge's reply read as a score: the forms LLM judges write, tried from the most explicit.

LLM-as-a-judge prompts (Zheng et al. 2023, "Judging LLM-as-a-Judge with MT-Bench and Chatbot
Arena": ``Rating: [[5]]``; Prometheus, Kim et al. 2023: ``[RESULT] 4``; OpenAI's evals
model-graded templates) ask for the score in a fixed form, and judges still vary it. A reply is
read in this order, the last match of the first form found winning (a judge reasons first and
concludes last); ``<think>...</think>`` reasoning is dropped first:

1. JSON: ``{"score": 7}`` (also ``"score": "7"``);
2. a label: ``Score: 7``, ``**Rating:** 7/10``, ``Grade = 7``, ``[RESULT] 7``, ``[[7]]``;
3. a fraction: ``7/10``, ``7 out of 10`` (a denominator other than the top of the range is read
   as a share of the range: ``3/5`` on 0-10 is 6);
4. ``\\boxed{7}``;
5. unless ``strict``: the last number in the reply that lies within the range.

A score outside [low, high] in forms 1-4, or no form at all, is None: the reply is unparsed.
"""

from __future__ import annotations

import math
import re

NUMBER = r"[-+]?\d+(?:\.\d+)?"
THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
JSON_SCORE = re.compile(rf"[\"']score[\"']\s*:\s*[\"']?({NUMBER})", re.IGNORECASE)
LABELLED = re.compile(
    rf"(?:\b(?:score|rating|grade)\b|\[RESULT\])[*_\s]*(?:is|of|=|:)?[*_\s]*\[{{0,2}}({NUMBER})\]{{0,2}}"
    rf"(?:\s*(?:/|out\s+of)\s*({NUMBER}))?",
    re.IGNORECASE,
)
DOUBLE_BRACKETS = re.compile(rf"\[\[({NUMBER})\]\]")
FRACTION = re.compile(rf"({NUMBER})\s*(?:/|\bout\s+of\b)\s*({NUMBER})", re.IGNORECASE)
BOXED = re.compile(rf"\\boxed\{{\s*({NUMBER})\s*\}}")
ANY_NUMBER = re.compile(rf"(?<![\w.]){NUMBER}(?!\w)")


def parse_score(reply: str | None, low: float = 0.0, high: float = 10.0, *, strict: bool = False) -> float | None:
    """The score a judge's ``reply`` gives on the scale [low, high], or None when none can be read."""
    if not reply:
        return None
    text = THINK.sub(" ", reply)
    for pattern in (JSON_SCORE, LABELLED, DOUBLE_BRACKETS):
        found = pattern.findall(text)
        if found:
            last = found[-1]
            return _on_scale(*last, low, high) if isinstance(last, tuple) else _on_scale(last, "", low, high)
    fractions = FRACTION.findall(text)
    if fractions:
        return _on_scale(*fractions[-1], low, high)
    boxed = BOXED.findall(text)
    if boxed:
        return _on_scale(boxed[-1], "", low, high)
    if strict:
        return None
    for raw in reversed(ANY_NUMBER.findall(text)):
        value = _on_scale(raw, "", low, high)
        if value is not None:
            return value
    return None


def _on_scale(number: str, denominator: str, low: float, high: float) -> float | None:
    """``number`` (``number/denominator`` where one is written) on [low, high]; None outside it."""
    try:
        value = float(number)
    except ValueError:
        return None
    if denominator:
        over = float(denominator)
        if over <= 0:
            return None
        if not math.isclose(over, high):
            if not 0 <= value <= over:
                return None
            value = low + value / over * (high - low)
    if not math.isfinite(value) or value < low or value > high:
        return None
    return value


def normalized(score: float | None, low: float, high: float) -> float | None:
    """``score`` mapped from [low, high] onto [0, 1] (None stays None)."""
    return None if score is None else (score - low) / (high - low)


__all__ = ["normalized", "parse_score"]
