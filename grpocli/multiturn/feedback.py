"""Arithmetic with feedback: an environment that answers the model's text turns, no tools.

The model answers an arithmetic question (dataset 'arithmetic', whose rows carry the ``answer``
column); a wrong answer gets a user message back ("Wrong, try again.", or with ``hint =
"direction"`` whether the answer is too high or too low) and the model tries again, up to
``multi_turn.max_turns`` turns; a right one ends the rollout. It is verl's ``Gsm8kInteraction``
(verl/interactions/gsm8k_interaction.py: "Your response is incorrect! You need to reflect on your
answer and try again.") and TRL's text environments in grpo's ``respond`` form
(grpocli.registry.hookspecs.Environment).

Reward (``environment.reward``): 1.0 when solved at the first turn, less ``turn_penalty`` for
each further turn it took (never below ``turn_penalty``), 0.0 unsolved. Metrics (``env/...``):
``success_first_turn``, ``success`` (by the last turn) and ``turns`` (model turns used).
"""

from __future__ import annotations

from typing import Any, Literal

from grpocli.errors import UserError
from grpocli.rewards.text import completion_text, last_integer

#: The feedback messages (``hint = "none"`` uses WRONG alone).
WRONG = "Wrong, try again. Reply with just the number."
TOO_HIGH = "Wrong: too high. Try again. Reply with just the number."
TOO_LOW = "Wrong: too low. Try again. Reply with just the number."


class ArithmeticFeedback:
    """One arithmetic question, answered until right: feedback after each wrong answer."""

    def __init__(self, hint: Literal["none", "direction"] = "none", turn_penalty: float = 0.0) -> None:
        if hint not in ("none", "direction"):
            raise UserError(f"arithmetic_feedback's hint must be 'none' or 'direction', got {hint!r}",
                            where="multi_turn.environment_args.hint", valid="'none' or 'direction'")
        if not 0.0 <= turn_penalty < 1.0:
            raise UserError(f"arithmetic_feedback's turn_penalty must be in [0, 1), got {turn_penalty!r}",
                            where="multi_turn.environment_args.turn_penalty", valid="0 <= turn_penalty < 1")
        self.hint, self.turn_penalty = hint, float(turn_penalty)
        self.answer: int | None = None
        self.turns = 0
        self.solved_at: int | None = None  # the model turn that answered right (1 = the first)

    def reset(self, answer: Any = None, **row: Any) -> None:
        """Start on a dataset row: its ``answer`` column is the expected integer."""
        if answer is None:
            raise ValueError("the row has no 'answer' column (use data.dataset = 'arithmetic')")
        self.answer, self.turns, self.solved_at = int(str(answer).strip()), 0, None

    def respond(self, messages: list[dict[str, Any]]) -> str | None:
        """Judge the last assistant message (its last integer); None (the end) when right."""
        self.turns += 1
        given = last_integer(completion_text(messages[-1]))
        if given == self.answer:
            self.solved_at = self.turns
            return None
        if self.hint == "direction" and given is not None and self.answer is not None:
            return TOO_HIGH if given > self.answer else TOO_LOW
        return WRONG

    def get_reward(self) -> float:
        """1.0 solved at the first turn, less turn_penalty a further turn (>= turn_penalty); 0.0 unsolved."""
        if self.solved_at is None:
            return 0.0
        return max(1.0 - self.turn_penalty * (self.solved_at - 1), self.turn_penalty)

    def get_metrics(self) -> dict[str, float]:
        return {"success_first_turn": float(self.solved_at == 1), "success": float(self.solved_at is not None),
                "turns": float(self.turns)}
