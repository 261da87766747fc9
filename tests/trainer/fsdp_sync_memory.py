"""Peak memory of an FSDP2 weight sync, per process: `torchrun --nproc_per_node 2 THIS [LAYERS HIDDEN [lora]]`.

Shards a Qwen2 model over the processes (grpocli.parallel.fsdp2.shard), then syncs its weights
twice, as the two backends do: every process walks them (a colocated engine each), and the main
one packs 8 MiB buckets (the HTTP bodies `grpo vllm-serve` takes) while the others take part.
Prints one JSON line per process and sync: the growth of its peak RSS over its RSS before the
sync (Linux: /proc/self/clear_refs resets the peak), and the model's whole size.

With `lora` the model is a peft LoRA model (r 8 on every linear layer, lora_B drawn at random so
that merging changes the weights) before it is sharded: `policy_weights` adds each adapter to its
base weight out of place as the sync reaches it (W, A and B gathered one after another; nothing is
written into the shards), and the line also holds what a third sync sent, compared with
`merge_and_unload()` of the same model unsharded (`merged_max_diff`, over the names in both;
`names_differ`: names in one only), how far the adapters move the weights (`merge_moves`), how far
the sharded model's tensors (base and adapters) are from the unsharded ones after the syncs
(`base_drift`: exactly 0, since no sync writes into the model; peft's merge and unmerge left
W + d - d, rounding, before), whether any layer reports itself merged (`still_merged`), and what
the in-process reference refresh makes of a sharded plain copy of the base (`PolicyWeights.state()`
mixed in with alpha 1, as trainer/loop.py does), against the same merged model (`reference_mix_max_diff`).
"""

from __future__ import annotations

import copy
import json
import os
import sys


def _kib(field: str) -> int:
    with open("/proc/self/status", encoding="utf-8") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w", encoding="utf-8") as f:
        f.write("5")


def _model(layers: int, hidden: int, lora: bool):
    """The same model on every process (seeded): a Qwen2 of the given size, LoRA-wrapped when asked."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=4096, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=8,
                         num_key_value_heads=8, intermediate_size=4 * hidden, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config)
    if not lora:
        return model
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:  # peft starts lora_B at 0 (a merge would change nothing)
                param.normal_(0.0, 0.05)
    return model


def _sync_peaks(model, parallel) -> dict:
    """Peak RSS growth of a colocated sync (every process walks the weights) and of a server sync."""
    import torch.distributed as dist

    from grpocli.generation.weights import buckets, pack_bucket, policy_weights

    results = {}
    for mode in ("every_process", "main_sends"):
        dist.barrier()
        before = _kib("VmRSS")
        _reset_peak()
        received = 0
        with policy_weights(model, parallel=parallel) as weights:
            if mode == "every_process":
                received = sum(t.numel() for _, t in weights)
            elif parallel.main:
                received = sum(len(pack_bucket(b)) for b in buckets(weights.unique(), 8 * 2**20))
            else:
                weights.take_part()
        results[mode] = {"peak_growth_mib": round((_kib("VmHWM") - before) / 1024, 1), "received": received}
        dist.barrier()
    return results


def _lora_checks(model, plain, parallel, reference) -> dict:
    """What a colocated sync of the sharded peft `model` sends against `plain` (the same model,
    unsharded) merged by peft's merge_and_unload; the sharded tensors after the syncs; and the sharded
    plain `reference` after a refresh with alpha 1 (it must become the merged model)."""
    from grpocli.generation.weights import policy_weights
    from grpocli.parallel.fsdp2 import full_state
    from grpocli.reference.mixing import mix_state

    initial = {name: t.clone() for name, t in plain.state_dict().items()}
    expected = plain.merge_and_unload().state_dict()
    with policy_weights(model, parallel=parallel) as weights:
        sent = {name: t.clone() for name, t in weights}  # every process walks them: each gathers
    with policy_weights(model, parallel=parallel) as weights:
        mix_state(reference, weights.state(), 1.0)  # every process looks up the same names in the same order
    mixed = full_state(reference, keep=True)
    common = sorted(set(sent) & set(expected))
    after = full_state(model, keep=True)
    base = [n for n in initial if "lora_" not in n]
    clean = {n: n.removeprefix("base_model.model.").replace(".base_layer", "") for n in base}
    return {
        "names_differ": sorted(set(sent) ^ set(expected)),
        "merged_max_diff": max((sent[n] - expected[n]).abs().max().item() for n in common),
        "merge_moves": max((expected[clean[n]] - initial[n]).abs().max().item() for n in base),
        "base_drift": max((after[n] - initial[n]).abs().max().item() for n in initial),
        "still_merged": any(getattr(m, "merged", False) for m in model.modules()),
        "reference_mix_max_diff": max((mixed[n] - expected[n]).abs().max().item() for n in mixed),
    }


def main(layers: int, hidden: int, lora: bool = False) -> None:
    import torch.distributed as dist
    from accelerate import Accelerator

    from grpocli.parallel.fsdp2 import Fsdp2, shard

    acc = Accelerator(cpu=True)
    parallel = Fsdp2(acc)
    model = _model(layers, hidden, lora)
    plain = copy.deepcopy(model) if lora else None  # the unsharded model for the checks
    model = shard(model, acc)
    whole = sum(p.numel() * 4 for p in model.parameters())
    results = _sync_peaks(model, parallel)
    if lora:  # an in-process reference: the plain base model (same seed), sharded as prepare shards it
        results["lora"] = _lora_checks(model, plain, parallel, shard(_model(layers, hidden, False), acc))
    line = json.dumps({"rank": acc.process_index, "whole_model_mib": round(whole / 2**20, 1), **results}) + "\n"
    os.write(1, line.encode())  # one write (< PIPE_BUF): the two ranks' lines never interleave
    dist.destroy_process_group()


if __name__ == "__main__":
    args = sys.argv[1:]
    lora = "lora" in args
    sizes = [int(a) for a in args if a != "lora"]
    main(*(sizes or [4, 512]), lora=lora)
