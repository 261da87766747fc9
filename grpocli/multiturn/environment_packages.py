"""Environments from other libraries' formats, named by a prefix in ``multi_turn.environment``.

    verifiers:ENV_ID          a verifiers environment (grpocli.multiturn.verifiers_rollouts)
    openenv:module:Class      an OpenEnv environment class (grpocli.multiturn.openenv_env)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def factory_for(name: str, where: str) -> Callable[..., Any]:
    """The per-rollout factory of a prefixed environment name; UserError before any model loads
    where its library or the environment is missing."""
    if name.startswith("verifiers:"):
        from grpocli.multiturn import verifiers_rollouts

        return verifiers_rollouts.factory_for(name, where)
    from grpocli.multiturn import openenv_env

    return openenv_env.factory_for(name, where)
