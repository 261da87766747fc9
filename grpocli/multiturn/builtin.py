"""Built-in tools and environments, registered through the same hooks as a third-party plugin.

``calculator``     a tool: exact arithmetic on an expression (the multi-digit arithmetic task:
                   dataset 'arithmetic' with large numbers, reward 'arithmetic.exact')
``guess_number``   an environment: find a secret number with the ``guess`` tool, told
                   higher / lower each time; the dataset 'guess_number' holds the secrets and
                   the reward 'environment.reward' reads each rollout's environment.
``arithmetic_feedback``  an environment without tools: it answers the model's text turns
                   ("Wrong, try again.") until the answer is right (grpocli.multiturn.feedback).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import grpocli
from grpocli.errors import UserError
from grpocli.multiturn.feedback import ArithmeticFeedback


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return its value.

    Args:
        expression: Integers joined by +, -, * and /, with parentheses, e.g. "(123 + 45) * 67".
    """
    from grpocli.rewards.expression import parse_expression

    text = expression.replace("×", "*").replace("x", "*").replace("÷", "/").replace(",", "")
    parsed = parse_expression(text)
    if parsed is None:
        raise ValueError(f"{expression!r} is not an expression of non-negative integers, + - * / and parentheses")
    value = parsed.value()
    if value is None:
        raise ZeroDivisionError("division by zero")
    return _number(value)


def _number(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"


class GuessNumber:
    """Guess-the-number: a secret integer, found by guesses answered 'higher', 'lower' or 'correct'."""

    def __init__(self, low: int = 1, high: int = 100) -> None:
        self.low, self.high = low, high
        self.secret: int | None = None
        self.guesses = 0
        self.solved = False

    def reset(self, secret: int | None = None, **row: Any) -> None:
        """Start a new game on a dataset row (its ``secret`` column)."""
        self.secret = int(secret) if secret is not None else random.randint(self.low, self.high)
        self.guesses, self.solved = 0, False

    def guess(self, number: int) -> str:
        """Guess the secret number; the answer says whether it is higher, lower or correct.

        Args:
            number: The guess, an integer in the game's range.
        """
        if self.secret is None:
            raise RuntimeError("the game has not started (reset was not called)")
        if self.solved:
            return f"You already found it: {self.secret}."
        self.guesses += 1
        if int(number) == self.secret:
            self.solved = True
            return f"Correct! The number is {self.secret}."
        return "Higher." if int(number) < self.secret else "Lower."

    def get_reward(self) -> float:
        """1.0 for a game won, less 0.1 per guess after the first (at least 0.1); 0.0 unsolved."""
        return max(1.0 - 0.1 * (self.guesses - 1), 0.1) if self.solved else 0.0


def guess_number_dataset(split: str, seed: int, *, num_samples: int = 1000, low: int = 1,
                         high: int = 100) -> list[dict[str, Any]]:
    """Rows {"prompt": "...", "secret": 42}: a secret per game, seeded by split and seed."""
    if not (isinstance(low, int) and isinstance(high, int) and low < high):
        raise UserError(f"guess_number needs integers low < high, got low={low!r}, high={high!r}",
                        where="data.args", valid="e.g. { low = 1, high = 100 }")
    rng = random.Random(f"guess_number:{seed}:{split}")
    prompt = (f"I am thinking of an integer between {low} and {high}. Find it with the guess tool, "
              "then reply with the number.")
    return [{"prompt": prompt, "secret": rng.randint(low, high)} for _ in range(num_samples)]


def environment_reward(prompts: list, completions: list, environments: list | None = None,
                       **kwargs: Any) -> list[float | None]:
    """Each rollout's environment's get_reward() (None where it has none); for multi_turn.environment."""
    if environments is None:
        raise UserError("reward 'environment.reward' reads each rollout's environment, and this run has none",
                        where="rewards", valid="with multi_turn.environment set",
                        hint="set multi_turn.environment (e.g. \"guess_number\"), or remove this reward")
    return [float(e.get_reward()) if callable(getattr(e, "get_reward", None)) else None for e in environments]


def tool_call_ran(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
    """1.0 when a tool call ran without error in the conversation, else 0.0: a format reward that
    gives a model which rarely writes a well-formed call a signal to write one (a weight such as 0.2
    keeps it below the task's reward). Completions are the conversations of multi-turn rollouts."""
    out: list[float | None] = []
    for conversation in completions:
        if not isinstance(conversation, list):
            out.append(None)  # a single-turn completion: the reward does not apply
            continue
        ran = any(m.get("role") == "tool" and not str(m.get("content", "")).startswith("Error:")
                  for m in conversation if isinstance(m, dict))
        out.append(1.0 if ran else 0.0)
    return out


@grpocli.hookimpl
def register_tools(register: Callable[..., None]) -> None:
    register("calculator", calculator)


@grpocli.hookimpl
def register_environments(register: Callable[..., None]) -> None:
    register("guess_number", GuessNumber, description="Find a secret integer with guess(number) -> "
             "'Higher.' / 'Lower.' / 'Correct!'; args low, high; reset reads the 'secret' column.")
    register("arithmetic_feedback", ArithmeticFeedback, description="Arithmetic with feedback, no tools: a wrong "
             "answer gets 'Wrong, try again.' and another turn; args hint ('none' | 'direction'), turn_penalty; "
             "reset reads the 'answer' column (dataset 'arithmetic'); env/success_first_turn, env/success, env/turns.")


@grpocli.hookimpl
def register_datasets(register: Callable[..., None]) -> None:
    register("guess_number", guess_number_dataset, description="Guess-the-number games (offline, seeded) for "
             "multi_turn.environment = 'guess_number': a prompt and a 'secret' column; args num_samples, low, high.")


@grpocli.hookimpl
def register_rewards(register: Callable[..., None]) -> None:
    register("environment.reward", environment_reward)
    register("tools.call_ran", tool_call_ran)
