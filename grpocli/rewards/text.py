"""Text of a completion and the answer inside it: the small parsers the built-in rewards share.

Completions reach a reward as TRL hands them over: a string, or (for conversational data) a
list of chat messages such as ``[{"role": "assistant", "content": "..."}]``.
"""

from __future__ import annotations

import re
from typing import Any

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
INTEGER = re.compile(r"-?\d+")
THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")


def completion_text(completion: Any) -> str:
    """The text of one completion: the string itself, or the last assistant message's content.

    Message content may be a string or a list of parts (``{"type": "text", "text": ...}``), as
    in TRL's conversational and multimodal formats.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    if isinstance(completion, (list, tuple)):
        messages = [m for m in completion if isinstance(m, dict)]
        assistant = [m for m in messages if m.get("role", "assistant") == "assistant"]
        chosen = assistant or messages
        if chosen:
            return _content_text(chosen[-1].get("content"))
        if not completion:
            return ""
    raise TypeError(
        f"a completion must be a string or a list of chat messages "
        f"([{{'role': 'assistant', 'content': '...'}}]), got {type(completion).__name__}: "
        f"{str(completion)[:80]!r}"
    )


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def answer_tag(text: str) -> str | None:
    """The inside of the last ``<answer>...</answer>`` (as ``ANSWER_TAG.findall(text)[-1]``), stripped;
    None when there is none. In linear time: the regular expression retries from every unclosed tag
    (40 KB of "<answer>" took 3 s)."""
    found, at = None, 0
    while (opened := text.find("<answer>", at)) != -1:
        closed = text.find("</answer>", opened + len("<answer>"))
        if closed == -1:
            break
        found, at = text[opened + len("<answer>") : closed], closed + len("</answer>")
    return found.strip() if found is not None else None


def last_boxed(text: str) -> str | None:
    """The inside of the last ``\\boxed{...}`` (braces matched), or None."""
    start, limit = text.rfind("\\boxed{"), len(text)
    while start != -1:
        depth, i = 0, start + len("\\boxed")
        for j in range(i, limit):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[i + 1 : j]
        # unclosed: try an earlier one, which closes before this one or never (linear time in all)
        start, limit = text.rfind("\\boxed{", 0, start), start
    return None


def last_line(text: str) -> str:
    """The last non-blank line, stripped ('' for blank text)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def last_integer(text: str) -> int | None:
    """The last integer written in the text (``1,234`` read as 1234), or None."""
    found = INTEGER.findall(THOUSANDS.sub("", text))
    return int(found[-1]) if found else None
