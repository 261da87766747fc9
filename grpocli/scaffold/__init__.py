"""`grpo new`: a plugin project and a commented recipe, written from templates and the schema.

    plugin_project.py  `grpo new plugin NAME`: a pip-installable project with the `grpo` entry point
    recipe_text.py     `grpo new recipe`: every key of the schema, commented, with the source's values
"""

from grpocli.scaffold.plugin_project import plugin_files, write_plugin
from grpocli.scaffold.recipe_text import commented_recipe

__all__ = ["commented_recipe", "plugin_files", "write_plugin"]
