"""Tiny Qwen2 models built from a [model.tiny] section: no download, bit-identical for a seed.

The architecture is transformers' Qwen2ForCausalLM (so vLLM serves a saved tiny model like any
Qwen2 checkpoint); the special-token ids follow Qwen2.5-Instruct: eos is <|im_end|>, pad and bos
are <|endoftext|>, and generation stops at either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

    from grpocli.recipe.schema import TinyModel


def build_tiny_model(
    tiny: TinyModel,
    tokenizer: PreTrainedTokenizerBase,
    seed: int,
    *,
    attn_implementation: str | None = None,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2ForCausalLM; equal (tiny, tokenizer, seed) give equal weights.

    The global torch RNG is left as it was (the seed is applied inside ``fork_rng``).
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    pad_id = tokenizer.pad_token_id
    eos_id = tokenizer.eos_token_id
    config = tiny_config(tiny, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation=attn_implementation, dtype=torch.float32
        )
    # Stop at the end of a turn or of a document, as Qwen2.5-Instruct's generation_config.json.
    stop_ids = [eos_id] if pad_id in (None, eos_id) else [eos_id, pad_id]
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=stop_ids, pad_token_id=pad_id
    )
    return model


def tiny_config(tiny: TinyModel, tokenizer: PreTrainedTokenizerBase) -> Qwen2Config:
    """The Qwen2Config of the tiny model `build_tiny_model` builds (grpo plan reads its shape from it)."""
    from transformers import Qwen2Config

    pad_id = tokenizer.pad_token_id
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=tiny.hidden_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=tiny.num_heads,
        num_key_value_heads=tiny.num_kv_heads or tiny.num_heads,
        intermediate_size=tiny.intermediate_size,
        max_position_embeddings=tiny.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        bos_token_id=pad_id,
        eos_token_id=tokenizer.eos_token_id,
        use_sliding_window=False,
    )
