"""Rewards a recipe names without a plugin: a function, or a reward model directory.

``[[rewards]] name`` is, in this order:

1. a registered name (``grpo inspect plugins``): registered names keep priority;
2. a reward model: a directory holding a sequence-classification checkpoint (TRL's
   ``reward_funcs="path"``), scored by ``grpocli.rewards.reward_model.RewardModel``;
3. ``module.path:function``: the module is imported (the working directory is on the import
   path, as TRL's CLI puts it there) and the function taken from it;
4. ``path/to/file.py:function``: the file is loaded as a module (relative paths from the
   working directory; the file's own directory joins the import path, as for a script).

An entry with ``url`` is none of these here: the name is the reward a `grpo reward-serve` server
resolves the same way, and ``grpocli.rewards.remote.RemoteReward`` calls it there.

TRL's CLI writes a function as ``my_lib.rewards.custom_reward``; here a dotted name is a
registered name (``countdown.equation``), so a function is written ``my_lib.rewards:custom_reward``.
The plugin route stays the way to share rewards; these are for one's own experiments.

Labels (metric names ``rewards/<label>/mean``): a registered name as written; a function by its
name alone, as TRL labels ``reward_func.__name__`` (``reward_len`` for ``my_rewards.py:reward_len``);
a reward model by its directory's name (TRL's label for a reward model is the last part of its
model id). Where two rewards of a recipe would share a label, each takes its qualified one
(``Found.qualified``: ``module:function`` as written, ``file.py:function`` without the file's
directory), so their metrics stay apart.

Light imports only: nothing here imports torch or transformers, so ``grpo train --dry-run``
checks every name without loading a model.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from grpocli.errors import UserError, did_you_mean

if TYPE_CHECKING:
    from grpocli.recipe.schema import RewardSpec
    from grpocli.registry import Registry

CONTRACT = "a function fn(prompts, completions, **kwargs) -> list[float | None]"
FORMS = ("a registered name (`grpo inspect plugins`), module.path:function, path/to/file.py:function, "
         "or a reward model directory")
MODEL_ONLY = ("batch_size", "device")


@dataclass(frozen=True)
class Found:
    """What a [[rewards]] name resolved to: the callable, its label, and which route found it."""

    fn: Callable[..., Any]
    label: str
    kind: Literal["registered", "function", "model", "remote"]
    qualified: str = ""  # the label where another reward of the recipe has the same one ("" : label)


def lookup(spec: RewardSpec, index: int, registry: Registry) -> Found:
    """The reward that entry ``index`` of [[rewards]] names; UserError naming rewards[index].name."""
    name, where = spec.name, f"rewards[{index}].name"
    if getattr(spec, "url", None) is not None:  # scored by grpo reward-serve: the server resolves the name
        from grpocli.rewards.remote import from_spec, remote_label

        label, qualified = remote_label(name)
        found = Found(from_spec(spec, index), label, "remote", qualified)
        _check_model_only(spec, index, name)
        return found
    from grpocli.rewards.remote import check_remote_only

    check_remote_only(spec, index)
    if name in registry:
        found = Found(registry.get(name, where=where).fn, name, "registered")
    elif _names_model(name):
        from grpocli.rewards.reward_model import RewardModel, check_reward_model_dir

        path = check_reward_model_dir(name, where=where)
        options = {k: getattr(spec, k, None) for k in MODEL_ONLY}
        label = path.name
        model = RewardModel(path, label=label, entry=f"rewards[{index}]", **options)
        if model.device is not None:
            model.check_device()  # a device this machine lacks is refused before any model loads
        found = Found(model, label, "model")
    elif ":" in name:
        found = _function(name, where)
    elif name.endswith(".py"):
        raise UserError(
            f"{name!r} names a file but not the function in it",
            where=where,
            valid=f"{name}:FUNCTION, where FUNCTION is one of: {_file_functions(Path(name))}",
            hint=f'write name = "{name}:your_reward_function"',
        )
    elif _looks_like_path(name):
        raise UserError(
            f"no directory {name!r} (a reward model is a local directory; looked from {Path.cwd()})",
            where=where,
            valid=f"{FORMS}; a reward model directory holds config.json, the weights and the tokenizer",
            hint="check the path; for a hub model, download it first: "
            "`huggingface-cli download ORG/NAME --local-dir DIR` and name DIR",
        )
    else:
        found = _registered(name, where, registry)
    if found.kind != "model":
        _check_model_only(spec, index, name)
    return found


def _check_model_only(spec: RewardSpec, index: int, name: str) -> None:
    """UserError for batch_size or device on an entry that is no local reward model."""
    for key in MODEL_ONLY:
        if getattr(spec, key, None) is not None:
            raise UserError(
                f"{key} is set for reward {name!r}, which is {'served' if getattr(spec, 'url', None) else 'a function'}, "
                "not a reward model in this process",
                where=f"rewards[{index}].{key}",
                valid=f"{key} only on entries that name a reward model directory (without url)",
                hint=f"leave {key} out of this [[rewards]] entry",
            )


def _registered(name: str, where: str, registry: Any) -> Found:
    """The registry's entry; its did-you-mean error told of the other ways to name a reward."""
    try:
        return Found(registry.get(name, where=where).fn, name, "registered")
    except UserError as err:
        valid = (f"{err.valid}; or a function as module.path:function or path/to/file.py:function, "
                 "or a reward model directory")
        hint = err.hint or ""
        if "." in name and "did you mean" not in err.what:
            module, _, attr = name.rpartition(".")
            hint += f"; a function is named with a colon, e.g. {module}:{attr} (TRL's CLI writes {name})"
        raise UserError(err.what, where=err.where, valid=valid, hint=hint) from None


