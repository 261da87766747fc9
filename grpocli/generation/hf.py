"""Generation with transformers' `generate` on the training model itself (no weight sync needed)."""

from __future__ import annotations

from typing import Any

import torch

from grpocli.generation.base import Generated, Sampling


class HFBackend:
    """Samples from the live policy: `sync_weights` is free because it is the same model."""

    def __init__(self, model: Any, tokenizer: Any, *, max_prompt_length: int, batch_size: int = 64) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.batch_size = batch_size  # completions per generate call

    def sync_weights(self, model: Any) -> None:
        self.model = model

    def close(self) -> None:
        pass

    def encode_prompts(self, prompts: list[str]) -> list[list[int]]:
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        return [row[-self.max_prompt_length :] for row in ids]  # left-truncate

    @torch.no_grad()
    def generate(self, prompts: list[str], n: int, sampling: Sampling) -> Generated:
        prompt_ids = self.encode_prompts(prompts)
        eos = _eos_ids(self.tokenizer, self.model)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
        rows = [p for p in prompt_ids for _ in range(n)]  # [B*G] prompt-major
        completions: list[list[int]] = []
        truncated: list[bool] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(rows), self.batch_size):
                chunk = rows[start : start + self.batch_size]
                out = self._generate_chunk(chunk, sampling, eos, pad)
                for seq in out:
                    cut, trunc = _cut_at_eos(seq, eos)
                    completions.append(cut)
                    truncated.append(trunc)
        finally:
            self.model.train(was_training)
        return Generated(prompt_ids=prompt_ids, completion_ids=completions, truncated=truncated)

    def _generate_chunk(self, chunk: list[list[int]], s: Sampling, eos: list[int], pad: int) -> list[list[int]]:
        width = max(len(r) for r in chunk)
        input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)  # [b, Tp] left-padded
        attention = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, row in enumerate(chunk):
            input_ids[i, width - len(row) :] = torch.tensor(row)
            attention[i, width - len(row) :] = 1
        device = next(self.model.parameters()).device
        kwargs: dict[str, Any] = dict(
            do_sample=True,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k or None,
            min_p=s.min_p or None,
            repetition_penalty=s.repetition_penalty,
            max_new_tokens=s.max_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
            use_cache=True,
        )
        if s.stop:
            kwargs.update(stop_strings=list(s.stop), tokenizer=self.tokenizer)
        out = self.model.generate(
            input_ids=input_ids.to(device), attention_mask=attention.to(device), **kwargs
        )  # [b, Tp + Tc]
        return out[:, width:].tolist()


def _eos_ids(tokenizer: Any, model: Any) -> list[int]:
    ids = model.generation_config.eos_token_id if getattr(model, "generation_config", None) else None
    ids = ids if ids is not None else tokenizer.eos_token_id
    return list(ids) if isinstance(ids, (list, tuple)) else [ids]


def _cut_at_eos(seq: list[int], eos: list[int]) -> tuple[list[int], bool]:
    """Keep tokens up to and including the first EOS; truncated when there is none."""
    for i, tok in enumerate(seq):
        if tok in eos:
            return seq[: i + 1], False
    return seq, True
