"""`grpo eval` and evaluation during training: sample, score with the recipe's rewards, pass@k.

    estimators.py  pass@k (Chen et al. 2021), mean@N, maj@N: pure functions
    answers.py     the final answer of a completion, for majority voting
    evaluator.py   sample with any generation backend, score, summarize
    targets.py     which models to compare (base, checkpoints, run directories)
    records.py     eval/<label>-<split>/samples.jsonl + summary.json
    report.py      the comparison table
    comparison.py  `grpo eval RECIPE` end to end: base and checkpoints, one table
    periodic.py    PeriodicEval: evaluation every eval.every steps inside the training loop
"""
