"""The training phase of grpo's real step (and its no-grad log-prob pass), measured: `grpo plan`'s prediction against torch's own
tracking of tensor allocations (torch.distributed._tools.mem_tracker.MemTracker).

One configuration is a list of recipe overrides of the quickstart. The model is the recipe's (the
tiny Qwen2 of [model.tiny], or a directory written by `save_small_model`); it loads through
grpocli.models (gradient checkpointing, LoRA), is prepared by grpocli.parallel (one process, or
FSDP2 over torchrun's processes), and trains on a batch of full-length sequences (every prompt
data.max_prompt_length tokens, every completion generation.max_completion_length) laid out as the
trainer lays them out (each group's first completion one token shorter, so that padded rows carry
their attention mask, as real batches do). The peak is taken over two optimizer steps (the second
holds AdamW's moments from the start), counting the weights, reference and optimizer state as
MemTracker's externals. On
CUDA: torch.cuda.max_memory_allocated over two steps after a first one, less what the allocator holds
that is no tensor of the models or the optimizer (cuBLAS's workspaces).

    torchrun --nproc_per_node 2 tests/planning/measured_step.py OVERRIDE...   (one JSON line per process)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import weakref
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(TESTS)]

#: The settings every measured configuration shares: 2 prompts x 4 completions a step, one process.
BASE = ["log.progress=none", "generation.num_generations=4", "train.prompts_per_step=2", "train.torch_threads=1",
        "data.args={num_samples=8}"]
#: A small Llama shape (GQA: 4 query heads, 2 key/value heads; untied embeddings; a 4096 vocabulary).
SMALL = {"vocab_size": 4096, "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 384, "max_position_embeddings": 1024,
         "tie_word_embeddings": False}


def save_small_model(folder: Path) -> Path:
    """A randomly initialised LlamaForCausalLM of the SMALL shape, saved (config.json + safetensors)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(LlamaConfig(**SMALL)).save_pretrained(folder)
    return folder


def peak_tracker():
    """torch's MemTracker without its per-module snapshots (they allow one forward per module, and
    a step runs one per micro-batch): every tensor storage still counted, the peak per device kept."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class PeakTracker(MemTracker):
        def _pre_fw_hook(self, module, inputs):
            pass

        def _post_fw_hook(self, module, inputs, outputs):
            pass

        def _pre_bw_hook(self, module, args):
            pass

        def _post_bw_hook(self, module, args):
            pass

    return PeakTracker()


def host_offloading(model):
    """train.activation_offloading on a CPU, as on a GPU: grpocli.trainer.offloading's hooks (the same
    choice of what to copy, each tensor once), with the host copies made in numpy arrays, memory that
    the tracker does not count (on a CPU the trainer's copies are torch tensors in the same memory as
    the activations, so they would be counted and nothing would seem saved)."""
    import numpy
    import torch

    from grpocli.trainer.offloading import ActivationOffloading

    class HostOffloading(ActivationOffloading):
        def _pack(self, t: torch.Tensor):
            if self._stays(t):
                self.kept += 1
                return t
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
                   t.dtype, t._version)
            seen = self.copies.get(key)
            if seen is not None and seen[0]() is not None:
                return seen[1]
            bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
            host = numpy.empty(tuple(t.shape), dtype=torch.empty((), dtype=bits).numpy().dtype)
            torch.from_numpy(host).copy_(t.detach().view(bits))
            packed = (t.size(), t.stride(), t.dtype, bits, host)
            self.copies[key] = (weakref.ref(t), packed)
            self.packed += 1
            self.offloaded_bytes += t.numel() * t.element_size()
            return packed

        @staticmethod
        def _unpack(packed):
            if isinstance(packed, torch.Tensor):
                return packed
            size, stride, dtype, bits, host = packed
            back = torch.empty_strided(size, stride, dtype=dtype)
            back.view(bits).copy_(torch.from_numpy(host))
            return back

    return HostOffloading(model)


def _held(*objects) -> int:
    """Bytes of the distinct storages of the models' parameters and the optimizers' state."""
    import torch

    seen: dict[int, int] = {}
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            tensors = list(obj.parameters()) + list(obj.buffers())
        elif obj is not None:
            tensors = [t for state in obj.state_dict()["state"].values() for t in state.values()
                       if isinstance(t, torch.Tensor)]
        else:
            tensors = []
        for t in tensors:
            local = t.to_local() if hasattr(t, "to_local") else t
            if local.device.type == "cuda":
                seen[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
    return sum(seen.values())


def _rollouts(r, vocab: int, rank: int, processes: int):
    """This process's share of a step's rollouts: prompts_per_step / processes groups."""
    import torch

    from grpocli.trainer.rollouts import Rollouts

    g, b = r.generation.num_generations, r.train.prompts_per_step // processes
    gen = torch.Generator().manual_seed(rank)
    prompts = torch.randint(1, vocab, (b, r.data.max_prompt_length), generator=gen).tolist()
    completions = torch.randint(1, vocab, (b * g, r.generation.max_completion_length), generator=gen).tolist()
    for k in range(0, b * g, g):  # each group's first completion a token short: padded rows need their mask
        completions[k] = completions[k][:-1]
    return Rollouts(rows=[{} for _ in range(b)], prompt_ids=prompts, completion_ids=completions,
                    completions=[""] * (b * g), truncated=torch.zeros(b * g, dtype=torch.bool), group_size=g)


def measure_on_two(overrides: list[str], cwd: Path, timeout: float) -> list[dict]:
    """`measure` on 2 processes (torchrun --standalone: a free rendezvous port): each process's line, by rank."""
    import subprocess

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__,
           *overrides]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = sorted((json.loads(x) for x in done.stdout.splitlines() if x.startswith('{"rank"')),
                   key=lambda line: line["rank"])
    assert [line["rank"] for line in lines] == [0, 1]
    return lines


