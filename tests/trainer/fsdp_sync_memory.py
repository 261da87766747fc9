"""Peak memory of an FSDP2 weight sync, per process: `torchrun --nproc_per_node 2 THIS [LAYERS HIDDEN]`.

Shards a Qwen2 model over the processes (grpocli.trainer.sharding.shard), then syncs its weights
twice, as the two backends do: every process walks them (a colocated engine each), and the main
one packs 8 MiB buckets (the HTTP bodies `grpo vllm-serve` takes) while the others take part.
Prints one JSON line per process and sync: the growth of its peak RSS over its RSS before the
sync (Linux: /proc/self/clear_refs resets the peak), and the model's whole size.
"""

from __future__ import annotations

import json
import os
import sys


def _kib(field: str) -> int:
    for line in open("/proc/self/status", encoding="utf-8"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w", encoding="utf-8") as f:
        f.write("5")


def main(layers: int, hidden: int) -> None:
    import torch
    import torch.distributed as dist
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, Qwen2Config

    from grpocli.generation.weights import buckets, pack_bucket, policy_weights
    from grpocli.trainer.sharding import shard

    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=4096, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=8,
                         num_key_value_heads=8, intermediate_size=4 * hidden, tie_word_embeddings=True)
    model = shard(AutoModelForCausalLM.from_config(config), acc)
    whole = sum(p.numel() * 4 for p in model.parameters())
    results = {}
    for mode in ("every_process", "main_sends"):
        dist.barrier()
        before = _kib("VmRSS")
        _reset_peak()
        received = 0
        with policy_weights(model) as weights:
            if mode == "every_process":
                received = sum(t.numel() for _, t in weights)
            elif acc.is_main_process:
                received = sum(len(pack_bucket(b)) for b in buckets(weights.unique(), 8 * 2**20))
            else:
                weights.take_part()
        results[mode] = {"peak_growth_mib": round((_kib("VmHWM") - before) / 1024, 1), "received": received}
        dist.barrier()
    line = json.dumps({"rank": acc.process_index, "whole_model_mib": round(whole / 2**20, 1), **results}) + "\n"
    os.write(1, line.encode())  # one write (< PIPE_BUF): the two ranks' lines never interleave
    dist.destroy_process_group()


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    main(*(args or [4, 512]))
