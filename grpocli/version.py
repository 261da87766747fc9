"""grpo's version, in a module of its own: the plugin manager and the command line read it without
importing the package's public names (``grpocli/__init__.py`` re-exports it as ``__version__``)."""

__version__ = "0.1.0"
