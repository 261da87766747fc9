"""An OpenEnv environment driven by grpo's turn loop: ``multi_turn.environment = "openenv:module:Class"``.

OpenEnv (Meta / Hugging Face, ``openenv-core``) environments are Gym-style servers:
``reset(seed=..., episode_id=..., **kwargs) -> Observation`` and ``step(action) -> Observation``,
an ``Observation`` carrying ``done`` and ``reward`` (``openenv.core.env_server``); the same class
runs behind OpenEnv's HTTP server or in process. grpo runs it in process, one instance per rollout
(the recipe's ``multi_turn.environment_args`` go to its constructor), through the text turns of
the turn loop:

    reset(**row)       ``env.reset`` with the row's ``seed`` / ``episode_id`` columns and those its
                       signature names; the observation's text is appended to the prompt
    respond(messages)  the model's turn (``messages[-1]``) becomes the environment's ``Action``
                       (its one text field), ``env.step(action)``; the observation's text is the
                       next user turn, and ``done`` ends the rollout
    get_reward()       the sum of the rewards ``reset`` and every ``step`` returned (the return)
    get_metrics()      ``env/steps`` and ``env/done``

The Action type is the ``action`` annotation of ``step`` (or the environment's ``Environment[Act,
Obs, State]`` parameter) and must have exactly one ``str`` field; an observation's text is its
``str`` fields (other than ``metadata``), in order, else its fields as JSON.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable
from typing import Any

from grpocli.errors import UserError

PREFIX = "openenv:"
INSTALL = "pip install 'grpocli[envs]' (openenv-core; docs/environments.md says which packages)"
_OBSERVATION_BOOKKEEPING = ("done", "reward", "metadata")


class OpenEnvEnvironment:
    """One rollout of an OpenEnv ``Environment`` as a grpo Environment (grpocli.registry.hookspecs)."""

    def __init__(self, env: Any, action_type: type, action_field: str) -> None:
        self._env, self._action_type, self._action_field = env, action_type, action_field
        self._rewards: list[float] = []
        self._steps, self._done = 0, False

    def reset(self, **row: Any) -> str:
        """``env.reset`` on the rollout's row; its observation's text, appended to the prompt."""
        accepted = inspect.signature(self._env.reset).parameters
        kwargs = {k: v for k, v in row.items() if k in accepted and k not in ("self", "kwargs")}
        observation = self._env.reset(**kwargs)
        self._rewards, self._steps, self._done = [_reward(observation)], 0, bool(getattr(observation, "done", False))
        return observation_text(observation)

    def respond(self, messages: list[dict[str, Any]]) -> str | None:
        """Step the environment with the model's turn; the observation's text, or None once done."""
        if self._done:
            return None
        action = self._action_type(**{self._action_field: str(messages[-1].get("content") or "")})
        observation = self._env.step(action)
        self._steps += 1
        self._rewards.append(_reward(observation))
        self._done = bool(getattr(observation, "done", False))
        return None if self._done else observation_text(observation)

    def get_reward(self) -> float:
        """The episode's return: the sum of every reward the environment gave."""
        return float(sum(self._rewards))

    def get_metrics(self) -> dict[str, float]:
        """How many steps the rollout took, and whether the environment ended it (done)."""
        return {"steps": float(self._steps), "done": float(self._done)}


def factory_for(name: str, where: str) -> Callable[..., OpenEnvEnvironment]:
    """The environment factory of ``openenv:module:Class`` (or ``openenv:path/file.py:Class``),
    called with ``multi_turn.environment_args`` once per rollout; UserError now where openenv-core
    is missing, the class is not an OpenEnv Environment, or its Action has no single text field."""
    from grpocli.rewards.references import _function

    try:
        from openenv.core.env_server.interfaces import Environment
    except ModuleNotFoundError as exc:
        raise UserError(f"openenv-core is not installed (or misses {exc.name!r})", where=where,
                        valid="openenv-core installed in this environment", hint=INSTALL) from None
    cls = _function(name[len(PREFIX):], where).fn
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise UserError(f"{name!r} is not an OpenEnv Environment class", where=where,
                        valid="openenv:module:Class with Class a subclass of openenv.core.env_server.interfaces."
                        "Environment", hint="name the environment's server-side class (reset/step/state)")
    action_type = _action_type(cls, name, where)
    action_field = _text_field(action_type, name, where)

    def openenv_environment(**environment_args: Any) -> OpenEnvEnvironment:
        return OpenEnvEnvironment(cls(**environment_args), action_type, action_field)

    openenv_environment.__qualname__ = openenv_environment.__name__ = name
    openenv_environment.__doc__ = f"The OpenEnv environment {cls.__name__}, one instance per rollout."
    openenv_environment.__signature__ = inspect.signature(cls)  # type: ignore[attr-defined]
    return openenv_environment


def observation_text(observation: Any) -> str:
    """An observation as the model reads it: its text fields, else its fields as JSON."""
    if observation is None:
        return ""
    if isinstance(observation, str):
        return observation
    fields = {k: v for k, v in observation.model_dump().items() if k not in _OBSERVATION_BOOKKEEPING}
    texts = [v for v in fields.values() if isinstance(v, str) and v]
    return "\n".join(texts) if texts else json.dumps(fields, default=str)


def _reward(observation: Any) -> float:
    value = getattr(observation, "reward", None)
    return float(value) if value is not None else 0.0


def _action_type(cls: type, name: str, where: str) -> type:
    """The Action model ``step`` takes: its annotation, else the class's Environment[Act, ...]."""
    try:
        hint = typing.get_type_hints(cls.step).get("action")
    except Exception:  # noqa: BLE001 (unresolvable annotations: fall back to the generic parameter)
        hint = None
    if not (isinstance(hint, type) and hasattr(hint, "model_fields")):
        hint = next((typing.get_args(b)[0] for b in getattr(cls, "__orig_bases__", ()) if typing.get_args(b)), None)
    if not (isinstance(hint, type) and hasattr(hint, "model_fields")):
        raise UserError(f"{name!r}: the Action type of step() is not known", where=where,
                        valid="step(self, action: MyAction) with MyAction an openenv Action (pydantic) model",
                        hint="annotate step's action parameter with the environment's Action class")
    return hint


def _text_field(action_type: type, name: str, where: str) -> str:
    """The one ``str`` field of the Action model, which receives the model's turn."""
    texts = [f for f, info in action_type.model_fields.items() if info.annotation is str]
    if len(texts) != 1:
        raise UserError(f"{name!r}: its Action {action_type.__name__} has {len(texts)} str fields "
                        f"({', '.join(texts) or 'none'})", where=where,
                        valid="an Action with exactly one str field: the model's turn goes there",
                        hint="give the environment an Action with one text field (others need defaults)")
    return texts[0]
