"""Generation with transformers' `generate` on the training model itself (no weight sync needed).

Where every forward pass is a collective (FSDP2, ZeRO-3: the parallel strategy's
`forward_collective`), transformers' `synced_gpus` keeps the processes together inside one
`generate` call, and `generate_ids` makes every process take part in the same number of calls,
each with the same passes (a process with fewer prompts, or none, makes dummy calls on one token
whose results are dropped).
"""

from __future__ import annotations

from typing import Any

import torch

from grpocli.generation.base import Generated, LivePolicyBackend, Sampling, cut_at_eos
from grpocli.parallel import Parallel
from grpocli.parallel.strategy import idle_forward


class HFBackend(LivePolicyBackend):
    """Samples from the live policy: `sync_weights` is free because it is the same model.

    transformers' `generate(num_return_sequences=G)` repeats each prompt G times *before* the
    prefill (`_expand_inputs_for_generation`), so the prompt is encoded G times. With
    `share_prefill` (the default) each unique prompt is prefilled once: all but its last token go
    through the model, the KV cache is repeated G times (`DynamicCache.batch_repeat_interleave`),
    and `generate` continues from that cache (it feeds only the uncached last prompt token).
    Same tokens for the same seed (tests/trainer/test_trainer_packing.py).
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_prompt_length: int, batch_size: int = 64,
                 share_prefill: bool = True, parallel: Parallel | None = None) -> None:
        self.model = model
        self.parallel = parallel or Parallel.alone()
        self.lockstep = self.parallel.forward_collective  # each generate call is a collective
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.batch_size = batch_size  # completions per generate call (whole groups, at least one)
        self.share_prefill = share_prefill

    @torch.no_grad()
    def generate_ids(self, prompt_ids: list[list[int]], n: int, sampling: Sampling) -> Generated:
        """n completions of each prompt given as token ids (multi-turn rollouts continue from them).
        Collective forwards: as many generate calls as the process with the most (`forward_passes`;
        None marks a dummy call), so a process with fewer prompts, or none, keeps the others going."""
        eos = self.eos_ids()
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
        per_call = max(1, self.batch_size // n)  # prompts per generate call
        chunks = self.parallel.forward_passes([prompt_ids[s : s + per_call] for s in range(0, len(prompt_ids), per_call)])
        completions: list[list[int]] = []  # [B*G] prompt-major
        truncated: list[bool] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for chunk in chunks:
                if chunk is None:
                    self._idle_generate(eos, pad)
                    continue
                for seq in self._generate_chunk(chunk, n, sampling, eos, pad):
                    cut, trunc = cut_at_eos(seq, eos)
                    completions.append(cut)
                    truncated.append(trunc)
        finally:
            self.model.train(was_training)
        return Generated(prompt_ids=prompt_ids, completion_ids=completions, truncated=truncated)

    def _generate_chunk(self, chunk: list[list[int]], n: int, s: Sampling, eos: list[int], pad: int) -> list[list[int]]:
        """n completions of each prompt in `chunk`, prompt-major: `[len(chunk) * n]` token lists."""
        width = max(len(r) for r in chunk)
        input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)  # [b, Tp] left-padded
        attention = torch.zeros((len(chunk), width), dtype=torch.long)     # [b, Tp]
        for i, row in enumerate(chunk):
            input_ids[i, width - len(row) :] = torch.tensor(row)
            attention[i, width - len(row) :] = 1
        device = next(self.model.parameters()).device
        input_ids, attention = input_ids.to(device), attention.to(device)
        cache = None
        if self.share_prefill and width > 1:
            cache = self._prefill(input_ids, attention, n)
        elif self.share_prefill and self.lockstep:
            idle_forward(self.model)  # one prefill pass per call on every process, as _idle_generate
        out = self.model.generate(
            input_ids=input_ids.repeat_interleave(n, 0), attention_mask=attention.repeat_interleave(n, 0),
            past_key_values=cache, **self._sampling_kwargs(s, eos, pad),
        )  # [b*n, Tp + Tc]
        return out[:, width:].tolist()

    def _idle_generate(self, eos: list[int], pad: int) -> None:
        """Take part in one generate call of the other processes (collective forwards) without a prompt of its
        own: the same passes as `_generate_chunk` (a prefill pass where it makes one, then generate,
        which synced_gpus keeps going until every process is done), on one token, greedy (the
        random stream is not touched), the result dropped."""
        if self.share_prefill:
            idle_forward(self.model)
        device = next(self.model.parameters()).device
        ids = torch.full((1, 1), pad, dtype=torch.long, device=device)  # [1, 1]
        self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=1,
                            eos_token_id=eos, pad_token_id=pad, use_cache=True)

    def _prefill(self, input_ids: torch.Tensor, attention: torch.Tensor, n: int) -> Any:
        """The KV cache of every prompt but its last token, computed once, repeated n times."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        mask = attention[:, :-1]                                   # [b, Tp-1]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)             # as generate numbers left-padded rows
        self.model(input_ids=input_ids[:, :-1], attention_mask=mask, position_ids=positions,
                   past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.batch_repeat_interleave(n)                           # [b*n, ...] prompt-major
        return cache

    def _sampling_kwargs(self, s: Sampling, eos: list[int], pad: int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "do_sample": True, "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k or None,
            "min_p": s.min_p or None, "repetition_penalty": s.repetition_penalty, "max_new_tokens": s.max_tokens,
            "eos_token_id": eos, "pad_token_id": pad, "use_cache": True,
        }
        if s.stop:
            kwargs.update(stop_strings=list(s.stop), tokenizer=self.tokenizer)
        return kwargs

