"""A multi-turn rollout's conversation as `grpo inspect RUN --rollouts STEP` prints it.

Rollouts files of multi-turn runs carry ``conversation``: the messages after the prompt, turn by
turn (grpocli.multiturn.turns): the model's turns (``assistant``, with ``tool_calls``) and the tools'
results (``tool``). Each message gets a label line (whose turn, which tool) and its text, cut in
the middle where it is long, so that the start and the end (where the answer is) both show.
"""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text

MESSAGE_CHARS = 400    # a message's text longer than this is cut in the middle
ARGUMENTS_CHARS = 160  # a tool call's arguments (JSON) longer than this are cut at the end


def conversation_text(messages: Any) -> Text:
    """The conversation, one labelled block per message: ``assistant (turn k)``, its tool calls as
    ``-> call name {arguments}``, and ``tool name`` (``tool name: error`` for a failed call)."""
    if not isinstance(messages, list):
        return Text(clip(str(messages), MESSAGE_CHARS))
    out = Text()
    turn = 0
    for k, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        if out:
            out.append("\n")
        role = str(message.get("role", "?"))
        if role == "assistant":
            turn += 1
            _assistant(out, message, turn, last=k == len(messages) - 1)
        elif role == "tool":
            _tool(out, message)
        else:
            out.append(f"[{role}]\n", style="bold")
            out.append(clip(_content(message), MESSAGE_CHARS))
    return out


def _assistant(out: Text, message: dict[str, Any], turn: int, *, last: bool) -> None:
    out.append(f"[assistant, turn {turn}]\n", style="bold cyan")
    content = _content(message)
    if content:
        out.append(clip(content, MESSAGE_CHARS))
    calls = message.get("tool_calls") or []
    for call in calls:
        function = call.get("function", call) if isinstance(call, dict) else {}
        arguments = json.dumps(function.get("arguments", {}), ensure_ascii=False)
        out.append("\n" if content or call is not calls[0] else "")
        out.append(f"-> call {function.get('name', '?')} ", style="magenta")
        out.append(clip(arguments, ARGUMENTS_CHARS, tail=False))
    if calls and last:
        out.append("\n(no tool result follows: the rollout ended here)", style="dim")


def _tool(out: Text, message: dict[str, Any]) -> None:
    content = _content(message)
    failed = content.startswith("Error:")
    label = f"[tool {message.get('name', '?')}{': error' if failed else ''}]\n"
    out.append(label, style="bold red" if failed else "bold green")
    out.append(clip(content, MESSAGE_CHARS), style="red" if failed else "")


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    return "" if content is None else content if isinstance(content, str) else str(content)


def clip(text: str, limit: int, *, tail: bool = True) -> str:
    """``text`` if it is at most ``limit`` characters; else its start and (with ``tail``) its end,
    with a note of how many characters were left out between them."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3 if tail else limit
    end = limit - head if tail else 0
    note = f" ... ({len(text) - head - end} characters cut) "
    return text[:head] + note + ("... " + text[-end:] if end else "")
