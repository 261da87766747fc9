"""``[[data.sources]]``: a weighted mixture of datasets, each with its own rewards and metrics.

Wired into ``DataSection`` by grpocli.recipe.schema as ``sources: Sources``. With sources, the prompts
of every step are drawn from them by weight (grpocli.data.mixture); ``data.dataset`` and ``data.args``
are then not read (the sources win), and data's ``split``, ``eval_split``, ``prompt_column``,
``template`` and ``system_prompt`` are each source's defaults. Everything a source names is checked
before a model loads (grpocli.trainer.preflight); what can be checked from the recipe alone is checked
here, each message naming the source as ``data.sources[1] ("gsm8k")``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from grpocli.recipe.section import Section

if TYPE_CHECKING:
    from grpocli.recipe.schema import DataSection

#: What a source's name may hold: it is part of metric keys (rewards/<source>/<reward>/mean).
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
NAME_VALID = "letters, digits, '_', '.' and '-' (it is part of metric keys such as rewards/<source>/<reward>/mean)"
#: The column each row of a mixture carries its source's name in (rewards never receive it).
SOURCE_COLUMN = "_source"
#: The largest weight (weights are relative: only their ratios matter).
MAX_WEIGHT = 1e6


class DataSource(Section):
    """One dataset of a weighted mixture (verl's and prime-rl's data mixtures)."""

    name: str | None = Field(
        None, min_length=1, max_length=64,
        description="The source's name in metrics (rewards/<name>/<reward>/mean, reward/<name>, eval/<name>/pass@1), "
        "rollouts (column _source) and messages; letters, digits, '_', '.', '-'. Default: from the dataset (a "
        "registered name as it is, a file's name without its suffix, a hub id's last part).",
    )
    dataset: str = Field(
        description="As data.dataset: a registered dataset name (`grpo inspect plugins`), a local .jsonl/.json/"
        ".parquet/.csv file, a hub id, or 'verifiers:ENV_ID'.",
    )
    weight: float = Field(
        1.0, gt=0, le=MAX_WEIGHT,
        description="The source's share of the prompts is its weight over the sum of the weights (relative: "
        "1 and 3 draw a quarter and three quarters). Drawn per prompt with train.seed, so a step's mix varies "
        "around the shares and a resumed run draws the same order.",
    )
    split: str | None = Field(None, description="Split used for training (default: data.split).")
    eval_split: str | None = Field(
        None, description="Held-out split evaluated as eval/<name>/... (default: eval.split, else data.eval_split, "
        "else 'test').",
    )
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the dataset loader.")
    rewards: list[str] | None = Field(
        None, description="The [[rewards]] (by name, or by metric label such as 'name#2') that score this source's "
        "rows; the others give None there (not applicable, counted as 0 in the total, as TRL's None). Default: all.",
    )
    prompt_column: str | None = Field(None, description="Column holding the prompt (default: data.prompt_column).")
    template: str | None = Field(
        None, description="Format string making the user message from the row (default: data.template).",
    )
    system_prompt: str | None = Field(None, description="System message (default: data.system_prompt).")

    @property
    def label(self) -> str:
        """The name, or the one the dataset gives."""
        return self.name or default_name(self.dataset)

    def section(self, data: DataSection) -> DataSection:
        """``data`` as this source alone: its dataset, split, args and prompt keys, data's for the rest
        (what the single-dataset code paths take: loading, rendering, evaluating)."""
        own = {"dataset": self.dataset, "args": dict(self.args), "sources": []}
        for key in ("split", "eval_split", "prompt_column", "template", "system_prompt"):
            if getattr(self, key) is not None:
                own[key] = getattr(self, key)
        return data.model_copy(update=own)


def default_name(dataset: str) -> str:
    """'gsm8k' -> 'gsm8k'; 'data/math.jsonl' or 'data/{split}.jsonl' -> 'math' / 'data'; 'openai/gsm8k' -> 'gsm8k';
    'verifiers:wordle' -> 'wordle'; characters a name may not hold become '_'."""
    text = dataset.split(":", 1)[1] if dataset.startswith("verifiers:") else dataset
    path = Path(text.replace("{split}", ""))
    stem = path.stem if path.suffix else path.name
    if not stem.strip("._-") or path.name.startswith("."):  # 'data/{split}.jsonl': the folder names it
        stem = path.parent.name or "source"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem)[:64]


def where(index: int, name: str) -> str:
    """How messages name a source: ``data.sources[1] ("gsm8k")``."""
    return f'data.sources[{index}] ("{name}")'


def _weights_first(value: Any) -> Any:
    """A weight that is no positive number, named with its source (pydantic's bound alone would say
    'data.sources.1.weight'); the bound itself stays on the field, for `grpo inspect fields` and the docs."""
    if not isinstance(value, list):
        return value
    for i, entry in enumerate(value):
        raw = entry if isinstance(entry, dict) else getattr(entry, "__dict__", {})
        weight = raw.get("weight", 1.0)
        if isinstance(weight, (int, float)) and not isinstance(weight, bool) and not 0 < weight <= MAX_WEIGHT:
            name = raw.get("name") or default_name(str(raw.get("dataset", "")))
            raise ValueError(
                f"{where(i, name)}: weight = {weight!r}; valid: a number > 0 and <= {MAX_WEIGHT:g}, the source's share "
                "being its weight over the sum of the weights (to leave a source out, remove its [[data.sources]] table)")
    return value


def _names_unique(sources: list[DataSource]) -> list[DataSource]:
    """Each source's name is a valid metric part and its own; a rewards list is not empty."""
    seen: dict[str, int] = {}
    for i, source in enumerate(sources):
        name = source.label
        if source.rewards == []:
            raise ValueError(f"{where(i, name)}: rewards = [] would score every row of it 0; valid: the names of "
                             "[[rewards]] entries, or no rewards key (all of them)")
        if not NAME.match(name):
            raise ValueError(f"{where(i, name)}: name {name!r} holds other characters; valid: {NAME_VALID}")
        if name in seen:
            raise ValueError(
                f"{where(i, name)}: the name is {where(seen[name], name)}'s too; valid: a name of its own for each "
                "source (set name = \"...\" in one of them: metrics are kept per name)")
        seen[name] = i
    return sources


#: The type of ``data.sources``: the list, its weights and names checked with the source named.
Sources = Annotated[list[DataSource], BeforeValidator(_weights_first), AfterValidator(_names_unique)]


def reward_indices(source: DataSource, names: Sequence[str], labels: Sequence[str]) -> list[int]:
    """The indices of the recipe's [[rewards]] that score ``source``'s rows: every one without
    ``source.rewards``, else those whose name (``names[i]``, as [[rewards]] writes it) or metric label
    (``labels[i]``, e.g. 'name#2') it lists."""
    if source.rewards is None:
        return list(range(len(names)))
    wanted = set(source.rewards)
    return [i for i, (name, label) in enumerate(zip(names, labels, strict=True)) if name in wanted or label in wanted]


def unknown_rewards(source: DataSource, names: Sequence[str], labels: Sequence[str]) -> list[str]:
    """The entries of ``source.rewards`` that are none of the recipe's rewards."""
    return [r for r in source.rewards or [] if r not in names and r not in labels]


__all__ = ["SOURCE_COLUMN", "DataSource", "Sources", "default_name", "reward_indices", "unknown_rewards", "where"]
