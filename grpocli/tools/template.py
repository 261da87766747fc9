"""The chat template's side of multi-turn rollouts: prompts with tools, and a tool turn's tokens.

Prompts are rendered with ``apply_chat_template(messages, tools=schemas)``. A template that
ignores ``tools`` (SmolLM2's, the tiny model's) gets the tools in a system message worded as
Qwen2.5's template words it, so the model still sees them.

A tool turn (the tool messages after a model turn, then the generation prompt of the next)
is rendered by the template alone and tokenized alone, as TRL does: a dummy conversation is
rendered with and without the tool messages, and the tokens are the difference, cut right
after the end-of-turn token that closes the assistant message. The model's own tokens are
never decoded and re-encoded: they stay exactly as the engine sampled them.
"""

from __future__ import annotations

import json
from typing import Any

from grpocli.errors import UserError

#: Qwen2.5's tool instructions (its chat template's wording), for templates that ignore `tools`.
TOOLS_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}}\n</tool_call>"
)


def render_with_tools(messages: list[dict[str, Any]], tokenizer: Any, schemas: list[dict[str, Any]]) -> str:
    """The prompt text: the chat template with the tools and a generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("the tokenizer has no chat template: tool calls and results are chat messages",
                        where="model.tokenizer", valid="a tokenizer with a chat template (an instruct model)",
                        hint="use an instruct model's tokenizer, or remove [[tools]] / multi_turn.environment")
    plain = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not schemas:
        return plain
    text = tokenizer.apply_chat_template(messages, tools=schemas, tokenize=False, add_generation_prompt=True)
    if text != plain:
        return text
    return tokenizer.apply_chat_template(with_tools_system(messages, schemas), tokenize=False,
                                         add_generation_prompt=True)


def with_tools_system(messages: list[dict[str, Any]], schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with the tool instructions added to (or as) the system message."""
    tools = TOOLS_SYSTEM.format(tools="\n".join(json.dumps(s) for s in schemas))
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{tools}"}, *messages[1:]]
    return [{"role": "system", "content": tools}, *messages]


class ToolTurns:
    """Token ids of tool turns in one tokenizer's chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_text = tokenizer.eos_token or ""

    def ids(self, tool_messages: list[dict[str, Any]]) -> list[int]:
        """The tokens that follow a model turn ending in EOS: the tool messages, then the next
        assistant turn's generation prompt."""
        return self.tokenizer(self.text(tool_messages), add_special_tokens=False)["input_ids"]

    def text(self, tool_messages: list[dict[str, Any]]) -> str:
        call = {"type": "function", "function": {"name": tool_messages[0].get("name", "tool"), "arguments": {}}}
        dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
        render = self.tokenizer.apply_chat_template
        prefix = render(dummy, tokenize=False)
        full = render(dummy + tool_messages, tokenize=False, add_generation_prompt=True)
        end = prefix.rfind(self.eos_text) if self.eos_text else -1
        cut = end + len(self.eos_text) if end >= 0 else len(prefix)
        if full[:cut] != prefix[:cut]:
            raise UserError(
                "the chat template renders the assistant turn differently once tool messages follow it, so "
                "a tool turn cannot be spliced in as tokens", where="model.tokenizer (chat template)",
                valid="a template whose rendering of a conversation extends its rendering of the first turns",
                hint="use a model whose template supports tool messages (Qwen2.5, Qwen3, SmolLM2), or remove the tools",
            )
        return full[cut:]
