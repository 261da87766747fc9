"""The `grpo` command: one thin module per subcommand; heavy imports happen inside functions."""
