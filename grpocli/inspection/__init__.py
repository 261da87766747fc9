"""`grpo inspect`: recipes, recipe fields, plugins, rendered prompts and run directories.

views.py         the tables of `grpo inspect recipes | recipe | fields | plugins | data`
overview.py      `grpo inspect RUN_DIR`: a run's summary, evaluations, metrics, alerts and rollouts
conversation.py  a multi-turn rollout's conversation, turn by turn (`--rollouts STEP`)
alerts.py        the rules that flag a failing run, read from its metrics (the trainer uses them live)
plot.py          metrics.png (matplotlib optional)

Never imports torch, but for `grpo inspect data` (it loads the tokenizer through transformers).
"""
