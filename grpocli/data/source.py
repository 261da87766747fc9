"""Resolve ``data.dataset`` to a loader and load one split as a ``datasets.Dataset``.

``data.dataset`` is, in this order: a registered dataset name (``data.args`` go to its
loader), a local file (a .jsonl/.json/.parquet/.csv name, or any existing path: the "local"
loader with ``path``), or a hub id containing "/" (the "hub" loader with ``id``); ``verifiers:ENV_ID`` is a verifiers
environment's dataset (the "verifiers" loader with ``env_id``, grpocli.data.verifiers_datasets).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpocli.data.columns import check_prompts, mixed_type, mixed_type_error
from grpocli.data.files import BUILDERS
from grpocli.data.saved import saved_kind
from grpocli.data.verifiers_datasets import PREFIX as VERIFIERS_PREFIX
from grpocli.errors import UserError
from grpocli.recipe.data_sources import where
from grpocli.registry.contracts import DATASET, Resolved, check

if TYPE_CHECKING:
    import datasets

    from grpocli.recipe.schema import DataSection
    from grpocli.registry.names import Entry, Registry


def load_dataset_for(
    data: DataSection, registry: Registry, split: str, seed: int
) -> datasets.Dataset:
    """Load ``split`` of the recipe's dataset; every failure is a UserError naming the loader."""
    entry, args = resolve(data, registry)
    _check_single_file(entry, args, data, split)
    _check_args(entry, args)
    try:
        loaded = entry.fn(split=split, seed=seed, **args)
    except UserError:
        raise
    except Exception as exc:  # the loader's own failure: say which loader and plugin
        raise UserError(
            f"dataset {data.dataset!r} failed to load split {split!r}: {type(exc).__name__}: {exc}",
            where=f"data.dataset (loader {entry.name!r} from plugin {entry.plugin}, "
            f"{entry.distribution})",
            hint="check data.args and data.split; `grpo inspect plugins` shows the loader's "
            "description",
        ) from None
    dataset = _as_dataset(loaded, entry)
    if len(dataset) == 0:
        raise UserError(
            f"dataset {data.dataset!r} split {split!r} has no rows",
            where="data.dataset",
            hint="check the file or data.args (num_samples)",
        )
    check_prompts(dataset, data, f"data.dataset {data.dataset!r}, split {split!r}")  # every row, now
    return dataset


def load_source(data: DataSection, index: int, registry: Registry, split: str | None, seed: int) -> datasets.Dataset:
    """Load ``split`` (None: the source's training split) of ``data.sources[index]`` as load_dataset_for
    loads data.dataset; a failure names the source, ``data.sources[1] ("gsm8k")``."""
    source = data.sources[index]
    section = source.section(data)
    try:
        return load_dataset_for(section, registry, split or section.split, seed)
    except UserError as exc:
        raise in_source(exc, index, source.label) from None


def in_source(exc: UserError, index: int, name: str) -> UserError:
    """``exc`` about a source's own section, its ``where`` naming the source (data.split ->
    data.sources[1] ("gsm8k").split; a file or plugin -> data.sources[1] ("gsm8k"), then it)."""
    here, was = where(index, name), exc.where or ""
    there = here + was[len("data"):] if was.startswith("data.") else f"{here}, {was}" if was else here
    return UserError(exc.what, where=there, valid=exc.valid, hint=exc.hint)


def resolve(data: DataSection, registry: Registry) -> tuple[Entry, dict[str, Any]]:
    """The loader entry for ``data.dataset`` and the keyword arguments it gets."""
    name = data.dataset
    if name.startswith(VERIFIERS_PREFIX):  # a verifiers environment's own dataset
        return registry.get("verifiers", where="data.dataset"), {"env_id": name[len(VERIFIERS_PREFIX):], **data.args}
    if name not in registry:
        if Path(name).suffix.lower() in BUILDERS or looks_local(name):
            return registry.get("local", where="data.dataset"), {"path": name, **data.args}
        if "/" in name:
            return registry.get("hub", where="data.dataset"), {"id": name, **data.args}
    try:
        return registry.get(name, where="data.dataset"), dict(data.args)
    except UserError as exc:  # add the other two forms to what is valid
        raise UserError(
            exc.what,
            where=exc.where,
            valid=f"{exc.valid}; or a local .jsonl/.json/.parquet/.csv file; or a hub id "
            "like openai/gsm8k",
            hint=exc.hint,
        ) from None


def looks_local(name: str) -> bool:
    """An existing path, or a name no hub id can be: absolute, starting with . or ~, or with
    more than one "/" (hub ids are "owner/name"). Such a path that does not exist is named as a
    missing file, not looked up on the hub."""
    return (
        Path(name).expanduser().exists()
        or name.startswith((".", "~", "/", "\\"))
        or Path(name).is_absolute()
        or name.count("/") > 1
    )


def _check_args(entry: Entry, args: dict[str, Any]) -> None:
    """The loader against its contract (``grpocli.registry.hookspecs.DatasetLoader``): unknown,
    reserved or missing ``data.args`` keys, and a loader that cannot take ``split`` or ``seed``,
    named before the loader runs."""
    check(Resolved.of("dataset", entry), DATASET, where="data.dataset", args=args, args_where="data.args")


def _check_single_file(entry: Entry, args: dict[str, Any], data: DataSection, split: str) -> None:
    """A single file holds one split: asking it for another would evaluate on training rows."""
    if entry.name != "local" or split == data.split:
        return
    path = str(args.get("path", ""))
    folder = Path(path).expanduser()
    if "{split}" in path or (folder.is_dir() and saved_kind(folder) != "Dataset"):
        return
    single = "a Dataset.save_to_disk folder" if folder.is_dir() else "a single file"
    raise UserError(
        f"split {split!r} was asked of {path!r}, {single} that holds split "
        f"{data.split!r} only",
        where="data.eval_split" if split == data.eval_split else "data.dataset",
        valid='a path with {split}, e.g. "data/{split}.jsonl" (data/train.jsonl, data/test.jsonl), '
        "a directory of files named by split, or a DatasetDict.save_to_disk folder",
        hint=f"or set data.eval_split = {data.split!r} to evaluate on the training file itself",
    )


def _as_dataset(loaded: Any, entry: Entry) -> datasets.Dataset:
    import datasets

    if isinstance(loaded, datasets.Dataset):
        return loaded
    if isinstance(loaded, (list, tuple)) and all(isinstance(r, dict) for r in loaded):
        found = mixed_type(loaded)  # arrow refuses these with its own traceback, or keeps them as JSON text
        if found is not None:
            raise mixed_type_error(found, f"data.dataset (loader {entry.name!r} from plugin {entry.plugin}, "
                                   f"{entry.distribution})")
        return datasets.Dataset.from_list(list(loaded))
    raise UserError(
        f"dataset loader {entry.name!r} returned {type(loaded).__name__}",
        where=f"plugin {entry.plugin} ({entry.distribution})",
        valid="a datasets.Dataset (one split) or a list of dicts",
        hint="fix the plugin's loader (select the split of a DatasetDict; materialize an "
        "IterableDataset)",
    )
