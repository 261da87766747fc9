"""grpo: train language models with GRPO from a TOML recipe.

What a plugin author needs is here: ``hookimpl`` (marks hook functions), ``recipe_args``
(declares the ``[[rewards]] args`` a reward reads through ``**kwargs``) and ``UserError``
(the error grpo prints without a traceback). The hooks themselves are documented in
``grpocli.registry.hookspecs``.

Only light imports here: `grpo --help` must not import torch or vllm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

from grpocli.version import __version__

#: Mark plugin functions with this: ``@grpocli.hookimpl def register_rewards(register): ...``
hookimpl = pluggy.HookimplMarker("grpo")

from grpocli.errors import UserError  # noqa: E402  (after hookimpl: modules below may use it)

if TYPE_CHECKING:
    from grpocli.registry.contracts import recipe_args

__all__ = ["UserError", "__version__", "hookimpl", "recipe_args"]


def __getattr__(name: str) -> Any:
    """``grpocli.recipe_args``, imported on first use (``import grpocli`` stays light)."""
    if name == "recipe_args":
        from grpocli.registry.contracts import recipe_args

        return recipe_args
    raise AttributeError(f"module 'grpocli' has no attribute {name!r}")
