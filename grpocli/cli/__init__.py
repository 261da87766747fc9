"""The `grpo` command: one thin module per subcommand; heavy imports happen inside functions.

    app.py            the typer application; the one place user errors become exit code 2
    train.py          `grpo train RECIPE [section.key=value ...]`
    evaluate.py       `grpo eval RECIPE`
    check_rewards.py  `grpo check-rewards RECIPE`
    inspect.py        `grpo inspect WHAT`
    compare.py        `grpo compare RUN_A RUN_B [...]`
    plan.py           `grpo plan RECIPE`
    bench.py          `grpo bench RECIPE`
    export.py         `grpo export RUN_OR_CHECKPOINT OUT_DIR`
    imports.py        `grpo import trl CONFIG -o recipe.toml`
    new.py            `grpo new plugin NAME`, `grpo new recipe`
    serve.py          `grpo vllm-serve` (alias `serve`)
    ref_serve.py      `grpo ref-serve`
    reward_serve.py   `grpo reward-serve`
    failures.py       failures of the machine rather than of grpo (a full disk, a read-only place, memory)
    shutdown.py       the exit: its code, never held open by a thread that hangs (a tool, judge, environment)
    bool_flags.py     bool flags that take a value too (TRL's `--enforce_eager True`)
"""
