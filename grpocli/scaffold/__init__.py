"""`grpo new`: a plugin project and a commented recipe, written from templates and the schema."""

from grpocli.scaffold.plugin_project import plugin_files, write_plugin
from grpocli.scaffold.recipe_text import commented_recipe

__all__ = ["commented_recipe", "plugin_files", "write_plugin"]
