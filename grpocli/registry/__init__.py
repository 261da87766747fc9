"""Plugins: the public contract and the plugin manager.

    hookspecs.py   the hooks a plugin implements, and a Protocol per kind it registers
    contracts.py   a plugin's callable checked against the Protocol of its kind
    names.py       name registries, one per kind (duplicates and did-you-mean)
    manager.py     the plugin manager: built-ins first, then entry points of the group ``grpo``
"""

from grpocli.registry.manager import Plugins, load_plugins
from grpocli.registry.names import Entry, Registry

__all__ = ["Entry", "Plugins", "Registry", "load_plugins"]
