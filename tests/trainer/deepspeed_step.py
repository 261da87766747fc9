"""One grpo optimizer step under DeepSpeed, on each process of `accelerate launch --config_file
configs/deepspeed_zero{2,3}.yaml --num_processes 2 tests/trainer/deepspeed_step.py [no|bf16]`
(test_deepspeed.py; under `torchrun --nproc_per_node 2` the same with DDP): a batch with a
non-finite advantage is skipped (grad_norm inf, weights as they were), a finite one updates.
Prints one JSON line per process."""

from __future__ import annotations

import json
import math
import os
import sys

import torch
from accelerate import Accelerator
from test_trainer_step import (  # this folder: the script's own (sys.path[0])
    SETTINGS,
    micro_batches,
    rollouts,
)

from grpocli.models import build_char_tokenizer, build_tiny_model
from grpocli.parallel import Parallel
from grpocli.parallel.deepspeed import DeepSpeed, accelerator_options
from grpocli.recipe.schema import Recipe, TinyModel
from grpocli.trainer.batching import OptimizerBatch
from grpocli.trainer.step import Frozen, LossSettings, optimizer_step


def whole(model, parallel) -> list[torch.Tensor]:
    """Every parameter whole (ZeRO-3: gathered), as CPU copies."""
    module = parallel.unwrap(model)
    with parallel.whole_weights(module):
        return [p.detach().cpu().clone() for p in module.parameters()]


def main() -> None:
    precision = sys.argv[1] if len(sys.argv) > 1 else "no"
    acc = Accelerator(**accelerator_options(600.0), mixed_precision=precision)
    if acc.state.deepspeed_plugin is not None:
        parallel = DeepSpeed(acc, Recipe(train={"mixed_precision": precision}))
    else:
        parallel = Parallel(acc)
    stage = getattr(parallel, "stage", None)
    tok = build_char_tokenizer()
    with parallel.loading():  # the same initial weights under every stage
        model = build_tiny_model(TinyModel(hidden_size=32, num_layers=1, num_heads=1, intermediate_size=64), tok, 0)
    model, _, opt, _ = parallel.prepare(model, None, lambda m: (torch.optim.SGD(m.parameters(), lr=0.1), None))
    settings = LossSettings(loss="dapo", **SETTINGS)
    before = whole(model, parallel)
    bad = micro_batches(rollouts(tok, [float("inf"), -1, 1, 0.5, 1, -1, 0.5, -0.5]), list(range(8)), pad_id=0,
                        max_sequences=4)
    skipped = optimizer_step(parallel, model, opt, OptimizerBatch(bad), Frozen(), settings, max_grad_norm=1.0)
    after_bad = whole(model, parallel)
    good = micro_batches(rollouts(tok, [1.0, -1, 1, 0.5, 1, -1, 0.5, -0.5]), list(range(8)), pad_id=0,
                         max_sequences=4)
    stepped = optimizer_step(parallel, model, opt, OptimizerBatch(good), Frozen(), settings, max_grad_norm=1.0)
    after_good = whole(model, parallel)
    line = json.dumps({
        "rank": acc.process_index, "stage": stage, "precision": precision,
        "sharding": [parallel.sharding, parallel.recipe_sharding],
        "bad": {"skipped": skipped["skipped"], "grad_norm_finite": math.isfinite(skipped["grad_norm"]),
                "unchanged": all(torch.equal(a, b) for a, b in zip(before, after_bad))},
        "good": {"skipped": stepped["skipped"], "grad_norm": stepped["grad_norm"],
                 "changed": not all(torch.equal(a, b) for a, b in zip(after_bad, after_good))},
    })
    os.write(1, (line + "\n").encode())  # one write: the two processes' lines do not interleave
    acc.wait_for_everyone()
    torch.distributed.destroy_process_group()  # no process leaves while another still talks to it


if __name__ == "__main__":
    main()
