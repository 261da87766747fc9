"""verifiers environments, loaded once per (id, args); their datasets as ``data.dataset``.

verifiers (Prime Intellect, github.com/PrimeIntellect-ai/verifiers) packages an RL environment as
a module with ``load_environment(**args) -> vf.Environment``: a dataset (``prompt`` as chat
messages, ``answer``, ``info``), a ``Rubric`` of reward functions and, for ``vf.MultiTurnEnv``,
``env_response(messages, state)`` and stop conditions. ``vf.load_environment(env_id, **args)``
imports the module ``env_id`` (``-`` read as ``_``; installed with ``vf-install`` / ``pip``, or a
``.py`` file in the working directory) and calls it; grpo does the same.

``data.dataset = "verifiers:ENV_ID"`` loads that environment (``data.args`` are its
``load_environment`` arguments) and gives its dataset: ``env.get_dataset()`` for the split
"train", ``env.get_eval_dataset()`` for any other. The rollouts are driven by grpo's turn loop
through ``grpocli.multiturn.verifiers_rollouts``.

grpo reads the classic (v0) API: ``vf.Environment`` / ``SingleTurnEnv`` / ``MultiTurnEnv`` /
``Rubric``. verifiers 0.3 keeps it (``verifiers.legacy``, aliased as ``import verifiers as vf``);
verifiers 0.4 has only the v1 Taskset/Harness API, which grpo refuses with that reason.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

from grpocli.errors import UserError

PREFIX = "verifiers:"
INSTALL = "pip install 'grpocli[envs]' (verifiers 0.3.x; docs/environments.md says which packages)"

_LOADED: dict[tuple[str, str], Any] = {}  # (env_id, args as JSON) -> vf.Environment


def import_verifiers(where: str) -> Any:
    """The verifiers module with the classic API (``vf.MultiTurnEnv`` ...), or UserError saying
    what to install."""
    try:
        import verifiers as vf
    except ModuleNotFoundError:
        raise UserError("the verifiers package is not installed", where=where,
                        valid="verifiers 0.3.x installed in this environment", hint=INSTALL) from None
    try:
        vf.MultiTurnEnv  # noqa: B018 (0.3: a lazy import that needs the classic stack's dependencies)
    except AttributeError as exc:
        version = getattr(vf, "__version__", "?")
        raise UserError(f"verifiers {version} has no classic environment API (vf.MultiTurnEnv): {exc}",
                        where=where, valid="verifiers 0.3.x with its dependencies (0.4 has only the v1 "
                        "Taskset/Harness API)", hint=INSTALL) from None
    return vf


def load_verifiers_env(env_id: str, args: dict[str, Any], where: str) -> Any:
    """The ``vf.Environment`` that ``load_environment(**args)`` of module ``env_id`` returns,
    loaded once per (id, args); UserError where verifiers or the module is missing, or it fails."""
    key = (env_id, json.dumps(args, sort_keys=True, default=str))
    if key in _LOADED:
        return _LOADED[key]
    vf = find_verifiers_env(env_id, where)
    try:
        env = vf.load_environment(env_id, **args)
    except Exception as exc:  # noqa: BLE001 (the environment's own code: named in the error)
        raise UserError(f"verifiers environment {env_id!r} failed to load: {type(exc).__name__}: "
                        f"{exc.__cause__ or exc}", where=where,
                        valid="load_environment(**args) returning a vf.Environment",
                        hint="check the environment's arguments (data.args / multi_turn.environment_args)") from None
    if not isinstance(env, vf.MultiTurnEnv):
        raise UserError(f"verifiers environment {env_id!r}: load_environment returned {type(env).__name__}",
                        where=where, valid="a vf.SingleTurnEnv or vf.MultiTurnEnv (subclass)",
                        hint="return the environment from load_environment")
    _LOADED[key] = env
    return env


def find_verifiers_env(env_id: str, where: str) -> Any:
    """Import verifiers and the module of environment ``env_id`` (without loading it); the
    verifiers module, or UserError naming what is missing and how to install it."""
    vf = import_verifiers(where)
    module = env_id.replace("-", "_").split("/")[-1]  # verifiers' env_module_name
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)  # as `vf-eval` and TRL's CLI: an environment file here is found
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise UserError(f"verifiers environment {env_id!r} needs a module that is missing: {exc}",
                            where=where, hint=f"install what {module} imports") from None
        raise UserError(f"no verifiers environment {env_id!r}: no module named {module!r} installed or in "
                        f"the working directory {cwd}", where=where,
                        valid="an installed environment (`vf-install ID`, `prime env install ID`, or pip) or "
                        "ID.py in the working directory, defining load_environment(**args)",
                        hint=f"install it, e.g. `vf-install {env_id}`, then run again") from None
    return vf


def verifiers_dataset(split: str, seed: int, env_id: str, **env_args: Any) -> Any:
    """The dataset of verifiers environment ``env_id``: ``get_dataset()`` for the split "train",
    ``get_eval_dataset()`` for another (verifiers' own split names); ``env_args`` go to
    ``load_environment``. Columns as verifiers makes them: prompt (chat messages), answer,
    example_id, info, task."""
    env = load_verifiers_env(env_id, env_args, "data.dataset")
    dataset = env.get_dataset() if split == "train" else env.get_eval_dataset()
    if dataset is None:
        raise UserError(f"verifiers environment {env_id!r} has no {'train' if split == 'train' else 'eval'} "
                        "dataset", where="data.split", valid="'train' (env.dataset) or another split "
                        "(env.eval_dataset)", hint="give the environment a dataset, or use another data.dataset")
    return dataset
