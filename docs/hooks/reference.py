"""MkDocs hook: the reference pages, generated from the code at build time so they cannot drift.

mkdocs.yml names this file under ``hooks:`` (MkDocs >= 1.4, "Hooks" in its user guide); its
``on_files`` adds one generated page per entry of ``PAGES`` (``File.generated``, MkDocs >= 1.6):

* ``reference/recipe-keys.md``: every recipe key with its type, bounds, default and description,
  from the pydantic schema (``grpocli.recipe.fields.describe``, what ``grpo inspect fields`` prints);
* ``reference/trl-fields.md``: TRL's GRPOConfig fields and their recipe keys (``TRL_FIELDS``);
* ``reference/plugins.md``: the built-in rewards, datasets, curricula, tools and environments, as
  ``grpo inspect plugins`` lists them (entry-point plugins off, so the page is the same on any
  machine), and the hook and callable contracts from ``grpocli.registry.hookspecs``;
* ``reference/recipes.md``: the built-in recipes and their header comments;
* ``reference/cli.md``: every command's help, read from the typer application.

``tests/test_docs.py`` imports this module by path and checks the pages against the schema.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

KINDS = ("rewards", "datasets", "curricula", "tools", "environments")


def cell(text: Any) -> str:
    """One Markdown table cell: no pipes, newlines or raw angle brackets."""
    return (str(text).replace("|", "&#124;").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")
            .strip())


def table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def recipe_keys() -> str:
    """Every leaf key of the recipe schema, one table per section."""
    from grpocli.recipe.fields import describe

    rows = describe()
    sections: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        sections.setdefault(row["key"].split(".")[0].removesuffix("[]"), []).append(row)
    out = ["# Recipe keys\n",
           ("Generated from the recipe schema (`grpocli/recipe/schema.py` and its `*_section.py` modules) "
           "when the site is built; `grpo inspect fields [SECTION]` prints the same rows. Set any key "
           "as `section.key=value` on the command line, `GRPO_SECTION__KEY` in the environment, or in "
           "the recipe's TOML. Bounds are part of the type.\n")]
    for name, section in sections.items():
        out.append(f"## {name}\n")
        out.append(table(("key", "type", "default", "description"),
                         [(f"`{r['key']}`", r["type"], r["default"], r["description"]) for r in section]))
    return "\n".join(out)


def trl_fields() -> str:
    """TRL's GRPOConfig fields, one row each, with the recipe key and the note."""
    from grpocli.recipe.trl_names import TRL_FIELDS

    rows = [(f"`{name}`", f"`{key}`" if key else "not supported", note) for name, (key, note) in TRL_FIELDS.items()]
    return "\n".join([
        "# TRL's GRPOConfig fields\n",
        ("Generated from `grpocli/recipe/trl_names.py` (TRL 1.16). `grpo inspect fields --trl NAME` "
        "finds one; a note starting \"unit:\" says where the units differ, \"TRL's default\" where "
        "grpo's default does. See [Coming from TRL](../coming-from-trl.md).\n"),
        table(("TRL (GRPOConfig)", "grpo recipe key", "note"), rows),
    ])


