"""A judge's reply read as a score, where the rubric asks for it and where the completion cannot put one.

LLM-as-a-judge prompts (Zheng et al. 2023, "Judging LLM-as-a-Judge with MT-Bench and Chatbot
Arena": ``Rating: [[5]]``; Prometheus, Kim et al. 2023: ``[RESULT] 4``; OpenAI's evals
model-graded templates) ask for the score in a fixed form, and judges still vary it. The judge
sees the completion it grades and may quote it, and a completion may hold a verdict of its own
("... Score: 10"): a quote of it must never be read as the judge's verdict. So a reply is read,
after its ``<think>...</think>`` reasoning is dropped, in this order:

1. Structured: the reply as a whole is the verdict (what ``structured_outputs`` makes it): a JSON
   object with a ``score`` (``{"score": 7, "reason": "..."}``, also in a ```` ```json ```` fence),
   or one form and nothing else: ``Score: 7``, ``Rating: [[5]]``, ``[RESULT] 4``, ``7/10``,
   ``\\boxed{7}``, ``7`` (not with ``strict``).
2. The judge's verdict line, the last one: a line that starts with the label (``Score: 7``,
   ``**Rating:** 7/10``, ``## Final score: 7``, ``Grade = 7``, ``{"score": 7``), the number being
   the first thing after the label; or the markers ``[RESULT] 7`` and ``[[7]]`` anywhere in the
   judge's own text. A later mention in the same line or in prose ("On reflection, Score: 6") is
   not a verdict line.
3. A fraction (``7/10``, ``7 out of 10``; a denominator other than the top of the range is read as
   a share of the range: ``3/5`` on 0-10 is 6), then ``\\boxed{7}``, the last one in the judge's
   own text; unless ``strict``, the last number in it that lies within the range.

The judge's own text (rules 2 and 3) leaves out what quotes: fenced code blocks, ``>`` quote
lines, text within double, curly or back quotes or single quotes that open and close a phrase,
and any line the completion itself holds (the judge copied it); a verdict the completion also
holds word for word is not read, so a completion that contains the judge's own verdict line
scores None rather than what it wrote (``structured_outputs`` avoids it: rule 1 reads the whole
reply). A score outside [low, high], or no form at all, is None: the reply is unparsed.

Untrusted text is read in linear time: every pattern's repeats are bounded or cannot overlap (no
backtracking blow-up on a crafted reply), a reply is read from its last ``MAX_REPLY_CHARS``
characters, and its verdict from the last ``MAX_PARSED_CHARS`` of them after reasoning is dropped,
in the last ``MAX_LINES`` lines that hold a number.
"""

from __future__ import annotations

import json
import math
import re

MAX_REPLY_CHARS = 1 << 20  # a longer reply: its last MiB (the verdict ends it), <think> blocks dropped
MAX_PARSED_CHARS = 1 << 14  # the verdict is read from the last 16 KiB of the rest,
MAX_LINES = 64  # from its last 64 lines that hold a number (the judge's own)

NUMBER = r"[-+]?\d{1,12}(?:\.\d{1,12})?(?!\d)"
_OF = rf"(?:[ \t]{{0,3}}(?:/|out[ \t]{{1,3}}of)[ \t]{{0,3}}({NUMBER}))?"  # an optional "/10", "out of 10"
_OPEN = r"[ \t]{0,8}(?:#{1,6}[ \t]{0,3}|[-+*][ \t]{1,3})?[*_]{0,3}"  # indent, a heading or bullet, bold
LABEL = re.compile(
    _OPEN + r"(?:(?:final|overall)[ \t]{1,3})?(?:score|rating|grade)[*_]{0,3}[ \t]{0,3}(?:is|of|=|:)?[ \t]{0,3}"
    rf"[*_]{{0,3}}[ \t]{{0,3}}\[{{0,2}}({NUMBER})\]{{0,2}}{_OF}", re.IGNORECASE)
JSON_KEY = re.compile(rf"[ \t]{{0,8}}\{{?[ \t]{{0,3}}[\"']score[\"'][ \t]{{0,3}}:[ \t]{{0,3}}[\"']?({NUMBER})",
                      re.IGNORECASE)
RESULT = re.compile(rf"\[RESULT\][ \t]{{0,3}}({NUMBER})", re.IGNORECASE)
DOUBLE_BRACKETS = re.compile(rf"\[\[({NUMBER})\]\]")
FRACTION = re.compile(rf"(?<![\w.])({NUMBER})[ \t]{{0,3}}(?:/|\bout[ \t]{{1,3}}of\b)[ \t]{{0,3}}({NUMBER})",
                      re.IGNORECASE)
BOXED = re.compile(rf"\\boxed\{{[ \t]{{0,3}}({NUMBER})[ \t]{{0,3}}\}}")
ANY_NUMBER = re.compile(rf"(?<![\w.])({NUMBER})(?!\w)")
ALONE = [re.compile(p + r"[ \t.*_]{0,8}", re.IGNORECASE) for p in (  # rule 1: the whole reply is one form
    LABEL.pattern, JSON_KEY.pattern + r"[\"']?[ \t]{0,3}\}", rf"\[RESULT\][ \t]{{0,3}}({NUMBER})",
    rf"\[\[({NUMBER})\]\]", rf"({NUMBER}){_OF}", BOXED.pattern)]
