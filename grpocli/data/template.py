"""Prompts as the model sees them: messages from a row, then the tokenizer's chat template.

A row becomes messages (``build_messages``): ``data.system_prompt`` first, then a user message
from ``data.template.format(**row)`` or the prompt column as it is; a prompt column that
already holds chat messages is kept, and the recipe's system prompt is put first only when
it has no system message of its own (the one rule; ``RenderedPrompts`` warns once, counting
such rows). ``render_prompt`` applies the chat template as TRL's ``maybe_apply_chat_template``
does (``add_generation_prompt=True``, text out) to conversational prompts; with
``data.chat_template = "auto"`` (TRL's behaviour) a plain-text prompt without a system prompt
goes to the model as it is. Tokens are counted without added special tokens, as TRL's
GRPOTrainer encodes prompts.

A rendered row is the dataset row plus two keys:
    prompt       what reward functions get as ``prompts`` (TRL's contract): the prompt column
                 as the dataset holds it (text or messages), or the templated user text when
                 the row has no prompt column
    prompt_text  the string the policy generates from (chat template applied)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError

if TYPE_CHECKING:
    import datasets

    from grpocli.recipe.schema import DataSection

Messages = list[dict[str, Any]]


def build_messages(row: dict[str, Any], data: DataSection) -> Messages:
    """The chat messages of one row: optional system prompt, then the user's message."""
    system = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if data.template is not None:
        return system + [{"role": "user", "content": _format(data.template, row)}]
    if data.prompt_column not in row:
        raise UserError(
            f"rows have no prompt column {data.prompt_column!r}",
            where="data.prompt_column",
            valid=f"a column of the row: {_columns(row)}",
            hint="set data.prompt_column to one of them, or data.template = '... {column} ...'",
        )
    value = row[data.prompt_column]
    if isinstance(value, str):
        return system + [{"role": "user", "content": value}]
    if _is_messages(value) and value:
        has_system = value[0].get("role") == "system"
        return [dict(m) for m in value] if has_system else system + [dict(m) for m in value]
    raise UserError(
        f"prompt column {data.prompt_column!r} holds {type(value).__name__} ({str(value)[:60]!r})",
        where="data.prompt_column",
        valid="a column of strings or of chat messages [{'role': ..., 'content': ...}]",
        hint="pick another column, or make one with data.template = 'Solve: {column}'",
    )


def render_prompt(messages: Messages, tokenizer: Any, use_chat_template: bool,
                  template_kwargs: dict[str, Any] | None = None) -> str:
    """The chat template with a generation prompt where asked and present (``template_kwargs``:
    data.chat_template_kwargs, e.g. enable_thinking); else the contents joined by newlines (system, then user)."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):  # noqa: SIM102
        try:
            return tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
            )
        except Exception as exc:  # jinja errors such as "System role not supported"
            raise UserError(
                f"the tokenizer's chat template rejected the prompt: {type(exc).__name__}: {exc}",
                where="data.chat_template",
                hint="drop data.system_prompt if the model has no system role, or set "
                "data.chat_template = \"never\" for plain text prompts",
            ) from None
    return "\n".join(str(m.get("content", "")) for m in messages)


def render_row(row: dict[str, Any], data: DataSection, tokenizer: Any) -> dict[str, Any]:
    """The row with ``prompt`` (for rewards) and ``prompt_text`` (for the policy) set. With data.system_prompt the
    rewards get the messages, as TRL's do after open-r1's make_conversation (so completions come as messages too)."""
    messages = build_messages(row, data)
    prompt = row[data.prompt_column] if data.prompt_column in row else messages[-1]["content"]
    if data.system_prompt is not None and data.template is None and isinstance(prompt, str):
        prompt = messages
    text = render_prompt(messages, tokenizer, uses_chat_template(row, data), data.chat_template_kwargs)
    return {**row, "prompt": prompt, "prompt_text": text}


def uses_chat_template(row: dict[str, Any], data: DataSection) -> bool:
    """data.chat_template for this row: 'auto' (TRL) only for conversational prompts, i.e. chat
    messages in the prompt column, or a recipe system prompt (which makes a chat of any prompt)."""
    if data.chat_template != "auto":
        return data.chat_template == "always"
    conversational = data.template is None and _is_messages(row.get(data.prompt_column))
    return conversational or data.system_prompt is not None


def keeps_own_system(row: dict[str, Any], data: DataSection) -> bool:
    """True where the recipe's system prompt is not used because the row has its own."""
    value = row.get(data.prompt_column)
    return (data.system_prompt is not None and data.template is None and _is_messages(value)
            and bool(value) and value[0].get("role") == "system")


