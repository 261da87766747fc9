"""Limits that several keys share, each where a library breaks or memory runs out beyond it.

The schema (grpocli.recipe.schema and its section modules) declares them on its fields, so the
recipe loader and `--dry-run` refuse a value before any model loads; `grpo eval`'s flags and the
reward checks (grpocli.rewards.scoring) use the same numbers.
"""

from __future__ import annotations

#: Lowest sampling temperature. Logits are divided by it: at 1e-320 the sampler's probabilities
#: are NaN (torch.multinomial stops the run); well before that every completion of a group is the
#: greedy one (vLLM samples greedily below 1e-5), so the group has no reward spread to learn from.
MIN_TEMPERATURE = 0.01
#: Lowest repetition penalty: transformers divides positive logits by it (the same NaN as above).
MIN_REPETITION_PENALTY = 0.01
#: Largest top_k: vLLM keeps it in a 32-bit integer (no vocabulary is near this size).
MAX_TOP_K = 2**31 - 1
#: Largest train.seed: numpy (transformers' set_seed) takes seeds below 2**32, and each of up to
#: 1024 processes samples with seed + rank.
MAX_SEED = 2**31 - 1
#: Most completions in one generation batch (prompts_per_step x steps_per_generation x
#: num_generations). Rollouts, rewards and log-probs of a batch are all held at once; 2**20 is
#: over a hundred times the largest published GRPO batches (thousands of completions).
MAX_COMPLETIONS_PER_BATCH = 2**20
#: Largest |weight| of a reward (typical weights are 0.1 to 10).
MAX_ABS_REWARD_WEIGHT = 1e6
#: Largest |reward| (and |weight x reward| summed): rewards become float32 tensors (largest
#: 3.4e38) whose standard deviation squares them, and Python's statistics.stdev overflows at 1e154;
#: 1e12 leaves room for a million squares of that size.
MAX_ABS_REWARD = 1e12
