"""Probe completions for `grpo check-rewards`: the gold answer in the recipe's format, and near
misses that each change one thing about it (the answer, the format, the length).

The probes of one dataset row, for a gold answer ``g`` and the recipe's format ``F``:

    gold        F(g)                         the answer a reward should pay for
    wrong       F(w)                         the same format around a wrong answer w
    no format   g                            the answer alone (left out when F is plain)
    empty       ""
    long        F(g), its reasoning padded to generation.max_completion_length tokens
    repeated    F(g) three times, one per line

The wrong answer is g + 1 for a number, else another row's gold answer that differs from g
(else "none"). Rows without a gold column (``GOLD_COLUMNS``, or ``--answer-column``) get the
placeholder answer ``PLACEHOLDER`` and no ``wrong`` probe, so right and wrong go unchecked.

The format ``F`` is made of three parts: ``think`` (``<think>\\n...\\n</think>\\n`` first),
``answer`` (``<answer>\\n...\\n</answer>`` around the answer, DeepSeek-R1's layout, which the
strict format reward wants) and ``boxed`` (``\\boxed{...}`` around the answer). It is read from
the recipe's words to the model (data.system_prompt, data.template, the first row's prompt:
a mention of ``<think>``, ``<answer>`` or ``boxed``), and from the format the recipe's own
rewards are known to check (``REWARD_FORMATS``: the built-in format rewards, TRL's
``think_format_reward`` and its math-verify rewards, which read ``\\boxed{}``), both together;
plain when neither names a part; ``--format`` sets it. The probes follow the reward hacks the
DeepSeek-R1 and DAPO reports name (pay for format or length alone), checked before training.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe

GOLD_COLUMNS = ("answer", "solution", "ground_truth", "gold", "reference", "target", "label")
PARTS = ("think", "answer", "boxed")
PLACEHOLDER = "42"
REASONING = "Let me work through the problem step by step."
FILLER = " Let me check that once more."
REPEATS = 3
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")

#: The format a reward is known to check ("module:name" of the function -> its parts).
REWARD_FORMATS = {
    "grpocli.rewards.builtin:format_strict": ("think", "answer"),
    "grpocli.rewards.builtin:format_soft": ("think", "answer"),
    "grpocli.rewards.builtin:format_answer_tag": ("answer",),
    "grpocli.rewards.builtin:format_tag_count": ("think", "answer"),
    "trl.rewards.format_rewards:think_format_reward": ("think",),
    "trl.rewards.accuracy_rewards:accuracy_reward": ("boxed",),
    "trl.rewards.accuracy_rewards:reasoning_accuracy_reward": ("think", "boxed"),
    "trl.rewards.accuracy_rewards:cosine_scaled_reward": ("boxed",),
}


@dataclass(frozen=True)
class Format:
    """Which parts a well-formed completion has, and where that was read from."""

    parts: tuple[str, ...] = ()
    source: str = "nothing names one"

    @property
    def plain(self) -> bool:
        return not self.parts

    @property
    def label(self) -> str:
        return "+".join(self.parts) or "plain"

    def render(self, answer: str, reasoning: str = REASONING) -> str:
        """A completion stating ``answer`` in this format."""
        body = f"\\boxed{{{answer}}}" if "boxed" in self.parts else answer
        if "answer" in self.parts:
            body = f"<answer>\n{body}\n</answer>"
        if "think" in self.parts:
            return f"<think>\n{reasoning}\n</think>\n{body}"
        return body


@dataclass(frozen=True)
class Probe:
    """One kind of probe completion, for several rows: row indices, texts and token ids."""

    name: str
    rows: list[int]                 # [P] the dataset row of each completion
    texts: list[str]                # [P]
    ids: list[list[int]] | None = None  # [P][T] token ids (None: tokenized when scored)


def parse_format(text: str) -> Format:
    """``--format``: "plain", or parts joined by "+" (think+answer, boxed, think+boxed...)."""
    value = text.strip().lower()
    if value == "plain":
        return Format((), "--format")
    parts = tuple(p.strip() for p in value.split("+") if p.strip())
    bad = [p for p in parts if p not in PARTS]
    if not parts or bad:
        raise UserError(f"--format {text!r} names no format", where="--format",
                        valid=f"auto, plain, or parts joined by '+' out of {', '.join(PARTS)}",
                        hint="--format think+answer (DeepSeek-R1's tags) or --format boxed")
    return Format(tuple(p for p in PARTS if p in parts), "--format")


def format_texts(recipe: Recipe, rows: Sequence[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """Where the recipe tells the model the format, for detect_format: data.system_prompt,
    data.template, the first of ``rows`` (rendered dataset rows)'s prompt."""
    first = rows[0].get("prompt") if rows else None
    if isinstance(first, list):  # chat messages
        first = "\n".join(str(m.get("content", "")) for m in first if isinstance(m, dict))
    return [("data.system_prompt", recipe.data.system_prompt), ("data.template", recipe.data.template),
            ("the first row's prompt", first if isinstance(first, str) else None)]


