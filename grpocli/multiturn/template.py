"""The chat template's side of multi-turn rollouts: prompts with tools, and a tool turn's tokens.

Prompts are rendered with ``apply_chat_template(messages, tools=schemas)``. A template that
ignores ``tools`` (SmolLM2's, the tiny model's) gets the tools in a system message worded as
Qwen2.5's template words it, so the model still sees them.

A tool turn (the tool messages after a model turn, then the generation prompt of the next)
is rendered by the template alone and tokenized alone, as TRL does: a dummy conversation is
rendered with and without the tool messages, and the tokens are the difference, cut right
after the end-of-turn token that closes the assistant message. The model's own tokens are
never decoded and re-encoded: they stay exactly as the engine sampled them.

A tool result longer than the completion budget has room for is cut (``ToolTurns.fit``): first
in characters, before anything is tokenized (a text longer than the room times the longest
token's length cannot fit; a tool that returns 10 MB costs no 10 MB tokenization), then to the
tokens that fit, its start kept and a note at its end saying how much was kept.
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


def render_with_tools(messages: list[dict[str, Any]], tokenizer: Any, schemas: list[dict[str, Any]],
                      template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt text: the chat template with the tools and a generation prompt (``template_kwargs``:
    data.chat_template_kwargs)."""
    extra = template_kwargs or {}
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("the tokenizer has no chat template: tool calls and results are chat messages",
                        where="model.tokenizer", valid="a tokenizer with a chat template (an instruct model)",
                        hint="use an instruct model's tokenizer, or remove [[tools]] / multi_turn.environment")
    plain = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
    if not schemas:
        return plain
    text = tokenizer.apply_chat_template(messages, tools=schemas, tokenize=False, add_generation_prompt=True, **extra)
    if text != plain:
        return text
    return tokenizer.apply_chat_template(with_tools_system(messages, schemas), tokenize=False,
                                         add_generation_prompt=True, **extra)


def with_tools_system(messages: list[dict[str, Any]], schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with the tool instructions added to (or as) the system message."""
    tools = TOOLS_SYSTEM.format(tools="\n".join(json.dumps(s) for s in schemas))
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{tools}"}, *messages[1:]]
    return [{"role": "system", "content": tools}, *messages]


#: Ends a tool result that was cut to fit the completion budget.
CUT_NOTE = "\n[grpo cut this tool result to fit generation.max_completion_length: {kept} of {total} characters kept]"


class ToolTurns:
    """Token ids of tool turns in one tokenizer's chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_text = tokenizer.eos_token or ""
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        # no token stands for more characters than its vocabulary entry has (bytes, or '##'-marked pieces)
        self.max_token_chars = max((len(t) for t in vocab), default=0) or 64

    def fit(self, tool_messages: list[dict[str, Any]], room: int) -> tuple[list[dict[str, Any]], list[int]] | None:
        """The tool messages and their turn's token ids within ``room`` tokens: as they are where
        they fit, else with the longest results cut (their start kept, then CUT_NOTE); None where
        not even the cut turn fits."""
        if room <= 0:
            return None
        totals = [len(m["content"]) for m in tool_messages]
        kept = [m["content"][: room * self.max_token_chars] for m in tool_messages]  # more cannot fit
        for _ in range(2 * len(kept) + 4):
            messages = [{**m, "content": k if len(k) == t else k + CUT_NOTE.format(kept=len(k), total=t)}
                        for m, k, t in zip(tool_messages, kept, totals)]
            ids = self.ids(messages)
            excess = len(ids) - room
            if excess <= 0:
                return messages, ids
            j = max(range(len(kept)), key=lambda n: len(kept[n]))
            if not kept[j]:
                return None  # the notes (and the template) alone do not fit
            kept[j] = self._cut(kept[j], excess, note=len(kept[j]) == totals[j])
        return None

    def _cut(self, text: str, excess: int, *, note: bool) -> str:
        """``text`` less ``excess`` tokens (and the tokens of a CUT_NOTE where ``note``: not cut yet)."""
        pieces = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if note:
            excess += len(self.tokenizer(CUT_NOTE.format(kept=len(text), total=len(text)),
                                         add_special_tokens=False)["input_ids"])
        keep = len(pieces) - excess
        if keep <= 0:
            return ""
        cut = self.tokenizer.decode(pieces[:keep]).rstrip("\ufffd")  # not half a character
        return cut if len(cut) < len(text) else text[: max(len(text) - excess, 0)]

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