# -- functions -----------------------------------------------------------------------------
def _function(name: str, where: str) -> Found:
    target, _, attr = name.rpartition(":")
    if not target or not attr or not all(part.isidentifier() for part in attr.split(".")):
        raise UserError(
            f"{name!r} is not module:function",
            where=where,
            valid="module.path:function (an importable module) or path/to/file.py:function",
            hint='e.g. name = "my_rewards:reward_len" with my_rewards.py in the working directory',
        )
    if target.endswith(".py") or "/" in target or os.sep in target:
        module, qualified = _load_file(target, where), f"{Path(target).name}:{attr}"
    else:
        module, qualified = _import(target, where), name
    fn = _attribute(module, target, attr, where)
    return Found(fn, attr, "function", qualified)


def _import(target: str, where: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)  # as TRL's CLI; appended, so a file here does not shadow an installed package
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (target == missing or target.startswith(missing + ".")):
            raise UserError(
                f"no module named {missing!r}{'' if missing == target else f' (for {target})'}: looked in "
                f"the working directory {cwd} and the installed packages",
                where=where,
                valid="module.path:function with an importable module, or path/to/file.py:function",
                hint=f"run grpo from the directory holding {target.replace('.', '/')}.py, `pip install` the "
                "package that has it, or name the file: path/to/file.py:function",
            ) from None
        raise _import_error(target, exc, where) from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - SystemExit too: it would end grpo without a word
        raise _import_error(target, exc, where) from None


def _load_file(target: str, where: str) -> Any:
    path = Path(target).expanduser()
    if not path.is_file():
        raise UserError(
            f"no file {target!r} (looked from {Path.cwd()})",
            where=where,
            valid="path/to/file.py:function, the path absolute or relative to the working directory",
            hint="check the path, or run grpo from the directory it is relative to",
        )
    path = path.resolve()
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"_grpo_reward_{''.join(c if c.isalnum() else '_' for c in path.stem)}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"{target!r} cannot be loaded as a Python module", where=where,
                        valid="path/to/file.py:function, a Python source file")
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))  # its sibling modules import as they would for a script
    sys.modules[module_name] = module  # before running it, as importlib does (dataclasses, pickle)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - SystemExit too: it would end grpo without a word
        del sys.modules[module_name]
        raise _import_error(target, exc, where) from None
    return module


def _import_error(target: str, exc: BaseException, where: str) -> UserError:
    frames = traceback.extract_tb(exc.__traceback__)
    origin = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    if isinstance(exc, SyntaxError) and exc.filename:
        origin = f" at {exc.filename}:{exc.lineno}"
    hint = "fix the module so that `python -c \"import ...\"` works, then run this again"
    if isinstance(exc, ModuleNotFoundError):
        hint = f"install the package it imports (`pip install {exc.name or '...'}`), or remove the import"
    what = f"raised {type(exc).__name__}: {exc}"
    if isinstance(exc, SystemExit):  # e.g. a script's argparse or `sys.exit(main())` run at import
        what = f"called sys.exit({exc.code!r})"
        hint = ("a module named in a recipe is imported, not run: put its script part under "
                "`if __name__ == \"__main__\":`")
    return UserError(f"importing {target!r} {what}{origin}", where=where,
                     valid="a module that imports without error", hint=hint)


def _attribute(module: Any, target: str, attr: str, where: str) -> Callable[..., Any]:
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            owner = target if i == 0 else f"{target}:{'.'.join(attr.split('.')[:i])}"
            candidates = _public_functions(obj)
            raise UserError(
                f"{owner!r} has no attribute {part!r}{did_you_mean(part, candidates)}",
                where=where,
                valid=f"{target}:NAME with NAME one of: {', '.join(candidates) or '(it defines no functions)'}",
                hint=f"check the function's name in {getattr(module, '__file__', None) or target}",
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(
            f"{target}:{attr} is not callable: it is {_short(obj)} ({type(obj).__name__})",
            where=where,
            valid=f"{CONTRACT}; in {target}: {', '.join(_public_functions(module)) or '(no functions)'}",
            hint="name a function of the module",
        )
    return obj


def _public_functions(obj: Any) -> list[str]:
    import inspect

    return sorted(k for k, v in vars(obj).items() if not k.startswith("_") and inspect.isfunction(v))[:30] \
        if hasattr(obj, "__dict__") else []


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 60 else text[:57] + "..."


def _file_functions(path: Path) -> str:
    """Top-level function names of a .py file, read without running it."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return "(the file cannot be read)" if not path.is_file() else "(the file does not parse)"
    names = [n.name for n in tree.body
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not n.name.startswith("_")]
    return ", ".join(names) or "(it defines no functions)"


# -- reward models -------------------------------------------------------------------------
def _names_model(name: str) -> bool:
    """A directory that is a checkpoint (config.json) or is written as a path."""
    path = Path(name).expanduser()
    return path.is_dir() and (_looks_like_path(name) or (path / "config.json").is_file())


def _looks_like_path(name: str) -> bool:
    return "/" in name or os.sep in name or name.startswith((".", "~"))
