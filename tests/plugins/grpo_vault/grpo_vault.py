"""A third-party grpo plugin written from grpocli/registry/hookspecs.py alone (its hooks and
Protocols): a dataset loader, a tool, an environment and a curriculum.

The vault game: each row holds a secret ``code``; the model opens the vault by calling the
environment's ``try_code`` tool; ``digit_sum`` is a standalone tool. The environment and the
curriculum append what they were called with to JSON-lines files (``log_path`` args), so a
test can see that grpo called them as the Protocols say.
"""

import itertools
import json
import random

import grpocli


def _log(path, record):
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")


# -- DatasetLoader: loader(split=..., seed=..., **args) -> list of dicts with a "prompt" ------
def vault_codes(split, seed, num_samples=16, digits=3):
    """Vaults to open: a prompt and the secret 'code' column (offline, seeded)."""
    rng = random.Random(f"vault:{split}:{seed}")
    return [{"prompt": f"Open the vault: its code has {digits} digits. Use try_code.",
             "code": rng.randrange(10 ** digits)} for _ in range(num_samples)]


# -- Tool: typed, Google-style docstring, called by keyword ----------------------------------
def digit_sum(number: int) -> int:
    """Sum the decimal digits of a number.

    Args:
        number: A non-negative integer, e.g. 512.
    """
    return sum(int(d) for d in str(abs(int(number))))


# -- EnvironmentFactory / Environment --------------------------------------------------------
class Vault:
    """A locked vault: try codes until it opens or the tries run out."""

    def __init__(self, max_tries=3, log_path=None):
        self.max_tries, self.log_path = max_tries, log_path
        self.code, self.tries, self.opened = None, 0, False

    def reset(self, code, **row):
        """Start on the rollout's row: its 'code' column, the rest through **row."""
        self.code, self.tries, self.opened = int(code), 0, False
        _log(self.log_path, {"reset": sorted(["code", *row])})
        return None

    def try_code(self, code: int) -> str:
        """Try a code on the vault's lock.

        Args:
            code: The code to try, e.g. 123.
        """
        if self.tries >= self.max_tries:
            return "The lock is jammed."
        self.tries += 1
        self.opened = self.opened or int(code) == self.code
        return "Open!" if self.opened else "Wrong code."

    def get_reward(self):
        return 1.0 if self.opened else 0.0


# -- Curriculum: keywords only, returns rows or None ------------------------------------------
def retry_locked(*, prompts, completions, rewards, metas, state, batch_size, next_rows, threshold=0.5,
                 log_path=None):
    """Put the first prompt no completion of which opened its vault back into the next batch."""
    state["calls"] = state.get("calls", 0) + 1
    _log(log_path, {"prompts": len(prompts), "completions": [len(c) for c in completions],
                    "rewards": [len(r) for r in rewards], "metas": sorted(metas[0]), "batch_size": batch_size,
                    "calls": state["calls"]})
    locked = [meta for meta, scores in zip(metas, rewards)
              if max((s for s in scores if s is not None), default=0.0) < threshold]
    if not locked:
        return None
    return [locked[0], *itertools.islice(next_rows, batch_size - 1)]


@grpocli.hookimpl
def register_datasets(register):
    register("vault.codes", vault_codes)


@grpocli.hookimpl
def register_tools(register):
    register("vault.digit_sum", digit_sum)


@grpocli.hookimpl
def register_environments(register):
    register("vault.lock", Vault)


@grpocli.hookimpl
def register_curricula(register):
    register("vault.retry_locked", retry_locked)
