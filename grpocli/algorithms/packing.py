"""Rows of a micro-batch: the sequences packed end to end, or padded, and where tokens are scored.

Three layouts, the same log-probs (tests/trainer/test_trainer_packing.py):

* "packed", one sequence after another in one row (TRL's `padding_free`, open-instruct's
  `pack_sequences`): position ids restart at 0 for each sequence and no attention mask is passed;
  transformers keeps attention inside each sequence by itself: flash-attention runs varlen
  (cu_seqlens from the position ids); sdpa / eager / flex get a block-diagonal causal mask that
  `masking_utils.find_packed_sequence_indices` derives from the position ids.
* "shared", the prompt once, then the completions of its group that are in this micro-batch,
  each continuing the prompt's positions. A 4D tree mask (a completion token sees its prompt and
  its own earlier tokens) replaces the block-diagonal one, so the prompt's forward and backward
  run once per group instead of once per completion. Needs an attention that takes a 4D mask:
  sdpa or eager.
* "padded", one right-padded row per sequence with a 2D attention mask (any model).

sdpa and eager attend over a whole packed row: a row of W tokens costs ~W^2 attention and a W^2
mask, where padded rows of length L cost ~n L^2. `choose_layout` therefore shares prompts with
sdpa / eager only for rows up to `DENSE_ROW_FACTOR x hidden_size` tokens (where that attention is
small next to the matmuls) and pads longer ones; with flash-attention it packs (varlen, no waste).

Log-probs are computed only where a completion token is scored: `logit_index` lists the positions
whose logits predict a completion token (1D `logits_to_keep`), so the vocabulary projection skips
prompt positions. The last token of each completion is scored but predicts nothing, so it is not
fed to the model at all.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

#: Attention implementations that accept a ready 4D mask (transformers returns it as is).
TREE_MASK_ATTENTION = ("sdpa", "eager")
#: Shared-prompt rows up to this many times the hidden size; longer ones are padded.
DENSE_ROW_FACTOR = 4

Sequence = tuple[int, list[int], list[int]]  # (group, prompt ids, completion ids)


@dataclass(frozen=True)
class Layout:
    """How micro-batches are laid out: "shared", "packed" or "padded" (module docstring)."""

    kind: str = "padded"
    max_shared_row: int | None = None  # "shared" rows longer than this are padded instead


@dataclass(frozen=True)
class Rows:
    """The rows of one micro-batch and where its completion tokens are scored."""

    input_ids: torch.Tensor               # [r, W]
    position_ids: torch.Tensor            # [r, W]
    attention_mask: torch.Tensor | None   # [r, W] (padded), None (packed; shared: `tree`)
    logit_index: torch.Tensor             # [K] positions (of every row) whose logits score a token
    labels: torch.Tensor                  # [r, K] the token scored at each of them
    token_index: torch.Tensor             # [n, T] token t of sequence i is labels.flatten()[token_index[i, t]]
    loss_mask: torch.Tensor               # [n, T] 1.0 on real completion tokens
    cu_seqlens: torch.Tensor | None = None  # [S+1] packed: where each sequence starts in the row (flash-attention's)
    max_seqlen: int = 0                     # packed: the longest of them
    tree: torch.Tensor | None = None        # [2, W] shared: each token's prompt copy and sequence (-1: prompt),
                                            # from which `model_attention_mask` builds the [1, 1, W, W] mask
                                            # on the model's device


def attention_implementation(model: Any) -> str | None:
    """transformers' `_attn_implementation` of `model` (DDP-wrapped or not)."""
    config = getattr(getattr(model, "module", model), "config", None)  # DDP keeps the model in .module
    name = getattr(config, "_attn_implementation", None)
    return name.removeprefix("grpo_ulysses_") if name else name  # the attention grpocli.parallel.ulysses wraps


def choose_layout(model: Any) -> Layout:
    """Packed for flash-attention, shared prompts for sdpa / eager (short rows), else padded."""
    attn = attention_implementation(model)
    if attn is not None and "flash" in attn:
        return Layout("packed")
    if attn in TREE_MASK_ATTENTION:
        config = getattr(model, "module", model).config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return Layout("shared", max_shared_row=DENSE_ROW_FACTOR * getattr(text, "hidden_size", 0) or None)
    return Layout("padded")


def model_attention_mask(model: Any, rows: Rows, device: torch.device) -> torch.Tensor | None:
    """The rows' attention mask on `device`: padded rows' [r, W], or the [1, 1, W, W] tree mask of
    shared rows built there (moving W^2 booleans per micro-batch to a GPU costs more than building
    them), as the model's attention wants it: bool for sdpa, additive float for eager."""
    if rows.tree is not None:
        tree = rows.tree.to(device)
        mask = tree_mask(tree[0], tree[1])
    else:
        mask = rows.attention_mask.to(device) if rows.attention_mask is not None else None
    return eager_mask(model, mask)


def eager_mask(model: Any, mask: torch.Tensor | None) -> torch.Tensor | None:
    """A 4D bool mask as the model's attention wants it: as it is (sdpa), additive float (eager)."""
    if mask is None or mask.dim() != 4 or attention_implementation(model) != "eager":
        return mask
    dtype = next(model.parameters()).dtype
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def shared_row_tokens(sequences: list[Sequence]) -> int:
    """Tokens of the shared-prompt row of `sequences` (each prompt once per run of its group)."""
    total, last = 0, None
    for group, prompt, completion in sequences:
        total += max(len(completion) - 1, 0) + (0 if group == last else len(prompt))
        last = group
    return total


