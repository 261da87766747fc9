"""grpo: train language models with GRPO from a TOML recipe.

Only light imports here: `grpo --help` must not import torch or vllm.
"""

import pluggy

__version__ = "0.1.0"

#: Mark plugin functions with this: ``@grpocli.hookimpl def register_rewards(register): ...``
hookimpl = pluggy.HookimplMarker("grpo")

__all__ = ["__version__", "hookimpl"]