def measure(overrides: list[str]) -> dict:
    """Predicted and measured peak bytes of this process's training phase (two optimizer steps) and,
    on a CPU, of the old policy's log-prob pass after them."""
    import torch

    from grpocli.algorithms.packing import choose_layout
    from grpocli.models import load_policy, load_reference
    from grpocli.parallel import start
    from grpocli.planning import make_plan, shape_of
    from grpocli.recipe import load_recipe
    from grpocli.trainer.batching import OptimizerBatch, make_micro_batches
    from grpocli.trainer.offloading import ActivationOffloading
    from grpocli.trainer.session import _optimizer
    from grpocli.trainer.step import Frozen, LossSettings, frozen_logprobs, optimizer_step

    r = load_recipe("quickstart", [*BASE, *overrides]).recipe
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as project:
        parallel = start(r, Path(project))
    device = parallel.load_device  # CUDA: the weights load straight onto it
    model = load_policy(r.model, r.train.seed, device=device)
    reference = load_reference(r.model, r.train.seed, device=device) if r.algorithm.beta > 0 else None
    parallel.split_models(model, reference)  # train.sequence_parallel: Ulysses attention, as the trainer's session
    model, reference, optimizer, _ = parallel.prepare(model, reference, lambda m: _optimizer(r.train, m))
    policy = parallel.unwrap(model)
    vocab = policy.get_input_embeddings().num_embeddings
    rollouts = _rollouts(r, vocab, parallel.rank, parallel.size)
    advantages = torch.linspace(-1.0, 1.0, len(rollouts.completion_ids))  # none 0: every row is computed
    micro = tuple(make_micro_batches(rollouts, advantages, list(range(len(advantages))),
                                     max_sequences=r.train.micro_batch_size, layout=choose_layout(policy)))
    chunk = r.train.logits_chunk_tokens
    settings = LossSettings.of(r.algorithm, r.generation, chunk_tokens=chunk)
    ref = (frozen_logprobs(parallel, reference, micro, settings.temperature, chunk_tokens=chunk)
           if reference is not None else None)
    offload = None
    if r.train.activation_offloading:  # host copies the tracker does not count, as a GPU's count has no host memory
        offload = host_offloading(model) if parallel.device.type == "cpu" else ActivationOffloading(model)

    def steps() -> None:
        for _ in range(2):
            optimizer_step(parallel, model, optimizer, OptimizerBatch(micro), Frozen(ref_logp=ref), settings,
                           max_grad_norm=r.train.max_grad_norm, offload=offload)

    kinds: dict[str, int] = {}
    logprob_measured = None
    if parallel.device.type == "cuda":  # the caching allocator's own count of every tensor allocated
        steps()  # a first step allocates AdamW's moments and cuBLAS's workspaces, which stay
        overhead = torch.cuda.memory_allocated(parallel.device) - _held(model, optimizer, reference)
        torch.cuda.reset_peak_memory_stats(parallel.device)
        steps()
        measured = torch.cuda.max_memory_allocated(parallel.device) - overhead  # tensors only
        kinds = {"overhead (not tensors of the step: cuBLAS workspaces)": overhead}
    else:
        tracker = peak_tracker()
        tracker.track_external(model, optimizer, *([reference] if reference is not None else []))
        with tracker:
            steps()
        peak = tracker.get_tracker_snapshot("peak")
        measured = sum(snap["Total"] for snap in peak.values())
        kinds = {str(k): v for snap in peak.values() for k, v in snap.items() if v}
        tracker = peak_tracker()  # the old policy's pass, AdamW's moments held from the steps
        tracker.track_external(model, optimizer, *([reference] if reference is not None else []))
        with tracker:
            frozen_logprobs(parallel, policy, micro, settings.temperature, chunk_tokens=chunk)
        logprob_measured = sum(snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values())
    plan = make_plan(r, shape_of(r.model), gpus=parallel.size, gpu_memory=2**50, knobs=False)
    training = next(p for p in plan.phases if p.name == "training")
    logprob = next(p for p in plan.phases if p.name == "log-prob passes")
    return {"rank": parallel.rank, "predicted": training.total, "measured": measured,
            "logprob_predicted": logprob.total, "logprob_measured": logprob_measured,
            "parts": dict(training.parts), "rows": [tuple(mb.input_ids.shape) for mb in micro],
            "device": parallel.device.type, "measured_parts": kinds}


if __name__ == "__main__":
    line = measure(sys.argv[1:])
    os.write(1, (json.dumps(line) + "\n").encode())  # one write: the processes' lines never interleave
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
