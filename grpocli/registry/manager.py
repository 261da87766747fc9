"""The plugin manager: built-ins first, then entry points of the group ``grpo``.

Environment variables (as pytest and simonw/llm have them):
  GRPO_DISABLE_PLUGIN_AUTOLOAD=1   load no entry-point plugins (built-ins still load)
  GRPO_PLUGINS=name1,name2         load only these entry points (by entry-point or
                                   distribution name); with autoload disabled, these still load
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from grpocli.errors import UserError
from grpocli.registry import hookspecs
from grpocli.registry.names import Registry
from grpocli.version import __version__

GROUP = "grpo"
BUILTIN_PLUGINS = ("grpocli.rewards.builtin", "grpocli.data.builtin", "grpocli.data.curricula",
                   "grpocli.multiturn.builtin")
KINDS = {"rewards": "reward", "datasets": "dataset", "curricula": "curriculum", "tools": "tool",
         "environments": "environment"}


@dataclass
class PluginInfo:
    """One loaded plugin: its name, module, and the distribution that shipped it."""

    name: str
    module: str
    distribution: str
    version: str


@dataclass
class Plugins:
    """Everything the plugins registered, by kind, and the plugins themselves."""

    rewards: Registry = field(default_factory=lambda: Registry("reward"))
    datasets: Registry = field(default_factory=lambda: Registry("dataset"))
    curricula: Registry = field(default_factory=lambda: Registry("curriculum"))
    tools: Registry = field(default_factory=lambda: Registry("tool"))
    environments: Registry = field(default_factory=lambda: Registry("environment"))
    loaded: list[PluginInfo] = field(default_factory=list)

    def registered_by(self, plugin: str) -> dict[str, list[str]]:
        """{kind: [names]} that one plugin registered."""
        out: dict[str, list[str]] = {}
        for attr in KINDS:
            names = [e.name for e in getattr(self, attr) if e.plugin == plugin]
            if names:
                out[attr] = names
        return out


def load_plugins(extra: list[tuple[str, object]] | None = None) -> Plugins:
    """Load built-ins and entry-point plugins, call their hooks, return the registries.

    ``extra`` is a list of (name, module-or-object) registered after the others (for tests
    and for recipes that name a module directly).
    """
    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    plugins = Plugins()
    for module_name in BUILTIN_PLUGINS:
        module = importlib.import_module(module_name)
        _register(pm, plugins, module, PluginInfo(module_name, module_name, "grpocli", __version__))
    for ep in _selected_entry_points():
        module = _load_entry_point(ep)
        dist = ep.dist.name if ep.dist else "?"
        version = ep.dist.version if ep.dist else "?"
        _register(pm, plugins, module, PluginInfo(ep.name, ep.value, dist, version))
    for name, obj in extra or []:
        _register(pm, plugins, obj, PluginInfo(name, getattr(obj, "__name__", name), "(local)", "-"))
    return plugins


def _register(pm: pluggy.PluginManager, plugins: Plugins, obj: object, info: PluginInfo) -> None:
    """Add one plugin to the manager, then call its hooks (only its own) to fill the registries."""
    if pm.is_registered(obj):
        return
    try:
        pm.register(obj, name=info.name)
    except (ValueError, pluggy.PluginValidationError) as exc:
        newer = isinstance(exc, pluggy.PluginValidationError)  # e.g. written for a later hook argument
        raise UserError(
            f"plugin {info.name!r} ({info.distribution}) could not be registered: {exc}",
            valid="hook functions named as in grpocli.registry.hookspecs, each declaring a subset "
            "of that hook's arguments",
            hint=("pip install -U grpocli if the plugin needs a newer grpo, or " if newer else "")
            + "set GRPO_DISABLE_PLUGIN_AUTOLOAD=1 to go on without it",
        ) from None
    plugins.loaded.append(info)
    for attr in KINDS:
        register = getattr(plugins, attr).registrar(info.name, info.distribution)
        _call_hook(pm, obj, f"register_{attr}", info, register=register)


def _call_hook(pm: pluggy.PluginManager, obj: object, hook: str, info: PluginInfo, **kwargs: Any) -> None:
    """Call ``hook`` of plugin ``obj`` alone, through pluggy, with keyword arguments.

    pluggy hands each implementation only the arguments it declares, so an implementation may
    take any subset of the hook's arguments and a hook may gain arguments later. Calling one
    plugin at a time lets each ``register`` callback know which plugin registered a name.
    """
    others = [p for p in pm.get_plugins() if p is not obj]
    caller = pm.subset_hook_caller(hook, remove_plugins=others)
    try:
        caller(**kwargs)
    except UserError:
        raise
    except SystemExit as exc:  # would end grpo with the plugin's code and without a word
        raise UserError(
            f"plugin {info.name!r} ({info.distribution}, {info.module}) called sys.exit({exc.code!r}) in {hook}",
            valid="a hook that registers and returns; a plugin never ends the process",
            hint=f"fix or uninstall the plugin ({_uninstall(info.distribution)}), or set "
            "GRPO_DISABLE_PLUGIN_AUTOLOAD=1",
        ) from None
    except Exception as exc:  # noqa: BLE001 - a plugin's own bug: name it
        raise UserError(
            f"plugin {info.name!r} ({info.distribution}) failed in {hook}: {type(exc).__name__}: {exc}",
            hint="fix or uninstall the plugin, or set GRPO_DISABLE_PLUGIN_AUTOLOAD=1",
        ) from None


def _selected_entry_points() -> list[metadata.EntryPoint]:
    eps = list(metadata.entry_points(group=GROUP))
    wanted = os.environ.get("GRPO_PLUGINS")
    if wanted is not None:
        names = {n.strip() for n in wanted.split(",") if n.strip()}
        known = {ep.name for ep in eps} | {ep.dist.name for ep in eps if ep.dist}
        missing = sorted(names - known)
        if missing:
            raise UserError(
                f"GRPO_PLUGINS names {', '.join(missing)}, which no installed distribution provides",
                where="environment variable GRPO_PLUGINS",
                valid=", ".join(sorted(known)) or "(no entry-point plugins are installed)",
                hint="pip install the plugin, or unset GRPO_PLUGINS",
            )
        return [ep for ep in eps if ep.name in names or (ep.dist and ep.dist.name in names)]
    if os.environ.get("GRPO_DISABLE_PLUGIN_AUTOLOAD", "").strip() not in ("", "0", "false"):
        return []
    return eps


def _load_entry_point(ep: metadata.EntryPoint) -> ModuleType:
    dist = ep.dist.name if ep.dist else "?"
    try:
        return ep.load()
    except SystemExit as exc:  # would end grpo with the plugin's code and without a word
        raise UserError(
            f"plugin {ep.name!r} from distribution {dist} called sys.exit({exc.code!r}) while being imported "
            f"({ep.value}){_raised_at(exc)}",
            where=f"entry point {ep.name} = {ep.value}",
            valid="a plugin module that imports without ending the process",
            hint=f"pip install --upgrade {dist}, or {_uninstall(dist)}, or skip it with "
            "GRPO_DISABLE_PLUGIN_AUTOLOAD=1",
        ) from None
    except Exception as exc:  # noqa: BLE001 - whatever its import raised: name the plugin
        raise UserError(
            f"plugin {ep.name!r} from distribution {dist} failed to import ({ep.value}): "
            f"{type(exc).__name__}: {exc}",
            where=f"entry point {ep.name} = {ep.value}",
            hint=f"pip install --upgrade {dist}, or pip uninstall {dist}, or skip it with "
            "GRPO_DISABLE_PLUGIN_AUTOLOAD=1",
        ) from None


def _uninstall(dist: str) -> str:
    return f"pip uninstall {dist}" if dist not in ("?", "grpocli", "(local)") else "remove it"


def _raised_at(exc: BaseException) -> str:
    """' at file:line' of the innermost frame that raised ``exc`` outside importlib ('' if none)."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
