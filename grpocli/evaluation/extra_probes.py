"""A second look at a reward that scores every probe alike: is it constant, or were the probes blind to it?

A reward can be sound and still score every probe (grpocli.evaluation.probes) the same, because it
pays for something none of them carries: open-r1's reasoning_steps_reward counts "Step 1:",
numbered and bulleted lines and "First,"/"Next,"/"Finally,", which no probe writes. Such a reward
is scored once more on the completions below (each row's gold answer in the recipe's format, with
reasoning of another shape, or something else altogether); where any of them scores differently, its
flag "constant" (exit 2) becomes "not exercised" (a warning, exit 0) naming the completion that
moved it. A reward that scores those alike too stays "constant".
"""

from __future__ import annotations

from typing import Any

from grpocli.evaluation.probe_scores import EPS, Flag, RewardReport, score_probes
from grpocli.evaluation.probes import PLACEHOLDER, Format, Probe

#: Reasoning of shapes the probes lack, before the answer (inside <think> where the format has it).
REASONING = {
    "reasoning steps": "Step 1: Read the question.\nStep 2: Work out the answer.\nStep 3: Check it.",
    "numbered list": "1. Read the question.\n2. Work out the answer.\n3. Check it.",
    "bullet list": "Plan:\n- read the question\n- work out the answer\n* check it",
    "first, next, finally": "First, read the question. Second, work out the answer. Next, check it. "
                            "Finally, state it.",
}
#: Completions of another kind than an answer.
OTHER = {
    "code block": "```python\nanswer = {answer!r}\nprint(answer)\n```",
    "refusal": "I cannot answer that.",
}


def extra_probes(golds: list[str] | None, rows: int, fmt: Format) -> list[Probe]:
    """The completions above for ``rows`` rows (``golds``: their answers, or None: the placeholder)."""
    answers = list(golds) if golds is not None else [PLACEHOLDER] * rows
    every = list(range(rows))

    def reasoned(answer: str, reasoning: str) -> str:
        return fmt.render(answer, reasoning) if "think" in fmt.parts else f"{reasoning}\n{fmt.render(answer)}"

    probes = [Probe(name, every, [reasoned(a, text) for a in answers]) for name, text in REASONING.items()]
    return probes + [Probe(name, every, [text.format(answer=a) for a in answers]) for name, text in OTHER.items()]


def recheck_constant(reward_fns: list[Any], reports: list[RewardReport], rows: list[dict[str, Any]],
                     extras: list[Probe], tokenizer: Any, *, prompt_column: str, state: Any) -> None:
    """Each report flagged "constant" alone whose reward scores an extra probe differently is flagged
    "not exercised" instead (in place); the others are left as they are."""
    for rf, report in zip(reward_fns, reports):
        if [f.kind for f in report.flags] != ["constant"]:
            continue
        [again] = score_probes([rf], rows, extras, tokenizer, prompt_column=prompt_column, state=state)
        moved = _moved(report, again)
        if moved:
            report.flags = [_not_exercised(report, again, moved, extras)]


def _moved(report: RewardReport, again: RewardReport) -> list[str]:
    """The extra probes whose mean differs from the value the reward gave every probe (None: any value)."""
    values = [v for vs in report.values.values() for v in vs if v is not None]
    constant = values[0] if values else None
    out = []
    for name in again.values:
        mean = again.mean(name)
        if name not in again.failures and mean is not None and (constant is None or abs(mean - constant) > EPS):
            out.append(name)
    return out


def _not_exercised(report: RewardReport, again: RewardReport, moved: list[str], extras: list[Probe]) -> Flag:
    count = sum(len(vs) for vs in report.values.values())
    values = [v for vs in report.values.values() for v in vs if v is not None]
    was = f"{values[0]:g}" if values else "None"
    listed = ", ".join(f"{name!r} {again.mean(name):.3g}" for name in moved)
    example = next(p.texts[0] for p in extras if p.name == moved[0])
    return Flag("not exercised", f"scored {was} on every probe completion ({count}) but differently on extra "
                f"completions: {listed} (e.g. {example!r}): it pays for something the probes do not carry, so "
                "right vs wrong, format and length were not checked; see it on the model's own completions "
                "with --sample N")
