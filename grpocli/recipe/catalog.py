"""Built-in recipes: the TOML files in recipes/ (shipped inside the wheel as grpocli/recipes)."""

from __future__ import annotations

from pathlib import Path

from grpocli.errors import UserError, did_you_mean

_PACKAGE = Path(__file__).resolve().parent.parent


def recipe_dirs() -> list[Path]:
    """Where built-in recipes live: inside the installed package, or the checkout's recipes/."""
    return [d for d in (_PACKAGE / "recipes", _PACKAGE.parent / "recipes") if d.is_dir()]


def builtin() -> dict[str, Path]:
    """{name: path} of every built-in recipe."""
    out: dict[str, Path] = {}
    for d in reversed(recipe_dirs()):
        out.update({p.stem: p for p in sorted(d.glob("*.toml"))})
    return dict(sorted(out.items()))


def find(name_or_path: str) -> Path:
    """A recipe file from a path or the name of a built-in recipe."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    recipes = builtin()
    if name_or_path in recipes:
        return recipes[name_or_path]
    if path.suffix in (".toml", ".yaml", ".yml", ".json", ".py") or "/" in name_or_path:
        what = f"no recipe file at {name_or_path}"
    else:
        what = f"no built-in recipe named {name_or_path!r}{did_you_mean(name_or_path, recipes)}"
    raise UserError(
        what,
        valid="a path to a .toml file, or a built-in recipe: " + ", ".join(recipes),
        hint="run `grpo inspect recipes` to list the built-in recipes",
    )
