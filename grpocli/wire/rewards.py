"""The protocol of `grpo reward-serve`: its version, path and API-key variable, the request
(``ScoreRequest``, which the server's route takes) and the answer (``ScoreAnswer``, which the
trainer's grpocli.rewards.remote reads with ``ScoreAnswer.read``).

Protocol version 1. Given an API key (``--api-key`` or GRPO_REWARD_API_KEY), every path requires it.

    GET  /health   {"status": "ok", "rewards": [names served]}
    GET  /info     {"protocol", "rewards": {name: description}, "timeout"}
    POST /score    ScoreRequest -> ScoreAnswer: one score (or null) per completion, what the reward logged
                   through log_extra / log_metric, and the seconds the call took

Both ends write JSON as Python does (``json.dumps``: NaN and infinities stay numbers), and the
trainer sends what TRL hands a reward (numpy arrays, tensors, numpy scalars) as lists and numbers
(``json_default``). A reward's own failure is a 500 whose body says ``"failure": "raised"`` (it
raised or timed out) or ``"invalid"`` (it returned no valid scores); an unknown reward is a 404, a
request that does not fit a 422.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grpocli.wire.client import BadAnswer, shortened

PROTOCOL_VERSION = 1
KEY_ENV = "GRPO_REWARD_API_KEY"
HEALTH_PATH, INFO_PATH, SCORE_PATH = "/health", "/info", "/score"
ANSWER_SHAPE = ('a JSON object {"scores": [one number or null per completion], "log_extra": {column: [values]}, '
                f'"log_metric": {{name: [numbers]}}}} (grpo reward-serve, protocol {PROTOCOL_VERSION})')


class ScoreRequest(BaseModel):
    """One call of a served reward on a batch, with the keywords grpo passes a reward in-process."""

    model_config = ConfigDict(extra="forbid")

    protocol: int = Field(PROTOCOL_VERSION, description="The client's protocol version.")
    reward: str = Field(..., description="Which served reward scores the batch.")
    args: dict[str, Any] = Field(default_factory=dict, description="The [[rewards]] entry's args.")
    prompts: list[Any]
    completions: list[Any]
    completion_ids: list[list[int]] | None = None
    columns: dict[str, list[Any]] = Field(default_factory=dict, description="Dataset columns, one value per row.")
    trainer_state: dict[str, Any] | None = None

    def to_json(self) -> bytes:
        """The body as Python's JSON (module docstring); TypeError or ValueError for a value JSON cannot carry."""
        return json.dumps(dict(self), default=json_default).encode()


class ScoreAnswer(BaseModel):
    """The answer to a ScoreRequest. Strict: a score "3" is text, not a number, and true no number."""

    model_config = ConfigDict(strict=True)

    scores: list[float | None]
    log_extra: dict[str, list[Any]] = Field(default_factory=dict)
    log_metric: dict[str, list[float]] = Field(default_factory=dict)
    seconds: float | None = None
    row_seconds: list[float | None] | None = None  # each row's, where the reward reported them (log_row_seconds)

    @classmethod
    def read(cls, raw: bytes, n: int) -> ScoreAnswer:
        """The answer to a request of ``n`` completions; BadAnswer naming the field and what it held."""
        try:
            data = json.loads(raw)
        except ValueError:
            raise BadAnswer("the body", f"something that is not JSON: {shortened(raw)}") from None
        if not isinstance(data, dict):
            raise BadAnswer("the body", f"a JSON {type(data).__name__}, not an object: {shortened(raw)}")
        scores = data.get("scores")
        if isinstance(scores, list) and len(scores) != n:
            raise BadAnswer('"scores"', f"{len(scores)} scores for {n} completions")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise misfit(exc.errors()[0], data) from None


def misfit(error: Any, data: dict[str, Any]) -> BadAnswer:
    """The BadAnswer of pydantic's first ``error`` in a ScoreAnswer ``data``, in the protocol's words."""
    loc, value = error["loc"], error.get("input")
    top = loc[0]
    if top == "scores" and len(loc) == 1:
        return BadAnswer('"scores"', "no list of scores" if data.get("scores") is None else f"scores = {shortened(value)}")
    if top == "scores":
        return BadAnswer(f'"scores"[{loc[1]}]',
                         f"scores[{loc[1]}] = {shortened(value)} ({type(value).__name__}), not a number")
    if top == "log_metric" and len(loc) == 3:
        name = loc[1]
        return BadAnswer(f'"log_metric"."{name}"', f"log_metric[{name!r}] = {shortened(data[top][name])}, not numbers")
    if top in ("log_extra", "log_metric"):
        return BadAnswer(f'"{top}"', f"{top} = {shortened(data[top])}, not an object of lists")
    return BadAnswer(f'"{top}"', f"{top} = {shortened(value)}: {error['msg']}")


def json_default(value: Any) -> Any:
    """``json.dumps``'s default: arrays and tensors as lists, numpy scalars as numbers, tuples and sets as lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def jsonable(value: Any) -> Any:
    """``value`` with arrays, tensors and numpy scalars as JSON types; NaN stays (Python's JSON carries it)."""
    return json.loads(json.dumps(value, default=json_default))


__all__ = ["ANSWER_SHAPE", "HEALTH_PATH", "INFO_PATH", "KEY_ENV", "PROTOCOL_VERSION", "SCORE_PATH", "ScoreAnswer",
           "ScoreRequest", "json_default", "jsonable", "misfit"]
