"""A verifiers environment driven by grpo's turn loop: ``multi_turn.environment = "verifiers:ENV_ID"``.

verifiers' own ``Environment.rollout`` asks an OpenAI-compatible client for each model turn and
re-tokenizes the text; grpo keeps the engine's token ids instead (the turn loop), so this adapter
runs the environment's parts at the points where its rollout loop would (verifiers
``MultiTurnEnv.rollout``, the classic v0 API), as prime-rl and verifiers' own loop order them:

    reset(**row)        ``init_state`` on the dataset row (prompt, answer, info, ...), ``setup_state``
    respond(messages)   after each model turn: the turn joins ``state["trajectory"]``; if
                        ``is_completed(state)`` (max_turns, the env's ``@vf.stop`` conditions) the
                        rollout ends (None); else ``env_response(messages, state)`` is the next
                        user turn, and a ``final_env_response`` ends it
    get_metrics()       once the rollout is over: ``cleanup`` (renders ``state["completion"]``),
                        then ``rubric.score_rollout(state)``; each reward function's score is
                        logged as ``env/<function name>``
    get_reward()        the rubric's weighted sum, for the reward ``environment.reward``

The environment's coroutines run on one background event loop (``run``), so the same loaded
environment serves every rollout and any caller (the turn loop, a reward in a thread or a loop).
A rubric with group-level reward functions (scored over the G rollouts of a prompt) is not
supported: grpo scores each rollout alone.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from grpocli.data.verifiers_datasets import PREFIX, find_verifiers_env, import_verifiers, load_verifiers_env
from grpocli.errors import UserError

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` on the adapters' background event loop (started once, a daemon thread) and
    wait for its result; works from plain code, a thread, or inside another running loop."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="grpo-verifiers-loop", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(coro, _LOOP).result()


class VerifiersEnvironment:
    """One rollout of a loaded ``vf.MultiTurnEnv`` as a grpo Environment (grpocli.registry.hookspecs)."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self._state: Any = None
        self._scored = False

    def reset(self, **row: Any) -> None:
        """Start the rollout's verifiers state on its dataset row. The prompt is the row's own
        (verifiers' ``prompt`` column): nothing is appended to it."""
        vf = import_verifiers("multi_turn.environment")
        fields = {k: v for k, v in row.items() if k != "prompt_text"}
        state = run(self._env.init_state(fields, vf.ClientConfig(), "grpo"))
        state = run(self._env.setup_state(state)) or state
        self._state, self._scored = state, False

    def respond(self, messages: list[dict[str, Any]]) -> str | None:
        """The environment's answer to the model's last turn (``messages[-1]``), or None where the
        rollout ends (``is_completed``, or a ``final_env_response``)."""
        state = self._state
        state["trajectory"].append(_step(messages, state["trajectory_id"]))
        if run(self._env.is_completed(state)):
            return None
        reply = run(self._env.env_response(_normalized(messages), state))
        if state.get("final_env_response") is not None:
            run(self._env.is_completed(state))  # records the stop condition
            return None
        return "\n\n".join(_text(m) for m in _normalized(reply or []))

    def get_metrics(self) -> dict[str, float]:
        """The rubric's score of each reward function for this rollout (``env/<name>``)."""
        self._score()
        return {name: float(value) for name, value in (self._state.get("metrics") or {}).items()}

    def get_reward(self) -> float:
        """The rubric's reward (its functions' weighted sum) for this rollout."""
        self._score()
        return float(self._state.get("reward") or 0.0)

    def _score(self) -> None:
        if self._scored:
            return
        state = self._state
        if state.get("completion") is None:
            run(self._env.cleanup(state))  # renders state["completion"] from the trajectory
        run(self._env.rubric.score_rollout(state))
        self._scored = True


def factory_for(name: str, where: str) -> Callable[..., VerifiersEnvironment]:
    """The environment factory of ``verifiers:ENV_ID``: called with ``multi_turn.environment_args``
    (the environment's ``load_environment`` arguments), once per rollout; the environment itself
    loads once per (id, args)."""
    env_id = name[len(PREFIX):]
    if not env_id:
        raise UserError(f"{name!r} names no environment", where=where, valid="verifiers:ENV_ID",
                        hint='e.g. multi_turn.environment = "verifiers:wordle"')
    find_verifiers_env(env_id, where)  # not installed / not found: said now (loading: the probe instance)

    def verifiers_environment(**environment_args: Any) -> VerifiersEnvironment:
        return VerifiersEnvironment(load_verifiers_env(env_id, environment_args, where))

    verifiers_environment.__qualname__ = verifiers_environment.__name__ = f"verifiers:{env_id}"
    verifiers_environment.__doc__ = f"The verifiers environment {env_id!r}, one instance per rollout."
    return verifiers_environment


def _step(messages: list[dict[str, Any]], trajectory_id: str) -> dict[str, Any]:
    """A verifiers ``TrajectoryStep`` for the model turn ``messages[-1]`` (no response object or
    token ids: grpo keeps those)."""
    return {"prompt": _normalized(messages[:-1]), "completion": _normalized(messages[-1:]), "response": None,
            "tokens": None, "reward": None, "advantage": None, "is_truncated": False,
            "trajectory_id": trajectory_id or uuid.uuid4().hex, "extras": {}}


def _normalized(messages: list[Any]) -> Any:
    """Messages as verifiers keeps them (its pydantic message types)."""
    from verifiers.utils.message_utils import normalize_messages

    return normalize_messages(messages, field_name="messages")


def _text(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else getattr(message, "content", "")
    if isinstance(content, list):  # content parts: the text ones
        content = "".join(p.get("text", "") if isinstance(p, dict) else getattr(p, "text", "") for p in content)
    return str(content or "")
