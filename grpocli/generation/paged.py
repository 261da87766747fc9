"""generation.backend = "paged": transformers' continuous batching (paged attention, as TRL's
`use_transformers_continuous_batching`) on the training model itself.

Every completion of a call is one request in a paged KV cache: the G completions of a prompt are
forked from it after its prefill (one prefill per prompt, its cache blocks shared), a sequence that
writes EOS leaves the batch at once and frees its blocks, and each forward pass takes the tokens of
every live sequence (no padding, no finished rows carried along as `generate` does).

What is the same as the 'hf' backend: the live policy (no copy, no weight sync), put in eval mode for
the call; prompts, the n completions of each, prompt-major; completion ids cut after the first EOS,
`truncated` where none came within max_tokens; temperature, top_p, top_k, min_p; stop strings (the
completion is cut after the first token whose text completes one, not truncated, as vLLM does; the
sequence itself runs on to EOS or max_tokens, so the tokens after it cost time but are dropped).
What is not: repetition_penalty (transformers' continuous batching drops that processor: the recipe
is refused), collective forwards (FSDP2, ZeRO-3: refused), engine log-probs (none, as 'hf').
Temperature 0 is greedy (vLLM's convention; recipes ask for at least MIN_TEMPERATURE).
Seeds: each call, transformers draws its sampler's seed from torch's global generator (which the run
seeds with train.seed + rank) and reseeds that generator with it; every request is queued before the
loop starts, so that the batches, hence the tokens, repeat for the same seed, machine and thread
count. The samples differ from those of 'hf' for the same seed (another random stream); greedy
decoding agrees with it token for token. The cache is sized to hold every sequence of a call whole
(no eviction), not from free memory.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from grpocli.generation.base import Generated, LivePolicyBackend, Sampling, cut_at_eos, paged_on_sharded_policy
from grpocli.parallel import Parallel

#: Tokens of one page of the paged KV cache; small pages waste little on short completions.
PAGE_SIZE = 32
#: Most tokens of one forward pass (prefill chunks and decode tokens together).
MAX_BATCH_TOKENS = 2048


class PagedBackend(LivePolicyBackend):
    """Samples from the live policy through `model.init_continuous_batching`; `sync_weights` is free."""

    def __init__(self, model: Any, tokenizer: Any, *, max_prompt_length: int, parallel: Parallel | None = None) -> None:
        self.parallel = parallel or Parallel.alone()
        if self.parallel.forward_collective:
            raise paged_on_sharded_policy("FSDP2 or DeepSpeed ZeRO-3")
        self.model = model
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length

    @torch.no_grad()
    def generate_ids(self, prompt_ids: list[list[int]], n: int, sampling: Sampling) -> Generated:
        """n completions of each prompt given as token ids, prompt-major."""
        if not prompt_ids:
            return Generated(prompt_ids=[], completion_ids=[], truncated=[])
        eos = self.eos_ids()
        was_training = self.model.training
        self.model.eval()
        try:
            sequences = self._generate(prompt_ids, n, sampling, eos)
        finally:
            self.model.train(was_training)
        completions: list[list[int]] = []  # [B*G]
        truncated: list[bool] = []
        for seq in sequences:
            cut, trunc = cut_at_eos(seq, eos)
            if sampling.stop:
                cut, trunc = _cut_at_stop(cut, trunc, sampling.stop, self.tokenizer)
            completions.append(cut)
            truncated.append(trunc)
        return Generated(prompt_ids=prompt_ids, completion_ids=completions, truncated=truncated)

    def _generate(self, prompt_ids: list[list[int]], n: int, s: Sampling, eos: list[int]) -> list[list[int]]:
        """The generated tokens of every request, prompt-major. Sampling: one request per prompt, forked n
        times after its prefill (transformers' num_return_sequences); greedy (which refuses forks): n
        requests of the prompt, its cache blocks shared. All requests are queued before the generation
        thread starts, so the batches, and the tokens, do not depend on timing."""
        from transformers.generation.continuous_batching.utils import WorkloadHints

        forks = 1 if s.temperature == 0 else n
        inputs = [p for p in prompt_ids for _ in range(n // forks)]
        hints = WorkloadHints(max_prompt_length=max(len(p) for p in prompt_ids), max_generated_length=s.max_tokens,
                              num_requests=len(prompt_ids) * n)
        manager = self.model.init_continuous_batching(
            generation_config=self._generation_config(s, eos, forks),
            continuous_batching_config=_cache_config(prompt_ids, n, s.max_tokens), workload_hints=hints)
        results: dict[str, Any] = {}
        try:
            ids = manager.add_requests(inputs=inputs, max_new_tokens=s.max_tokens)
            manager.start()
            while len(results) < len(prompt_ids) * n:
                out = manager.get_result(timeout=1)
                if out is not None and out.is_finished():
                    results[out.request_id] = out
                elif out is None and not manager.is_running():
                    break  # the generation thread stopped on an error (its requests failed, or are missing)
        finally:
            manager.stop(block=True)
            manager.destroy()
        order = [rid for parent in ids for rid in (parent, *(f"{parent}__child#{i}" for i in range(forks - 1)))]
        failed = [(rid, results[rid].error) for rid in order if rid in results and results[rid].error]
        missing = [rid for rid in order if rid not in results]
        if failed or missing:
            raise RuntimeError(f"transformers' continuous batching lost {len(missing)} of {len(order)} requests "
                               f"and failed {len(failed)}: {failed[:1] or missing[:3]}")
        return [list(results[rid].generated_tokens) for rid in order]

    def _generation_config(self, s: Sampling, eos: list[int], n: int) -> Any:
        from transformers import GenerationConfig

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
        greedy = s.temperature == 0  # vLLM's convention; a recipe's temperature is at least MIN_TEMPERATURE
        sampling: dict[str, Any] = {} if greedy else {
            "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k or None, "min_p": s.min_p or None}
        return GenerationConfig(do_sample=not greedy, max_new_tokens=s.max_tokens, eos_token_id=eos, pad_token_id=pad,
                                num_return_sequences=n, **sampling)


def _cache_config(prompt_ids: list[list[int]], n: int, max_tokens: int) -> Any:
    """A paged cache that holds every sequence of the call whole (no eviction, no offloading), sized from
    the call rather than from free memory: on a CPU transformers would otherwise take 90% of the host's RAM."""
    from transformers.generation import ContinuousBatchingConfig

    blocks = sum(n * math.ceil((len(p) + max_tokens) / PAGE_SIZE) for p in prompt_ids) + len(prompt_ids)
    batch_tokens = min(MAX_BATCH_TOKENS, max(64, sum(len(p) for p in prompt_ids) + len(prompt_ids) * n))
    return ContinuousBatchingConfig(page_size=PAGE_SIZE, num_blocks=blocks, max_batch_tokens=batch_tokens,
                                    max_memory_percent=1.0, auto_switch_to_flash=False)


def _cut_at_stop(ids: list[int], truncated: bool, stop: tuple[str, ...], tokenizer: Any) -> tuple[list[int], bool]:
    """Cut after the first token whose text completes a stop string (then not truncated); as it was without one."""
    if not any(s in tokenizer.decode(ids) for s in stop):
        return ids, truncated
    for end in range(1, len(ids) + 1):
        if any(s in tokenizer.decode(ids[:end]) for s in stop):
            return ids[:end], False
    return ids, truncated