class RenderedPrompts(Sequence):
    """A dataset whose rows come out rendered (lazily, one at a time): ``prompts[i] -> dict``.

    The first row is rendered at construction, so a wrong template or prompt column stops the
    run before any model is loaded. Errors name the row index.
    """

    def __init__(
        self, dataset: datasets.Dataset | Sequence[dict], data: DataSection, tokenizer: Any
    ) -> None:
        self.dataset, self.data, self.tokenizer = dataset, data, tokenizer
        if len(dataset):
            self[0]
        self.own_system = self._count_own_system()
        if self.own_system:
            print(f"warning: data.system_prompt is not used for {self.own_system} of {len(dataset)} rows: "
                  "they carry their own system message, which is kept (data.system_prompt fills in for "
                  "rows without one)", file=sys.stderr, flush=True)

    def _count_own_system(self) -> int:
        """Rows whose own system message keeps the recipe's system prompt out (0 without one)."""
        if self.data.system_prompt is None or self.data.template is not None:
            return 0
        column = self.data.prompt_column
        values = (self.dataset[column] if hasattr(self.dataset, "column_names") and column in self.dataset.column_names
                  else [dict(row).get(column) for row in self.dataset])
        return sum(1 for v in values if keeps_own_system({column: v}, self.data))

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:  # type: ignore[override]
        try:
            return render_row(dict(self.dataset[index]), self.data, self.tokenizer)
        except UserError as exc:
            where = f"{exc.where} (row {index})"
            raise UserError(exc.what, where=where, valid=exc.valid, hint=exc.hint) from None


def complete_rows(
    rows: list[dict[str, Any]], data: DataSection, tokenizer: Any
) -> list[dict[str, Any]]:
    """Render the rows that lack ``prompt_text`` (rows a curriculum made), keep the others."""
    return [row if "prompt_text" in row else render_row(row, data, tokenizer) for row in rows]


def preview(
    dataset: datasets.Dataset | Sequence[dict], data: DataSection, tokenizer: Any, n: int = 5
) -> list[dict[str, Any]]:
    """The first ``n`` rendered rows for `grpo inspect data`, plus ``prompt_tokens`` (how many
    tokens ``prompt_text`` is) and ``truncated`` (longer than ``data.max_prompt_length``)."""
    prompts = RenderedPrompts(dataset, data, tokenizer)
    out = []
    for i in range(min(n, len(prompts))):
        row = prompts[i]
        count = len(tokenizer(row["prompt_text"], add_special_tokens=False)["input_ids"])
        out.append({**row, "prompt_tokens": count, "truncated": count > data.max_prompt_length})
    return out


def _format(template: str, row: dict[str, Any]) -> str:
    try:
        return template.format(**row)
    except KeyError as exc:
        raise UserError(
            f"data.template names column {exc.args[0]!r}, which the rows lack",
            where="data.template",
            valid=f"columns of the row: {_columns(row)}",
        ) from None
    except (IndexError, ValueError, AttributeError) as exc:
        raise UserError(
            f"data.template {template!r} is not a valid format string: {exc}",
            where="data.template",
            valid="text with {column} fields; write {{ and }} for literal braces",
        ) from None


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in value
    )


def _columns(row: dict[str, Any]) -> str:
    return ", ".join(row) or "(none)"
