"""Tool calls in the model's text, in the format of its chat template: one parser per format.

``TOOL_CALL_PARSERS[name](text) -> list[ToolCall]`` (``multi_turn.tool_parser`` picks the entry).
A call the model wrote but that cannot be read (broken JSON, no name) is still a ``ToolCall``,
with ``error`` set: the model gets the error back as the tool's result, and it counts in
``tools/errors``, so a malformed call teaches instead of vanishing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCall:
    """One call: the tool's name and its keyword arguments (or why it could not be read)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # set when the call's text could not be parsed

    def message(self) -> dict[str, Any]:
        """The call as a chat message's ``tool_calls`` entry (OpenAI / transformers format)."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


#: Hermes / Qwen2.5 / Qwen3: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>.
#: SmolLM2 writes a JSON list of such objects inside one tag; both are read.
HERMES_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str) -> list[ToolCall]:
    """Every <tool_call>...</tool_call> block of `text`, in order (an unclosed last block too)."""
    calls: list[ToolCall] = []
    for match in HERMES_CALL.finditer(text):
        body = match.group(1).strip()
        try:
            value = json.loads(body)
        except json.JSONDecodeError as exc:
            calls.append(ToolCall("(unparsed)", error=f"the tool call is not valid JSON ({exc.msg}): {body[:200]}"))
            continue
        for item in value if isinstance(value, list) else [value]:
            calls.append(_hermes_call(item))
    return calls


def _hermes_call(item: Any) -> ToolCall:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return ToolCall("(unparsed)", error='a tool call must be {"name": "...", "arguments": {...}}, got '
                        f"{json.dumps(item)[:200]}")
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(item["name"], error=f"the arguments of a tool call must be a JSON object, got "
                        f"{json.dumps(arguments)[:200]}")
    return ToolCall(item["name"], arguments)


def strip_hermes(text: str) -> str:
    """The text without its tool-call blocks (the assistant message's content)."""
    return HERMES_CALL.sub("", text).strip()


#: multi_turn.tool_parser -> (parse(text) -> calls, strip(text) -> content without the calls).
TOOL_CALL_PARSERS: dict[str, tuple[Callable[[str], list[ToolCall]], Callable[[str], str]]] = {
    "hermes": (parse_hermes, strip_hermes),
}
