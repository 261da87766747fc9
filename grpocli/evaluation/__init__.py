"""`grpo eval` and evaluation during training: sample, score with the recipe's rewards, pass@k;
`grpo check-rewards`: the rewards on probe completions before training (and during it).

    estimators.py  pass@k (Chen et al. 2021), mean@N, maj@N: pure functions
    answers.py     the final answer of a completion, for majority voting
    evaluator.py   sample with any generation backend, score, summarize
    targets.py     which models to compare (base, checkpoints, run directories)
    records.py     eval/<label>-<split>/samples.jsonl + summary.json
    report.py      the comparison table
    eval_run.py    `grpo eval RECIPE` end to end: base and checkpoints, one table
    periodic.py    PeriodicEval: evaluation every eval.every steps inside the training loop (SourcesEval:
                   a [[data.sources]] mixture's, source by source, eval/<source>/...)
    probes.py      `grpo check-rewards`: probe completions (gold, wrong, no format, empty, long, repeated)
    probe_scores.py  each reward's scores on the probes, and the flags they raise
    reward_audit.py  `grpo check-rewards RECIPE` end to end: the table, the flags, exit 2
    extra_probes.py  a reward every probe scores alike: constant, or not exercised by the probes
    live_probes.py   the same probes every eval.reward_probes_every training steps, beside the live completions
"""
