"""Tables for `grpo inspect recipes | recipe | fields | plugins | data`."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

console = Console(highlight=False, soft_wrap=True)


def show_recipes() -> None:
    from grpocli.recipe import catalog

    table = Table(title="built-in recipes (grpo train NAME)")
    table.add_column("name", style="bold")
    table.add_column("what it is")
    for name, path in catalog.builtin().items():
        table.add_row(name, _first_comment(path.read_text(encoding="utf-8")))
    console.print(table)


def show_recipe(name_or_path: str, overrides: list[str]) -> None:
    from grpocli.recipe import flatten, load_recipe

    resolved = load_recipe(name_or_path, overrides)
    table = Table(title=f"recipe {resolved.name} ({resolved.path or 'defaults'})")
    table.add_column("key", style="bold")
    table.add_column("value")
    table.add_column("source", style="dim")
    for key, value in flatten(resolved.recipe).items():
        table.add_row(key, _short(value), resolved.source_of(key))
    console.print(table)


def show_fields(section: str | None = None, *, trl: str | None = None) -> None:
    """Every recipe key with its type, default, bounds and description, read from the schema;
    with ``trl``, the TRL GRPOConfig fields matching it and their keys first."""
    from grpocli.recipe.fields import describe

    rows = describe()
    if trl is not None:
        keys = _show_trl(trl)
        rows = [row for row in rows if row["key"] in keys]
    table = Table(title="recipe keys (section.key=value on the command line)")
    for col in ("key", "type", "default", "description"):
        table.add_column(col, style="bold" if col == "key" else None, overflow="fold")
    for row in rows:
        if section is None or row["key"].startswith(section):
            table.add_row(row["key"], row["type"], row["default"], row["description"])
    if rows:
        console.print(table)


def _show_trl(name: str) -> set[str]:
    """Print the TRL fields matching ``name`` and their recipe keys; return those keys."""
    from grpocli.errors import UserError, did_you_mean
    from grpocli.recipe.trl_names import TRL_FIELDS, lookup

    hits = lookup(name)
    if not hits:
        raise UserError(f"no TRL GRPOConfig field matches {name!r}{did_you_mean(name, TRL_FIELDS)}",
                        where="--trl", valid="a GRPOConfig field name or part of one, e.g. beta, vllm, loss",
                        hint="grpo inspect fields --trl vllm")
    table = Table(title=f"TRL GRPOConfig fields matching {name!r}")
    for col in ("TRL field", "recipe key", "note"):
        table.add_column(col, style="bold" if col == "TRL field" else None, overflow="fold")
    for field, (key, note) in hits.items():
        table.add_row(field, key or "not supported", note)
    console.print(table)
    return {key for key, _ in hits.values() if key}


def show_plugins() -> None:
    from grpocli.registry import load_plugins

    plugins = load_plugins()
    table = Table(title="plugins (entry-point group 'grpo')")
    for col in ("plugin", "distribution", "version", "registered"):
        table.add_column(col, style="bold" if col == "plugin" else None)
    for info in plugins.loaded:
        registered = plugins.registered_by(info.name)
        text = "\n".join(f"{kind}: {', '.join(names)}" for kind, names in registered.items())
        table.add_row(info.name, info.distribution, info.version, text or "-")
    console.print(table)
    for attr in ("rewards", "datasets", "curricula", "tools", "environments"):
        names = Table(title=attr, title_justify="left")
        names.add_column("name", style="bold")
        names.add_column("plugin")
        names.add_column("description")
        for entry in getattr(plugins, attr):
            names.add_row(entry.name, entry.plugin, entry.description)
        console.print(names)


#: `grpo inspect data`: the steps a mixture's table counts by default, and the steps shown one by one.
MIX_STEPS, MIX_STEPS_SHOWN = 100, 5


def show_data(name_or_path: str, overrides: list[str], *, n: int, steps: int | None = None) -> None:
    from grpocli.data.source import load_dataset_for
    from grpocli.models import load_tokenizer
    from grpocli.recipe import load_recipe
    from grpocli.registry import load_plugins

    resolved = load_recipe(name_or_path, overrides)
    recipe = resolved.recipe
    plugins = load_plugins()
    if recipe.data.sources:  # [[data.sources]]: each source, then the mix its draws make
        from grpocli.data.source import load_source

        loaded = [load_source(recipe.data, i, plugins.datasets, None, recipe.train.seed)
                  for i in range(len(recipe.data.sources))]
        tokenizer = load_tokenizer(recipe.model)
        for source, dataset in zip(recipe.data.sources, loaded, strict=True):
            section = source.section(recipe.data)
            console.rule(f"source {source.label!r}")
            _show_rows(dataset, section, tokenizer, n)
        show_mix(recipe, [len(d) for d in loaded], steps=steps)
        return
    dataset = load_dataset_for(recipe.data, plugins.datasets, recipe.data.split, recipe.train.seed)
    tokenizer = load_tokenizer(recipe.model)
    _show_rows(dataset, recipe.data, tokenizer, n)


def _show_rows(dataset: Any, data: Any, tokenizer: Any, n: int) -> None:
    from grpocli.data.template import preview

    console.print(f"dataset {data.dataset!r} split {data.split!r}: {len(dataset)} rows, "
                  f"columns: {', '.join(dataset.column_names)}")
    for i, row in enumerate(preview(dataset, data, tokenizer, n)):
        console.rule(f"row {i}")
        for key, value in row.items():
            console.print(f"[bold]{key}[/bold]: ", end="")
            console.print(_short(value, 2000), markup=False)


def show_mix(recipe: Any, rows: list[int], *, steps: int | None = None) -> dict[str, int]:
    """The prompts each source gives in the first ``steps`` optimizer steps (default: train.steps, at most
    MIX_STEPS) against its weight's share, drawn as training draws them (grpocli.data.mixture); {name: count}."""
    from grpocli.data.mixture import MixtureStream

    sources, t = recipe.data.sources, recipe.train
    steps = steps or min(t.steps, MIX_STEPS)
    stream = MixtureStream([(s.label, range(count)) for s, count in zip(sources, rows, strict=True)],
                           [s.weight for s in sources], seed=t.seed)
    drawn = stream.drawn(steps * t.prompts_per_step)
    total = sum(drawn.values())
    table = Table(title=f"the mix of the first {steps} steps: {total} prompts ({t.prompts_per_step} a step, "
                  f"train.seed {t.seed}; a fill round's prompts not counted)", title_justify="left")
    for column in ("source", "weight", "share", "prompts", "realised", "rows", "epochs"):
        table.add_column(column, justify="left" if column == "source" else "right")
    for source, share, count in zip(sources, stream.shares, rows, strict=True):
        got = drawn[source.label]
        table.add_row(source.label, f"{source.weight:g}", f"{share:.1%}", str(got), f"{got / max(total, 1):.1%}",
                      str(count), f"{got / count:.2f}")
    console.print(table)
    for step in range(min(steps, MIX_STEPS_SHOWN)):
        start = step * t.prompts_per_step
        names = [stream.source_at(p) for p in range(start, start + t.prompts_per_step)]
        console.print(f"step {step + 1}: " + ", ".join(f"{s.label} {names.count(s.label)}" for s in sources))
    return drawn


def _first_comment(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."