def detect_format(texts: Sequence[tuple[str, str | None]], reward_fns: Sequence[Any]) -> Format:
    """The format the recipe asks for: the parts named in ``texts`` ((source, text) pairs: the
    first text that names any), together with the parts its rewards check (REWARD_FORMATS);
    plain when neither names one."""
    parts: set[str] = set()
    sources = []
    for source, text in texts:
        found = {p for p, mark in zip(PARTS, ("<think>", "<answer>", "boxed")) if text and mark in text}
        if found:
            parts.update(found)
            sources.append(source)
            break
    named = []
    for rf in reward_fns:
        fn = rf.fn
        key = f"{getattr(fn, '__module__', type(fn).__module__)}:{getattr(fn, '__name__', type(fn).__name__)}"
        if key in REWARD_FORMATS:
            parts.update(REWARD_FORMATS[key])
            named.append(rf.name)
    if named:
        sources.append(f"what {', '.join(named)} check{'s' if len(named) == 1 else ''}")
    if not parts:
        return Format()
    return Format(tuple(p for p in PARTS if p in parts), " and ".join(sources))


def gold_column(columns: Sequence[str], chosen: str | None) -> str | None:
    """The column holding the gold answer: ``chosen`` (UserError if absent), else the first of GOLD_COLUMNS."""
    if chosen is not None:
        if chosen not in columns:
            raise UserError(f"the dataset has no column {chosen!r}", where="--answer-column",
                            valid=f"a column of the dataset: {', '.join(columns)}")
        return chosen
    return next((c for c in GOLD_COLUMNS if c in columns), None)


def wrong_answer(gold: str, others: Sequence[str]) -> str:
    """A wrong answer like ``gold``: the number + 1, else another row's different answer, else "none"."""
    plain = gold.strip().replace(",", "")
    if NUMBER.fullmatch(plain):
        value = float(plain) + 1
        return str(int(value)) if "." not in plain else repr(value)
    different = [o for o in others if o.strip() != gold.strip()]
    return different[0] if different else "none"


def build_probes(golds: Sequence[str] | None, rows: int, fmt: Format, count_tokens: Callable[[str], int],
                 max_tokens: int) -> list[Probe]:
    """The probes of ``rows`` dataset rows (see the module docstring); ``golds`` [rows] or None."""
    answers = list(golds) if golds is not None else [PLACEHOLDER] * rows
    every = list(range(rows))
    first = "gold" if golds is not None else "formatted"
    probes = [Probe(first, every, [fmt.render(a) for a in answers])]
    if golds is not None:
        probes.append(Probe("wrong", every, [fmt.render(wrong_answer(a, answers)) for a in answers]))
    if not fmt.plain:
        probes.append(Probe("no format", every, list(answers)))
    probes.append(Probe("empty", every, [""] * rows))
    probes.append(Probe("long", every, [_padded(fmt, a, count_tokens, max_tokens) for a in answers]))
    probes.append(Probe("repeated", every, ["\n".join([fmt.render(a)] * REPEATS) for a in answers]))
    return probes


def _padded(fmt: Format, answer: str, count_tokens: Callable[[str], int], max_tokens: int) -> str:
    """``fmt.render(answer)`` with filler reasoning (inside <think> where the format has it, else
    before the answer), at least ``max_tokens`` tokens long."""
    def text(reasoning: str) -> str:
        return fmt.render(answer, reasoning) if "think" in fmt.parts else f"{reasoning}\n{fmt.render(answer)}"

    repeats = max(1, math.ceil((max_tokens - count_tokens(text(REASONING))) / max(1, count_tokens(FILLER))))
    return text(REASONING + FILLER * repeats)


def gold_text(value: Any) -> str:
    """A gold column's value as the text of an answer (a list: its items joined by ", ")."""
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
