"""`grpo inspect`: recipes, recipe fields, plugins, rendered prompts and run directories.

views.py         the tables of `grpo inspect recipes | recipe | fields | plugins | data`
overview.py      `grpo inspect RUN_DIR`: a run's summary, evaluations, metrics, alerts and rollouts
conversation.py  a multi-turn rollout's conversation, turn by turn (`--rollouts STEP`)
alerts.py        the rules that flag a failing run, read from its metrics (the trainer uses them live)
plot.py          metrics.png, and compare.png with several runs overlaid (matplotlib optional)
comparison.py    `grpo compare RUN_A RUN_B [...]`: runs read side by side, config diff with sources, shared rollouts
comparison_view.py  what `grpo compare` prints
run_summary.py   the lines `grpo train` ends a finished run with (reward, time, the next command)
bottleneck.py    the phase that bounds a run's step: median shares of its phases' seconds (step 1 left out)
remedies.py      what to turn for a bounding phase: recipe keys, values and the measured gain; the section's text

Never imports torch, but for `grpo inspect data` (it loads the tokenizer through transformers).
"""
