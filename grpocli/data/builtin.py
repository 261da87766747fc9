"""Built-in dataset loaders, registered through the same hook a third-party plugin uses.

Loader contract (grpocli.registry.hookspecs.DatasetLoader):
``loader(split: str, seed: int, **args)`` returns a ``datasets.Dataset`` or a list of dicts
with a ``prompt`` column and the columns its rewards read (grpocli.data.source turns lists
into Datasets). Light module: `datasets` is imported inside the loaders that need it.
"""

from __future__ import annotations

import grpocli
from grpocli.data.files import load_local
from grpocli.data.generators import arithmetic, countdown
from grpocli.data.hub import load_gsm8k, load_hub
from grpocli.data.verifiers_datasets import verifiers_dataset


@grpocli.hookimpl
def register_datasets(register) -> None:
    register(
        "arithmetic",
        arithmetic,
        description="Procedural sums like '12+7=' with an int answer (offline, seeded); args "
        "num_samples, min_value, max_value, ops, num_terms, style ('equation': '12+7=', or "
        "'question': 'What is 12 + 7?').",
    )
    register(
        "countdown",
        countdown,
        description="Procedural Countdown as in TinyZero, always solvable; columns nums, target, "
        "solution; args num_samples, num_numbers, max_number, max_target.",
    )
    register(
        "local",
        load_local,
        description="A local .jsonl/.json/.parquet/.csv file or directory; args path (may hold "
        "{split}).",
    )
    register(
        "hub",
        load_hub,
        description="A Hugging Face Hub dataset via datasets.load_dataset; args id, name (config).",
    )
    register(
        "gsm8k",
        load_gsm8k,
        description="GSM8K from the hub (openai/gsm8k, main): question -> prompt, the number "
        "after '####' -> answer.",
    )
    register(
        "verifiers",
        verifiers_dataset,
        description="A verifiers environment's dataset (data.dataset = \"verifiers:ENV_ID\" names it); "
        "args env_id and the environment's load_environment arguments.",
    )
