"""Plugins: hookspecs (the public contract: hooks, and a Protocol per kind a plugin registers),
the checks of a callable against its Protocol (contracts), name registries and the plugin manager."""

from grpocli.registry.manager import Plugins, load_plugins
from grpocli.registry.names import Entry, Registry

__all__ = ["Entry", "Plugins", "Registry", "load_plugins"]