def build_rows(sequences: list[Sequence], layout: Layout, pad_id: int = 0) -> Rows:
    """The rows of one micro-batch in `layout` ("shared" falls back to padded for long rows)."""
    if layout.kind == "shared":
        if layout.max_shared_row is None or shared_row_tokens(sequences) <= layout.max_shared_row:
            return pack_row(sequences, share_prompts=True)
        return pad_rows(sequences, pad_id)
    if layout.kind == "packed":
        return pack_row(sequences, share_prompts=False)
    if layout.kind == "padded":
        return pad_rows(sequences, pad_id)
    raise ValueError(f"unknown layout {layout.kind!r}: 'shared', 'packed' or 'padded'")


def pack_row(sequences: list[Sequence], share_prompts: bool) -> Rows:
    """Lay `(group, prompt_ids, completion_ids)` sequences end to end in one row: each prompt,
    then its completion without the last token. With `share_prompts`, consecutive sequences of
    the same group share one copy of the prompt."""
    ids: list[int] = []
    positions: list[int] = []
    segment: list[int] = []   # [W] which prompt copy a token belongs to
    branch: list[int] = []    # [W] -1 on prompt tokens, else the sequence number
    scored_at: list[int] = []
    labels: list[int] = []
    spans: list[tuple[int, int]] = []  # (first scored token, completion length) per sequence
    last_group, prompt_end, seg = None, -1, 0
    for n, (group, prompt, completion) in enumerate(sequences):
        if not prompt:
            raise ValueError(f"sequence {n} has an empty prompt: its first token would have no logits")
        if not (share_prompts and group == last_group):
            ids += prompt
            positions += range(len(prompt))
            segment += [n] * len(prompt)
            branch += [-1] * len(prompt)
            prompt_end, seg = len(ids) - 1, n
        fed = completion[:-1]  # the last token is scored but predicts nothing: not fed
        start = len(ids)
        spans.append((len(labels), len(completion)))
        scored_at += ([prompt_end] + list(range(start, start + len(fed))))[: len(completion)]
        labels += completion
        ids += fed
        positions += range(positions[prompt_end] + 1, positions[prompt_end] + 1 + len(fed))
        segment += [seg] * len(fed)
        branch += [n] * len(fed)
        last_group = group
    token_index, loss_mask = _token_index([(first, length) for first, length in spans])
    tree = torch.tensor([segment, branch], dtype=torch.long) if share_prompts else None
    lengths = [] if share_prompts else [int(c) for c in torch.bincount(torch.tensor(segment)) if c]  # per sequence
    return Rows(
        input_ids=torch.tensor([ids], dtype=torch.long), position_ids=torch.tensor([positions], dtype=torch.long),
        attention_mask=None, logit_index=torch.tensor(scored_at, dtype=torch.long),
        labels=torch.tensor([labels], dtype=torch.long), token_index=token_index, loss_mask=loss_mask,
        cu_seqlens=torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32) if lengths else None,
        max_seqlen=max(lengths, default=0), tree=tree,
    )


def pad_rows(sequences: list[Sequence], pad_id: int = 0) -> Rows:
    """One right-padded row per sequence (prompt + completion without its last token); logits
    from the shortest prompt's last position on, the same positions for every row."""
    fed = [prompt + completion[:-1] for _, prompt, completion in sequences]
    full = [prompt + completion for _, prompt, completion in sequences]
    width = max(len(f) for f in fed)
    first = min(len(prompt) for _, prompt, _ in sequences) - 1  # first position that scores a token
    if first < 0:
        raise ValueError("a sequence has an empty prompt: its first token would have no logits")
    keep = width - first
    input_ids = torch.full((len(fed), width), pad_id, dtype=torch.long)  # [r, W]
    attention = torch.zeros((len(fed), width), dtype=torch.long)     # [r, W]
    labels = torch.zeros((len(fed), keep), dtype=torch.long)         # [r, K]
    spans = []
    for i, (f, seq, (_, prompt, completion)) in enumerate(zip(fed, full, sequences)):
        input_ids[i, : len(f)] = torch.tensor(f, dtype=torch.long)
        attention[i, : len(f)] = 1
        labels[i, : len(seq) - 1 - first] = torch.tensor(seq[first + 1 :], dtype=torch.long)
        spans.append((i * keep + len(prompt) - 1 - first, len(completion)))
    token_index, loss_mask = _token_index(spans)
    positions = torch.arange(width).expand(len(fed), width).clone()   # [r, W]
    return Rows(input_ids=input_ids, position_ids=positions, attention_mask=attention,
                logit_index=torch.arange(first, width), labels=labels, token_index=token_index,
                loss_mask=loss_mask)


def _token_index(spans: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """`[n, T]` indices into the flattened scored tokens and the mask of real ones, from each
    sequence's (first scored token, completion length)."""
    width = max((length for _, length in spans), default=0) or 1
    token_index = torch.zeros((len(spans), width), dtype=torch.long)  # [n, T]
    loss_mask = torch.zeros((len(spans), width), dtype=torch.float32)  # [n, T]
    for n, (first, length) in enumerate(spans):
        token_index[n, :length] = torch.arange(first, first + length)
        loss_mask[n, :length] = 1.0
    return token_index, loss_mask


def tree_mask(segment: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """`[1, 1, W, W]` bool, on the inputs' device: query q sees key k when k <= q, both in one
    prompt copy, and k is a prompt token or in q's own completion."""
    w = segment.shape[0]
    causal = torch.ones((w, w), dtype=torch.bool, device=segment.device).tril_()  # [W, W]
    same_segment = segment[:, None] == segment[None, :]
    visible = (branch[None, :] == -1) | (branch[None, :] == branch[:, None])
    return (causal & same_segment & visible)[None, None]  # [1, 1, W, W]
