"""grpo plugin for reasoning-gym (https://github.com/open-thought/reasoning-gym).

Registers the dataset ``reasoning_gym`` and the reward ``reasoning_gym.score``; see
``grpo_reasoning_gym.plugin``.
"""

__version__ = "0.1.0"
