"""Name registries, one per kind a plugin registers (reward, dataset, curriculum, tool,
environment), each name traced to the plugin and distribution that registered it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from grpocli.errors import UserError, did_you_mean


@dataclass(frozen=True)
class Entry:
    """One registered thing: its name, function, description and who provided it."""

    name: str
    fn: Callable[..., Any]
    description: str
    plugin: str
    distribution: str


class Registry:
    """Names of one kind ("reward", "dataset", "curriculum", "tool", "environment") mapped to entries."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def registrar(self, plugin: str, distribution: str) -> Callable[..., None]:
        """The ``register(name, fn, description=...)`` callback handed to one plugin's hook."""

        def register(name: str, fn: Callable[..., Any], *, description: str = "") -> None:
            self.add(Entry(name, fn, description or _first_line(fn.__doc__), plugin, distribution))

        return register

    def add(self, entry: Entry) -> None:
        if not isinstance(entry.name, str) or not entry.name:
            raise UserError(
                f"a {self.kind} name must be a non-empty string, got {entry.name!r}",
                where=f"plugin {entry.plugin}",
            )
        if not callable(entry.fn):
            raise UserError(
                f"{self.kind} {entry.name!r} was registered with {entry.fn!r}, which is not callable",
                where=f"plugin {entry.plugin}",
            )
        old = self._entries.get(entry.name)
        if old is not None:
            raise UserError(
                f"{self.kind} name {entry.name!r} is registered twice: by plugin {old.plugin} "
                f"({old.distribution}) and by plugin {entry.plugin} ({entry.distribution})",
                valid="each name once; plugins namespace their names, e.g. 'myplugin.reward'",
                hint="uninstall one of the two, or pick plugins with GRPO_PLUGINS=name1,name2",
            )
        self._entries[entry.name] = entry

    def get(self, name: str, *, where: str | None = None) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise UserError(
                f"unknown {self.kind} {name!r}{did_you_mean(name, self._entries)}",
                where=where,
                valid=", ".join(sorted(self._entries)) or f"(no {self.kind}s are registered)",
                hint="run `grpo inspect plugins` to list every name and the plugin behind it",
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(sorted(self._entries.values(), key=lambda e: e.name))

    def __len__(self) -> int:
        return len(self._entries)


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().split("\n", 1)[0]
