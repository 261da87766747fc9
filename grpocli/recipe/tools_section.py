"""Multi-turn rollouts: the [[tools]] entries and the [multi_turn] section.

Wired into ``Recipe`` by grpocli.recipe.schema as ``tools: list[ToolSpec]`` and
``multi_turn: MultiTurnSection``. A recipe with tools or an environment samples each completion
as a conversation (grpocli.multiturn.turns): the model calls tools, their results come back as tool
messages, and the model goes on until it answers without a call or ``max_turns`` is reached.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from grpocli.recipe.section import Section


class ToolSpec(Section):
    name: str = Field(
        description="A registered tool (`grpo inspect plugins` lists them, e.g. 'calculator') or a plain "
        "typed Python function with a docstring as 'module.path:function' or 'path/to/file.py:function'; "
        "its JSON schema (from the signature and docstring) goes to the chat template."
    )


class MultiTurnSection(Section):
    max_turns: int = Field(
        4, ge=1, le=64,
        description="Model turns per rollout: after a turn whose tool calls ran, the model speaks again, "
        "up to this many times; a rollout whose last allowed turn still calls a tool ends there (not a "
        "final answer).",
    )
    tool_timeout: float = Field(
        10.0, gt=0.0, le=3600.0,
        description="Seconds one tool call may take; a call past it (or one that raises) becomes an "
        "error message to the model and counts in tools/errors, never a hung or failed step.",
    )
    environment_timeout: float = Field(
        60.0, gt=0.0, le=3600.0,
        description="Seconds one call of the environment's own methods may take (its constructor, reset, "
        "respond: an OpenEnv step or a verifiers env_response, get_metrics); a call past it, or one that "
        "raises or calls sys.exit / os._exit, stops the run (exit 2) naming the method and where it waits. "
        "Its tool methods are tools (tool_timeout).",
    )
    tool_parser: Literal["hermes"] = Field(
        "hermes",
        description="How the model writes a tool call (grpocli.multiturn.parsers.TOOL_CALL_PARSERS): 'hermes' is "
        "<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>, the format of Qwen2.5, Qwen3 "
        "and SmolLM2 chat templates.",
    )
    max_tool_calls: int = Field(
        8, ge=1, le=256, description="Tool calls run per model turn; calls beyond them get an error message."
    )
    environment: str | None = Field(
        None,
        description="A registered environment (`grpo inspect plugins`, e.g. 'guess_number') or "
        "'module:Class': one instance per rollout, reset with its dataset row; its public methods "
        "are tools, its respond(messages) (optional) answers the model's turns without a tool call with the next "
        "user message (None ends the rollout), and rewards receive it as the `environments` keyword. Also "
        "'verifiers:ENV_ID' (a verifiers environment) or 'openenv:module:Class' (an OpenEnv environment): "
        "docs/environments.md.",
    )
    environment_args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the environment's constructor."
    )
