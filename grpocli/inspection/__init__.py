"""`grpo inspect`: read recipes, plugins and run directories; never imports torch (but `data`)."""
