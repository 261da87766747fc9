"""Run by tests/parallel/test_sequence_parallel.py: one optimizer step of grpo's real step on N gloo
processes (accelerate, DDP), with and without train.sequence_parallel, for each layout; writes what
every process measured as JSON.

    python split_worker.py OUT WORLD SPLIT[,SPLIT...] LAYOUT[,LAYOUT...] [FAMILY:ATTENTION,...]

Each process has its own micro-batches (its own prompts, groups of 3 completions of different
lengths). For each layout (packed, shared prompts, padded) and split size, from the same weights:
the frozen log-probs of the micro-batches, then one step (SGD, lr 1, no clipping) whose update is
the gradient; against the unsplit run's (DDP over the same processes).
"""

from __future__ import annotations

import json
import os
import socket
import sys

import torch
import torch.multiprocessing as mp

VOCAB = 97


def _model(family: str, attention: str, kv: str = "4"):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=int(kv), head_dim=8,
                                  max_position_embeddings=512, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=torch.float32)


def _micro_batches(rank: int, layout):
    from grpocli.trainer.batching import make_micro_batches
    from grpocli.trainer.rollouts import Rollouts

    g = torch.Generator().manual_seed(100 + rank)
    prompts = [torch.randint(1, VOCAB, (int(n),), generator=g).tolist() for n in (5 + rank, 7)]
    completions = [torch.randint(1, VOCAB, (int(n),), generator=g).tolist()
                   for n in (9 + 3 * rank, 4, 13, 6, 11 - rank, 8)]
    rollouts = Rollouts(rows=[{}, {}], prompt_ids=prompts, completion_ids=completions, completions=[""] * 6,
                        truncated=torch.zeros(6, dtype=torch.bool), group_size=3)
    advantages = torch.randn(6, generator=g)
    sizes = {0: 3, 1: 2}  # different micro-batch counts on different processes
    return tuple(make_micro_batches(rollouts, advantages, list(range(6)), max_sequences=sizes.get(rank, 6),
                                    layout=layout))


def _run(rank: int, world: int, port: int, splits: list[int], layouts: list[str], models: list[str],
         out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from accelerate import Accelerator

    from grpocli.algorithms.packing import Layout
    from grpocli.parallel import Parallel
    from grpocli.parallel.sequence import SequenceSplit
    from grpocli.trainer.batching import OptimizerBatch
    from grpocli.trainer.step import Frozen, LossSettings, frozen_logprobs, optimizer_step

    acc = Accelerator(cpu=True)
    settings = LossSettings(loss="grpo", beta=0.04, kl_estimator="k3", temperature=0.9, max_completion_length=16,
                            entropy_coef=0.01, chunk_tokens=7)  # a KL term, an entropy bonus (its gradient gathered too)
    from grpocli.parallel import ulysses

    exchanged = [0]
    plain_exchange = ulysses.exchange

    def counted(*args, **kwargs):
        exchanged[0] += 1
        return plain_exchange(*args, **kwargs)

    ulysses.exchange = counted
    results = {}
    groups = {n: SequenceSplit(n, rank, world) for n in splits}  # every process creates every group, in order
    for name, model_spec in ((x, m) for m in models for x in layouts):  # family:attention[:kv heads]
        mbs = _micro_batches(rank, Layout(name))
        for n in (1, *splits):
            p = Parallel(acc)
            model = _model(*model_spec.split(":"))
            if n > 1:
                p.split = groups[n]
                p.split_models(model)
            model, _, opt, _ = p.prepare(model, None, lambda m: (torch.optim.SGD(m.parameters(), lr=1.0), None))
            before = [q.detach().clone() for q in p.unwrap(model).parameters()]
            old = frozen_logprobs(p, model, mbs, settings.temperature, chunk_tokens=settings.chunk_tokens)
            shifted = tuple(x + 0.2 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
                            for x in old)  # an old policy != the current one: ratios off 1, some clipped
            reference = tuple(x - 0.1 for x in old)
            exchanged[0] = 0
            stats = optimizer_step(p, model, opt, OptimizerBatch(mbs), Frozen(old_logp=shifted, ref_logp=reference),
                                   settings, max_grad_norm=0.0)
            grads = torch.cat([(b - a.detach()).flatten() for b, a in zip(before, p.unwrap(model).parameters())])
            results[f"{model_spec}/{name}/{n}"] = {"logp": [x.flatten().tolist() for x in old], "loss": stats["loss"],
                                      "grad_norm": stats["grad_norm"], "grad": grads.tolist(),
                                      "tokens": stats["tokens"], "clip": stats["clip_region"], "kl": stats["kl"],
                                      "exchanges": exchanged[0]}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(results, f)
    acc.wait_for_everyone()
    torch.distributed.destroy_process_group()


def main() -> None:
    out, world, splits = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
    layouts = sys.argv[4].split(",")
    models = sys.argv[5].split(",") if len(sys.argv) > 5 else ["qwen2:sdpa"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_run, args=(world, port, splits, layouts, models, out), nprocs=world, join=True)


if __name__ == "__main__":
    main()
