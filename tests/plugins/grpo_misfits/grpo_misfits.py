"""A grpo plugin whose callables do not fit their Protocols (grpocli.registry.hookspecs), one
mistake each; grpo must refuse each before any model loads, naming plugin, function and parameter."""

import grpocli


def old_curriculum(prompts, completions, rewards, metas, state):
    """Written from the old hookspec docstring: no batch_size, next_rows or **kwargs."""
    return None


def unseeded(split, num_samples=8):
    """A loader that does not take the seed grpo passes."""
    return [{"prompt": f"{split} {i}"} for i in range(num_samples)]


def lookup(key: str, /) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    return key


class SecretOnly:
    """An environment whose reset takes the 'secret' column only, not the row's other columns."""

    def reset(self, secret):
        self.secret = secret


class NeedsLevel:
    """An environment whose constructor needs an arg the recipe does not give."""

    def __init__(self, level):
        self.level = level


class RewardWithArgs:
    """An environment whose get_reward wants an argument (grpo calls it with none)."""

    def get_reward(self, scale):
        return scale


@grpocli.hookimpl
def register_curricula(register):
    register("misfits.old_curriculum", old_curriculum)


@grpocli.hookimpl
def register_datasets(register):
    register("misfits.unseeded", unseeded)


@grpocli.hookimpl
def register_tools(register):
    register("misfits.lookup", lookup)


@grpocli.hookimpl
def register_environments(register):
    register("misfits.secret_only", SecretOnly)
    register("misfits.needs_level", NeedsLevel)
    register("misfits.reward_with_args", RewardWithArgs)