BARE = 4  # ALONE[BARE]: a number, or a fraction
QUOTED = re.compile(r'"[^"\n]*"|“[^”\n]*”|«[^»\n]*»|`[^`\n]*`|(?<!\w)\'[^\'\n]*\'(?!\w)')
DIGIT = re.compile(r"\d")
THINK_OPEN, THINK_CLOSE = re.compile(r"<think>", re.IGNORECASE), re.compile(r"</think>", re.IGNORECASE)
FENCE = ("```", "~~~")


def parse_score(reply: str | None, low: float = 0.0, high: float = 10.0, *, strict: bool = False,
                completion: str | None = None) -> float | None:
    """The score a judge's ``reply`` gives on the scale [low, high], or None when none can be read;
    ``completion`` is the text the judge graded (a verdict it holds is not the judge's)."""
    if not reply:
        return None
    text = without_thinking(reply[-MAX_REPLY_CHARS:]).strip()
    if len(text) <= MAX_PARSED_CHARS:
        found = _structured(text, strict)
        if found is not None:
            return _on_scale(*found, low, high)
    lines = own_lines(text[-MAX_PARSED_CHARS:], completion or "")
    for raw, unquoted in lines:
        found = _verdict(raw, unquoted)
        if found is not None:
            return _on_scale(*found, low, high)
    for pattern in (FRACTION, BOXED):
        for _, unquoted in lines:
            hits = pattern.findall(unquoted)
            if hits:
                last = hits[-1]
                return _on_scale(*last, low, high) if isinstance(last, tuple) else _on_scale(last, "", low, high)
    if strict:
        return None
    for _, unquoted in lines:
        for raw_number in reversed(ANY_NUMBER.findall(unquoted)):
            value = _on_scale(raw_number, "", low, high)
            if value is not None:
                return value
    return None


def without_thinking(text: str) -> str:
    """``text`` without its closed ``<think>...</think>`` blocks (one pass: linear time)."""
    parts, at = [], 0
    while (opened := THINK_OPEN.search(text, at)) is not None:
        closed = THINK_CLOSE.search(text, opened.end())
        if closed is None:
            break
        parts += [text[at : opened.start()], " "]
        at = closed.end()
    parts.append(text[at:])
    return "".join(parts)


def own_lines(text: str, completion: str) -> list[tuple[str, str]]:
    """Of the last ``MAX_LINES`` lines that hold a digit (outside fenced blocks and ``>`` quote
    lines), those the judge wrote itself (the completion does not hold them: not copied from it),
    last first, each as written and with its quoted phrases blanked."""
    kept, fenced = [], False
    for line in text.splitlines():
        bare = line.strip()
        if bare.startswith(FENCE):
            fenced = not fenced
        elif not fenced and not bare.startswith(">") and DIGIT.search(bare):
            kept.append(line)
    out = []
    for line in reversed(kept[-MAX_LINES:]):  # each copy check costs up to the completion's length
        bare = line.strip()
        if not (len(bare) >= 3 and bare in completion):
            out.append((line, QUOTED.sub(" ", line)))
    return out


def _structured(text: str, strict: bool) -> tuple[str, str] | None:
    """(number, denominator) where the whole reply is the verdict (rule 1; a bare number unless
    ``strict``), else None."""
    body = text
    if body.startswith(FENCE) and body.endswith(FENCE[0]):  # ```json {...} ```
        body = body[3:-3].removeprefix("json").strip()
    if body.startswith("{"):
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            data = None
        if isinstance(data, dict) and "score" in data:
            value = data["score"]
            ok = isinstance(value, (int, float, str)) and not isinstance(value, bool)
            return (str(value) if ok else "nan"), ""
    if "\n" in text:
        return None
    for pattern in ALONE:
        match = pattern.fullmatch(text)
        if match is not None:
            groups = [g or "" for g in match.groups()]
            if strict and pattern is ALONE[BARE] and not groups[1]:
                return None
            return groups[0], groups[1] if len(groups) > 1 else ""
    return None


def _verdict(raw: str, unquoted: str) -> tuple[str, str] | None:
    """(number, denominator) of a verdict line (rule 2): the label at its start, else its last marker."""
    for pattern in (LABEL, JSON_KEY):
        match = pattern.match(raw)
        if match is not None:
            groups = match.groups()
            return groups[0], (groups[1] or "") if len(groups) > 1 else ""
    markers = [(m.start(), m.group(1)) for p in (RESULT, DOUBLE_BRACKETS) for m in p.finditer(unquoted)]
    return (max(markers)[1], "") if markers else None


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


__all__ = ["MAX_LINES", "MAX_PARSED_CHARS", "MAX_REPLY_CHARS", "normalized", "own_lines", "parse_score",
           "without_thinking"]
