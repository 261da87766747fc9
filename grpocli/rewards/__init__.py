"""Rewards: the TRL reward contract, the built-in rewards and the runner that scores a batch.

    scoring.py          a batch scored with the recipe's rewards: each called, its values checked, combined
    subsets.py          a batch in parts, each scored by its own rewards ([[data.sources]]), put back together
    invocation.py       calling reward functions: sync ones in turn, async ones together on one loop
    watchdog.py         a sync reward in the main thread under grpo's timeout (signal-alarm rewards)
    failures.py         what a failed call becomes: the UserError that stops the run, or a None score
    timings.py          each row's seconds a reward reports (log_row_seconds), the slowest, the warning
    arguments.py        the ``[[rewards]] args`` a reward accepts, and the checks that refuse others
    factories.py        [[rewards]] functions that make the reward from its args, as TRL's
    references.py       rewards named without a plugin: a ``module:function``, a reward model directory
    builtin.py          the built-in rewards, registered through the plugin hook
    text.py             a completion's text and the answer in it: parsers the built-ins share
    expression.py       safe integer arithmetic for the arithmetic rewards
    reward_model.py     a sequence-classification checkpoint as a reward
    code_tests.py       ``code.tests``: a completion's code run against its row's tests
    sandbox.py          one untrusted program in a sandbox: a process per case, limits, a private directory
    sandbox_cases.py    what a case runs and how its answers are judged, outside the solution's reach
    sandbox_harness.py  the first code that runs inside a sandboxed case; stdlib only
    sandbox_judge.py    the judge of test code grpo cannot take apart, in a process of its own
    assertions.py       assert tests taken apart: the expression the solution evaluates, the expected value kept
    case_values.py      plain values across the sandbox's edge, as one line of tagged JSON
    uid_pool.py         the uids cases run under when grpo is root, where only root writes
    judge.py            ``judge``: an LLM grades completions through an OpenAI-compatible endpoint
    verdicts.py         a judge's reply read as a score
    remote.py           [[rewards]] entries with ``url``: scored by `grpo reward-serve` over HTTP

Light imports only (no torch): ``grpo --help`` and ``grpo inspect plugins`` import this.
"""

from grpocli.rewards.scoring import (
    COMBINATIONS,
    RewardFn,
    Scores,
    resolve,
    reward_metrics,
    score,
)
from grpocli.rewards.text import completion_text

__all__ = ["COMBINATIONS", "RewardFn", "Scores", "completion_text", "resolve", "reward_metrics", "score"]