def plugins() -> str:
    """The built-in registrations and the contracts a plugin implements."""
    from grpocli.registry import hookspecs, load_plugins

    saved = os.environ.get("GRPO_DISABLE_PLUGIN_AUTOLOAD")
    os.environ["GRPO_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # built-ins only: the page is machine-independent
    try:
        loaded = load_plugins()
    finally:
        if saved is None:
            os.environ.pop("GRPO_DISABLE_PLUGIN_AUTOLOAD")
        else:
            os.environ["GRPO_DISABLE_PLUGIN_AUTOLOAD"] = saved
    out = ["# Plugins: built-ins and contracts\n",
           ("Generated from the plugin registry (what `grpo inspect plugins` lists, with entry-point "
           "plugins off) and `grpocli/registry/hookspecs.py`. Writing a plugin: "
           "[Rewards and datasets are plugins](../plugins.md).\n")]
    for kind in KINDS:
        entries = list(getattr(loaded, kind))
        out.append(f"## Built-in {kind}\n")
        out.append(table(("name", "plugin", "description"), [(f"`{e.name}`", e.plugin, e.description)
                                                              for e in entries]) if entries else "(none)\n")
    out.append("## Hooks\n")
    for name in ("register_" + kind for kind in KINDS):
        out.append(_doc_block(f"{name}(register)", getattr(hookspecs, name)))
    out.append("## Contracts\n")
    for name in ("RewardFunction", "DatasetLoader", "Curriculum", "Tool", "EnvironmentFactory", "Environment"):
        out.append(_doc_block(name, getattr(hookspecs, name)))
    return "\n".join(out)


def _doc_block(title: str, obj: Callable[..., Any] | type) -> str:
    doc = inspect.getdoc(obj) or ""
    text = "\n".join("    " + line if line else "" for line in doc.splitlines())
    return f"### `{title}`\n\n{text}\n"


def recipes() -> str:
    """The built-in recipes with each one's header comment (hardware, time, command)."""
    from grpocli.recipe import catalog

    out = ["# Built-in recipes\n",
           ("Generated from `recipes/*.toml`; `grpo inspect recipes` lists them, `grpo train NAME` runs "
           "one. Each header says the hardware, the time and the exact command.\n")]
    for name, path in catalog.builtin().items():
        header = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                break
            header.append(line[1:].removeprefix(" "))
        out.append(f"## `{name}`\n")
        out.append("\n".join("    " + line if line else "" for line in header) + "\n")
    return "\n".join(out)


def cli() -> str:
    """Every command's help: its description, arguments and options, from the typer app."""
    import typer.main

    from grpocli.cli.app import app

    root = typer.main.get_command(app)
    out = ["# Command line\n",
           ("Generated from the typer application (`grpocli/cli/`); `grpo COMMAND --help` prints the "
           "same.\n")]

    def walk(command: Any, path: str) -> None:  # typer's (click-like) Command or Group
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                if not sub.hidden:
                    walk(sub, f"{path} {name}")
            return
        out.append(f"## `{path}`\n")
        out.append(help_markdown(command.help or ""))
        rows = []
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            option = param.param_type_name == "option"
            names = ", ".join(param.opts + getattr(param, "secondary_opts", [])) if option else param.name.upper()
            default = "" if param.required or param.default in (None, (), False) else repr(param.default)
            rows.append((f"`{names}`", getattr(param, "help", "") or "", default))
        if rows:
            out.append(table(("argument / option", "meaning", "default"), rows))

    walk(root, "grpo")
    return "\n".join(out)


#: Help lines that are example commands (typer dedents them) and so go in a code block.
COMMANDS = ("grpo ", "GRPO_", "accelerate ", "trl ")


def help_markdown(text: str) -> str:
    """A command's help text as Markdown: its indented example lines become a code block."""
    lines, code = [], False
    for line in inspect.cleandoc(text).replace("[bold]", "**").replace("[/bold]", "**").splitlines():
        if line.strip() == "\b":
            continue
        if (line.startswith("  ") and line.strip()) or line.startswith(COMMANDS):
            if not code and lines and lines[-1].strip():
                lines.append("")
            lines.append("    " + line.removeprefix("  "))
            code = True
        elif line.strip():
            if code:
                lines.append("")
            lines.append(line)
            code = False
        else:
            lines.append("")
    return "\n".join(lines) + "\n"


#: The generated pages: path under docs/ -> the function that writes it.
PAGES: dict[str, Callable[[], str]] = {
    "reference/recipe-keys.md": recipe_keys,
    "reference/trl-fields.md": trl_fields,
    "reference/plugins.md": plugins,
    "reference/recipes.md": recipes,
    "reference/cli.md": cli,
}




def on_files(files: Any, config: Any) -> Any:
    """MkDocs event: add the generated pages to the site's files."""
    from mkdocs.structure.files import File

    for path, write in PAGES.items():
        files.append(File.generated(config, path, content=write()))
    return files
